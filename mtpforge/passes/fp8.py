"""Block-scaled FP8 (E4M3) sources, dequantized before anything else touches them.

FP8 releases store ``W`` as F8_E4M3 and ``W_scale_inv`` as one float per 128x128 block; the real
weight is ``fp8(W) * scale`` blockwise. Passing FP8 bytes through as if bf16 would write garbage.
"""

from __future__ import annotations

import mlx.core as mx

BLOCK = 128


def dequantize_block_fp8(raw_u8: mx.array, scale_inv: mx.array, block: int = BLOCK) -> mx.array:
    """float32 weight from FP8 E4M3 codes [out, in] and block scales [ceil(out/b), ceil(in/b)]."""
    w = mx.from_fp8(raw_u8, dtype=mx.float32)
    out_dim, in_dim = w.shape
    s = scale_inv.astype(mx.float32)
    s = mx.repeat(mx.repeat(s, block, axis=0), block, axis=1)[:out_dim, :in_dim]
    return w * s
