"""Block-scaled low-bit sources (FP8 E4M3, FP4 E2M1), read before anything else touches them.

FP8 releases store ``W`` as F8_E4M3 and one scale per 128x128 block — F32 in ``W_scale_inv``
(DeepSeek-V3, Qwen) or an E8M0 exponent in ``<module>.scale`` (DeepSeek-V4's ue8m0); the real
weight is ``fp8(W) * scale`` blockwise. Passing FP8 bytes through as if bf16 would write garbage.

DeepSeek-V4 stores its routed experts FP4: two E2M1 codes a byte and one E8M0 exponent per 32
values along the row (the microscaling layout). ggml's MXFP4 holds the same codes and exponents
in another order, so llama.cpp keeps those experts as they are, only moving bits
(``repack_mxfp4``): no dequantization, no rounding, byte for byte what its converter writes.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx
import numpy as np

from .half import encodes_float16, to_float16

BLOCK = 128
#: the exponent bias of an E8M0 scale byte: it stands for 2 ** (byte - 127)
E8M0_BIAS = 127
#: the E8M0 byte that stands for no number (NaN)
E8M0_NAN = 255
#: values per E8M0 exponent in an FP4 (MXFP4) row, and the bytes ggml's block of them takes
MXFP4_GROUP = 32
MXFP4_BLOCK_BYTES = 1 + MXFP4_GROUP // 2


def _e4m3_table() -> np.ndarray:
    """float32 of every FP8 E4M3 ("fn": no infinities) byte: sign, 4 exponent bits (bias 7), 3
    mantissa bits; exponent 0 is subnormal and 0x7F / 0xFF are NaN. Exact in float32."""
    b = np.arange(256, dtype=np.int32)
    exp, man = (b >> 3) & 0xF, (b & 7).astype(np.float32)
    mag = np.where(exp == 0, np.ldexp(man / 8, -6), np.ldexp(1 + man / 8, exp - 7)).astype(np.float32)
    mag[(b & 0x7F) == 0x7F] = np.nan
    return np.where(b & 0x80, -mag, mag).astype(np.float32)


#: FP8 E4M3 byte -> float32 (a lookup: one pass over the codes, where casting through a framework
#: took most of a block-FP8 head's conversion time)
E4M3_TO_F32 = _e4m3_table()


def dequantize_block_fp8(codes: np.ndarray, scale_inv: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """float32 weight from FP8 E4M3 codes [out, in] (uint8) and block scales [ceil(out/b),
    ceil(in/b)]: ``fp8 * scale`` in float32, as llama.cpp's converter computes it."""
    w = E4M3_TO_F32[np.asarray(codes, np.uint8)]
    s = np.asarray(scale_inv, np.float32)
    out_dim, in_dim = w.shape
    if out_dim % block == 0 and in_dim % block == 0 and s.shape == (out_dim // block, in_dim // block):
        v = w.reshape(s.shape[0], block, s.shape[1], block)
        np.multiply(v, s[:, None, :, None], out=v)
        return w
    w *= np.repeat(np.repeat(s, block, axis=0), block, axis=1)[:out_dim, :in_dim]
    return w


#: the two E4M3 bytes that stand for NaN (0x7F and 0xFF: every magnitude bit set)
_NAN_CODES = np.array([0x7F, 0xFF])


def _block_values(codes: np.ndarray, scale_inv: np.ndarray, block: int, nan_codes: bool = True) -> np.ndarray | None:
    """Every block's 256 possible values [row blocks, column blocks, 256] (float32, ``fp8 *
    scale`` as ``dequantize_block_fp8`` computes it), or None where a lookup does not apply: a
    shape not in whole blocks, a NaN code used (``nan_codes``: a caller that sees every code's
    magnitude anyway checks it there, saving a pass), a block whose values overflow."""
    rows, cols = codes.shape
    if rows % block or cols % block or scale_inv.shape != (rows // block, cols // block):
        return None
    with np.errstate(over="ignore", invalid="ignore"):  # a damaged scale: declined just below
        values = E4M3_TO_F32[None, None, :] * np.asarray(scale_inv, np.float32)[:, :, None]
    values[:, :, _NAN_CODES] = 0.0  # never looked up once no NaN code is used (checked below)
    if not np.isfinite(values).all() or (nan_codes and _uses_nan_code(codes)):
        return None
    return values


def _uses_nan_code(codes: np.ndarray) -> bool:
    """Whether any code is E4M3's NaN (all seven magnitude bits set): the largest magnitude is then
    0x7F. A masked maximum, a tenth of the time a comparison of every code took."""
    return bool(codes.size) and int(np.bitwise_and(codes, 0x7F).max()) == 0x7F


def _group_maxima(band: np.ndarray) -> np.ndarray:
    """The largest magnitude code of each group of the last axis (E4M3 magnitudes order as their
    7 low bits), a column at a time: numpy reduces a short last axis several times slower."""
    mags = np.bitwise_and(band, 0x7F)
    top = mags[..., 0].copy()
    for j in range(1, mags.shape[-1]):
        np.maximum(top, mags[..., j], out=top)
    return top


def encode_block_fp8(codes: np.ndarray, scale_inv: np.ndarray, encode: Callable[[np.ndarray], np.ndarray],
                     block: int = BLOCK) -> np.ndarray | None:
    """``encode(fp8 * scale)`` of every value by one lookup a value: a 128x128 block holds at most
    256 distinct values, so each block's 256 are computed and encoded once and the codes index
    them. ``encode`` must act value by value (a float cast: the writers' float16 / bfloat16 /
    float32), so the bits equal ``encode(dequantize_block_fp8(...))``; the decode, the scale and
    the cast each took a pass over the tensor, several ns a value, where the lookup takes one.

    None where the lookup does not apply and the caller takes the exact path (which refuses what
    is not finite): a shape not in whole blocks, a NaN code used, a block whose values overflow."""
    values = _block_values(codes, scale_inv, block)
    if values is None:
        return None
    rows, cols = codes.shape
    table = np.ascontiguousarray(to_float16(values) if encodes_float16(encode) else encode(values))
    width = table.nbytes // values.size  # bytes a value (gguf-py hands bfloat16 back as bytes)
    bits = table.view(np.uint8).reshape(-1, width).view(f"u{width}").reshape(rows // block, -1)
    per_block = cols // block
    offsets = (np.arange(per_block, dtype=np.uint16 if per_block <= 256 else np.uint32) * 256)[None, :, None]
    out = np.empty((rows, cols), bits.dtype)
    for i in range(rows // block):
        band = np.s_[i * block:(i + 1) * block]
        # every index is in range by construction: "wrap" skips the buffered bounds check
        np.take(bits[i], codes[band].reshape(block, per_block, block) + offsets,
                out=out[band].reshape(block, per_block, block), mode="wrap")
    return out.view(table.dtype) if table.dtype.itemsize == width else out.view(table.dtype).reshape(rows, -1)


#: values a ggml Q8_0 block holds (one float16 scale, then 32 int8 codes)
Q8_0_GROUP = 32
_Q8_0_BYTES = 2 + Q8_0_GROUP
#: distinct E4M3 magnitudes (the code without its sign bit)
_MAGNITUDES = 128


def q8_0_block_fp8(codes: np.ndarray, scale_inv: np.ndarray, block: int = BLOCK) -> np.ndarray | None:
    """ggml Q8_0 rows [rows, cols / 32 * 34] of ``fp8 * scale`` by lookup: the same bytes as
    gguf-py's ``quantize(dequantize_block_fp8(...), Q8_0)``, which took most of a block-FP8 head's
    conversion to q8_0 (a dozen float32 passes a value).

    A Q8_0 group's scale is its largest magnitude over 127, and E4M3 magnitudes order as their
    7 low bits, so the largest value's code is a byte maximum; within one 128x128 source block a
    group's int8 codes then depend only on (that code, the value's code), so each pair of block
    and largest code that occurs gets its 256 int8 codes computed once — gguf-py's own arithmetic
    (``np_roundf(x * (1 / d))`` in float32) on the 256 values — and the codes index them. None
    where ``_block_values`` declines (the exact path then decodes and refuses what is not finite)."""
    from gguf.quants import np_roundf

    values = _block_values(codes, scale_inv, block, nan_codes=False)
    if values is None:
        return None
    rows, cols = codes.shape
    groups, per_block = cols // Q8_0_GROUP, cols // block
    column_block = (np.arange(groups, dtype=np.int32) // (block // Q8_0_GROUP)) * _MAGNITUDES
    out = np.empty((rows, groups, _Q8_0_BYTES), np.uint8)
    for i in range(rows // block):
        band = codes[i * block:(i + 1) * block].reshape(block, groups, Q8_0_GROUP)
        top = _group_maxima(band)  # [block, groups]: the largest magnitude's code
        if (top == 0x7F).any():
            return None  # a NaN code
        key = column_block + top
        present = np.zeros(per_block * _MAGNITUDES, bool)
        present[key] = True
        pairs = np.flatnonzero(present)
        at = values[i][pairs // _MAGNITUDES]  # [pairs, 256]
        amax = np.abs(at[np.arange(pairs.size), pairs % _MAGNITUDES])[:, None]
        d = amax / 127
        with np.errstate(divide="ignore"):
            inv = np.where(d == 0, 0, 1 / d)
        table = np_roundf(at * inv).astype(np.int8).view(np.uint8)
        row = (np.cumsum(present, dtype=np.int32) - 1)[key]  # [block, groups]: the pair's table row
        target = out[i * block:(i + 1) * block]
        target[:, :, :2] = to_float16(d).view(np.uint8)[row]  # gguf-py's cast: many scales are subnormal
        target[:, :, 2:] = np.take(table.reshape(-1), (row * 256)[..., None] + band, mode="wrap")  # in range
    return out.reshape(rows, groups * _Q8_0_BYTES)


#: tensor-parallel rank counts a rank-sharded block-FP8 release may be stored over, tried most
#: first as llama.cpp's converter tries them (MiMo-V2.5 ships 4, V2.5-Pro 8)
TP_RANKS = (8, 4)


def rank_count(rows: int, scale_rows: int, block: int = BLOCK) -> int | None:
    """The tensor-parallel ranks a rank-sharded block-FP8 matrix of ``rows`` rows was stored over:
    the count whose ranks' own 128-row blocks add up to the scale's rows (None: no count fits)."""
    for ranks in TP_RANKS:
        if rows % ranks == 0 and scale_rows == ranks * -(-(rows // ranks) // block):
            return ranks
    return None


def dequantize_by_rank(codes: np.ndarray, scale_inv: np.ndarray, parts: tuple[int, ...], ranks: int,
                       block: int = BLOCK) -> np.ndarray:
    """float32 weight of a matrix whose release lies rank by rank — each rank's share of every
    part (a fused [q | k | v]), its rows quantized in blocks of its own — back in the parts' order:
    each rank dequantized with its own scale rows, then the shares regrouped part by part (what
    llama.cpp's converter computes for MiMo-V2.5's ``qkv_proj``)."""
    per = codes.shape[0] // ranks
    blocks = -(-per // block)
    pieces = [dequantize_block_fp8(codes[r * per:(r + 1) * per], scale_inv[r * blocks:(r + 1) * blocks], block)
              for r in range(ranks)]
    bounds = np.cumsum([0, *(n // ranks for n in parts)])
    return np.concatenate([piece[bounds[j]:bounds[j + 1]] for j in range(len(parts)) for piece in pieces])


def e8m0_to_float(exps: "np.ndarray | mx.array") -> np.ndarray:
    """E8M0 exponent bytes as the float32 powers of two they stand for (exact: ``ldexp``; 255,
    E8M0's NaN, becomes inf here and is refused downstream as not finite)."""
    e = np.array(exps, dtype=np.int32) - E8M0_BIAS
    with np.errstate(over="ignore"):
        return np.ldexp(np.float32(1.0), e).astype(np.float32)


def repack_mxfp4(packed: np.ndarray, exps: np.ndarray) -> np.ndarray:
    """ggml ``block_mxfp4`` rows [rows, cols/32 * 17] from a release's FP4 weight: ``packed``
    [rows, cols/2] (value 2i in the low nibble, 2i+1 in the high one) and ``exps`` [rows, cols/32].
    A ggml block is its exponent then 16 bytes, byte j holding value j low and value j+16 high;
    the 4-bit codes index the same E2M1 table on both sides. Rows are independent, so a row block
    repacks on its own."""
    p = np.ascontiguousarray(packed).view(np.uint8)
    s = np.ascontiguousarray(exps).view(np.uint8)
    rows, half = p.shape
    nb = 2 * half // MXFP4_GROUP
    if 2 * half % MXFP4_GROUP or s.shape != (rows, nb):
        raise ValueError(f"an FP4 weight of {2 * half} values a row needs {nb} exponents a row, not {s.shape}")
    src = p.reshape(rows, nb, MXFP4_GROUP // 2)
    vals = np.stack((src & 0x0F, src >> 4), axis=-1).reshape(rows, nb, MXFP4_GROUP)
    qs = vals[:, :, :16] | (vals[:, :, 16:] << 4)
    return np.concatenate((s[:, :, None], qs.astype(np.uint8)), axis=-1).reshape(rows, nb * MXFP4_BLOCK_BYTES)
