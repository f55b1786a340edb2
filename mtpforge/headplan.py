"""The head to write, in no output format's terms: one plan, two emitters.

Whatever the target (an MLX folder or a llama.cpp GGUF trunk), add-mtp writes the same thing:
the source's MTP tensors, each read as byte slices of the source (one, or E stacked expert by
expert), decoded to float32 (block-FP8 dequantized), refused when not finite, with the norm
offset added. This module holds that part once — the tensors (``head_parts``), the MTP layer
count, the fit check, the fetch list, the peak estimate, the decoding and the finiteness
refusal. ``plan.py`` (MLX layouts) and ``gguf/head.py`` (llama.cpp) only name, stack, encode
and write what it plans, so a check added here holds for both formats.
"""

from __future__ import annotations

import heapq
import math

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

import numpy as np

from .checkpoint.safetensors_header import TensorInfo
from .checkpoint.tensors import to_float32
from .errors import InputError, RefusedError
from .families.spec import FamilySpec, Role
from .families.tables import declared_mtp_layers, mtp_layers_of
from .passes.experts import FUSED_OF, expert_span, parse_expert_key, stack_roles
from .passes.fp8 import BLOCK as FP8_BLOCK
from .passes.fp8 import TP_RANKS, dequantize_block_fp8, dequantize_by_rank, e8m0_to_float, encode_block_fp8, rank_count

#: read(info, start, end) -> bytes within one source tensor (both emitters read the source so)
Reader = Callable[[TensorInfo, int, int], bytes]

#: the suffix a block-FP8 weight's scale tensor carries (DeepSeek-V3, Qwen: F32 ``weight_scale_inv``)
SCALE_SUFFIX = "_scale_inv"


def scale_key(key: str) -> tuple[str, str]:
    """The names a block-scaled weight's scale may have: ``<key>_scale_inv`` (F32 scales) and,
    DeepSeek-V4's spelling, the module's ``.scale`` (``<module>.weight`` -> ``<module>.scale``,
    E8M0 exponents)."""
    return key + SCALE_SUFFIX, key.removesuffix(".weight") + ".scale"


def scale_of(key: str, entries: Mapping[str, TensorInfo]) -> Optional[str]:
    """The scale tensor of a block-scaled source weight, if the source has one."""
    return next((k for k in scale_key(key) if k != key and k in entries), None)


def is_scale(key: str, entries: Mapping[str, TensorInfo]) -> bool:
    """A block scale of another source tensor (read with its weight, never a head tensor itself)."""
    if key.endswith(SCALE_SUFFIX):
        return True
    return key.endswith(".scale") and key.removesuffix(".scale") + ".weight" in entries


@dataclass(frozen=True)
class SliceRef:
    """A contiguous byte range [start, end) inside one source tensor, with its 2-D shape."""

    src: str  # bare source key
    start: int
    end: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class HeadPart:
    """One tensor of the head as the source holds it: what it is (role, MTP step), where its
    bytes are (slices: one, or one per expert when ``stacked``) and the offset its norm pass
    adds. An emitter gives it a name and an encoding."""

    source: str  # the bare source key (a stack: the key of its first expert's tensor)
    role: Optional[Role]
    step: int  # the MTP layer it belongs to
    shape: tuple[int, ...]  # the whole tensor's (a stack: (E, ...))
    slices: tuple[SliceRef, ...]
    stacked: bool  # built here from E source slices (the output stacks experts on axis 0)
    offset: float  # what the norm pass adds (the family's offset_of: 0 but for zero-centred norms)
    norm: bool


def mtp_layer_count(config: Mapping[str, Any], family: str, keys: Iterable[str]) -> int:
    """The MTP layers of a source: what its config declares, else what its tensors hold."""
    return declared_mtp_layers(config, family) or (1 + max(mtp_layers_of(keys, family), default=0))


def source_expert_slices(
    role: Role, i: int, src_fmt: str, entries: Mapping[str, TensorInfo], E: int, spec: FamilySpec
) -> list[SliceRef]:
    """Byte slices of the source that make up MTP layer ``i``'s stack of ``role``, expert by
    expert."""
    out = []
    for e in range(E):
        key = spec.key(role, i, e, src_fmt) if src_fmt == "per-expert" else spec.key(FUSED_OF[role], i, fmt=src_fmt)
        info = entries[key]
        start, end, shape = expert_span(src_fmt, role, e, E, info.shape, info.nbytes)
        out.append(SliceRef(key, start, end, shape))
    return out


