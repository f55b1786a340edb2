"""A store is a read-only view of a checkpoint's files, local or remote.

The catalogue, inspect and the fetcher only ever talk to this protocol, so the same code reads a
local folder and a Hub repo (where only headers and wanted byte ranges travel).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..errors import CorruptFileError, InputError


@runtime_checkable
class Store(Protocol):
    """Read access to the files of one checkpoint (one revision)."""

    @property
    def name(self) -> str:
        """Human name: a path or ``org/repo@sha``."""

    def list_files(self) -> list[str]:
        """Relative POSIX paths of every file (recursive)."""

    def exists(self, rel: str) -> bool: ...

    def size(self, rel: str) -> int: ...

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a file; must return exactly end - start bytes or raise."""

    def read_bytes(self, rel: str) -> bytes: ...


def safe_relpath(rel: str) -> str:
    """Refuse names that would escape the checkpoint (``../``, absolute paths) — they come from
    untrusted index files."""
    if not rel or rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":"):
        raise CorruptFileError(
            f"file name {rel!r} in the checkpoint is absolute or empty",
            "the index must name files inside the model folder; re-download or fix the index",
        )
    parts = rel.replace("\\", "/").split("/")
    if any(p in ("..", "") for p in parts):
        raise CorruptFileError(
            f"file name {rel!r} in the checkpoint points outside the model folder",
            "the index must name files inside the model folder; re-download or fix the index",
        )
    return "/".join(parts)


class LocalStore:
    """A model folder on disk (symlinks into a Hub blob store are followed for reading only)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        if not self.root.exists():
            raise InputError(f"{self.root} does not exist", "pass the path of a model folder")
        if not self.root.is_dir():
            raise InputError(
                f"{self.root} is a file, not a model folder",
                "pass the folder that holds config.json and the *.safetensors files",
            )

    @property
    def name(self) -> str:
        return str(self.root)

    def path(self, rel: str) -> Path:
        return self.root / safe_relpath(rel)

    def list_files(self) -> list[str]:
        out: list[str] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for fn in filenames:
                out.append(Path(dirpath, fn).relative_to(self.root).as_posix())
        return sorted(out)

    def exists(self, rel: str) -> bool:
        try:
            return self.path(rel).is_file()
        except OSError:  # a name the filesystem cannot hold (too long, a NUL): no such file
            return False

    def size(self, rel: str) -> int:
        try:
            return self.path(rel).stat().st_size
        except FileNotFoundError:
            raise
        except OSError as e:  # a symlink loop, a directory, no permission: a damaged folder, not a bug
            raise _unreadable(rel, e) from None

    def _open(self, rel: str):  # type: ignore[no-untyped-def]
        """Open a regular file for reading. A FIFO or device named like a shard would block the
        run forever (or read endlessly): it is refused without waiting for a writer."""
        fd = os.open(self.path(rel), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CorruptFileError(f"{rel} is not a regular file (a FIFO, socket or device)",
                                       f"replace {rel} with the real file (re-download it)")
        except BaseException:
            os.close(fd)
            raise
        return os.fdopen(fd, "rb")

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        try:
            with self._open(rel) as f:
                f.seek(start)
                data = f.read(end - start)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise _unreadable(rel, e) from None
        if len(data) != end - start:
            raise CorruptFileError(
                f"{rel} is truncated: wanted bytes {start}..{end}, file has {self.size(rel)}",
                "re-download the file",
            )
        return data

    def read_bytes(self, rel: str) -> bytes:
        try:
            with self._open(rel) as f:
                return f.read()
        except FileNotFoundError:
            raise
        except OSError as e:
            raise _unreadable(rel, e) from None


def _unreadable(rel: str, e: OSError) -> CorruptFileError:
    return CorruptFileError(f"cannot read {rel}: {e.strerror or e}",
                            f"replace {rel} with a regular file (re-download it)")


def read_json(store: Store, rel: str) -> dict[str, Any]:
    """A JSON object from the store, or one clear error."""
    try:
        raw = store.read_bytes(rel)
    except FileNotFoundError as e:
        raise InputError(f"{store.name} has no {rel}", "pass a model folder or repo that has it") from e
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptFileError(
            f"{rel} in {store.name} is not valid JSON ({e.__class__.__name__}: {e})",
            f"repair or re-download {rel}",
        ) from e
    except RecursionError:
        raise CorruptFileError(f"{rel} in {store.name} is not valid JSON (nested too deeply)",
                               f"repair or re-download {rel}") from None
    if not isinstance(obj, dict):
        raise CorruptFileError(f"{rel} in {store.name} is not a JSON object", f"repair or re-download {rel}")
    return obj
