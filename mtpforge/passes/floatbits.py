"""Finiteness and zeroness of float bytes read from their bits, without converting them.

A float is Inf or NaN exactly when its exponent field is all ones, that is when its magnitude
bits (the sign masked off) are at least that field's mask; it is zero when they are zero. So one
masked maximum answers both for a whole buffer, where the checks took two masks, a comparison and
two ``any`` (0.40 -> 0.12 ms a 4 MiB bf16 chunk: about 1.6 s over a 23.5 GB head).
"""

from __future__ import annotations

import numpy as np

#: float encoding -> (unsigned view, exponent mask, magnitude mask)
FLOAT_BITS: dict[str, tuple[str, int, int]] = {
    "F64": ("<u8", 0x7FF0000000000000, 0x7FFFFFFFFFFFFFFF),
    "F32": ("<u4", 0x7F800000, 0x7FFFFFFF),
    "F16": ("<u2", 0x7C00, 0x7FFF),
    "BF16": ("<u2", 0x7F80, 0x7FFF),
}


def largest_magnitude(buf: "bytes | memoryview | np.ndarray", encoding: str) -> int:
    """The largest magnitude's bit pattern among the floats in ``buf`` (0 when empty or all
    zero); ``>= FLOAT_BITS[encoding][1]`` means an Inf or NaN is among them."""
    view, _, mag = FLOAT_BITS[encoding]
    u = np.frombuffer(buf, dtype=view)
    return int(np.bitwise_and(u, np.array(mag, dtype=view)).max()) if u.size else 0


def all_finite(buf: "bytes | memoryview | np.ndarray", encoding: str) -> bool:
    return largest_magnitude(buf, encoding) < FLOAT_BITS[encoding][1]
