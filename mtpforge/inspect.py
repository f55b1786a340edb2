"""``mtpforge inspect``: what a checkpoint holds and every problem of docs/SPEC.md §6 that applies.

Reads config, index and safetensors headers only; tensor values are read for the head's norms
(a few KB) and, for local folders, for the finite/degenerate scan of the head. Over HTTP no
projection or expert data is ever fetched. The checks are small modules under ``checks/`` run
in order over one context; each adds findings and fills in its part of the report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from .checks import data, drafts, folder, index, norms, quant, runtime as runtime_check, structure, values
from .checks.context import InspectContext, build_context, open_target_store
from .errors import unknown_choice
from .findings import ERROR, INFO, WARNING, Finding
from .runtimes import RUNTIMES

#: the checks in report order (structure fills ``expected``, quant fills ``precisions``)
CHECKS: tuple[Callable[[InspectContext], list[Finding]], ...] = (
    index.check, values.check, folder.check, structure.check, quant.check, norms.check, drafts.check, runtime_check.check,
    data.check,
)


def inspect_checkpoint(
    target: str,
    *,
    source: str | None = None,
    runtime: str | None = None,
    strict: bool = False,
    revision: str | None = None,
    source_revision: str | None = None,
    mlx_lm_version: str | None = None,
    data_checks: bool = True,
    use_manifest: bool = True,
    behaviour: bool = True,
) -> dict[str, Any]:
    """Inspect TARGET (folder or repo id) and return the docs/CONTRACT.md report.

    ``report["exit_code"]`` is 1 when a finding is an error (or a warning with ``strict``).
    ``behaviour``: let the norm check decode with the head when nothing else decides its norms.
    """
    if runtime is not None and runtime not in RUNTIMES:
        raise unknown_choice("--runtime", runtime, tuple(RUNTIMES))
    from .gguf.addmtp import is_gguf_path
    from .gguf.inspect import inspect_gguf, inspect_gguf_hub_repo

    if is_gguf_path(target):  # a llama.cpp GGUF file
        return inspect_gguf(target, source=source, revision=source_revision, strict=strict)
    store = open_target_store(target, revision)
    gguf = inspect_gguf_hub_repo(store, target, strict=strict)
    if gguf is not None:  # a Hub repo of GGUF files
        return gguf
    ctx = build_context(target, store, revision=revision, source=source, source_revision=source_revision, runtime=runtime,
                        mlx_lm_version=mlx_lm_version, data_checks=data_checks, use_manifest=use_manifest,
                        behaviour=behaviour)
    drafter = _drafter_beside(store, ctx.report)
    if drafter is not None:  # mlx-vlm's layout: the head is the sibling folder, as verify finds it
        report = inspect_checkpoint(str(drafter), source=source, runtime=runtime, strict=strict,
                                    source_revision=source_revision, mlx_lm_version=mlx_lm_version,
                                    data_checks=data_checks, use_manifest=use_manifest, behaviour=behaviour)
        report["head_folder"] = report["target"]
        report["target"] = target
        return report
    findings: list[Finding] = []
    for check in CHECKS:
        findings += check(ctx)
    return _finish(ctx.report, findings, strict)


def _drafter_beside(store: Any, report: dict[str, Any]) -> Path | None:
    """``<target>-mtp-drafter`` when the target folder holds no head and that sibling is an
    mlx-vlm drafter: inspect then judges the head where mlx-vlm (and verify) read it, instead
    of reporting the model headless and advising a second head."""
    from .checkpoint.store import LocalStore
    from .layouts.read import drafter_folder
    from .layouts.table import is_drafter_type

    if not isinstance(store, LocalStore) or report.get("layout") != "none" or report.get("mtp_tensors"):
        return None
    d = drafter_folder(Path(store.root))
    try:
        config = json.loads((d / "config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return d if isinstance(config, dict) and is_drafter_type(config.get("model_type")) else None


def _finish(report: dict[str, Any], findings: list[Finding], strict: bool) -> dict[str, Any]:
    report["findings"] = [f.as_dict() for f in findings]
    bad = {ERROR, WARNING} if strict else {ERROR}
    report["exit_code"] = 1 if any(f.severity in bad for f in findings) else 0
    report["ok"] = report["exit_code"] == 0
    return report


__all__ = ["inspect_checkpoint", "INFO", "WARNING", "ERROR"]
