"""A safetensors writer that knows the whole header before the first byte of data.

Because every output shape is planned in advance, the header (and so every tensor's offset) is
fixed up front; data then arrives in any order — one expert slice of a stack at a time, the
quantized triplet of a slice into three places — and is written at its offset. Peak memory is
one slice, whatever the head's size (docs/SPEC.md §4).

Data that arrives in the file's order (a float head: every slice follows the one before) goes
past the page cache where the platform allows (``writer.uncached``: the kernel's copy into its
cache cost a giant head ~1 ns a byte of CPU) and past an observer, which sees the file's bytes
in order as they are written (``watch``: the caller's digests, without reading GBs back). The first slice
out of order ends both: what follows is written at its offset through the page cache, as before,
and ``in_order`` says so.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Callable, Iterable

from ..checkpoint.safetensors_header import DTYPE_SIZES, TensorInfo
from .ahead import EarlySync
from .uncached import UncachedAppender, pwrite_all


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
    """Create ``path`` (must not exist) and fill it slice by slice; an observer (``watch``) is
    handed the file's bytes (its header first) while they are written in order (``in_order``)."""

    def __init__(self, path: Path, specs: list[TensorSpec], metadata: dict[str, str] | None = None) -> None:
        self.path = Path(path)
        self.specs = {s.key: s for s in specs}
        header, offsets = build_header(specs, metadata)
        self.data_start = len(header)
        self.offsets = offsets
        self.total = self.data_start + sum(s.nbytes for s in specs)
        self._written = {s.key: 0 for s in specs}
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._direct: UncachedAppender | None = None
        self._observe: Callable[[bytes], None] | None = None
        self._header = header
        try:
            pwrite_all(self._fd, header, 0, self.path)
            os.ftruncate(self._fd, self.total)
            self._direct = UncachedAppender.open(self.path, self._fd, self.data_start, header)
        except BaseException:
            os.close(self._fd)
            raise
        self._sync = EarlySync(self._fd)
        self._next = self.data_start  # where the next byte in the file's order goes
        self.in_order = True

    def tensors(self) -> dict[str, TensorInfo]:
        """Every tensor's span in the file, as a reader of its header finds it."""
        return {k: TensorInfo(k, self.path.name, s.dtype, s.shape, self.data_start + self.offsets[k],
                              self.data_start + self.offsets[k] + s.nbytes) for k, s in self.specs.items()}

    def watch(self, observe: Callable[[bytes], None]) -> None:
        """Hand ``observe`` the file's bytes in order from its start: the header now, then each
        slice written in order, until the first one out of order. Before any slice is written."""
        if self._next != self.data_start or not self.in_order:
            raise RuntimeError(f"{self.path.name}: watched after its first slice")
        self._observe = observe
        observe(self._header)

    def write(self, key: str, data: bytes, index: int = 0, count: int = 1) -> None:
        """Write slice ``index`` of ``count`` equal slices of tensor ``key``."""
        spec = self.specs[key]
        step = spec.nbytes // count
        if len(data) != step:
            raise ValueError(f"{key}: slice of {len(data)} bytes, expected {step}")
        at = self.data_start + self.offsets[key] + index * step
        if self.in_order and at == self._next:
            if self._direct is not None:
                done = self._direct.write(data)
            else:
                done = pwrite_all(self._fd, data, at, self.path)
                self._sync.wrote(done)
            self._next += done
            if self._observe is not None:
                self._observe(data)
        else:
            self._out_of_order()
            done = pwrite_all(self._fd, data, at, self.path)
            self._sync.wrote(done)
        self._written[key] += done

    def _out_of_order(self) -> None:
        """The file's order is left: the direct writes end (their last block onto the file) and
        the observer hears no more."""
        if self._direct is not None:
            self._direct.finish()
            self._direct.close()
            self._direct = None
        self.in_order, self._observe = False, None

    def close(self) -> None:
        incomplete = [k for k, s in self.specs.items() if self._written[k] != s.nbytes]
        try:
            if incomplete:
                raise RuntimeError(f"{self.path.name}: tensors not fully written: {incomplete[:3]}")
            if self._direct is not None:
                self._direct.finish()
            self._sync.wait()
            os.fsync(self._fd)
        finally:
            self._release()

    def _release(self) -> None:
        if self._direct is not None:
            self._direct.close()
            self._direct = None
        os.close(self._fd)

    def __enter__(self) -> "SafetensorsWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            with contextlib.suppress(OSError):
                self._sync.wait()
            self._release()
