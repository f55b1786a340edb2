"""Raw safetensors bytes -> arrays, without going through a framework's file loader.

Bytes arrive from anywhere (a range request, a cache file, a local shard), so decoding is a
pure function of (TensorInfo, bytes). bf16 has no numpy dtype: it travels as uint16 and is
reinterpreted by mlx.
"""

from __future__ import annotations

import numpy as np
import mlx.core as mx

from ..errors import RefusedError
from .safetensors_header import TensorInfo

_NP = {
    "F32": np.float32, "F16": np.float16, "F64": np.float64,
    "U32": np.uint32, "I32": np.int32, "U16": np.uint16, "I16": np.int16,
    "U8": np.uint8, "I8": np.int8, "I64": np.int64, "U64": np.uint64, "BOOL": np.bool_,
    # FP8 stays raw bytes here; passes/fp8.py dequantizes it with its scales.
    "F8_E4M3": np.uint8, "F8_E5M2": np.uint8, "F8_E8M0": np.uint8,
}

#: mlx dtype -> safetensors dtype name
MX_TO_ST = {
    mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16", mx.uint32: "U32",
    mx.int32: "I32", mx.uint8: "U8", mx.int8: "I8", mx.uint16: "U16", mx.int16: "I16",
}


def to_mx(info: TensorInfo, raw: bytes) -> mx.array:
    """Decode one tensor's bytes (little-endian, as safetensors stores them)."""
    if info.dtype == "BF16":
        a = np.frombuffer(raw, dtype="<u2").reshape(info.shape)
        return mx.array(a).view(mx.bfloat16)
    dt = _NP.get(info.dtype)
    if dt is None:
        raise RefusedError(
            f"tensor {info.name} has dtype {info.dtype}, which mtpforge cannot convert",
            "use a bf16/fp16/fp32 source (or a block-FP8 one) of the same model",
        )
    a = np.frombuffer(raw, dtype=np.dtype(dt).newbyteorder("<")).reshape(info.shape)
    return mx.array(a)


def to_float32(info: TensorInfo, raw: bytes) -> np.ndarray:
    """One tensor's bytes as a float32 numpy array (bf16 widened by a shift: exact), for the
    conversion passes, which run in numpy: one pass over the values, no framework round trip."""
    if info.dtype == "BF16":
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).reshape(info.shape)
    dt = _NP.get(info.dtype)
    if dt is None:
        to_mx(info, b"")  # the one refusal of a dtype mtpforge cannot convert
    return np.frombuffer(raw, dtype=np.dtype(dt).newbyteorder("<")).reshape(info.shape).astype(np.float32)


def to_bytes(a: mx.array) -> bytes:
    """The safetensors byte representation of an array (C order, little-endian)."""
    if a.dtype == mx.bfloat16:
        return bytes(memoryview(np.array(a.view(mx.uint16), copy=False)))
    return bytes(memoryview(np.array(a, copy=False)))
