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
import stat
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import InputError, RefusedError

#: errnos of a full disk: no bytes, no inodes (also ENOSPC), a quota
_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))

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


def rmtree(path: Path) -> None:
    """Remove a tree even where a folder in it is read-only (a read-only model folder's old copy
    after the swap): never leave an undeletable leftover beside the user's folder."""
    def retry(func, p, _exc):  # type: ignore[no-untyped-def]
        try:
            parent = os.path.dirname(p)
            os.chmod(parent, stat.S_IMODE(os.lstat(parent).st_mode) | stat.S_IRWXU)
            if func is not os.rmdir and os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, stat.S_IMODE(os.lstat(p).st_mode) | stat.S_IRWXU)
            func(p)
        except OSError:
            pass
    if os.path.lexists(path):
        if not os.path.islink(path):
            try:
                os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | stat.S_IRWXU)
            except OSError:
                pass
        shutil.rmtree(path, onerror=retry)


def _copy_owner_mode(ref: os.stat_result, dst: Path, *, writable: bool) -> None:
    """Give ``dst`` the mode bits (setgid included) and group of ``ref``; while staging the
    owner keeps write access, the exact mode comes at commit. A group that cannot be kept is
    refused: the new folder must not be readable by other people than the old one was."""
    mode = stat.S_IMODE(ref.st_mode) | (stat.S_IRWXU if writable else 0)
    st = os.lstat(dst)
    if (st.st_uid, st.st_gid) != (ref.st_uid, ref.st_gid):
        try:
            os.chown(dst, ref.st_uid if st.st_uid != ref.st_uid else -1, ref.st_gid if st.st_gid != ref.st_gid else -1)
        except OSError:
            who = f"another user (uid {ref.st_uid})" if st.st_uid != ref.st_uid else f"a group this user is not in (gid {ref.st_gid})"
            raise RefusedError(
                f"the folder belongs to {who}, and the new copy mtpforge swaps in would not: nothing was changed",
                "run mtpforge as the folder's owner (or a member of its group), or use --output DIR") from None
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(dst, mode)


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
        rmtree(child)
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


def check_disk_space(dest: Path, need: int, elsewhere: str = "use --output DIR on another disk") -> None:
    """Refuse before writing anything when the staged files cannot fit beside ``dest``."""
    dest = Path(os.path.abspath(dest))
    where = dest if dest.is_dir() else dest.parent
    free = free_bytes(where)
    if free < need:
        raise RefusedError(
            f"not enough disk space: {need:,} bytes ({need / 2**20:,.1f} MiB) needed beside {dest}, "
            f"{free:,} bytes free",
            f"free at least {need - free:,} bytes on that disk, or {elsewhere}",
            code="NO_SPACE",
        )


def check_download_room(cache: Path, need: int, beside: tuple[Path, int] | None = None) -> None:
    """Refuse before downloading when ``need`` bytes cannot fit in the download cache ``cache``
    (its nearest existing folder): a giant head's gigabytes would otherwise fail at the disk's
    end, minutes in. ``beside``, the output's folder and size, counts too where it shares the
    cache's disk (one internal disk, as most Macs have: each fitting alone is not both fitting)."""
    from ..cells import human_bytes

    where = _existing(cache)
    free, what = free_bytes(where), f"{need:,} bytes ({human_bytes(need)}) needed under {cache}"
    if beside is not None and os.stat(_existing(beside[0])).st_dev == os.stat(where).st_dev:
        need += beside[1]
        what = (f"{need:,} bytes ({human_bytes(need)}) needed on one disk: the download under {cache} and "
                f"the head beside {beside[0]}")
    if free < need:
        raise RefusedError(f"not enough disk space for the download: {what}, {free:,} bytes free",
                           "free some space, or point HF_HOME / HF_HUB_CACHE to a larger disk", code="NO_SPACE")


def _existing(path: Path) -> Path:
    """``path``, or its nearest folder that exists."""
    where = Path(os.path.abspath(path))
    while not where.exists() and where != where.parent:
        where = where.parent
    return where


def _link_or_copy(s: Path, t: Path, dst: Path) -> None:
    try:
        os.link(s, t)
    except OSError as e:
        if e.errno in _FULL:
            raise  # no space or no free inodes: the disk is full, hard links or not
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


def _mirror(src: Path, dst: Path, *, elsewhere: bool = False) -> None:
    """Copy the tree's structure: hard links for files, symlinks re-created verbatim, folders
    with their mode and group (writable by the owner until the commit)."""
    dst.mkdir()
    _copy_owner_mode(os.stat(src), dst, writable=True)
    root = Path(os.path.realpath(src))
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        rel = Path(dirpath).relative_to(src)
        for d in list(dirnames):
            s = Path(dirpath, d)
            if s.is_symlink():
                os.symlink(os.readlink(s), dst / rel / d)
                dirnames.remove(d)
            else:
                (dst / rel / d).mkdir()
                _copy_owner_mode(os.stat(s), dst / rel / d, writable=True)
        for f in filenames:
            s = Path(dirpath, f)
            t = dst / rel / f
            if s.is_symlink():
                real = Path(os.path.realpath(s))
                if elsewhere and not (real == root or root in real.parents):
                    # a new folder elsewhere (--output from a Hub cache snapshot): a relative link
                    # into the blob store would dangle there, so the file itself comes along
                    if not real.is_file():
                        raise RefusedError(f"{s.relative_to(src)} in {src.name} is a broken symlink",
                                           "re-download the model (the file it points to is missing)")
                    _link_or_copy(real, t, dst)
                else:
                    os.symlink(os.readlink(s), t)
            else:
                _link_or_copy(s, t, dst)


