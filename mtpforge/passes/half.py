"""float32 -> float16 without numpy's cost on subnormal results.

numpy's cast takes ~65 ns for each value that lands in float16's subnormal range (it raises the
underflow flag value by value through ``feraiseexcept``) against ~1.5 ns for the others. Weights
rarely land there, but a third or so of a block-FP8 tensor's lookup tables do: a block's 256
values are its codes times a scale of about 2e-4, and every code below ~0.3 scales under
float16's smallest normal (2**-14). Over a 256-expert DeepSeek head those tables are seconds of
CPU.

Subnormal float16 values are whole multiples of 2**-24, so ``|x| * 2**24`` (exact: a power of two)
rounded to nearest-even *is* the subnormal's bit pattern — 1024 where it rounds up to the smallest
normal, whose pattern is 0x0400 too. The rest goes through numpy's cast as before, so the bits
equal ``astype(np.float16)`` for every non-NaN float32 (a unit test walks the ranges).
"""

from __future__ import annotations

import numpy as np

#: float16's smallest normal value: below it a result is subnormal (or zero)
SMALLEST_NORMAL = np.float32(2.0 ** -14)
#: a float16 subnormal's unit is 2**-24: |x| in units of it is the subnormal's bit pattern
_SUBNORMAL_UNITS = np.float32(2.0 ** 24)


def to_float16(w: np.ndarray) -> np.ndarray:
    """``w.astype(np.float16)``, bit for bit, at numpy's normal-range speed where many values are
    subnormal in float16 (a lookup table); on weights, where few are, the plain cast is faster."""
    w = np.asarray(w, np.float32)
    tiny = np.abs(w) < SMALLEST_NORMAL
    if not tiny.any():
        return w.astype(np.float16)
    out = np.where(tiny, np.float32(0), w).astype(np.float16)
    t = w[tiny]
    out.view(np.uint16)[tiny] = np.rint(np.abs(t) * _SUBNORMAL_UNITS).astype(np.uint16) | (
        np.signbit(t).astype(np.uint16) << 15)
    return out


def encodes_float16(encode: "object") -> bool:
    """Whether a value-by-value float encoding (a writer's cast) writes float16: every one the
    writers use rounds to nearest, ties to even, which ``to_float16`` equals."""
    return callable(encode) and np.asarray(encode(np.zeros(1, np.float32))).dtype == np.float16
