"""The GGUF emitter: the head's parts (``headplan.head_parts``) as llama.cpp tensors — names,
ggml types, shapes — then converted one tensor, one expert, at a time.

The conversion is llama.cpp's converter's, step for step: decode to float32, +1 on the seven
zero-centred norm kinds (the source is raw Hugging Face), stack experts on the slowest axis,
split what the converter splits (MLA's ``kv_b_proj``: ``passes/mla.py``), reorder the query/key
rows where the family's converter does (``passes/rope.py``), quantize with gguf-py's
own ``quants`` (the same code the converter calls, so an f32/f16/bf16 head is byte-identical to
the converter's). Norms, 1-D tensors and routers stay F32 as there.
Stacks are produced expert by expert (every ggml type here quantizes rows independently), so a
512-expert head never sits in memory whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Iterator, Mapping

import gguf
import numpy as np

from ..checkpoint.safetensors_header import TensorInfo
from ..errors import RefusedError
from ..families.spec import FamilySpec, Role
from ..families.tables import dims, family_spec
from ..headplan import (GGUF_DEFAULT_PRECISION, GGUF_PRECISIONS, HeadPart, Reader, SliceRef, block_scale, decode, head_parts,
                        parse_precision as _parse_precision, rank_sharded, read_scale, row_blocks, scale_of)
from ..passes.fp8 import E8M0_NAN, q8_0_block_fp8, repack_mxfp4
from ..passes.mla import SPLITS, split_part, split_unit
from ..passes.norms import add_offset
from ..passes.rope import qk_permutation
from ..writer.ahead import in_order
from .names import expert_name, family_names, gguf_name, keeps_f32, split_names

Q = gguf.GGMLQuantizationType
#: the ggml types gguf-py encodes value by value (a cast), not in blocks
FLOAT_TYPES = frozenset({Q.F32, Q.F16, Q.BF16})
#: block types converted from block-FP8 codes by a lookup of their own, the bytes gguf-py's
#: quantizer writes (``passes/fp8.py``)
FP8_LOOKUPS = {Q.Q8_0: q8_0_block_fp8}


#: --precision values -> ggml type of the head's matrices (norms and routers stay F32)
PRECISIONS: dict[str, gguf.GGMLQuantizationType] = {p: Q[p.upper()] for p in GGUF_PRECISIONS}
#: measured on the trained tiny models (README, "llama.cpp"): an f16 head drafts as well as the
#: f32 one on every trunk quantization, q8_0 loses a little on the Q4_K_M trunks
DEFAULT_PRECISION = GGUF_DEFAULT_PRECISION
#: llama.cpp's file-type code for an MTP-only file of each precision (``general.file_type``)
FILE_TYPES: dict[str, int] = {
    "f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
    "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}



@dataclass
class HeadTensor:
    name: str
    type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order
    slices: list[SliceRef]  # one, or one per expert (stacked on axis 0)
    #: added to a zero-centred norm (the family spec's offset, as the MLX writer adds it); 0 else
    offset: float
    #: float32 source tensor -> this tensor's values, for a part of a tensor the converter splits
    #: or a tensor whose rows it reorders
    transform: Callable[[np.ndarray], np.ndarray] | None = None
    #: rows the transform acts on one unit at a time (a split's heads), so row blocks of whole
    #: units convert alone; 0: it needs the whole tensor (a rope permutation)
    transform_unit: int = 0
    #: the slices are parts lying side by side (columns after columns: ``FamilySpec.gguf_fused_columns``)
    side_by_side: bool = False
    #: the source's own decode where ``headplan.decode`` reads it wrong (a rank-sharded FP8
    #: release: ``FamilySpec.rank_sharded``); it takes the whole tensor
    decoder: Callable[..., np.ndarray] | None = None

    @property
    def row_unit(self) -> int | None:
        """Rows a row block holds whole multiples of (``headplan.row_blocks``); None where the
        conversion needs the whole tensor (a decoder of its own, a q/k rope permutation)."""
        if self.decoder is not None or (self.transform is not None and not self.transform_unit):
            return None
        return self.transform_unit or 1

    @property
    def nbytes(self) -> int:
        rows = 1
        for d in self.shape[:-1]:
            rows *= d
        bs, ts = gguf.GGML_QUANT_SIZES[self.type]
        return rows * (self.shape[-1] // bs) * ts


def parse_precision(p: str | None) -> str:
    """A GGUF head's ``--precision`` (``headplan.parse_precision``, the one parser of both formats)."""
    return str(_parse_precision(p, gguf=True))


