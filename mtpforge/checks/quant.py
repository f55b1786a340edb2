"""Shapes and precision of every head module against the config (MTP_SHAPE_MISMATCH,
QUANT_CONFIG_MISMATCH): what is on disk vs what the config makes the loader build."""

from __future__ import annotations

from typing import Any

from ..findings import Finding, finding
from ..layouts.quant import expected_precision, stored_precision
from ..layouts.table import runtime_module_path
from .context import InspectContext
from .structure import modules


def _mismatch(ctx: InspectContext, m: str, prec: dict[str, Any]) -> str | None:
    """Why module ``m``'s stored precision is not what the loader builds, else None."""
    rpath = runtime_module_path(m, ctx.loc.layout, ctx.family, ctx.cat.config)
    exp_q = expected_precision(ctx.cat.config, rpath, f"{m}.scales" in ctx.loc.entries)
    if prec.get("quantized"):
        if exp_q is None or exp_q.get("bits") != prec.get("bits") or exp_q.get("group_size") != prec.get("group_size"):
            return (f"{m}: stored {prec.get('bits')}-bit/{prec.get('group_size')}, config builds "
                    + (f"{exp_q.get('bits')}-bit/{exp_q.get('group_size')}" if exp_q else "unquantized"))
    elif exp_q is not None:
        return f"{m}: stored unquantized, config builds {exp_q.get('bits')}-bit"
    return None


def check(ctx: InspectContext) -> list[Finding]:
    if not ctx.has_head:
        return []
    entries, expected = ctx.loc.entries, ctx.expected
    bad_shapes: list[str] = []
    qmismatch: list[str] = []
    for m in sorted(set(modules(list(expected))) & set(modules(list(entries)))):
        want = expected.get(f"{m}.weight") or expected.get(m)
        info = entries.get(f"{m}.weight") or entries.get(m)
        if want is None or info is None:
            continue  # a module whose weight is missing (its scales remain) is the missing-tensor check's finding
        prec = stored_precision(entries, m, want[-1])
        ctx.precisions[m] = prec
        if prec.get("quantized"):
            ok = info.shape[:-1] == tuple(want[:-1]) and isinstance(prec.get("bits"), int) and prec.get("group_size")
        else:
            ok = tuple(info.shape) == tuple(want)
        if not ok:
            bad_shapes.append(f"{m} {list(info.shape)} (expected {list(want)})")
        elif not ctx.raw and (why := _mismatch(ctx, m, prec)):
            qmismatch.append(why)
    ctx.report["quantization"]["mtp_modules"] = ctx.precisions
    out = []
    if bad_shapes:
        out.append(finding(
            "MTP_SHAPE_MISMATCH",
            f"{len(bad_shapes)} MTP tensor(s) do not fit this model's config (head from another model size?): {bad_shapes[0]}",
            f"re-create the head from this model's own source: {ctx.add_fix} --force",
        ))
    if qmismatch:
        out.append(finding(
            "QUANT_CONFIG_MISMATCH",
            f"{len(qmismatch)} MTP module(s) are stored at another precision than the config makes the loader build: {qmismatch[0]}",
            "add per-module entries under \"quantization\" and \"quantization_config\" in config.json, or re-run `mtpforge add-mtp --force`",
        ))
    return out