#: folders this process has committed a change to (the CLI's Ctrl-C message tells the truth)
COMMITTED: list[Path] = []


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Ctrl-C during the swap and the removal of the old copy is taken after them: the change
    is then complete and reported as such, never half-reported as "left as it was"."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, _frame: pending.append(signum))
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            raise KeyboardInterrupt


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
        if dest.is_dir() and os.path.ismount(dest):
            raise RefusedError(
                f"{dest} is a mount point: mtpforge stages a copy beside the folder and swaps the two, which cannot cross a mount",
                "use --output DIR to write a new folder, or pass a folder inside the mount")
        cleanup_leftovers(dest)
        busy = live_stages(dest)
        if busy:
            raise RefusedError(
                f"another mtpforge run is changing {dest} right now (its staged copy is {busy[0].name})",
                f"wait for it to finish; if no mtpforge is running, delete {busy[0]}")
        self.stage = dest.parent / f".{dest.name}{STAGE_TAG}{os.getpid()}"
        if len(os.fsencode(self.stage.name)) > 255:
            raise InputError(f"the folder name {dest.name[:40]!r}… is too long for the staged copy mtpforge makes beside it",
                             "rename the folder (at most 220 bytes), or use --output DIR with a shorter name")
        self.committed = False
        if self.stage.exists():
            rmtree(self.stage)
        # the folder the result takes its mode and group from: the one it replaces
        ref = self.output if self.output is not None and self.output.is_dir() else \
            self.target if self.target.is_dir() else None
        self.ref_root = ref
        try:
            if empty:
                self.stage.mkdir()
                if ref is not None:
                    _copy_owner_mode(os.stat(ref), self.stage, writable=True)
            else:
                _mirror(self.target, self.stage, elsewhere=self.output is not None)
        except BaseException as e:
            rmtree(self.stage)
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

    def _settle_modes(self) -> None:
        """New files take the mode and group of the file they replace (else of config.json),
        folders exactly those of the folder they replace: a 0700 folder stays 0700, a
        read-only one read-only, a group-shared one in its group."""
        ref_root = self.ref_root
        if ref_root is None:
            return
        fallback = ref_root / "config.json"
        dirs: list[tuple[Path, os.stat_result]] = []
        for dirpath, dirnames, filenames in os.walk(self.stage):
            rel = Path(dirpath).relative_to(self.stage)
            for f in filenames:
                p = Path(dirpath, f)
                st = os.lstat(p)
                if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
                    continue  # a symlink, or a hard link to the user's own file: already theirs
                for cand in (ref_root / rel / f, fallback):
                    if cand.is_file() and not cand.is_symlink():
                        r = os.stat(cand)
                        _copy_owner_mode(r, p, writable=False)
                        break
            ref_dir = ref_root / rel
            while not ref_dir.is_dir() and ref_dir != ref_root:
                ref_dir = ref_dir.parent
            dirs.append((Path(dirpath), os.stat(ref_dir)))
        for d, r in reversed(dirs):  # deepest first: a read-only parent is set last
            _copy_owner_mode(r, d, writable=False)

    def commit(self) -> None:
        """Make the staged folder the target (or the output) in one atomic step."""
        self._settle_modes()
        for dirpath, _, _ in os.walk(self.stage):
            _fsync_dir(Path(dirpath))
        with _sigint_deferred():
            self._swap()
            COMMITTED.append(self.output or self.target)
            if self.stage.exists():
                rmtree(self.stage)

    def _swap(self) -> None:
        if self.output is not None:
            if self.output.exists():
                if self.output.is_symlink() or not self.output.is_dir() or any(self.output.iterdir()):
                    raise InputError(f"--output {self.output} is not an empty folder", "pass a new or empty folder")
                # the user's empty folder is swapped out, never removed first: no moment without it
                if exchange(self.stage, self.output):
                    _fsync_dir(self.output.parent)
                    self.committed = True
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

    def abort(self) -> None:
        if not self.committed and self.stage.exists():
            rmtree(self.stage)

    def __enter__(self) -> "StagedFolder":
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.abort()
        no_space = _no_space(exc, self.output or self.target)
        if no_space is not None:
            raise no_space from None


def _no_space(e: BaseException | None, dest: Path) -> RefusedError | None:
    """A full disk (no bytes or no inodes left), a quota or a file larger than the filesystem
    allows, while staging, is the user's situation, not a bug: one line, and the folder was not
    touched (the stage is already gone)."""
    if isinstance(e, OSError) and e.errno == errno.EFBIG:
        return RefusedError(f"a file is larger than the filesystem beside {dest} allows (EFBIG); nothing was changed",
                            "use --output DIR on a filesystem without that limit (FAT32 holds at most 4 GiB per file)",
                            code="NO_SPACE")
    if isinstance(e, OSError) and e.errno in _FULL:
        return RefusedError(f"the disk filled up while staging the change beside {dest} (no free space or no free inodes); "
                            "nothing was changed", "free some space, or use --output DIR on another disk", code="NO_SPACE")
    return None


def check_writable_parent(dest: Path) -> None:
    parent = Path(os.path.abspath(dest)).parent
    if not os.access(parent, os.W_OK):
        raise RefusedError(
            f"cannot write beside {dest} (mtpforge stages its changes in {parent})",
            "make that folder writable, or use --output DIR elsewhere",
        )
