"""The GGUF write's commit order and its leftover sweep, under one lock per target folder.

add-mtp writes three things beside a trunk: the head, its record (``<head>.mtpforge.json``) and
the card's section. The head is renamed into place first; then the record, staged complete
before that rename, is renamed in; then the card. A kill at any moment therefore never leaves a
record (or a card section) for a head that does not exist. A kill between the head's and the
record's rename leaves the staged record: the next run in the folder renames it in when the head
in place is the one it records (rolled forward), else removes it, with every other temporary
file a killed run left (the head's, the record's, the card's). The sweep runs under the folder's
lock, so every temporary file it finds belongs to a run that is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from .write import TMP_MARK, file_sha256, tmp_path_for

RECORD_SUFFIX = ".mtpforge.json"


def stage_json(path: Path, obj: dict[str, Any]) -> Path:
    """``obj`` written complete and synced to a temporary file beside ``path``; renamed in later."""
    tmp = tmp_path_for(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _ours(name: str) -> bool:
    """A temporary file name an mtpforge GGUF write makes (head, record, card)."""
    return name.startswith(".") and (TMP_MARK in name or (name.startswith(".mtpforge-") and name.endswith(".md.tmp"))
                                     or (RECORD_SUFFIX + ".tmp-") in name)


def _roll_forward(folder: Path, tmp: Path) -> bool:
    """Rename a staged record into place when its head is there, as it records, and no record is."""
    name = tmp.name[1:]
    for mark in (TMP_MARK, ".tmp-"):
        if mark in name:
            name = name[: name.index(mark)]
            break
    if not name.endswith(RECORD_SUFFIX):
        return False
    record, head = folder / name, folder / name[: -len(RECORD_SUFFIX)]
    if os.path.lexists(record) or head.is_symlink() or not head.is_file():
        return False
    try:
        sha = json.loads(tmp.read_text("utf-8")).get("file_sha256")
    except (OSError, ValueError, UnicodeDecodeError, AttributeError, RecursionError):
        return False
    if not isinstance(sha, str) or file_sha256(head) != sha:
        return False
    os.replace(tmp, record)
    return True


def sweep_leftovers(folder: Path) -> list[str]:
    """What a killed GGUF write left in ``folder`` (call under :func:`folder_lock`): staged
    records rolled forward where their head is in place, every other temporary file removed.
    Returns the names handled."""
    done: list[str] = []
    with contextlib.suppress(OSError):
        for p in sorted(folder.iterdir()):
            if not _ours(p.name) or p.is_symlink() or not p.is_file():
                continue
            with contextlib.suppress(OSError):
                if not _roll_forward(folder, p):
                    p.unlink()
                done.append(p.name)
    return done


__all__ = ["sweep_leftovers", "stage_json"]
