"""writer.uncached: the GGUF writer's data region past the page cache — the same bytes as a plain
write, whatever the header's length and however the data arrives."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from mtpforge.writer.uncached import ALIGN, STAGE, UncachedAppender


def _chunkings(rng: np.random.Generator) -> list[list[int]]:
    return [[1] * 100, [ALIGN - 1, 1, ALIGN + 1], [STAGE - 7, 3, 5], [STAGE * 2 + 11],
            list(rng.integers(1, 3 * ALIGN, 200)), [0, 10, 0, STAGE, 0]]


@pytest.mark.parametrize("start", [0, 1, ALIGN - 1, ALIGN, 12_345])
def test_the_same_bytes_as_a_plain_write(tmp_path: Path, start: int) -> None:
    rng = np.random.default_rng(start)
    for i, sizes in enumerate(_chunkings(rng)):
        path = tmp_path / f"f{i}"
        head = rng.integers(0, 256, start, dtype=np.uint8).tobytes()
        chunks = [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in sizes]
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, head)
            out = UncachedAppender.open(path, fd, start, head)
            if hasattr(os, "O_DIRECT") and out is None:
                pytest.skip(f"the file system of {tmp_path} takes no O_DIRECT")
            assert out is not None or not hasattr(os, "O_DIRECT")
            if out is None:
                return
            for c in chunks:
                assert out.write(c) == len(c)
            assert out.position == start + sum(map(len, chunks))
            out.finish()
            out.close()
            os.fsync(fd)
        finally:
            os.close(fd)
        assert path.read_bytes() == head + b"".join(chunks), (start, sizes[:5])


def test_no_appender_where_the_header_is_not_what_was_written(tmp_path: Path) -> None:
    """``head`` must be every byte before ``start``: its last partial block is written again."""
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        assert UncachedAppender.open(path, fd, 10, b"short") is None
    finally:
        os.close(fd)
