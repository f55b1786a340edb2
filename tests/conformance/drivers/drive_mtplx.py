"""MTPLX 2.12.2 driver: ``mtplx.runtime.load`` (its loader, head injection included) and
``mtplx.generation.generate_ar`` / ``generate_mtp1`` (its plain and K=1 MTP decode loops).
The runtime's acceptance is its own ``accepted_drafts / drafted_tokens``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import standins
from common import LoadLog, compare_loaded, head_files, load_report, main, stage

standins.libsystem()


def _api() -> Any:
    from mtplx import runtime as R
    from mtplx.generation import generate_ar, generate_mtp1
    from mtplx.sampling import SamplerConfig

    # fixed length (no stop tokens): plain, MTP and bare runs compare token for token
    greedy = dict(sampler=SamplerConfig(temperature=0.0, top_p=1.0, top_k=0), stop_token_ids=set())
    return R, generate_ar, generate_mtp1, greedy


def cell(spec: dict[str, Any], entry: dict[str, Any], out: dict[str, Any]) -> None:
    R, generate_ar, generate_mtp1, greedy = _api()
    n, prompts = spec["max_tokens"], spec["prompts"]
    out["standins"] = standins.APPLIED
    with LoadLog() as log:
        try:
            rt = stage("load", lambda: R.load(entry["folder"], mtp=True))
        finally:
            out["load"] = load_report(log.head_calls())
    out["mtp_enabled"] = bool(getattr(rt, "mtp_enabled", False))
    standins.float32_expert_stacks(rt.model)
    calls = log.head_calls()
    if calls:
        out["values"] = compare_loaded(calls[0]["obj"], head_files(Path(entry["folder"])))
    out["plain"] = stage("plain decode", lambda: [
        generate_ar(rt, ids, max_tokens=n, **greedy).tokens for ids in prompts])
    if out["mtp_enabled"] and entry.get("mtp", True):
        res = stage("mtp decode", lambda: [generate_mtp1(rt, ids, max_tokens=n, **greedy) for ids in prompts])
        out["mtp"] = [r.tokens for r in res]
        out["drafted"] = sum(int(r.stats.drafted_tokens) for r in res)
        out["accepted"] = sum(int(r.stats.accepted_drafts) for r in res)


def bare(spec: dict[str, Any], out: dict[str, Any]) -> None:
    R, generate_ar, _, greedy = _api()
    rt = stage("load without head", lambda: R.load(spec["bare"], mtp=False))
    standins.float32_expert_stacks(rt.model)
    out["tokens"] = stage("bare decode", lambda: [
        generate_ar(rt, ids, max_tokens=spec["max_tokens"], **greedy).tokens for ids in spec["prompts"]])


if __name__ == "__main__":
    main(cell, bare)