def head_parts(spec: FamilySpec, entries: Mapping[str, TensorInfo], E: int, src_fmt: str, *, stack: bool,
               skip_roles: Iterable[Role] = ()) -> list[HeadPart]:
    """Every tensor of the head, in source-key order: a stack per MTP layer and expert role
    when ``stack`` (gate, up, down as ``stack_roles`` orders them, at the layer's first expert
    key), else one part per source tensor (a fused stack kept whole: one slice per expert)."""
    parts: list[HeadPart] = []
    skip = frozenset(skip_roles)
    stacked_layers: set[int] = set()
    for bare in sorted(entries):
        if is_scale(bare, entries) or spec.role_of(bare) in skip:
            continue
        info = entries[bare]
        parsed = parse_expert_key(bare, spec)
        if parsed is not None and stack:
            i = parsed[1]
            if i not in stacked_layers:
                stacked_layers.add(i)
                parts += [_stack(spec, role, i, src_fmt, entries, E) for role in stack_roles(spec)]
            continue
        if parsed is not None and parsed[2] is None:  # a fused stack kept as is
            per = info.nbytes // info.shape[0]
            sl = tuple(SliceRef(bare, e * per, (e + 1) * per, tuple(info.shape[1:])) for e in range(info.shape[0]))
        else:
            sl = (SliceRef(bare, 0, info.nbytes, tuple(info.shape)),)
        hit = spec.match(bare)
        parts.append(HeadPart(bare, spec.role_of(bare), (hit[2] or 0) if hit else 0, tuple(info.shape), sl, False,
                              spec.offset_of(bare), spec.is_norm_key(bare)))
    return parts


def _stack(spec: FamilySpec, role: Role, i: int, src_fmt: str, entries: Mapping[str, TensorInfo], E: int) -> HeadPart:
    sl = tuple(source_expert_slices(role, i, src_fmt, entries, E, spec))
    return HeadPart(sl[0].src, role, i, (E,) + tuple(sl[0].shape), sl, True, 0.0, False)


#: the dimensions a head must share with the model it is grafted onto (each checked where both
#: sides state it: two configs state them all, a GGUF trunk what its metadata holds), and how a
#: refusal names each
FIT_DIMS: Mapping[str, str] = {
    "layers": "layer count", "H": "hidden size", "NH": "attention heads", "KV": "kv heads", "D": "head dim",
    "QD": "attention heads x head_dim", "KD": "kv heads x head_dim", "I": "intermediate size", "E": "expert count",
    "IM": "expert intermediate size", "IS": "shared expert size", "V": "vocabulary size", "RQ": "query rank",
    "RKV": "key/value rank", "ROPE": "rope dimensions", "QKD": "query/key head dim", "VD": "value head dim",
    "L": "latent size", "IN": "indexer heads", "ID": "indexer head dim",
}


def refuse_misfit(source: Mapping[str, Optional[int]], target: Mapping[str, Optional[int]], what: str = "target") -> None:
    """Refuse a head of another model size before anything is downloaded: the first dimension
    of ``FIT_DIMS`` both sides state and disagree on."""
    for sym, label in FIT_DIMS.items():
        a, b = source.get(sym), target.get(sym)
        if a is not None and b is not None and int(a) != int(b):
            raise RefusedError(f"{what} and source differ in {label} ({b} vs {a}): the head would not fit",
                               "pass the original checkpoint of the same model size as --source")


def fetch_list(slices: Iterable[SliceRef], entries: Mapping[str, TensorInfo]) -> list[TensorInfo]:
    """Every source tensor the slices read, each block scale just before its tensor, in the
    order the slices come (the conversion's: ``--fetch stream`` downloads in this order)."""
    keys: dict[str, None] = {}
    for s in slices:
        if (sk := scale_of(s.src, entries)) is not None:
            keys.setdefault(sk)
        keys.setdefault(s.src)
    return [entries[k] for k in keys]


