"""vllm-mlx 0.6.0 driver, through the two routes its server takes:

- Qwen3.5/3.6 (vision-language checkpoints, so the server's MLLM route): ``BatchedEngine`` with
  ``force_mllm`` (mlx-vlm loads the model, ``_inject_mtp_mllm`` injects the head with
  ``patches/qwen3_5_mtp``, ``install_mtp_mllm`` drafts). Acceptance: the engine's ``mtp`` stats.
- Qwen3-Next (text model, the LLM route): ``utils.tokenizer.load_model_with_fallback`` (injects
  with ``patches/qwen3_next_mtp``) and the continuous-batching ``Scheduler`` with ``enable_mtp``.
  Acceptance: the scheduler's MTP counters.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import standins
from common import LoadLog, compare_loaded, head_files, load_report, main, stage


class _Notes(logging.Handler):
    """Keeps the runtime's own warnings about MTP (e.g. why it disabled drafting)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "MTP" in msg and msg not in self.lines:
            self.lines.append(msg[:300])


NOTES = _Notes()
logging.getLogger("vllm_mlx").addHandler(NOTES)


def _decode(model: Any, tok: Any, ids: list[int], n: int, mtp: bool) -> tuple[list[int], dict]:
    from vllm_mlx.request import Request, SamplingParams
    from vllm_mlx.scheduler import Scheduler, SchedulerConfig

    cfg = SchedulerConfig(enable_mtp=mtp, mtp_num_draft_tokens=1, enable_prefix_cache=False,
                          use_memory_aware_cache=False)
    sched = Scheduler(model, tok, cfg)
    req = Request(request_id="r0", prompt=list(ids), sampling_params=SamplingParams(max_tokens=n, temperature=0.0))
    sched.add_request(req)
    for _ in range(4 * n + 16):
        if not sched.has_requests():
            break
        sched.step()
    counters = dict(sched._mtp_stats_state.counters) if hasattr(sched, "_mtp_stats_state") else {}
    return list(req.output_token_ids), counters


def _mllm_decode(folder: str, texts: list[str], n: int, mtp: bool, log: Any = None) -> tuple[list, dict, Any]:
    """One engine (the server's MLLM route) decoding every prompt greedily; its MTP stats."""
    import asyncio

    from vllm_mlx.engine.batched import BatchedEngine
    from vllm_mlx.scheduler import SchedulerConfig

    async def go() -> tuple[list, dict, Any]:
        cfg = SchedulerConfig(enable_mtp=mtp, mtp_num_draft_tokens=1, enable_prefix_cache=False,
                              use_memory_aware_cache=False)
        eng = BatchedEngine(folder, scheduler_config=cfg, force_mllm=True)
        if log is not None:
            with log:
                await eng.start()
        else:
            await eng.start()
        standins.float32_expert_stacks(eng._model)
        outs = [await eng.generate(prompt=t, max_tokens=n, temperature=0.0) for t in texts]
        stats = dict(eng.get_stats().get("mtp") or {})
        await eng.stop()
        return [list(o.tokens) for o in outs], stats, eng

    return asyncio.run(go())


def _cell_mllm(spec: dict[str, Any], entry: dict[str, Any], out: dict[str, Any]) -> None:
    n, texts = spec["max_tokens"], spec["texts"]
    want_mtp = entry.get("mtp", True)
    NOTES.lines.clear()
    log = LoadLog()
    try:
        tokens, stats, eng = stage("load", lambda: _mllm_decode(entry["folder"], texts, n, want_mtp, log))
    finally:
        out["load"] = load_report(log.head_calls()) if hasattr(log, "calls") else None
    calls = log.head_calls()
    # the MLLM route injects the head into a wrapped model: that it loaded one is what the log saw
    out["mtp_enabled"] = bool(calls)
    if calls:
        out["values"] = compare_loaded(calls[0]["obj"], head_files(Path(entry["folder"])))
    if want_mtp and calls:  # without a head the first engine already decoded plainly
        out.update(mtp=tokens, drafted=int(stats.get("attempted", 0)), accepted=int(stats.get("accepted", 0)))
        out["plain"] = stage("plain decode", lambda: _mllm_decode(entry["folder"], texts, n, False)[0])
    else:
        out["plain"] = tokens
    out["notes"] = list(NOTES.lines)


def cell(spec: dict[str, Any], entry: dict[str, Any], out: dict[str, Any]) -> None:
    from vllm_mlx.utils.tokenizer import load_model_with_fallback

    out["standins"] = standins.APPLIED
    out["route"] = "mllm" if spec["family"] != "next" else "llm"
    if out["route"] == "mllm":
        return _cell_mllm(spec, entry, out)

    n, prompts = spec["max_tokens"], spec["prompts"]
    out["standins"] = standins.APPLIED
    NOTES.lines.clear()
    with LoadLog() as log:
        try:
            model, tok = stage("load", lambda: load_model_with_fallback(entry["folder"]))
        finally:
            out["load"] = load_report(log.head_calls())
    standins.float32_expert_stacks(model)
    out["mtp_enabled"] = getattr(model, "mtp", None) is not None or \
        getattr(getattr(model, "language_model", None), "mtp", None) is not None
    calls = log.head_calls()
    if calls:
        out["values"] = compare_loaded(calls[0]["obj"], head_files(Path(entry["folder"])))
    out["plain"] = stage("plain decode", lambda: [_decode(model, tok, ids, n, False)[0] for ids in prompts])
    if out["mtp_enabled"] and entry.get("mtp", True):
        mtp, drafted, accepted = [], 0, 0
        for ids in prompts:
            toks, c = stage("mtp decode", lambda: _decode(model, tok, ids, n, True))
            mtp.append(toks)
            drafted += int(c.get("attempted", 0))
            accepted += int(c.get("accepted", 0))
        out.update(mtp=mtp, drafted=drafted, accepted=accepted)
    out["notes"] = list(NOTES.lines)


def bare(spec: dict[str, Any], out: dict[str, Any]) -> None:
    from vllm_mlx.utils.tokenizer import load_model_with_fallback

    if spec["family"] != "next":
        out["tokens"] = stage("bare decode", lambda: _mllm_decode(spec["bare"], spec["texts"], spec["max_tokens"],
                                                                  False)[0])
        return

    model, tok = stage("load without head", lambda: load_model_with_fallback(spec["bare"]))
    standins.float32_expert_stacks(model)
    out["tokens"] = stage("bare decode", lambda: [_decode(model, tok, ids, spec["max_tokens"], False)[0]
                                                  for ids in spec["prompts"]])


if __name__ == "__main__":
    main(cell, bare)
