"""Findings about a set of a GGUF's tensors, for an MTP block and a drafter file alike: what it
lacks or holds besides what is expected, and NaN / Inf in it."""

from __future__ import annotations

from typing import Any

from ..findings import Finding, finding
from .finite import nonfinite_tensors
from .gguffile import GgufFile


def held_against(what: str, have: dict[str, Any], want: dict[str, tuple[int, ...]], maybe: set[str]) -> list[Finding]:
    """What a set of tensors (a block, or a drafter's tensors outside its stages) lacks, holds
    besides what is expected, and holds in another shape."""
    out: list[Finding] = []
    fix = "re-write the head with mtpforge add-mtp --force"
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want) - maybe)
    if missing:
        out.append(finding("MTP_MISSING_TENSORS", f"{what} lacks {', '.join(missing[:3])}"
                           + (f" and {len(missing) - 3} more" if len(missing) > 3 else ""), fix))
    if extra:
        out.append(finding("MTP_UNEXPECTED_TENSORS", f"{what} has unexpected {', '.join(extra[:3])}", fix))
    # a 0 in the expected shape is a width the reference GGUF does not state (no tensor has
    # a 0 dimension): that tensor's shape is not judged, rather than called a mismatch
    bad = [f"{k} {list(reversed(have[k].shape))} (expected {list(reversed(shp))})"
           for k, shp in want.items() if k in have and 0 not in shp and tuple(have[k].shape) != shp]
    if bad:
        out.append(finding("MTP_SHAPE_MISMATCH", f"{what}: head of another model size: {'; '.join(bad[:2])}",
                           "use the original checkpoint of this model as --source: mtpforge add-mtp --force"))
    return out


def nonfinite_in(g: GgufFile, names: list[str], where: str) -> list[Finding]:
    bad = nonfinite_tensors(g, names)
    if not bad:
        return []
    return [finding("NONFINITE_WEIGHTS", f"{where + ': ' if where else ''}NaN or Inf in {len(bad)} head tensor(s): "
                                         f"{', '.join(bad[:3])}", "re-write the head with mtpforge add-mtp --force")]


__all__ = ["held_against", "nonfinite_in"]