#: conversion steps held at once: writer.ahead's most threads (4) and the step the writer waits on
STEPS_AT_ONCE = 5
#: float32-sized buffers one step holds at its peak: the decoded values, a transient, the output
STEP_COPIES = 3


def step_bytes(s: SliceRef, info: TensorInfo, unit: int | None = 1) -> int:
    """float32 bytes of the largest conversion step of slice ``s``: one row block of whole
    ``unit``s (``row_blocks``), or the whole slice where its conversion needs it (``unit`` None:
    a rope permutation, a decoder of its own)."""
    n = math.prod(s.shape)
    return n // (1 if unit is None else row_blocks(s, info, unit)) * 4


def peak_memory_estimate(steps: Iterable[int], overhead: int = 0) -> int:
    """The conversion's memory at its largest: the ``STEPS_AT_ONCE`` largest steps
    (``step_bytes``), ``STEP_COPIES`` buffers each. Row blocks bound a step, so a giant head's
    estimate is flat in its size as its measured peak is (docs/PERFORMANCE.md)."""
    return STEP_COPIES * sum(heapq.nlargest(STEPS_AT_ONCE, steps)) + overhead


def decode(info: TensorInfo, raw: bytes, shape: tuple[int, ...], scale: np.ndarray | None, *,
           check: bool = True, encode: Callable[[np.ndarray], np.ndarray] | None = None,
           lookup: Callable[[np.ndarray, np.ndarray], np.ndarray | None] | None = None) -> np.ndarray:
    """One slice (or row block) of a source tensor as float32, block-FP8 dequantized — refused
    when it holds NaN or Inf (``check``): quantization or a cast would launder them into
    finite-looking bytes, so every tensor either format writes passes here. numpy throughout: a
    lazy framework graph evaluated for the check alone cost most of a giant head's conversion.

    ``encode``, a cast applied value by value (the writer's float encoding), returns the encoded
    values instead: a block-FP8 source then goes through ``encode_block_fp8``'s lookup, the
    same bits in a fraction of the time (a giant head's conversion was mostly that cast).
    ``lookup`` is that shortcut for an ``encode`` that is not value by value (ggml's Q8_0 groups:
    ``passes.fp8.q8_0_block_fp8``), the same bits as ``encode`` of the decoded values, or None
    where it declines."""
    if info.dtype == "F8_E4M3":
        if scale is None:
            raise RefusedError(f"source tensor {info.name} is FP8 without a block scale (weight_scale_inv)",
                               "use the bf16 release of the model as --source")
        codes = np.frombuffer(raw, np.uint8).reshape(shape)
        looked_up = lookup(codes, scale) if lookup else encode_block_fp8(codes, scale, encode or _as_float32)
        if looked_up is not None:
            return looked_up
        w = dequantize_block_fp8(codes, scale)
    else:
        w = to_float32(TensorInfo(info.name, info.file, info.dtype, tuple(shape), 0, 0), raw)
    if check:
        refuse_nonfinite(info.name, w)
    return w if encode is None else encode(w)


def _as_float32(w: np.ndarray) -> np.ndarray:
    return w


def rank_sharded(parts: tuple[int, ...]) -> Callable[..., np.ndarray]:
    """``decode`` for a tensor whose block-FP8 release lies rank by rank (``FamilySpec.rank_sharded``:
    ``parts`` are its parts' rows): unsharded as llama.cpp's converter unshards it. A float source
    stores the parts in order already and is decoded as it is."""

    def dec(info: TensorInfo, raw: bytes, shape: tuple[int, ...], scale: np.ndarray | None, *,
            check: bool = True) -> np.ndarray:
        if info.dtype != "F8_E4M3" or scale is None:
            return decode(info, raw, shape, scale, check=check)
        ranks = rank_count(shape[0], scale.shape[0])
        if ranks is None:
            raise RefusedError(f"source tensor {info.name} has {scale.shape[0]} rows of block scales for {shape[0]} rows, "
                               f"which fit no layout over {' or '.join(map(str, TP_RANKS))} tensor-parallel ranks",
                               "pass the original release as --source")
        w = dequantize_by_rank(np.frombuffer(raw, np.uint8).reshape(shape), scale, parts, ranks)
        if check:
            refuse_nonfinite(info.name, w)
        return w

    return dec


