"""mlx-vlm 0.7.10 driver: ``mlx_vlm.load`` for the target, ``load_drafter(kind="mtp")`` for the
drafter folder, and ``mlx_vlm.generate.stream_generate`` (plain, and with ``draft_model``: its
speculative MTP rounds). The runtime's acceptance is the drafter's own
``sum(accept_lens) / sum(draft_lens)``, at the drafter's own block size and again at one draft a
round (``depth1``), which is what verify counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import standins
from common import LoadLog, compare_loaded, head_files, load_report, main, stage


def _decode(model: Any, processor: Any, ids: list[int], n: int, **kw: Any) -> list[int]:
    import mlx.core as mx
    from mlx_vlm.generate import stream_generate

    return [int(r.token) for r in stream_generate(model, processor, "", input_ids=mx.array([ids]),
                                                  max_tokens=n, temperature=0.0, **kw)]


def _drafting(model: Any, processor: Any, draft: Any, prompts: list[list[int]], n: int,
              **kw: Any) -> tuple[list[list[int]], int, int]:
    """Every prompt decoded with the drafter (``kw``: stream_generate's own, e.g. its block
    size): the tokens, and the drafts accepted and made, as the drafter counts them."""
    mtp, accepted, drafted = [], 0, 0
    for ids in prompts:
        mtp.append(stage("mtp decode", lambda: _decode(model, processor, ids, n, draft_model=draft,
                                                      draft_kind="mtp", **kw)))
        accepted += sum(draft.accept_lens)
        drafted += sum(draft.draft_lens)
    return mtp, accepted, drafted


def cell(spec: dict[str, Any], entry: dict[str, Any], out: dict[str, Any]) -> None:
    from mlx_vlm import load
    from mlx_vlm.speculative.drafters import load_drafter

    n, prompts = spec["max_tokens"], spec["prompts"]
    out["standins"] = standins.APPLIED
    model, processor = stage("load", lambda: load(entry["folder"]))
    standins.float32_expert_stacks(model)
    drafter_dir = entry.get("drafter")
    out["mtp_enabled"] = False
    if drafter_dir:
        with LoadLog() as log:
            try:
                draft, kind = stage("load", lambda: load_drafter(drafter_dir, kind="mtp"))
            finally:
                out["load"] = load_report(log.head_calls())
        standins.float32_expert_stacks(draft)
        out["mtp_enabled"] = kind == "mtp"
        calls = log.head_calls()
        if calls:
            out["values"] = compare_loaded(calls[0]["obj"], head_files(Path(drafter_dir)))
    out["plain"] = stage("plain decode", lambda: [_decode(model, processor, ids, n) for ids in prompts])
    if out["mtp_enabled"] and entry.get("mtp", True):
        mtp, accepted, drafted = _drafting(model, processor, draft, prompts, n)
        out.update(mtp=mtp, drafted=drafted, accepted=accepted)
        # one draft a round (its CLI's --draft-block-size 2): what verify counts at depth 1
        out["depth1"] = list(_drafting(model, processor, draft, prompts, n, draft_block_size=2)[1:])


def bare(spec: dict[str, Any], out: dict[str, Any]) -> None:
    from mlx_vlm import load

    model, processor = stage("load without head", lambda: load(spec["bare"]))
    standins.float32_expert_stacks(model)
    out["tokens"] = stage("bare decode", lambda: [_decode(model, processor, ids, spec["max_tokens"])
                                                  for ids in spec["prompts"]])


if __name__ == "__main__":
    main(cell, bare)
