"""Will the runtimes load this head. Without ``--runtime``: the sidecar reference, the installed
mlx-lm (MLX_LM_LOAD_BREAKS, LEGACY_LOADER_DOUBLE_SHIFT) and the expert format the layout's
runtime loads, as warnings. With ``--runtime R``: R's row (``runtimes/table.py``, the rows
add-mtp writes by) predicts R's own loader — an error exactly when R fails to load or draft the
head, a warning when it loads it but re-shifts norms that are already right, an info line for
what R's decode loop costs every head."""

from __future__ import annotations

import json
import posixpath
import re
from importlib import metadata
from typing import Any, Optional

from ..findings import ERROR, INFO, WARNING, Finding, finding
from ..layouts.quant import quant_defaults
from ..layouts.sidecar import SIDECAR_CONFIG_KEY
from ..layouts.table import LAYOUTS, SIDECAR_FILE, loads_in_mlx_lm_glob
from ..passes.quantize import QSpec
from ..runtimes import RUNTIMES, HeadFacts
from ..runtimes.predict import Placed, predict, reshifted
from .context import InspectContext


def _mlx_lm_version() -> str | None:
    try:
        return metadata.version("mlx-lm")
    except metadata.PackageNotFoundError:
        return None


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def _sidecar(ctx: InspectContext) -> list[Finding]:
    if not ctx.store.exists(SIDECAR_FILE):
        return []
    extra = ctx.cat.config.get(SIDECAR_CONFIG_KEY)
    if isinstance(extra, dict) and extra.get("mtp_file") == SIDECAR_FILE:
        return []
    return [finding(
        "SIDECAR_UNREFERENCED", f"{SIDECAR_FILE} is present but config.json does not reference it (mlx_lm_extra_tensors.mtp_file)",
        'add "mlx_lm_extra_tensors": {"mtp_file": "mtp.safetensors", "mtp_tensor_count": N} to config.json, or re-run `mtpforge add-mtp --force`',
    )]


def _installed_mlx_lm(ctx: InspectContext) -> list[Finding]:
    """Without --runtime: what the mlx-lm installed here (or named by ``mlx_lm_version``) does."""
    in_glob = [f for f in ctx.loc.files if loads_in_mlx_lm_glob(f)]
    if not in_glob or ctx.raw:
        return []
    out = []
    mlx_lm = RUNTIMES["mlx-lm"]
    if ctx.family in mlx_lm.rejects_head_in_glob:
        out.append(finding(
            "MLX_LM_LOAD_BREAKS",
            f"MTP keys in {in_glob[0]}: released mlx-lm loads Qwen3-Next strictly and fails (\"parameters not in model\")",
            "use the sidecar layout for mlx-lm users: `mtpforge add-mtp --force` (plain add-mtp writes a sidecar)",
        ))
    v = ctx.mlx_lm_version or _mlx_lm_version()
    legacy = mlx_lm.double_shift_versions
    if v and legacy and legacy[0] <= _version_tuple(v) <= legacy[1]:
        out.append(finding(
            "LEGACY_LOADER_DOUBLE_SHIFT",
            f"mlx-lm {v} adds +1 to every backbone norm when the head's keys reach sanitize: this folder's backbone would be corrupted",
            "upgrade mlx-lm to 0.32 or newer (pip install -U mlx-lm), or use the sidecar layout",
        ))
    return out


def head_facts(ctx: InspectContext) -> HeadFacts:
    d = quant_defaults(ctx.cat.config)
    default_q = QSpec(d["bits"], d["group_size"], d["mode"]) if d else None
    return HeadFacts(ctx.family, dict(ctx.precisions), default_q)


def _placed(ctx: InspectContext) -> Placed:
    in_glob = ctx.holds_backbone and not ctx.raw and any(loads_in_mlx_lm_glob(f) for f in ctx.loc.files)
    return Placed(ctx.loc.layout, ctx.report["expert_format"], in_glob, frozenset(ctx.cat.config))


def _layout_reader(ctx: InspectContext) -> list[Finding]:
    """Without --runtime: the expert format the layout's own runtime loads (a warning)."""
    if ctx.loc.layout not in LAYOUTS:
        return []
    row = RUNTIMES[LAYOUTS[ctx.loc.layout].runtime]
    return [finding(p.code, p.message, f"re-write the head for it: {ctx.add_fix} --runtime {row.name} --force",
                    severity=WARNING)
            for p in predict(row, head_facts(ctx), _placed(ctx)) if p.code == "EXPERT_LAYOUT_INCOMPATIBLE"]


def _marker(ctx: InspectContext, name: str) -> Optional[Any]:
    head_dir = posixpath.dirname(ctx.loc.files[0]) if ctx.loc.files else ""
    rel = posixpath.join(head_dir, name)
    if not ctx.store.exists(rel):
        return None
    try:
        return json.loads(ctx.store.read_range(rel, 0, min(ctx.store.size(rel), 1 << 20)))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def _named_runtime(ctx: InspectContext) -> list[Finding]:
    row = RUNTIMES[str(ctx.runtime)]
    fix = f"re-write the head for it: {ctx.add_fix} --runtime {row.name} --force"
    drafts = sorted(r.name for r in RUNTIMES.values() if r.write is not None and ctx.family not in r.no_mtp
                    and set(r.layouts_for(ctx.family)) & set(ctx.spec.layouts))
    no_path = f"no head {row.name} loads exists for {ctx.family}: use a runtime that drafts it ({', '.join(drafts)})"
    out = [finding(p.code, p.message, no_path if p.code == "RUNTIME_NO_MTP" else fix, severity=ERROR)
           for p in predict(row, head_facts(ctx), _placed(ctx))]
    # a gguf_only family has no convention of mtpforge's that a runtime could double-shift
    shifted = [] if ctx.spec.gguf_only else reshifted(row, ctx.family, ctx.norm_means, lambda n: _marker(ctx, n))
    if shifted and ctx.report["norm_convention"] not in ("raw", "none"):
        out.append(finding(
            "RUNTIME_RESHIFTS_NORMS",
            f"{row.name} decides the norm convention from the values and adds +1 to {len(shifted)} of this head's norms "
            f"(e.g. {shifted[0]}, mean {ctx.norm_means[shifted[0]]:.2f}); they are already shifted, so it double-shifts "
            "them: it loads, with lower acceptance",
            "nothing in the head can stop that runtime's value rule" if not row.norm_markers else fix,
        ))
    if row.loop_cost and not any(f.severity == ERROR for f in out):
        out.append(finding("RUNTIME_ACCEPTANCE_COST", row.loop_cost, "nothing to fix in the head: compare "
                           "`mtpforge verify` (the reference loop) with the runtime's own figure", severity=INFO))
    return out


def check(ctx: InspectContext) -> list[Finding]:
    if not ctx.has_head:
        return []
    if ctx.runtime:  # every runtime that reads a sidecar also finds a bare mtp.safetensors
        return _named_runtime(ctx)
    return _sidecar(ctx) + _installed_mlx_lm(ctx) + _layout_reader(ctx)