def refuse_nonfinite(name: str, w: np.ndarray) -> None:
    """The one finiteness check of a head's values, whatever format and encoding follows."""
    if not np.isfinite(w).all():
        raise RefusedError(f"the source's MTP tensor {name} holds NaN or Inf values, so the source checkpoint is damaged; "
                           "nothing was changed",
                           "re-download the source checkpoint (or pass an undamaged copy as --source)", code="SOURCE_NONFINITE")


def read_scale(src: str, entries: Mapping[str, TensorInfo], read: Callable[[TensorInfo, int, int], bytes]) -> np.ndarray | None:
    """The block scale of a block-FP8 source tensor as float32 (None for a float one): F32 as
    stored, or E8M0 exponents (DeepSeek-V4's ue8m0 scales) as the exact powers of two they name."""
    key = scale_of(src, entries)
    if entries[src].dtype != "F8_E4M3" or key is None:
        return None
    sinfo = entries[key]
    raw = read(sinfo, 0, sinfo.nbytes)
    if sinfo.dtype == "F8_E8M0":
        return e8m0_to_float(np.frombuffer(raw, np.uint8).reshape(sinfo.shape))
    return to_float32(sinfo, raw)


#: Source bytes converted per step. A large 2-D slice (q_proj of a 2048-wide head is 32 MiB in
#: bf16, ~200 MiB through decode/float32/cast/bytes; DeepSeek-V3's FP8 ``o_proj`` is 117 MB, ~1.9 GB
#: through from_fp8/scale/product/float32) is split into equal row blocks: casting and quantizing
#: are row-wise (groups run along the last axis), so the bytes are identical.
BLOCK_BYTES = 4 << 20


