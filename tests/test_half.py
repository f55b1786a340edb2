"""passes.half.to_float16: numpy's float16 cast, bit for bit, without its cost on subnormals."""

from __future__ import annotations

import numpy as np

from mtpforge.passes.half import encodes_float16, to_float16


def _patterns(step: int) -> np.ndarray:
    """float32 bit patterns: every ``step``-th one from zero up past float16's normal range
    (through the subnormal results, the round-up to the smallest normal, the overflow to
    infinity), both signs, random ones, and the special values."""
    rng = np.random.default_rng(0)
    walk = np.arange(0, 0x47900000, step, dtype=np.uint32)
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x33000000, 0x33000001, 0x387FE000, 0x387FF000,
                        0x38800000, 0x477FE000, 0x477FF000, 0x477FF001], np.uint32)
    return np.concatenate([walk, walk | np.uint32(0x80000000), special,
                           rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32)])


def test_the_same_bits_as_numpys_cast_over_every_range() -> None:
    w = _patterns(step=211).view(np.float32)
    with np.errstate(over="ignore"):  # the values past float16's range: inf, with numpy's warning
        want = w.astype(np.float16).view(np.uint16)
        got = to_float16(w)
    assert got.dtype == np.float16 and got.shape == w.shape
    nan = np.isnan(w)
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want[~nan])
    assert np.isnan(got[nan]).all()
    tiny = np.abs(w) < 2.0 ** -14
    assert tiny.sum() > 1_000_000 and (got.view(np.uint16)[tiny] & 0x7FFF).max() == 0x0400  # rounds up


def test_shape_and_no_subnormal_case() -> None:
    w = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    assert np.array_equal(to_float16(w).view(np.uint16), w.astype(np.float16).view(np.uint16))
    assert to_float16(w).shape == (2, 3, 4)


def test_which_encodings_write_float16() -> None:
    assert encodes_float16(lambda v: v.astype(np.float16))
    assert not encodes_float16(lambda v: v.astype(np.float32))
    assert not encodes_float16(lambda v: v.view(np.uint32).astype(np.uint16))
