"""A span of a file read past the operating system's page cache, where it has a way.

A giant head's download is written once (with direct I/O: ``checkpoint.fetch``) and read once by
the conversion, row block by row block. Read through the page cache, every byte is copied by the
kernel twice (disk into its cache, its cache into the process), and on the 2-core machine the
benchmarks run on, the kernel's copies cost ~1.5 ns a byte of CPU: a ``perf`` profile of a
full-size head's download found the copies of the run's cache write and of the loopback server's
read at ~60% of the machine's CPU, the conversion's own work a few percent. With ``O_DIRECT`` the
disk puts the bytes straight into a page-aligned buffer of the process (the span widened to whole
4 KiB blocks), and the one copy left is the process's own, out of that buffer.

Only where the platform and the file system take it: no ``O_DIRECT`` (macOS) or a file system that
refuses it (tmpfs, some network file systems) reads as before, through the page cache. Same bytes
either way; what the page cache holds still counts, since the kernel writes back a dirty page
before a direct read of it.
"""

from __future__ import annotations

import mmap
import os
import threading

# the direct writes' alignment and refusals hold for direct reads too
from ..writer.uncached import ALIGN, REFUSED

#: the largest buffer a thread keeps between reads (row blocks are a few MiB); a larger span gets
#: a buffer of its own, returned to the system after the read
KEEP = 32 << 20
_local = threading.local()


def read_span(path: str, offset: int, n: int) -> bytes:
    """Bytes ``[offset, offset + n)`` of ``path`` (fewer where the file ends sooner)."""
    flag = getattr(os, "O_DIRECT", 0)
    if flag and n > 0:
        try:
            fd = os.open(path, os.O_RDONLY | flag)
        except OSError as e:
            if e.errno not in REFUSED:
                raise
        else:
            try:
                return _direct(fd, offset, n)
            except OSError as e:
                if e.errno not in REFUSED:
                    raise
            finally:
                os.close(fd)
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def _direct(fd: int, offset: int, n: int) -> bytes:
    start = offset - offset % ALIGN
    size = -(-(offset + n - start) // ALIGN) * ALIGN
    buf = _buffer(size)
    view = memoryview(buf)[:size]
    try:
        got = 0
        while got < size:
            k = os.preadv(fd, [view[got:]], start + got)
            got += k
            if k == 0 or got % ALIGN:  # the file's end (a direct read may end mid-block only there)
                break
        skip = offset - start
        return bytes(view[skip:skip + max(0, min(n, got - skip))])
    finally:
        view.release()
        if size > KEEP:
            buf.close()


def _buffer(size: int) -> mmap.mmap:
    """A page-aligned buffer of at least ``size`` bytes: the thread's own, grown as needed, up to
    ``KEEP``."""
    if size > KEEP:
        return mmap.mmap(-1, size)
    buf: mmap.mmap | None = getattr(_local, "buf", None)
    if buf is None or len(buf) < size:
        if buf is not None:
            buf.close()
        buf = _local.buf = mmap.mmap(-1, max(size, 1 << 20))
    return buf


__all__ = ["read_span", "ALIGN"]
