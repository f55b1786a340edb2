"""Atomic folder updates: stage beside the target, then swap the two directories in one step.

A sequence of ``os.replace`` calls is not atomic (between the MTP file and the index the folder
is neither old nor new), so every change is made in a staged copy of the folder — hard links for
unchanged files, symlinks kept as symlinks (a Hub cache snapshot is symlinks into a blob store
that must never be written through) — and the staged folder is exchanged with the target by
``renameat2(RENAME_EXCHANGE)`` on Linux or ``renamex_np(RENAME_SWAP)`` on macOS. Killed at any
moment, the target is the old folder or the new one; leftovers are hidden siblings that the next
run removes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
import sys
from pathlib import Path

from ..errors import InputError, RefusedError

STAGE_TAG = ".mtpforge-stage-"
OLD_TAG = ".mtpforge-old-"


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True) if name else ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def exchange(a: Path, b: Path) -> bool:
    """Swap two directories atomically. False when the platform or filesystem cannot."""
    libc = _libc()
    if libc is None:
        return False
    pa, pb = os.fsencode(a), os.fsencode(b)
    if sys.platform.startswith("linux") and hasattr(libc, "renameat2"):
        AT_FDCWD, RENAME_EXCHANGE = -100, 2
        rc = libc.renameat2(AT_FDCWD, pa, AT_FDCWD, pb, RENAME_EXCHANGE)
    elif sys.platform == "darwin" and hasattr(libc, "renamex_np"):
        RENAME_SWAP = 0x2
        rc = libc.renamex_np(pa, pb, RENAME_SWAP)
    else:
        return False
    if rc != 0:
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, getattr(errno, "EOPNOTSUPP", errno.ENOTSUP)):
            return False
        raise OSError(err, os.strerror(err), str(a))
    return True


def _fsync_dir(p: Path) -> None:
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def cleanup_leftovers(target: Path) -> list[Path]:
    """Remove staged or old copies of ``target`` left by a killed run."""
    removed = []
    parent = target.parent
    prefix = "." + target.name
    if not parent.is_dir():
        return removed
    for child in parent.iterdir():
        n = child.name
        if n.startswith(prefix) and (STAGE_TAG in n or OLD_TAG in n) and child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    return removed


def _mirror(src: Path, dst: Path) -> None:
    """Copy the tree's structure: hard links for files, symlinks re-created verbatim."""
    dst.mkdir()
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        rel = Path(dirpath).relative_to(src)
        for d in list(dirnames):
            s = Path(dirpath, d)
            if s.is_symlink():
                os.symlink(os.readlink(s), dst / rel / d)
                dirnames.remove(d)
            else:
                (dst / rel / d).mkdir()
        for f in filenames:
            s = Path(dirpath, f)
            t = dst / rel / f
            if s.is_symlink():
                os.symlink(os.readlink(s), t)
            else:
                try:
                    os.link(s, t)
                except OSError:
                    shutil.copy2(s, t)


class StagedFolder:
    """A staged copy of ``target`` to change freely, then commit in one step.

    With ``output`` the staged folder becomes a new folder there and ``target`` is untouched.
    """

    def __init__(self, target: Path, *, output: Path | None = None, empty: bool = False) -> None:
        self.target = Path(os.path.abspath(target))
        self.output = Path(os.path.abspath(output)) if output else None
        dest = self.output or self.target
        if dest.is_symlink():
            raise InputError(
                f"{dest} is a symlink; mtpforge does not write through symlinks",
                f"pass the real folder ({os.path.realpath(dest)}) or use --output DIR",
            )
        cleanup_leftovers(dest)
        self.stage = dest.parent / f".{dest.name}{STAGE_TAG}{os.getpid()}"
        if self.stage.exists():
            shutil.rmtree(self.stage)
        if empty:
            self.stage.mkdir()
        else:
            _mirror(self.target, self.stage)
        self.committed = False

    def path(self, rel: str) -> Path:
        return self.stage / rel

    def new_file(self, rel: str) -> Path:
        """A path to create a fresh file at: whatever the stage has there (a hard link to the
        user's file, a symlink into a blob store) is unlinked first, never written through."""
        p = self.stage / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink() or p.exists():
            p.unlink()
        return p

    def write_bytes(self, rel: str, data: bytes) -> Path:
        p = self.new_file(rel)
        with open(p, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return p

    def remove(self, rel: str) -> None:
        p = self.stage / rel
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)
        parent = p.parent
        while parent != self.stage and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent

    def restore_link(self, rel: str, link_target: str) -> None:
        p = self.new_file(rel)
        os.symlink(link_target, p)

    def commit(self) -> None:
        """Make the staged folder the target (or the output) in one atomic step."""
        _fsync_dir(self.stage)
        if self.output is not None:
            if self.output.exists():
                if any(self.output.iterdir()):
                    raise InputError(f"--output {self.output} is not empty", "pass a new or empty folder")
                self.output.rmdir()
            os.rename(self.stage, self.output)
            _fsync_dir(self.output.parent)
            self.committed = True
            return
        if not exchange(self.stage, self.target):
            # Fallback for filesystems without an exchange primitive: two renames with the old
            # folder kept until the new one is in place (the next run's cleanup finishes it).
            old = self.target.parent / f".{self.target.name}{OLD_TAG}{os.getpid()}"
            os.rename(self.target, old)
            os.rename(self.stage, self.target)
            self.stage = old
        _fsync_dir(self.target.parent)
        self.committed = True
        shutil.rmtree(self.stage, ignore_errors=True)

    def abort(self) -> None:
        if not self.committed and self.stage.exists():
            shutil.rmtree(self.stage, ignore_errors=True)

    def __enter__(self) -> "StagedFolder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


def check_writable_parent(dest: Path) -> None:
    parent = Path(os.path.abspath(dest)).parent
    if not os.access(parent, os.W_OK):
        raise RefusedError(
            f"cannot write beside {dest} (mtpforge stages its changes in {parent})",
            "make that folder writable, or use --output DIR elsewhere",
        )
