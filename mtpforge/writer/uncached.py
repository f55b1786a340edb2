"""A file's data region written past the operating system's page cache, where it has a way.

A giant head's output is tens of GB written once and read back by nobody in this run. Through the
page cache every byte is first copied into the kernel's memory: on the 2-core machine the
benchmarks run on that copy ran at ~1 GB/s of kernel CPU (23.6 GB of float16 head: ~20 s of the
run's CPU, more than converting it), where the disk takes the same bytes at ~2.8 GB/s straight from
the process's memory (``O_DIRECT``). So the bytes are gathered in a page-aligned buffer and written
in whole aligned blocks with ``O_DIRECT``; what is not a whole block (the header's last partial
block, rewritten as it is, and the file's tail) goes through the ordinary descriptor.

Only where the platform and the file system take it: an ``open`` refused (no ``O_DIRECT``, as on
macOS, or a file system without it) gives None and the caller writes as before; a direct write
refused later (``EINVAL``) moves the rest to the ordinary descriptor, bytes unchanged. Durability is
the caller's, as before: the final fsync covers both descriptors' writes (they share the file).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from pathlib import Path

#: alignment of every direct write's offset, size and buffer (a page: covers 512- and 4096-byte
#: logical blocks)
ALIGN = 4096
#: bytes gathered before a direct write: large writes keep the disk busy, one at a time
STAGE = 8 << 20


class UncachedAppender:
    """Appends bytes from ``start`` on (the bytes before it, ``head``, already written): whole
    aligned blocks with ``O_DIRECT``, the unaligned rest through the ordinary descriptor ``fd``."""

    def __init__(self, direct_fd: int, fd: int, start: int, head: bytes) -> None:
        self._direct: int | None = direct_fd
        self._fd = fd
        self._stage = mmap.mmap(-1, STAGE)  # anonymous memory: page-aligned, reused for every block
        self._view = memoryview(self._stage)
        self._base = start - start % ALIGN  # file offset of the stage's first byte
        self._fill = start - self._base  # the header's last partial block, written again as it is
        self._view[:self._fill] = head[len(head) - self._fill:]
        self.position = start

    @classmethod
    def open(cls, path: Path, fd: int, start: int, head: bytes) -> "UncachedAppender | None":
        """None where direct I/O is not to be had for ``path`` (no ``O_DIRECT`` on this platform, or
        its file system refuses it): the caller then writes through ``fd`` as before."""
        flag = getattr(os, "O_DIRECT", 0)
        if not flag or len(head) != start:
            return None
        try:
            direct = os.open(path, os.O_WRONLY | flag)
        except OSError:
            return None
        return cls(direct, fd, start, head)

    def write(self, b: "bytes | memoryview") -> int:
        src, n, done = memoryview(b).cast("B"), len(b), 0
        while done < n:
            k = min(n - done, STAGE - self._fill)
            self._view[self._fill:self._fill + k] = src[done:done + k]
            self._fill += k
            done += k
            if self._fill == STAGE:
                self._flush_blocks(STAGE)
        self.position += n
        return n

    def finish(self) -> None:
        """Everything gathered onto the file: the whole blocks directly, the tail through ``fd``."""
        whole = self._fill - self._fill % ALIGN
        if whole:
            self._flush_blocks(whole)
        if self._fill:
            _pwrite_all(self._fd, self._view[:self._fill], self._base)
            self._base += self._fill
            self._fill = 0

    def close(self) -> None:
        if self._direct is not None:
            os.close(self._direct)
            self._direct = None
        # after a failed write (a full disk) the error's traceback still holds views of the stage:
        # the memory then goes with them
        with contextlib.suppress(BufferError):
            self._view.release()
            self._stage.close()

    def _flush_blocks(self, n: int) -> None:
        """The stage's first ``n`` bytes (whole blocks) onto the file, the rest moved to its start."""
        if self._direct is not None:
            try:
                _pwrite_all(self._direct, self._view[:n], self._base)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                os.close(self._direct)  # the file system takes no direct write after all
                self._direct = None
        if self._direct is None:
            _pwrite_all(self._fd, self._view[:n], self._base)
        rest = self._fill - n
        if rest:
            self._view[:rest] = self._view[n:self._fill]
        self._base += n
        self._fill = rest


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):  # a short write is legal; a full disk then raises ENOSPC
        k = os.pwrite(fd, data[done:], offset + done)
        if k <= 0:
            raise OSError(errno.ENOSPC, "no progress writing")
        done += k


__all__ = ["UncachedAppender", "ALIGN", "STAGE"]
