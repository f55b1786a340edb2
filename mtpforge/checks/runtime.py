"""Will the runtimes load this head (SIDECAR_UNREFERENCED, MLX_LM_LOAD_BREAKS,
LEGACY_LOADER_DOUBLE_SHIFT, EXPERT_LAYOUT_INCOMPATIBLE, LAYOUT_NOT_READ_BY_RUNTIME): the facts
come from the runtime rows (``runtimes/table.py``), the same rows add-mtp writes by."""

from __future__ import annotations

import re
from importlib import metadata

from ..findings import ERROR, WARNING, Finding, finding
from ..layouts.sidecar import SIDECAR_CONFIG_KEY
from ..layouts.table import LAYOUTS, SIDECAR_FILE, loads_in_mlx_lm_glob
from ..runtimes import RUNTIMES
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
        'add "mlx_lm_extra_tensors": {"mtp_file": "mtp.safetensors", "mtp_tensor_count": N} to config.json, or re-run `mtpforge add-mtp --layout sidecar --force`',
    )]


def _mlx_lm_loader(ctx: InspectContext) -> list[Finding]:
    in_glob = [f for f in ctx.loc.files if loads_in_mlx_lm_glob(f)]
    if not in_glob or ctx.raw:
        return []
    out = []
    mlx_lm = RUNTIMES["mlx-lm"]
    if ctx.family in mlx_lm.rejects_head_in_glob:
        out.append(finding(
            "MLX_LM_LOAD_BREAKS",
            f"MTP keys in {in_glob[0]}: released mlx-lm loads Qwen3-Next strictly and fails (\"parameters not in model\")",
            "use the sidecar layout for mlx-lm users: `mtpforge add-mtp --layout sidecar --force`",
            severity=ERROR if ctx.runtime == mlx_lm.name else WARNING,
        ))
    v = ctx.mlx_lm_version or _mlx_lm_version()
    legacy = mlx_lm.double_shift_versions
    if v and legacy and legacy[0] <= _version_tuple(v) <= legacy[1]:
        out.append(finding(
            "LEGACY_LOADER_DOUBLE_SHIFT",
            f"mlx-lm {v} adds +1 to every backbone norm when mtp. keys reach sanitize: this folder's backbone would be corrupted",
            "upgrade mlx-lm to 0.32 or newer (pip install -U mlx-lm), or use the sidecar layout",
        ))
    return out


def _experts(ctx: InspectContext) -> list[Finding]:
    fmt = ctx.report["expert_format"]
    if fmt == "none":
        return []
    check_rt = ctx.runtime or (LAYOUTS[ctx.loc.layout].runtime if ctx.loc.layout in LAYOUTS else None)
    row = RUNTIMES[check_rt] if check_rt else None
    allowed = row.experts_for(ctx.family) if row else None
    quant_experts = any(p.get("quantized") for m, p in ctx.precisions.items() if ".experts." in m)
    if row is None or allowed is None or (fmt in allowed and (row.quantized_experts or not quant_experts)):
        return []
    return [finding(
        "EXPERT_LAYOUT_INCOMPATIBLE",
        f"MoE experts stored as {fmt}{' (quantized)' if quant_experts else ''}; {check_rt} loads {' or '.join(allowed)}",
        f"re-write the head for it: mtpforge add-mtp --experts {'source' if 'switch_mlp' not in allowed else 'switch_mlp'} --force",
        severity=ERROR if ctx.runtime else WARNING,
    )]


def _layout_read(ctx: InspectContext) -> list[Finding]:
    reads = RUNTIMES[ctx.runtime].layouts if ctx.runtime else ()
    if not reads or ctx.loc.layout in reads or ctx.raw:
        return []
    return [finding(
        "LAYOUT_NOT_READ_BY_RUNTIME", f"{ctx.runtime} reads the {' / '.join(reads)} layout; this head is {ctx.loc.layout}",
        f"mtpforge add-mtp --layout {reads[0]} --force",
    )]


def check(ctx: InspectContext) -> list[Finding]:
    if not ctx.has_head:
        return []
    return _sidecar(ctx) + _mlx_lm_loader(ctx) + _experts(ctx) + _layout_read(ctx)
