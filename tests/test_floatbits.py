"""passes.floatbits: finiteness and zeroness read from float bits, as numpy judges the values."""

from __future__ import annotations

import numpy as np
import pytest

from mtpforge.passes.floatbits import FLOAT_BITS, all_finite, largest_magnitude

_NUMPY = {"F64": np.float64, "F32": np.float32, "F16": np.float16}


@pytest.mark.parametrize("encoding", sorted(FLOAT_BITS))
def test_finite_and_zero_as_the_values_say(encoding: str) -> None:
    view = np.dtype(FLOAT_BITS[encoding][0])
    rng = np.random.default_rng(3)
    bits = rng.integers(0, np.iinfo(view).max, 4096, dtype=np.uint64).astype(view)
    exp = FLOAT_BITS[encoding][1]
    special = np.array([0, exp, exp | 1, exp | (exp >> 1), 1], dtype=view)  # 0, inf, nan, nan, tiny
    sign = np.array(1 << (8 * view.itemsize - 1), dtype=view)
    for sample in (bits, special, special | sign):
        for i in range(len(sample)):
            one = sample[i:i + 1].tobytes()
            if encoding == "BF16":  # bf16 is the top half of a float32
                value = np.frombuffer(np.array([int(sample[i]) << 16], "<u4").tobytes(), np.float32)
            else:
                value = np.frombuffer(one, _NUMPY[encoding])
            assert all_finite(one, encoding) == bool(np.isfinite(value).all()), (encoding, hex(int(sample[i])))
            assert (largest_magnitude(one, encoding) > 0) == bool(value[0] != 0 or np.isnan(value[0]))
    assert all_finite(bits[bits & np.array(exp, dtype=view) != np.array(exp, dtype=view)].tobytes(), encoding)
    assert not all_finite(np.concatenate([bits[:9], special[1:2], bits[9:20]]).tobytes(), encoding)
    assert largest_magnitude(b"", encoding) == 0 and all_finite(b"", encoding)
