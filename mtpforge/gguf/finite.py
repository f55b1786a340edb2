"""NaN/Inf in a GGUF head's tensors, whatever their encoding, read in bounded chunks.

inspect looked only at F32/F16 tensors under 4 MB, so a q8_0 or bf16 head holding NaN had no
finding and ``verify`` decoded with it (exit 0). Floats are judged by their exponent bits (all
ones: Inf or NaN) without converting; Q8_0 by its blocks' f16 scales (its quants are integers);
any other quantized type by gguf-py's dequantization of whole rows, a few MB at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import gguf
import numpy as np

from ..passes.floatbits import FLOAT_BITS, all_finite
from .gguffile import GgufFile, GgufTensor

Q = gguf.GGMLQuantizationType
#: the float encodings, by their names in ``passes.floatbits``
_FLOATS = {Q.F64: "F64", Q.F32: "F32", Q.F16: "F16", Q.BF16: "BF16"}
#: integer tensors (llama.cpp keeps some indices and counts as I32) hold no NaN or Inf
_INTEGER = {Q.I8, Q.I16, Q.I32, Q.I64}
#: bytes read at a time (whole rows or blocks)
_CHUNK = 1 << 22


def _row_bytes(t: GgufTensor) -> int:
    bs, ts = gguf.GGML_QUANT_SIZES[t.type]
    return max(1, t.shape[-1] // bs * ts) if t.shape else ts


def _chunks(path: Path, t: GgufTensor, unit: int) -> Iterable[bytes]:
    """The tensor's bytes in reads of whole ``unit``s (rows or blocks), about _CHUNK each."""
    step = max(unit, _CHUNK // unit * unit)
    with open(path, "rb") as f:
        f.seek(t.offset)
        left = t.nbytes
        while left > 0:
            b = f.read(min(step, left))
            if not b:
                raise OSError(f"{path} is shorter than its header says")
            left -= len(b)
            yield b


def tensor_is_finite(path: Path, t: GgufTensor) -> bool:
    """Whether every value the tensor decodes to is finite (a type gguf-py cannot decode, some IQ
    quantizations, is not judged: True)."""
    if t.type in _INTEGER:
        return True
    if t.type in _FLOATS:
        name = _FLOATS[t.type]
        size = np.dtype(FLOAT_BITS[name][0]).itemsize
        return all(all_finite(c, name) for c in _chunks(path, t, size))
    bs, ts = gguf.GGML_QUANT_SIZES[t.type]
    if t.type == Q.Q8_0:  # 2-byte f16 scale, then 32 int8 quants
        return all(all_finite(np.frombuffer(c, dtype=np.uint8).reshape(-1, ts)[:, :2].copy(), "F16")
                   for c in _chunks(path, t, ts))
    row = _row_bytes(t)
    try:
        for c in _chunks(path, t, row):
            rows = np.frombuffer(c, dtype=np.uint8).reshape(-1, row)
            if not np.isfinite(gguf.quants.dequantize(rows, t.type)).all():
                return False
    except NotImplementedError:
        return True
    return True


def nonfinite_tensors(g: GgufFile, names: Iterable[str]) -> list[str]:
    """The named tensors of ``g`` holding NaN or Inf, in name order."""
    return [n for n in sorted(names) if not tensor_is_finite(g.file_of(g.tensors[n]), g.tensors[n])]


__all__ = ["nonfinite_tensors", "tensor_is_finite"]
