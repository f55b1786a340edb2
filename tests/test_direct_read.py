"""checkpoint.direct_read: a span read past the page cache is the same bytes as a plain read,
wherever it starts and ends in the file's blocks, up to and past the file's end."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from mtpforge.checkpoint.direct_read import ALIGN, KEEP, read_span


def _plain(path: Path, offset: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def _direct_ok(path: Path) -> bool:
    try:
        os.close(os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0)))
    except OSError:
        return False
    return hasattr(os, "O_DIRECT")


@pytest.mark.parametrize("size", [1, ALIGN - 1, ALIGN, 5 * ALIGN + 123])
def test_every_span_equals_a_plain_read(tmp_path: Path, size: int) -> None:
    rng = np.random.default_rng(size)
    path = tmp_path / "f.bin"
    path.write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    spans = {(0, size), (0, 1), (size - 1, 1), (0, size + ALIGN), (size, 5), (size + ALIGN, 3)}
    spans |= {(int(a), int(n)) for a, n in zip(rng.integers(0, size, 60), rng.integers(1, 2 * ALIGN + 2, 60))}
    spans |= {(ALIGN - 1, 2), (ALIGN, ALIGN), (ALIGN + 1, ALIGN - 2)} if size > 2 * ALIGN else set()
    for a, n in sorted(spans):
        assert read_span(str(path), a, n) == _plain(path, a, n), (a, n)


def test_a_span_larger_than_a_kept_buffer(tmp_path: Path) -> None:
    """A span over ``KEEP`` reads into a buffer of its own; the thread's kept one still serves
    the next small read."""
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, KEEP + 3 * ALIGN + 17, dtype=np.uint8).tobytes()
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    assert read_span(str(path), 5, len(data)) == data[5:]
    assert read_span(str(path), ALIGN + 3, 100) == data[ALIGN + 3:ALIGN + 103]


def test_a_file_written_with_direct_io_reads_back(tmp_path: Path) -> None:
    """What the download writes (``writer.uncached``, its tail through the ordinary descriptor)
    read back directly, before and after an fsync."""
    from mtpforge.writer.uncached import UncachedAppender

    path = tmp_path / "run.bin"
    data = np.random.default_rng(3).integers(0, 256, 3 * (8 << 20) + 999, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        out = UncachedAppender.open(path, f.fileno(), 0, b"", pool="direct-test")
        if out is None or not _direct_ok(path):
            pytest.skip(f"the file system of {tmp_path} takes no O_DIRECT")
        try:
            for k in range(0, len(data), 1 << 20):
                out.write(data[k:k + (1 << 20)])
            out.finish()
        finally:
            out.close()
        assert read_span(str(path), len(data) - 5000, 6000) == data[-5000:]
        os.fsync(f.fileno())
    for a, n in [(0, len(data)), (123, 4 << 20), (len(data) - 1, 1)]:
        assert read_span(str(path), a, n) == data[a:a + n]
