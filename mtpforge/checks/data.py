"""NaN/Inf and all-zero head tensors (NONFINITE_WEIGHTS, DEGENERATE_TENSOR), read chunk by chunk
with the same scan add-mtp runs on what it writes (a 512-expert stack is ~800 MB)."""

from __future__ import annotations

from ..checkpoint.store import LocalStore
from ..findings import Finding, finding
from .context import InspectContext


def data_findings(nonfinite: list[str], degenerate: list[str]) -> list[Finding]:
    """The findings of a scan's lists (inspect's and add-mtp's)."""
    fix = "re-create the head with `mtpforge add-mtp --force` from the original source"
    out = []
    if nonfinite:
        out.append(finding("NONFINITE_WEIGHTS", f"NaN or Inf in {len(nonfinite)} head tensor(s): {', '.join(sorted(nonfinite)[:3])}", fix))
    if degenerate:
        out.append(finding("DEGENERATE_TENSOR", f"{len(degenerate)} head tensor(s) are all zeros: {', '.join(sorted(degenerate)[:3])}", fix))
    return out


def check(ctx: InspectContext) -> list[Finding]:
    """Local folders only: over HTTP no projection or expert data is ever fetched."""
    if not ctx.has_head or not ctx.data_checks or not isinstance(ctx.store, LocalStore):
        return []
    from ..convert import scan_head

    nonfinite: list[str] = []
    degenerate: list[str] = []
    for file in ctx.loc.files:
        scan = scan_head(ctx.store.path(file), {k: i for k, i in ctx.loc.entries.items() if i.file == file}, whole_file=False)
        nonfinite += scan.nonfinite
        degenerate += scan.degenerate
    return data_findings(nonfinite, degenerate)
