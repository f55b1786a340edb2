"""Casting and quantization with MLX semantics (``.weight`` / ``.scales`` / ``.biases``).

Quantization is row-group-wise along the last axis, so quantizing one expert's slice gives
exactly the bytes of that slice in the quantized stack: the writer quantizes expert by expert.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

FLOAT_DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}
AFFINE_BITS = (2, 3, 4, 5, 6, 8)
#: (bits, group_size) that each non-affine mode supports
FIXED_MODES = {"mxfp4": (4, 32), "nvfp4": (4, 16), "mxfp8": (8, 32)}


@dataclass(frozen=True)
class QSpec:
    """How one module is quantized."""

    bits: int
    group_size: int
    mode: str = "affine"

    def as_config(self) -> dict[str, object]:
        d: dict[str, object] = {"group_size": self.group_size, "bits": self.bits}
        if self.mode != "affine":
            d["mode"] = self.mode
        return d


def check_qspec(q: QSpec) -> None:
    if q.mode == "affine":
        if q.bits not in AFFINE_BITS or q.group_size not in (32, 64, 128):
            raise ValueError(f"affine quantization supports bits {AFFINE_BITS} and groups 32/64/128, not {q.bits}/{q.group_size}")
    elif FIXED_MODES.get(q.mode) != (q.bits, q.group_size):
        raise ValueError(f"{q.mode} quantization is {FIXED_MODES.get(q.mode)} (bits, group), not {(q.bits, q.group_size)}")


def quantizable(shape: tuple[int, ...], q: QSpec) -> bool:
    """mx.quantize rejects 1-D tensors and last dimensions not divisible by the group size."""
    return len(shape) >= 2 and shape[-1] % q.group_size == 0


def quantized_shapes(shape: tuple[int, ...], q: QSpec, float_dtype: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """suffix -> (shape, safetensors dtype) of the triplet a quantized module stores."""
    lead, n = tuple(shape[:-1]), shape[-1]
    out = {".weight": (lead + (n * q.bits // 32,), "U32")}
    if q.mode == "affine":
        sdt = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[float_dtype]
        out[".scales"] = (lead + (n // q.group_size,), sdt)
        out[".biases"] = (lead + (n // q.group_size,), sdt)
    else:
        out[".scales"] = (lead + (n // q.group_size,), "U8")
    return out


def quantize(w: mx.array, q: QSpec, float_dtype: str) -> dict[str, mx.array]:
    """Quantize from float32 (the source rounded once) and store scales in ``float_dtype``."""
    parts = mx.quantize(w.astype(mx.float32), group_size=q.group_size, bits=q.bits, mode=q.mode)
    out = {".weight": parts[0]}
    if q.mode == "affine":
        dt = FLOAT_DTYPES[float_dtype]
        out[".scales"] = parts[1].astype(dt)
        out[".biases"] = parts[2].astype(dt)
    else:
        out[".scales"] = parts[1]
    return out


def dequantize(parts: dict[str, mx.array], q: QSpec) -> mx.array:
    return mx.dequantize(
        parts[".weight"], parts[".scales"], parts.get(".biases"), group_size=q.group_size, bits=q.bits, mode=q.mode
    )


def cast(w: mx.array, float_dtype: str) -> mx.array:
    return w.astype(FLOAT_DTYPES[float_dtype])


def cast_float32(w32: np.ndarray, float_dtype: str) -> np.ndarray:
    """A finite float32 array rounded to ``float_dtype`` (round to nearest, ties to even, as
    MLX's cast: the same bits), in numpy so that row blocks cast on every core at once. bf16 has
    no numpy dtype: its bits come back as uint16, from the float32 bits with the rounding bias
    added (``w32`` must be finite: ``headplan.decode`` refused anything else)."""
    if float_dtype == "float32":
        return np.ascontiguousarray(w32, np.float32)
    if float_dtype == "float16":
        return w32.astype(np.float16)
    u = np.ascontiguousarray(w32, np.float32).view(np.uint32)
    t = u >> 16
    t &= 1
    t += 0x7FFF
    t += u
    t >>= 16
    return t.astype(np.uint16)
