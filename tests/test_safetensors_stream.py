"""writer.safetensors_stream and convert.HeadScanner: slices written in the file's order go past
the page cache and past the scanner, which then gives what a read-back scan gives; slices out of
order are placed at their offsets all the same, and the writer says the order was left."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mtpforge.checkpoint.safetensors_header import read_local_header
from mtpforge.convert import HeadScanner, scan_head
from mtpforge.writer.safetensors_stream import SafetensorsWriter, TensorSpec

#: a stack whose slices are large enough to fill several direct-write stages, a tensor of zeros
#: (a degenerate projection), one holding an Inf, an integer one and an empty one
SHAPES = {"a.weight": ((4, 1100, 1024), "F16"), "b.weight": ((8, 16), "F32"), "c.weight": ((3, 5), "BF16"),
          "d.scales": ((7, 3), "U32"), "e.bias": ((0,), "F32"), "f.weight": ((33, 7), "F16")}


def _arrays(rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for k, (shape, dt) in SHAPES.items():
        if dt == "U32":
            out[k] = rng.integers(0, 2**32, shape, dtype=np.uint32)
        else:
            a = rng.standard_normal(shape).astype(np.float32)
            out[k] = {"F16": a.astype(np.float16), "BF16": (a.view(np.uint32) >> 16).astype(np.uint16)}.get(dt, a)
    out["b.weight"][:] = 0
    out["f.weight"][3, 4] = np.inf
    return out


def _slices(arrays: dict[str, np.ndarray]) -> list[tuple[str, bytes, int, int]]:
    writes = []
    for k, a in arrays.items():
        n = a.shape[0] if k == "a.weight" else 1
        raw = a.tobytes()
        step = len(raw) // n
        writes += [(k, raw[i * step:(i + 1) * step], i, n) for i in range(n)]
    return writes


def _specs() -> list[TensorSpec]:
    return [TensorSpec(k, dt, shape) for k, (shape, dt) in SHAPES.items()]


@pytest.mark.parametrize("shuffled", [False, True])
def test_the_same_file_in_order_or_not_and_the_scan_of_its_bytes(tmp_path: Path, shuffled: bool) -> None:
    rng = np.random.default_rng(1)
    arrays = _arrays(rng)
    writes = _slices(arrays)
    if shuffled:
        writes = [writes[i] for i in rng.permutation(len(writes))]
    path = tmp_path / "head.safetensors"
    seen: list[bytes] = []
    with SafetensorsWriter(path, _specs(), {"format": "mlx"}) as w:
        w.watch(lambda b: seen.append(bytes(b)))
        for k, data, i, n in writes:
            w.write(k, data, i, n)
    assert w.in_order is (not shuffled)
    data, infos = path.read_bytes(), read_local_header(path, path.name).tensors
    assert w.tensors() == infos  # the spans the writer gives are its header's
    for k, a in arrays.items():
        assert data[infos[k].begin:infos[k].end] == a.tobytes(), k
    if not shuffled:
        assert b"".join(seen) == path.read_bytes()  # the observer saw the file, byte for byte, in order

    scan = HeadScanner(infos)
    for b in seen if not shuffled else [path.read_bytes()[i:i + 12_345] for i in range(0, path.stat().st_size, 12_345)]:
        scan.feed(b)
    fed, read = scan.result(), scan_head(path, infos)
    assert fed == read
    assert read.nonfinite == ["f.weight"] and read.degenerate == ["b.weight"]
    assert set(read.digests) == set(SHAPES)


def test_a_scan_of_named_tensors_only(tmp_path: Path) -> None:
    """inspect's data check: the tensors named, no whole-file hash, the rest skipped."""
    path = tmp_path / "head.safetensors"
    arrays = _arrays(np.random.default_rng(2))
    with SafetensorsWriter(path, _specs()) as w:
        for k, data, i, n in _slices(arrays):
            w.write(k, data, i, n)
    infos = read_local_header(path, path.name).tensors
    some = {k: infos[k] for k in ("c.weight", "f.weight")}
    part, whole = scan_head(path, some, whole_file=False), scan_head(path, infos)
    assert part.file_sha256 == "" and part.digests == {k: whole.digests[k] for k in some}
    assert part.nonfinite == ["f.weight"] and part.degenerate == []