def row_blocks(s: SliceRef, info: TensorInfo, unit: int = 1) -> int:
    """Equal row blocks of slice ``s`` (a divisor of its row count), each at most BLOCK_BYTES of
    float32 work per source byte as a bf16 source has it, and each of whole ``unit``s of rows (a
    transform's: the heads a split acts on one by one). A block-FP8 slice is split only when it
    is its whole tensor and each block holds whole 128-row scale blocks (``block_scale``)."""
    nbytes, shape = s.end - s.start, s.shape
    fp8 = info.dtype == "F8_E4M3"
    if fp8:
        nbytes *= 2  # one byte per value, where bf16 has two: the same float32 work per block
    if len(shape) < 2 or nbytes <= BLOCK_BYTES:
        return 1
    if fp8 and (s.start != 0 or s.end != info.nbytes or tuple(shape) != tuple(info.shape)):
        return 1
    rows, step = shape[0], math.lcm(FP8_BLOCK if fp8 else 1, unit)
    if rows % step:
        return 1
    for k in range(2, rows // step + 1):
        if rows % k == 0 and nbytes // k <= BLOCK_BYTES and (rows // k) % step == 0:
            return k
    return rows // step


def block_scale(scale: np.ndarray | None, j: int, k: int, shape: tuple[int, ...]) -> np.ndarray | None:
    """The rows of a block-FP8 scale that row block ``j`` of ``k`` (``row_blocks``) is scaled by."""
    if scale is None or k == 1:
        return scale
    r = shape[0] // k // FP8_BLOCK
    return scale[j * r:(j + 1) * r]


#: every spelling of a float precision -> the name each output format uses for it
_FLOATS = {"bf16": "bf16", "bfloat16": "bf16", "float16": "float16", "fp16": "float16", "f16": "float16",
           "float32": "f32", "fp32": "f32", "f32": "f32", "q8_0": "q8_0", "q8": "q8_0"}
#: the precisions of a GGUF head (ggml types: norms and routers stay F32)
GGUF_PRECISIONS = ("f32", "f16", "bf16", "q8_0")
#: what a GGUF head is written in when no --precision is given (README, "llama.cpp": an f16 head
#: drafts as well as an f32 one on every trunk quantization)
GGUF_DEFAULT_PRECISION = "f16"


#: acceptance against head precision per head shape, measured on the trained tiny models
#: (scripts/measure_precision.py writes it; docs/PRECISION.md)
PRECISION_TABLE = "head_precision.json"


#: a head this large at its default precision gets a note on a smaller one (a giant MoE head is
#: 10-25 GB at f16 / bf16, held in memory beside the model)
LARGE_HEAD = 2 << 30


def _precision_row(family: str) -> tuple[str, dict[str, Any]] | tuple[None, None]:
    """The measured row of the family's head shape (docs/PRECISION.md), if there is one."""
    import json
    from importlib import resources

    path = resources.files("mtpforge").joinpath("data", PRECISION_TABLE)
    if not path.is_file():
        return None, None
    table = json.loads(path.read_text(encoding="utf-8"))
    return next(((k, r) for k, r in table["shapes"].items() if family in r["families"]), (None, None))


def measured_at(family: str, bits: int) -> Optional[str]:
    """What the trained tiny head of the family's shape drafted at ``bits`` against bf16 in MLX,
    in words; None where that shape or width was not measured."""
    return _measured(*_precision_row(family), bits)


def _measured(shape: str | None, row: dict[str, Any] | None, bits: int) -> Optional[str]:
    mlx = row["mlx"] if row is not None else {}
    if str(bits) not in mlx:
        return None
    return f"{shape} heads measured {mlx[str(bits)]['acceptance']:.1%} at {bits}-bit against {mlx['bf16']['acceptance']:.1%} as bf16"


def precision_note(family: str, precision: str | int | None, matched_bits: int | None = None) -> Optional[str]:
    """A note when the head gets fewer bits than the measured knee of the family's head shape:
    asked for (``--precision BITS``), or by default, matching a target quantized below the knee
    (``matched_bits``: the common 4-bit folder, where the dense and MoE heads measured 3-7 points
    under a full one). None: no bits, the family's shape unmeasured, or at or above the knee."""
    matched = not isinstance(precision, int) and matched_bits is not None
    if matched:
        precision = matched_bits
    if not isinstance(precision, int):
        return None
    shape, row = _precision_row(family)
    if row is None or row["knee_bits"] is None or precision >= row["knee_bits"]:
        return None
    mlx = row["mlx"]
    at = f", {mlx[str(precision)]['acceptance']:.1%} at {precision}-bit" if str(precision) in mlx else ""
    if matched:  # the default path: short, it is what most users see
        measured = _measured(shape, row, precision)  # the row read above, not the table again
        return (f"the head matches the target's {precision} bits; {measured} (docs/PRECISION.md): "
                f"pass --precision {row['knee_bits']} or more to keep the drafts") if measured else None
    what = f"--precision {precision} is"
    return (f"{what} below the measured knee of this head's shape ({shape}: {row['knee_bits']}-bit): "
            f"on the trained tiny model of that shape acceptance was {mlx['bf16']['acceptance']:.1%} with a bf16 head{at} "
            f"(docs/PRECISION.md); pass --precision {row['knee_bits']} or more to keep the drafts")


def parse_precision(precision: str | int | None, *, gguf: bool = False) -> str | int:
    """``--precision`` for either format, from any spelling: an MLX head's ``match``, ``bf16``,
    ``float16`` or bits; a GGUF head's ggml type (None: its default)."""
    p = str(GGUF_DEFAULT_PRECISION if precision is None and gguf else precision).strip().lower().replace("-", "_")
    if gguf:
        v = {"float16": "f16"}.get(_FLOATS.get(p, p), _FLOATS.get(p, p))
        if v not in GGUF_PRECISIONS:
            raise InputError(f"--precision for a GGUF must be one of {', '.join(GGUF_PRECISIONS)}, not {precision!r}",
                             f"e.g. --precision {GGUF_DEFAULT_PRECISION}")
        return v
    if p == "match" or _FLOATS.get(p) in ("bf16", "float16"):
        return p if p == "match" else _FLOATS[p]
    if p.isascii() and p.isdigit():  # "²".isdigit() is true, int("²") is not
        return int(p)
    raise InputError(f"--precision must be match, bf16, float16 or a number of bits, not {precision!r}", "e.g. --precision 4")


__all__ = ["is_scale", "scale_of", "FIT_DIMS", "HeadPart", "SliceRef", "decode", "fetch_list", "head_parts", "mtp_layer_count",
           "parse_precision", "precision_note", "peak_memory_estimate", "step_bytes", "read_scale", "refuse_misfit", "refuse_nonfinite", "source_expert_slices"]
