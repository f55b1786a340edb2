"""Values that do not validate in the files inspect reads (INVALID_VALUE): config.json and the
index (errors: a loader builds from them), generation_config.json, tokenizer_config.json and
mtpforge.json (warnings: the folder loads; generation, chat use or the provenance record is off).
Each finding names the file, the key and what was expected (mtpforge/inputs)."""

from __future__ import annotations

from ..findings import WARNING, Finding, finding
from ..inputs.problems import Problem
from ..inputs.side_files import GENERATION_CONFIG, TOKENIZER_CONFIG, read_side_file
from .context import InspectContext


def _finding(p: Problem, severity: str | None = None, fix: str | None = None) -> Finding:
    return finding("INVALID_VALUE", p.message, fix or p.fix or f"repair {p.file.rsplit('/', 1)[-1]}", severity)


def check(ctx: InspectContext) -> list[Finding]:
    from ..checkpoint.store import LocalStore

    out = [_finding(p) for p in ctx.cat.problems]
    if ctx.holds_backbone and isinstance(ctx.store, LocalStore):  # over HTTP inspect reads headers only
        for rel in (GENERATION_CONFIG, TOKENIZER_CONFIG):
            out += [_finding(p, WARNING) for p in read_side_file(ctx.store, rel).problems]
    if ctx.manifest_problem is not None:
        out.append(_finding(ctx.manifest_problem, WARNING,
                            "inspect ignores the record: restore mtpforge.json from a backup, or re-run `mtpforge add-mtp --force`"))
    return out
