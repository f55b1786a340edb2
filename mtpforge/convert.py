"""Execute a plan: stream source slices through the passes into one safetensors file.

Per slice: decode -> float32 -> (FP8 dequantize) -> (+1 on the seven norm kinds: the source is
raw Hugging Face, decided by provenance) -> quantize or cast -> bytes at their planned offset.
Only one slice is alive at a time.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable, Mapping

import mlx.core as mx

from .checkpoint.safetensors_header import TensorInfo
from .checkpoint.tensors import to_bytes, to_mx
from .passes.fp8 import dequantize_block_fp8
from .passes.norms import NORM_OFFSET
from .passes.quantize import cast, quantize
from .plan import OutModule, Plan
from .writer.safetensors_stream import SafetensorsWriter

#: read(info, start, end) -> bytes within one source tensor
Reader = Callable[[TensorInfo, int, int], bytes]


def _slice_info(info: TensorInfo, shape: tuple[int, ...], dtype: str | None = None) -> TensorInfo:
    return TensorInfo(info.name, info.file, dtype or info.dtype, tuple(shape), 0, 0)


def transform_slice(
    m: OutModule, raw: bytes, info: TensorInfo, shape: tuple[int, ...], scale: mx.array | None
) -> dict[str, bytes]:
    """The pure part: one slice's source bytes -> output bytes per suffix."""
    w = to_mx(_slice_info(info, shape), raw)
    if info.dtype == "F8_E4M3":
        assert scale is not None
        w = dequantize_block_fp8(w, scale)
    w = w.astype(mx.float32)
    if m.norm:
        w = w + NORM_OFFSET
    if m.q is None:
        return {"": to_bytes(cast(w, m.float_dtype))}
    return {sfx: to_bytes(a) for sfx, a in quantize(w, m.q, m.float_dtype).items()}


def write_plan(
    plan: Plan, path: Path, entries: Mapping[str, TensorInfo], read: Reader,
    metadata: dict[str, str] | None = None, on_progress: Callable[[int], None] | None = None,
) -> None:
    """Write the plan's head into a new file at ``path``."""
    specs = plan.specs()
    with SafetensorsWriter(path, specs, metadata or {"format": "mlx"}) as w:
        for m in plan.modules:
            names = {s.key[len(plan.prefix + m.bare):] or "": s.key for s in m.specs(plan.prefix)}
            n = len(m.slices)
            for e, sl in enumerate(m.slices):
                info = entries[sl.src]
                raw = read(info, sl.start, sl.end)
                scale = None
                if info.dtype == "F8_E4M3":
                    sinfo = entries[f"{sl.src}_scale_inv"]
                    scale = to_mx(sinfo, read(sinfo, 0, sinfo.nbytes))
                out = transform_slice(m, raw, info, sl.shape, scale)
                for sfx, data in out.items():
                    key = names[sfx] if sfx else names.get(".weight", names.get("", next(iter(names.values()))))
                    w.write(key, data, e, n)
                if on_progress:
                    on_progress(sl.end - sl.start)


def tensor_digests(path: Path, keys: Mapping[str, TensorInfo]) -> dict[str, str]:
    """sha256 of every tensor's bytes in a written file (re-read, streaming)."""
    out = {}
    with open(path, "rb") as f:
        for k, info in keys.items():
            f.seek(info.begin)
            h = hashlib.sha256()
            left = info.nbytes
            while left:
                chunk = f.read(min(left, 1 << 24))
                if not chunk:
                    raise OSError(f"{path} is shorter than its header says")
                h.update(chunk)
                left -= len(chunk)
            out[k] = h.hexdigest()
    return out