def is_quantized(precision: str) -> bool:
    """A precision whose ggml type is a block quantization (not a float)."""
    return PRECISIONS[precision] not in FLOAT_TYPES


def _type_for(name: str, shape: tuple[int, ...], precision: str, quantized: bool = False,
              full: bool = False) -> gguf.GGMLQuantizationType:
    """The tensor's ggml type: F32 where the converter keeps it so (unless the family's converter
    quantizes that matrix anyway: ``quantized``) or where the user asked for full precision
    (``full``: --keep-fc-full-precision), else the precision's."""
    if full or (keeps_f32(name, len(shape)) and not (quantized and len(shape) > 1)):
        return Q.F32
    t = PRECISIONS[precision]
    bs, _ = gguf.GGML_QUANT_SIZES[t]
    # the converter's fallback when rows do not split into blocks
    return t if shape[-1] % bs == 0 else Q.F16


def _own_type(spec: FamilySpec, role: Role | None, dtype: str, n_dims: int) -> gguf.GGMLQuantizationType | None:
    """The type the family's converter writes this tensor in whatever the precision
    (``FamilySpec.gguf_type_of``), None where the precision decides."""
    t = spec.gguf_type_of(role, dtype, n_dims) if spec.gguf_type_of else None
    return None if t is None else Q[t]


def _either(own: gguf.GGMLQuantizationType | None, t: gguf.GGMLQuantizationType) -> gguf.GGMLQuantizationType:
    """The family converter's own type where it has one (F32 is 0: not a truth test), else ``t``."""
    return t if own is None else own


def plan_head(entries: Mapping[str, TensorInfo], src_config: Mapping[str, object], n_trunk: int,
              precision: str, src_fmt: str, keep_fc: bool = False) -> list[HeadTensor]:
    """Every llama.cpp tensor of the head, in a stable order: the head's parts, experts stacked,
    named as llama.cpp's converter names them (``keep_fc``: the fc stays F32 in a quantized head)."""
    spec = family_spec(src_config)
    dm = dims(src_config)
    out: list[HeadTensor] = []
    fused_of = {part: whole for whole, parts in spec.gguf_fused.items() for part in parts}
    fused: dict[tuple[Role, int], dict[Role, HeadPart]] = {}
    for p in head_parts(spec, entries, dm["E"], src_fmt, stack=True):
        if p.role in fused_of:
            fused.setdefault((fused_of[p.role], p.step), {})[p.role] = p
            continue
        own = _own_type(spec, p.role, entries[p.source].dtype, len(p.shape))
        if p.stacked:
            assert p.role is not None
            name = expert_name(p.role, p.step, n_trunk)
            shape = p.shape
            if own == Q.MXFP4:  # stored two values a byte: the tensor's values are twice its bytes
                shape = (*p.shape[:-1], 2 * p.shape[-1])
            out.append(HeadTensor(name, _either(own, _type_for(name, shape, precision)), shape, list(p.slices), 0.0))
            continue
        out += _split(p, n_trunk, spec, dm, precision) or [_named(p, n_trunk, spec, dm, precision, keep_fc, src_config, own)]
    out += [_fused(whole, step, parts, n_trunk, spec, precision, entries) for (whole, step), parts in fused.items()]
    return sorted(out, key=lambda t: t.name)


