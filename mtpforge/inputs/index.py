"""``model.safetensors.index.json``: which file holds each tensor, and the total size add-mtp
grows when it adds the head to the index.

A weight map that is not an object of file names makes the folder unreadable (exit 2; inspect
cannot tell which shard holds what). A name that leads outside the folder is kept apart (never
opened; inspect reports it). ``metadata.total_size`` is a problem of the value only: inspect
reports it, and add-mtp, which rewrites it, refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ..errors import CorruptFileError
from .problems import Problem, describe

INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class IndexFile:
    """The parsed index: tensor -> file, the entries that point outside, and the total size."""

    weight_map: dict[str, str]
    #: tensor -> why its file name cannot be used (absolute, ``..``)
    unsafe: dict[str, str] = field(default_factory=dict)
    total_size: Optional[int] = None
    problems: tuple[Problem, ...] = ()


def parse_index(raw: Any, *, file: str = INDEX_FILE) -> IndexFile:
    from ..checkpoint.store import safe_relpath

    if not isinstance(raw, Mapping):
        raise CorruptFileError(f"{file} is not a JSON object", f"repair or re-download {INDEX_FILE}")
    wm = raw.get("weight_map")
    if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise CorruptFileError(f"{file} has no valid weight_map (expected an object of tensor name -> file name)",
                               f"repair or re-download {INDEX_FILE}")
    index: dict[str, str] = {}
    unsafe: dict[str, str] = {}
    for k, v in wm.items():
        try:
            index[k] = safe_relpath(v)
        except CorruptFileError as e:
            unsafe[k] = e.message
    problems: list[Problem] = []
    total: Optional[int] = None
    meta = raw.get("metadata")
    fix = f"repair {INDEX_FILE} (\"metadata\": {{\"total_size\": BYTES}}), or regenerate it from the shards"
    if meta is not None and not isinstance(meta, dict):
        problems.append(Problem(file, "metadata", describe(meta), "an object", fix))
    elif isinstance(meta, dict) and meta.get("total_size") is not None:
        t = meta["total_size"]
        if isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 62:
            total = t
        else:
            problems.append(Problem(file, "metadata.total_size", describe(t), "a byte count (an integer >= 0)", fix))
    return IndexFile(index, unsafe, total, tuple(problems))


__all__ = ["INDEX_FILE", "IndexFile", "parse_index"]
