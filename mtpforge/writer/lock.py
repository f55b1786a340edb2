"""One mtpforge run per model folder, from the first read to the commit.

A run reads the folder, fetches for minutes, stages and swaps; a second run on the same folder
that read it before the first one's swap would stage from a folder it no longer knows and record
the first run's head as "how it was before" (the original is then lost for good). So the whole
run holds an advisory ``flock`` on the folder itself: no lock file is written anywhere, a killed
run's lock dies with it, and it works the same on Linux and macOS.

The swap replaces the folder's inode; a run that waited on the old one re-checks after locking
and, if the path now names a new folder, the lock it holds protects nothing: it is refused too
(the other run changed the folder under it).
"""

from __future__ import annotations

import errno
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import RefusedError


def _busy(path: Path) -> RefusedError:
    return RefusedError(f"another mtpforge run is changing {path} right now",
                        "wait for it to finish, then run this command again", code="BUSY")


@contextmanager
def folder_lock(path: Path, *, shared: bool = False) -> Iterator[None]:
    """Hold ``path`` (a folder) against other mtpforge runs: exclusive for runs that change it,
    shared for runs that only read it (``--output``). Refuses at once when another run holds it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        yield  # not a readable folder: the command itself says what is wrong
        return
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise _busy(path) from None
            if e.errno in (errno.ENOLCK, errno.ENOTSUP, getattr(errno, "EOPNOTSUPP", errno.ENOTSUP)):
                yield  # a filesystem without locks (some network mounts): the stage check remains
                return
            raise
        try:
            st = os.stat(path)
        except OSError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != (lambda s: (s.st_dev, s.st_ino))(os.fstat(fd)):
            raise _busy(path)
        yield
    finally:
        os.close(fd)