def _fused(whole: Role, step: int, parts: Mapping[Role, HeadPart], n_trunk: int, spec: FamilySpec,
           precision: str, entries: Mapping[str, TensorInfo]) -> HeadTensor:
    """The one tensor llama.cpp's graph reads in place of the parts (``FamilySpec.gguf_fused``):
    their rows one after another in the family's order. Each part is converted on its own and
    its bytes follow the previous part's, which are the fused tensor's bytes, since every ggml
    type here encodes rows independently."""
    missing = [r.value for r in spec.gguf_fused[whole] if r not in parts]
    if missing:
        raise RefusedError(f"the source's MTP layer {step} lacks {', '.join(missing)}, which llama.cpp reads fused "
                           f"into {family_names(spec)[whole]}", "pass the original checkpoint as --source")
    order = [parts[r] for r in spec.gguf_fused[whole]]
    name = f"blk.{n_trunk + step}.{family_names(spec)[whole]}"
    columns = whole in spec.gguf_fused_columns
    if columns:  # side by side: the rows are each part's row, one after another
        shape = (order[0].shape[0], sum(p.shape[-1] for p in order))
    else:
        shape = (sum(p.shape[0] for p in order), *order[0].shape[1:])
    own = _own_type(spec, whole, entries[order[0].source].dtype, len(shape))
    return HeadTensor(name, _either(own, _type_for(name, shape, precision)), shape, [s for p in order for s in p.slices], 0.0,
                      side_by_side=columns)


def _named(p: HeadPart, n_trunk: int, spec: FamilySpec, dm: Mapping[str, int], precision: str, keep_fc: bool,
           src_config: Mapping[str, object], own: gguf.GGMLQuantizationType | None = None) -> HeadTensor:
    """A part llama.cpp keeps as one tensor, its rows reordered where the family's converter does."""
    name = gguf_name(p.source, n_trunk, spec)
    if name is None:
        raise RefusedError(f"source tensor {spec.head_prefix(src_config)}{p.source} has no llama.cpp name",
                           "report this with the source repo id")
    permute = qk_permutation(p.role, dm) if spec.gguf_permutes_qk and p.role is not None else None
    full = keep_fc and p.role == Role.FC and is_quantized(precision)
    t = _either(own, _type_for(name, p.shape, precision, p.role in spec.gguf_quantized_roles, full))
    sharded = spec.rank_sharded.get(p.role) if p.role is not None else None
    decoder = rank_sharded(tuple(dm[d] for d in sharded)) if sharded else None
    return HeadTensor(name, t, p.shape, list(p.slices), p.offset, permute, decoder=decoder)


def _split(p: HeadPart, n_trunk: int, spec: FamilySpec, dm: Mapping[str, int], precision: str) -> list[HeadTensor]:
    """The tensors the converter writes in place of a source tensor it splits (each the whole
    source tensor, transformed), [] for any other."""
    out = []
    for j, (name, part) in enumerate(split_names(p.source, n_trunk, spec)):
        assert p.role is not None
        shape = tuple(dm[s] for s in dict(SPLITS[p.role].parts)[part])
        out.append(HeadTensor(name, _type_for(name, shape, precision), shape, list(p.slices), 0.0,
                              split_part(p.role, j, dm), transform_unit=split_unit(p.role, dm)))
    return out


def encoded(w: np.ndarray, qtype: gguf.GGMLQuantizationType) -> memoryview:
    """``w`` in ggml type ``qtype``, as a buffer the writer takes without another copy."""
    return _bytes_of(gguf.quants.quantize(w, qtype))


