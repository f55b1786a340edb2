"""Whether an argument that names no existing file is a local path or a Hugging Face repo id.

``owner/name`` is both a relative path and a repo id. Taking a mistyped local path for a repo
id costs a Hub lookup (a timeout offline) and then blames the network, so an argument counts as
local when it is spelled like a path (``./``, ``../``, ``/``, ``~``), is not a valid repo id, or
its first component is a folder that exists here (``tour/tiny-qwen3_5x`` with ``tour/`` present).
"""

from __future__ import annotations

import os
from pathlib import Path


def looks_local(arg: str) -> bool:
    """True when ``arg`` can only mean a local path (existing or not)."""
    if arg in (".", "..") or arg.startswith(("./", "../", "~", ".\\", "..\\")) or os.path.isabs(arg):
        return True
    if arg.count("/") != 1:
        return True
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(arg)
    except HFValidationError:
        return True
    return Path(arg.split("/")[0]).is_dir()


def no_such_path(arg: str, what: str) -> str:
    """The message for a local-looking argument that does not exist (never a Hub lookup); where
    only the existing first folder made it local, it says how to mean the Hub repo instead."""
    first = arg.split("/")[0]
    why = (f"; ./{first}/ exists here, so it is read as a path — for the Hub repo, run from another folder"
           if arg.count("/") == 1 and not arg.startswith((".", "/", "~")) and Path(first).is_dir() else "")
    return f"{what} {arg}: no such folder{why}"
