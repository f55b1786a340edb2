"""A safetensors writer that knows the whole header before the first byte of data.

Because every output shape is planned in advance, the header (and so every tensor's offset) is
fixed up front; data then arrives in any order — one expert slice of a stack at a time, the
quantized triplet of a slice into three places — and is written at its offset. Peak memory is
one slice, whatever the head's size (docs/SPEC.md §4).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Iterable

from ..checkpoint.safetensors_header import DTYPE_SIZES
from .ahead import EarlySync
from .uncached import pwrite_all


@dataclass(frozen=True)
class TensorSpec:
    key: str
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(prod(self.shape) * DTYPE_SIZES[self.dtype])


def build_header(specs: Iterable[TensorSpec], metadata: dict[str, str] | None = None) -> tuple[bytes, dict[str, int]]:
    """Header bytes (8-byte length + JSON padded to 8) and each tensor's offset in the data area."""
    hdr: dict[str, object] = {}
    if metadata:
        hdr["__metadata__"] = dict(metadata)
    offsets: dict[str, int] = {}
    pos = 0
    for s in specs:
        if s.key in offsets:
            raise ValueError(f"duplicate tensor name {s.key}")
        offsets[s.key] = pos
        hdr[s.key] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [pos, pos + s.nbytes]}
        pos += s.nbytes
    raw = json.dumps(hdr, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw, offsets


class SafetensorsWriter:
    """Create ``path`` (must not exist) and fill it slice by slice."""

    def __init__(self, path: Path, specs: list[TensorSpec], metadata: dict[str, str] | None = None) -> None:
        self.path = Path(path)
        self.specs = {s.key: s for s in specs}
        header, offsets = build_header(specs, metadata)
        self.data_start = len(header)
        self.offsets = offsets
        self.total = self.data_start + sum(s.nbytes for s in specs)
        self._written = {s.key: 0 for s in specs}
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.pwrite(self._fd, header, 0)
        os.ftruncate(self._fd, self.total)
        self._sync = EarlySync(self._fd)

    def write(self, key: str, data: bytes, index: int = 0, count: int = 1) -> None:
        """Write slice ``index`` of ``count`` equal slices of tensor ``key``."""
        spec = self.specs[key]
        step = spec.nbytes // count
        if len(data) != step:
            raise ValueError(f"{key}: slice of {len(data)} bytes, expected {step}")
        done = pwrite_all(self._fd, data, self.data_start + self.offsets[key] + index * step, self.path)
        self._written[key] += done
        self._sync.wrote(done)

    def close(self) -> None:
        incomplete = [k for k, s in self.specs.items() if self._written[k] != s.nbytes]
        try:
            if incomplete:
                raise RuntimeError(f"{self.path.name}: tensors not fully written: {incomplete[:3]}")
            self._sync.wait()
            os.fsync(self._fd)
        finally:
            os.close(self._fd)

    def __enter__(self) -> "SafetensorsWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            with contextlib.suppress(OSError):
                self._sync.wait()
            os.close(self._fd)