def _bytes_of(a: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def tensor_chunks(t: HeadTensor, entries: Mapping[str, TensorInfo], read: Reader) -> Callable[[], Iterator[bytes]]:
    """The converted bytes of one tensor, one expert at a time: decoded (and refused when not
    finite) by ``headplan.decode``, as the MLX emitter's are."""

    if t.type == Q.MXFP4:
        return _mxfp4_chunks(t, entries, read)
    if t.side_by_side:
        return _side_by_side_chunks(t, entries, read)

    def convert(info: TensorInfo, raw: bytes, shape: tuple[int, ...], scale: np.ndarray | None) -> memoryview:
        if (t.type in FLOAT_TYPES or t.type in FP8_LOOKUPS) and t.decoder is None and not t.offset and t.transform is None:
            # a float type is a cast value by value, Q8_0 a lookup per group's largest code:
            # decoded straight into it (for a block-FP8 source, the same bits in one pass)
            return _bytes_of(decode(info, raw, shape, scale, encode=partial(gguf.quants.quantize, qtype=t.type),
                                    lookup=FP8_LOOKUPS.get(t.type)))
        w = (t.decoder or decode)(info, raw, shape, scale)
        if t.offset:
            w = np.asarray(add_offset(w, t.offset))
        if t.transform is not None:
            w = t.transform(w)
        return encoded(w, t.type)

    def read_convert(info: TensorInfo, a: int, b: int, shape: tuple[int, ...], scale: np.ndarray | None) -> memoryview:
        return convert(info, read(info, a, b), shape, scale)

    def jobs() -> Iterator[Callable[[], memoryview]]:
        for s in t.slices:
            info = entries[s.src]
            scale = read_scale(s.src, entries, read)
            # one row block at a time (headplan.row_blocks: the same bytes, a bounded float32
            # step) — of whole heads for a split; a q/k rope permutation or a decoder of its own
            # needs the whole matrix
            k = 1 if t.row_unit is None else row_blocks(s, info, t.row_unit)
            step = (s.end - s.start) // k
            shape = (s.shape[0] // k,) + tuple(s.shape[1:]) if k > 1 else s.shape
            for j in range(k):
                yield partial(read_convert, info, s.start + j * step, s.start + (j + 1) * step, shape,
                              block_scale(scale, j, k, s.shape))

    def gen() -> Iterator[memoryview]:
        # the row blocks are read and converted on every core, their bytes taken in order: a
        # download read back past the page cache (checkpoint.direct_read) has no read-ahead of the
        # kernel's, so the reads are what keeps the disk busy while the blocks before convert
        yield from in_order(jobs())

    return gen


def _mxfp4_chunks(t: HeadTensor, entries: Mapping[str, TensorInfo], read: Reader) -> Callable[[], Iterator[bytes]]:
    """An FP4 source's stack as ggml MXFP4, one expert at a time: its codes and E8M0 exponents
    moved, never dequantized (``passes/fp8.repack_mxfp4``), so the bytes are the converter's.
    An exponent byte 255 (E8M0's NaN) is refused as a non-finite value would be."""

    def gen() -> Iterator[bytes]:
        for s in t.slices:
            info = entries[s.src]
            skey = scale_of(s.src, entries)
            if skey is None:
                raise RefusedError(f"source tensor {info.name} is FP4 without its exponents (.scale)",
                                   "pass the original checkpoint as --source")
            sinfo = entries[skey]
            packed = np.frombuffer(read(info, s.start, s.end), np.uint8).reshape(s.shape)
            exps = np.frombuffer(read(sinfo, 0, sinfo.nbytes), np.uint8).reshape(sinfo.shape)
            if (exps == E8M0_NAN).any():
                raise RefusedError(f"the source's MTP tensor {info.name} holds NaN scales, so the source checkpoint is "
                                   "damaged; nothing was changed",
                                   "re-download the source checkpoint (or pass an undamaged copy as --source)",
                                   code="SOURCE_NONFINITE")
            yield repack_mxfp4(packed, exps).tobytes()

    return gen


def _side_by_side_chunks(t: HeadTensor, entries: Mapping[str, TensorInfo], read: Reader) -> Callable[[], Iterator[bytes]]:
    """Parts joined column-wise (``FamilySpec.gguf_fused_columns``), one row block at a time:
    block j of every part decoded, laid side by side, converted (rows are independent, so the
    blocks' bytes are the whole tensor's)."""

    def gen() -> Iterator[bytes]:
        first = t.slices[0]
        k = row_blocks(first, entries[first.src])
        if any(s.shape[0] != first.shape[0] or row_blocks(s, entries[s.src]) != k for s in t.slices):
            k = 1
        scales = [read_scale(s.src, entries, read) for s in t.slices]
        for j in range(k):
            blocks = []
            for s, scale in zip(t.slices, scales):
                info, step = entries[s.src], (s.end - s.start) // k
                shape = (s.shape[0] // k, *s.shape[1:])
                blocks.append(np.asarray(decode(info, read(info, s.start + j * step, s.start + (j + 1) * step), shape,
                                              block_scale(scale, j, k, s.shape))))
            w = np.concatenate(blocks, axis=1)
            del blocks
            yield encoded(w, t.type)

    return gen


__all__ = ["HeadTensor", "plan_head", "tensor_chunks", "parse_precision", "PRECISIONS", "DEFAULT_PRECISION", "FILE_TYPES"]
