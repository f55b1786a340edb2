"""The source's MTP head as llama.cpp tensors: plan (names, ggml types, shapes, source slices),
then convert one tensor — one expert — at a time.

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
from typing import Callable, Iterator, Mapping

import gguf
import mlx.core as mx
import numpy as np

from ..checkpoint.safetensors_header import TensorInfo
from ..checkpoint.tensors import to_mx
from ..errors import InputError, RefusedError
from ..families.spec import FUSED_PARTS, FamilySpec, Role
from ..families.tables import dims, family_spec
from ..passes.experts import parse_expert_key
from ..passes.fp8 import dequantize_block_fp8
from ..passes.mla import SPLITS, split_part
from ..passes.norms import add_offset
from ..passes.rope import qk_permutation
from ..plan import SliceRef, source_expert_slices
from .names import expert_name, gguf_name, keeps_f32, split_names

Q = gguf.GGMLQuantizationType

#: --precision values -> ggml type of the head's matrices (norms and routers stay F32)
PRECISIONS: dict[str, gguf.GGMLQuantizationType] = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0}
#: measured on the trained tiny models (README, "llama.cpp"): an f16 head drafts as well as the
#: f32 one on every trunk quantization, q8_0 loses a little on the Q4_K_M trunks
DEFAULT_PRECISION = "f16"
#: llama.cpp's file-type code for an MTP-only file of each precision (``general.file_type``)
FILE_TYPES: dict[str, int] = {
    "f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
    "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}

#: read(info, start, end) -> bytes within one source tensor
Reader = Callable[[TensorInfo, int, int], bytes]


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

    @property
    def nbytes(self) -> int:
        rows = 1
        for d in self.shape[:-1]:
            rows *= d
        bs, ts = gguf.GGML_QUANT_SIZES[self.type]
        return rows * (self.shape[-1] // bs) * ts


def parse_precision(p: str | None) -> str:
    v = (p or DEFAULT_PRECISION).strip().lower().replace("-", "_")
    v = {"float32": "f32", "float16": "f16", "fp16": "f16", "bfloat16": "bf16", "q8": "q8_0"}.get(v, v)
    if v not in PRECISIONS:
        raise InputError(f"--precision for a GGUF must be one of {', '.join(PRECISIONS)}, not {p!r}",
                         f"e.g. --precision {DEFAULT_PRECISION}")
    return v


def _type_for(name: str, shape: tuple[int, ...], precision: str, quantized: bool = False) -> gguf.GGMLQuantizationType:
    """The tensor's ggml type: F32 where the converter keeps it so (unless the family's converter
    quantizes that matrix anyway: ``quantized``), else the precision's."""
    if keeps_f32(name, len(shape)) and not (quantized and len(shape) > 1):
        return Q.F32
    t = PRECISIONS[precision]
    bs, _ = gguf.GGML_QUANT_SIZES[t]
    # the converter's fallback when rows do not split into blocks
    return t if shape[-1] % bs == 0 else Q.F16


def plan_head(entries: Mapping[str, TensorInfo], src_config: Mapping[str, object], n_trunk: int,
              precision: str, src_fmt: str) -> list[HeadTensor]:
    """Every llama.cpp tensor of the head, in a stable order."""
    out: list[HeadTensor] = []
    stacks: set[tuple[int, Role]] = set()
    dm = dims(src_config)
    E = dm["E"]
    spec = family_spec(src_config)
    for bare in sorted(entries):
        if bare.endswith("_scale_inv"):
            continue
        parsed = parse_expert_key(bare, spec)
        if parsed is not None:
            _, layer, _, role, _ = parsed
            for part in FUSED_PARTS.get(role, (role,)):
                if (layer, part) in stacks:
                    continue
                stacks.add((layer, part))
                sl = source_expert_slices(part, layer, src_fmt, entries, E, spec)
                name = expert_name(part, layer, n_trunk)
                shape = (E,) + tuple(sl[0].shape)
                out.append(HeadTensor(name, _type_for(name, shape, precision), shape, sl, 0.0))
            continue
        info = entries[bare]
        whole = [SliceRef(bare, 0, info.nbytes, tuple(info.shape))]
        parts = _split(bare, whole, n_trunk, spec, dm, precision)
        if parts:
            out += parts
            continue
        name = gguf_name(bare, n_trunk, spec)
        if name is None:
            raise RefusedError(f"source tensor {spec.head_prefix(src_config)}{bare} has no llama.cpp name",
                               "report this with the source repo id")
        permute = qk_permutation(spec.role_of(bare), dm) if spec.gguf_permutes_qk else None
        quantized = spec.role_of(bare) in spec.gguf_quantized_roles
        out.append(HeadTensor(name, _type_for(name, tuple(info.shape), precision, quantized), tuple(info.shape), whole,
                              spec.offset_of(bare), permute))
    return sorted(out, key=lambda t: t.name)


def _split(bare: str, whole: list[SliceRef], n_trunk: int, spec: FamilySpec, dm: Mapping[str, int],
           precision: str) -> list[HeadTensor]:
    """The tensors the converter writes in place of a source tensor it splits (each the whole
    source tensor, transformed), [] for any other."""
    out = []
    for j, (name, part) in enumerate(split_names(bare, n_trunk, spec)):
        role = spec.role_of(bare)
        assert role is not None
        shape = tuple(dm[s] for s in dict(SPLITS[role].parts)[part])
        out.append(HeadTensor(name, _type_for(name, shape, precision), shape, whole, 0.0, split_part(role, j, dm)))
    return out


def _decode(info: TensorInfo, raw: bytes, shape: tuple[int, ...], scale: bytes | None, scale_info: TensorInfo | None) -> np.ndarray:
    if info.dtype == "BF16":
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32).reshape(shape)
    if info.dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(shape)
    if info.dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").reshape(shape).copy()
    if info.dtype == "F8_E4M3" and scale is not None and scale_info is not None:
        w = to_mx(TensorInfo(info.name, info.file, info.dtype, shape, 0, 0), raw)
        s = to_mx(scale_info, scale)
        return np.array(dequantize_block_fp8(w, s).astype(mx.float32))
    raise RefusedError(f"source tensor {info.name} is {info.dtype}, which mtpforge cannot convert for llama.cpp",
                       "use the bf16 release of the model as --source")


def tensor_chunks(t: HeadTensor, entries: Mapping[str, TensorInfo], read: Reader) -> Callable[[], Iterator[bytes]]:
    """The converted bytes of one tensor, one expert at a time."""

    def gen() -> Iterator[bytes]:
        for s in t.slices:
            info = entries[s.src]
            raw = read(info, s.start, s.end)
            sc = entries.get(f"{s.src}_scale_inv")
            w = _decode(info, raw, s.shape, read(sc, 0, sc.nbytes) if sc else None, sc)
            if t.offset:
                w = np.asarray(add_offset(mx.array(w), t.offset))
            if t.transform is not None:
                w = t.transform(w)
            yield np.ascontiguousarray(gguf.quants.quantize(w, t.type)).tobytes()

    return gen


__all__ = ["HeadTensor", "plan_head", "tensor_chunks", "parse_precision", "PRECISIONS", "DEFAULT_PRECISION", "FILE_TYPES"]
