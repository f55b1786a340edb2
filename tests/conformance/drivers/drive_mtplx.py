"""MTPLX 2.12.2 driver: ``mtplx.runtime.load`` (its loader, head injection included) and the decode
loops its own ``mtplx run`` takes: ``generate_ar`` for plain decoding and ``generate_mtpk`` with
the policies ``mtplx run`` passes (post-norm hidden state, ``persistent`` head cache,
``committed`` history), at depth 1 to compare with ``mtpforge verify``.

Two differences from ``mtplx run``, both measured on the trained dense head: ``generate_mtp1``
with its defaults (the ``cycle`` history, a lane no ``mtplx`` command takes) drafts about 20
points lower; and ``mtplx run``'s ``capture_commit`` verification with the
``linear-gdn-from-conv-tape`` core does not reproduce MTPLX's own plain output on the CPU build
of MLX (54.9%, first divergence within 2-36 tokens on every prompt) — MTPLX's fast path, not the
head: the same head under its ``batched`` verification is identical to plain decoding at 84.8%.
So the driver keeps ``generate_mtpk``'s own verification defaults. The runtime's acceptance is
its own ``accepted_drafts / drafted_tokens``, the figure ``mtplx run`` prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import standins
from common import LoadLog, compare_loaded, head_files, load_report, main, stage

standins.libsystem()


def _api() -> Any:
    from mtplx import runtime as R
    from mtplx.generation import generate_ar, generate_mtpk
    from mtplx.sampling import SamplerConfig

    # fixed length (no stop tokens): plain, MTP and bare runs compare token for token
    greedy = dict(sampler=SamplerConfig(temperature=0.0, top_p=1.0, top_k=0), stop_token_ids=set())

    def mtp_run_lane(rt: Any, ids: list[int], max_tokens: int, **kw: Any) -> Any:
        return generate_mtpk(rt, ids, max_tokens=max_tokens, speculative_depth=1, mtp_hidden_variant="post_norm",
                             mtp_cache_policy="persistent", mtp_history_policy="committed", **kw)

    return R, generate_ar, mtp_run_lane, greedy


def cell(spec: dict[str, Any], entry: dict[str, Any], out: dict[str, Any]) -> None:
    R, generate_ar, generate_mtp, greedy = _api()
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
        res = stage("mtp decode", lambda: [generate_mtp(rt, ids, max_tokens=n, **greedy) for ids in prompts])
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
