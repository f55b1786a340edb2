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


#: set to 1 to use the two-rename fallback even where an exchange primitive exists (a filesystem
#: that misreports support; and the crash tests of the fallback)
NO_EXCHANGE_ENV = "MTPFORGE_NO_EXCHANGE"


def exchange(a: Path, b: Path) -> bool:
    """Swap two directories atomically. False when the platform or filesystem cannot."""
    if os.environ.get(NO_EXCHANGE_ENV) == "1":
        return False
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


def _leftover_pid(name: str, target_name: str) -> tuple[str, int] | None:
    """(tag, pid) when ``name`` is exactly a staged or old copy of ``target_name``."""
    for tag in (STAGE_TAG, OLD_TAG):
        head = f".{target_name}{tag}"
        if name.startswith(head) and name[len(head):].isdigit():
            return tag, int(name[len(head):])
    return None


def _alive(pid: int) -> bool:
    """Whether another process with this pid runs (then its stage may be in use: leave it)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def cleanup_leftovers(target: Path) -> list[Path]:
    """Finish what a killed run left beside ``target``, before anything else reads it.

    A stage is garbage (the old folder is still the target, or the stage holds the old folder
    after a swap). After a kill between the two renames of the fallback swap the target is
    absent and the old folder waits under its hidden name: it is put back (the run is rolled
    back; its stage is dropped). Only names exactly ours are touched (``.model2…`` is not
    ``.model``'s), and never the stage of a run that is still alive.
    """
    removed: list[Path] = []
    target = Path(os.path.abspath(target))
    parent = target.parent
    if not parent.is_dir():
        return removed
    mine = []
    for child in parent.iterdir():
        hit = _leftover_pid(child.name, target.name)
        if hit and child.is_dir() and not child.is_symlink() and not _alive(hit[1]):
            mine.append((hit[0], child))
    if not os.path.lexists(target):
        olds = [c for tag, c in mine if tag == OLD_TAG]
        if olds:
            os.rename(olds[0], target)
            _fsync_dir(parent)
            mine = [(t, c) for t, c in mine if c != olds[0]]
    for _, child in mine:
        shutil.rmtree(child, ignore_errors=True)
        removed.append(child)
    return removed


def live_stages(target: Path) -> list[Path]:
    """Stages of ``target`` that belong to mtpforge runs still alive (not this one)."""
    target = Path(os.path.abspath(target))
    if not target.parent.is_dir():
        return []
    out = []
    for child in sorted(target.parent.iterdir()):
        hit = _leftover_pid(child.name, target.name)
        if hit and hit[0] == STAGE_TAG and hit[1] != os.getpid() and _alive(hit[1]):
            out.append(child)
    return out


def free_bytes(path: Path) -> int:
    """Free space on the filesystem holding ``path`` (the one place the pipeline asks)."""
    return shutil.disk_usage(path).free


def check_disk_space(dest: Path, need: int) -> None:
    """Refuse before writing anything when the staged files cannot fit beside ``dest``."""
    dest = Path(os.path.abspath(dest))
    where = dest if dest.is_dir() else dest.parent
    free = free_bytes(where)
    if free < need:
        raise RefusedError(
            f"not enough disk space: {need:,} bytes ({need / 2**20:,.1f} MiB) needed beside {dest}, "
            f"{free:,} bytes free",
            f"free at least {need - free:,} bytes on that disk, or use --output DIR on another disk",
            code="NO_SPACE",
        )


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
                    # a filesystem without hard links (FAT, exFAT, some network mounts): a real
                    # copy, so the space check of the run never counted it; never fill the disk
                    size = s.stat().st_size
                    if free_bytes(dst) < size + (64 << 20):
                        raise RefusedError(
                            f"not enough disk space to stage a copy of {s.name} ({size:,} bytes): this filesystem "
                            "has no hard links, so mtpforge must copy every file of the folder",
                            "free space for a second copy of the model, or use --output DIR on a filesystem with hard links",
                            code="NO_SPACE") from None
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
        busy = live_stages(dest)
        if busy:
            raise RefusedError(
                f"another mtpforge run is changing {dest} right now (its staged copy is {busy[0].name})",
                f"wait for it to finish; if no mtpforge is running, delete {busy[0]}")
        self.stage = dest.parent / f".{dest.name}{STAGE_TAG}{os.getpid()}"
        self.committed = False
        if self.stage.exists():
            shutil.rmtree(self.stage)
        try:
            if empty:
                self.stage.mkdir()
            else:
                _mirror(self.target, self.stage)
        except BaseException as e:
            shutil.rmtree(self.stage, ignore_errors=True)
            no_space = _no_space(e, dest)
            if no_space is not None:
                raise no_space from None
            raise

    def path(self, rel: str) -> Path:
        """``rel`` inside the stage. Names come from manifests and indexes that may be hostile:
        an absolute path or ``..`` would make ``stage / rel`` point anywhere on the disk."""
        parts = rel.replace("\\", "/").split("/")
        if not rel or os.path.isabs(rel) or rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":") \
                or any(part in ("", ".", "..") for part in parts) or "\0" in rel:
            raise RefusedError(f"refusing to touch {rel!r}: it is not a path inside {self.target.name}",
                               "the file naming it (mtpforge.json or the index) is damaged or hostile; restore it")
        cur = self.stage
        for part in parts[:-1]:  # a symlinked folder on the way would lead outside the stage
            cur = cur / part
            if cur.is_symlink():
                raise RefusedError(f"refusing to touch {rel!r}: {part} is a symlink, and mtpforge never writes through symlinks",
                                   f"replace the symlink {part} in {self.target.name} with a real folder")
        return self.stage.joinpath(*parts)

    def new_file(self, rel: str) -> Path:
        """A path to create a fresh file at: whatever the stage has there (a hard link to the
        user's file, a symlink into a blob store) is unlinked first, never written through."""
        p = self.path(rel)
        if p.is_dir() and not p.is_symlink():
            raise RefusedError(f"{rel} in {self.target.name} is a folder, where mtpforge must write a file",
                               f"move the folder {rel} away (a file of that name belongs there)")
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
        p = self.path(rel)
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
        for dirpath, _, _ in os.walk(self.stage):
            _fsync_dir(Path(dirpath))
        if self.output is not None:
            if self.output.exists():
                if self.output.is_symlink() or not self.output.is_dir() or any(self.output.iterdir()):
                    raise InputError(f"--output {self.output} is not an empty folder", "pass a new or empty folder")
                # the user's empty folder is swapped out, never removed first: no moment without it
                if exchange(self.stage, self.output):
                    _fsync_dir(self.output.parent)
                    self.committed = True
                    shutil.rmtree(self.stage, ignore_errors=True)
                    return
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

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.abort()
        no_space = _no_space(exc, self.output or self.target)
        if no_space is not None:
            raise no_space from None


def _no_space(e: BaseException | None, dest: Path) -> RefusedError | None:
    """A full disk while staging is the user's situation, not a bug: one line, and the folder
    was not touched (the stage is already gone)."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return RefusedError(f"the disk filled up while staging the change beside {dest}; nothing was changed",
                            "free some space, or use --output DIR on another disk", code="NO_SPACE")
    return None


def check_writable_parent(dest: Path) -> None:
    parent = Path(os.path.abspath(dest)).parent
    if not os.access(parent, os.W_OK):
        raise RefusedError(
            f"cannot write beside {dest} (mtpforge stages its changes in {parent})",
            "make that folder writable, or use --output DIR elsewhere",
        )
