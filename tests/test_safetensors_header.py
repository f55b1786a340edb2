"""The strict safetensors header parser: real files parse, every kind of damage is refused with
mtpforge's own error, and nothing else ever escapes (property-based)."""

from __future__ import annotations

import json
import struct

import mlx.core as mx
import pytest
from hypothesis import given, settings, strategies as st

from mtpforge.checkpoint.safetensors_header import read_header
from mtpforge.errors import CorruptFileError


def _parse(blob: bytes):
    return read_header("x.safetensors", len(blob), lambda a, b: blob[a:b])


def _file(header: dict, data: bytes = b"", pad: bool = True) -> bytes:
    raw = json.dumps(header).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def test_real_mlx_file_parses_with_exact_spans(tmp_path):
    a = mx.arange(12, dtype=mx.float32).reshape(3, 4)
    b = mx.ones((5,), dtype=mx.bfloat16)
    p = tmp_path / "t.safetensors"
    mx.save_safetensors(str(p), {"a": a, "b": b}, metadata={"format": "mlx"})
    blob = p.read_bytes()
    h = _parse(blob)
    assert h.metadata == {"format": "mlx"}
    ia, ib = h.tensors["a"], h.tensors["b"]
    assert (ia.dtype, ia.shape, ia.nbytes) == ("F32", (3, 4), 48)
    assert blob[ia.begin:ia.end] == bytes(memoryview(__import__("numpy").array(a)))
    assert (ib.dtype, ib.nbytes) == ("BF16", 10)


GOOD = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}

BAD_CASES = {
    "empty file": b"",
    "shorter than length prefix": b"\x01\x02",
    "header length beyond file": struct.pack("<Q", 1000) + b"{}",
    "absurd header length": struct.pack("<Q", 2**62) + b"{}",
    "header not json": struct.pack("<Q", 4) + b"nope",
    "header not utf-8": struct.pack("<Q", 4) + b"\xff\xfe\xfd\xfc",
    "header is a list": _file([1, 2]),  # type: ignore[arg-type]
    "unknown dtype": _file({"w": {"dtype": "F13", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
    "offsets out of range": _file({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, b"\0" * 8),
    "shape times dtype != span": _file({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}, b"\0" * 16),
    "overlapping tensors": _file({
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
    }, b"\0" * 24),
    "negative dimension": _file({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}),
    "offsets reversed": _file({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}}, b"\0" * 8),
    "bad metadata": _file({"__metadata__": {"a": 1}, **GOOD}, b"\0" * 16),
    "duplicate names": struct.pack("<Q", 0) + b"",  # replaced below
}
_dup = ('{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
        '"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}').encode()
BAD_CASES["duplicate names"] = struct.pack("<Q", len(_dup)) + _dup + b"\0" * 8


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_damaged_headers_are_refused(case):
    with pytest.raises(CorruptFileError) as ei:
        _parse(BAD_CASES[case])
    assert "x.safetensors" in ei.value.message and ei.value.fix


def test_good_minimal_file_parses():
    assert _parse(_file(GOOD, b"\0" * 16)).tensors["w"].shape == (2, 2)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_fuzz_random_bytes_only_raise_our_error(blob):
    try:
        _parse(blob)
    except CorruptFileError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 40) | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "__metadata__"]), json_values, max_size=3), st.binary(max_size=64))
def test_fuzz_structured_headers_only_raise_our_error(header, data):
    try:
        _parse(_file(header, data))
    except CorruptFileError:
        pass
