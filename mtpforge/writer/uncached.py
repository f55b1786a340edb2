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
refused later (``EINVAL``, ``EOPNOTSUPP``) moves the rest to the ordinary descriptor, bytes
unchanged. Durability is the caller's, as before: the final fsync covers both descriptors' writes
(they share the file).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from concurrent.futures import Future
from pathlib import Path

from .ahead import named_pool

#: alignment of every direct write's offset, size and buffer (a page: covers 512- and 4096-byte
#: logical blocks)
ALIGN = 4096
#: bytes gathered before a direct write: large writes keep the disk busy, one at a time
STAGE = 8 << 20
#: how a file system that opened a file for direct I/O refuses its reads or writes after all
#: (FUSE and some network file systems): the rest then goes through the ordinary descriptor
REFUSED = frozenset({errno.EINVAL, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)})


class UncachedAppender:
    """Appends bytes from ``start`` on (the bytes before it, ``head``, already written): whole
    aligned blocks with ``O_DIRECT``, the unaligned rest through the ordinary descriptor ``fd``."""

    def __init__(self, direct_fd: int, fd: int, start: int, head: bytes, pool: str = "direct") -> None:
        self._direct: int | None = direct_fd
        self._fd = fd
        self._pool = pool
        # two stages of anonymous memory (page-aligned, reused): one fills while the other is
        # written in a thread of its own, so the disk's time overlaps the caller's
        self._stages = [mmap.mmap(-1, STAGE) for _ in range(2)]
        self._views = [memoryview(m) for m in self._stages]
        self._view = self._views[0]
        self._pending: Future[None] | None = None
        self._base = start - start % ALIGN  # file offset of the stage's first byte
        self._fill = start - self._base  # the header's last partial block, written again as it is
        self._view[:self._fill] = head[len(head) - self._fill:]
        self.position = start

    @classmethod
    def open(cls, path: Path, fd: int, start: int, head: bytes, pool: str = "direct") -> "UncachedAppender | None":
        """None where direct I/O is not to be had for ``path`` (no ``O_DIRECT`` on this platform, or
        its file system refuses it): the caller then writes through ``fd`` as before. ``pool`` names
        the thread that writes the stages: writers of different files that run at once (a download
        and the output it feeds) each take their own, so neither waits behind the other's disk."""
        flag = getattr(os, "O_DIRECT", 0)
        if not flag or len(head) != start:
            return None
        try:
            direct = os.open(path, os.O_WRONLY | flag)
        except OSError:
            return None
        return cls(direct, fd, start, head, pool)

    def write(self, b: "bytes | memoryview") -> int:
        src, n, done = memoryview(b).cast("B"), len(b), 0
        while done < n:
            k = min(n - done, STAGE - self._fill)
            self._view[self._fill:self._fill + k] = src[done:done + k]
            self._fill += k
            done += k
            if self._fill == STAGE:  # a full stage goes to the disk while the other fills
                self._wait()
                self._pending = named_pool(self._pool, 1).submit(self._put, self._view, self._base)
                self._view = self._views[1] if self._view is self._views[0] else self._views[0]
                self._base += STAGE
                self._fill = 0
        self.position += n
        return n

    def finish(self) -> None:
        """Everything gathered onto the file: the whole blocks directly, the tail through ``fd``."""
        self._wait()
        whole = self._fill - self._fill % ALIGN
        if whole:
            self._put(self._view[:whole], self._base)
        if self._fill > whole:
            pwrite_all(self._fd, self._view[whole:self._fill], self._base + whole)
        self._base += self._fill
        self._fill = 0

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a write that failed: its error was the caller's
            self._wait()
        if self._direct is not None:
            os.close(self._direct)
            self._direct = None
        # after a failed write (a full disk) the error's traceback still holds views of a stage:
        # the memory then goes with them
        with contextlib.suppress(BufferError):
            for v, m in zip(self._views, self._stages):
                v.release()
                m.close()

    def _wait(self) -> None:
        """The stage being written is on the file (its error raised here)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _put(self, data: memoryview, offset: int) -> None:
        """Whole blocks onto the file: directly, or through ``fd`` once direct writes are refused."""
        if self._direct is not None:
            try:
                pwrite_all(self._direct, data, offset)
                return
            except OSError as e:
                if e.errno not in REFUSED:
                    raise
                os.close(self._direct)  # the file system takes no direct write after all
                self._direct = None
        pwrite_all(self._fd, data, offset)


def pwrite_all(fd: int, data: "bytes | memoryview", offset: int, name: object = "the file") -> int:
    """All of ``data`` at ``offset``: a short write is legal, and a write that makes no progress
    (a full disk) raises ENOSPC naming ``name``."""
    view, done = memoryview(data), 0
    while done < len(view):
        k = os.pwrite(fd, view[done:], offset + done)
        if k <= 0:
            raise OSError(errno.ENOSPC, f"no progress writing {name}")
        done += k
    return done


__all__ = ["UncachedAppender", "pwrite_all", "ALIGN", "REFUSED", "STAGE"]
