"""Run inside MTPLX 2.12.2's own virtualenv: ``python family_mtplx_driver.py SPEC_JSON OUT_JSON``.

For each folder in SPEC: ``mtplx.runtime.load(folder, mtp=True)`` (its loader, which injects the
family's head: ``glm_mtp_patch`` / ``nemotron_h_mtp_patch``), then greedy ``generate_ar`` and
``generate_mtpk`` at depth 1 with the policies ``mtplx run`` passes (as the conformance driver
does, tests/conformance/drivers/drive_mtplx.py), and the head's parameter names and shapes as
MTPLX built them. Failures are reported, not raised: they are the measurement.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance" / "drivers"))
import standins  # noqa: E402

standins.libsystem()


def run(entry: dict, max_tokens: int, prompts: list[list[int]]) -> dict:
    from mlx.utils import tree_flatten
    from mtplx import runtime as R
    from mtplx.generation import generate_ar, generate_mtpk
    from mtplx.sampling import SamplerConfig

    out: dict = {"folder": entry["folder"]}
    greedy = dict(sampler=SamplerConfig(temperature=0.0, top_p=1.0, top_k=0), stop_token_ids=set())
    try:
        rt = R.load(entry["folder"], mtp=True)
    except Exception as e:  # noqa: BLE001 - the runtime's failure is the measurement
        out.update(stage="load", error=f"{type(e).__name__}: {e}", trace=traceback.format_exc()[-2500:])
        return out
    out["mtp_enabled"] = bool(getattr(rt, "mtp_enabled", False))
    out["upcast_expert_stacks"] = standins.float32_expert_stacks(rt.model)
    head = getattr(rt.model, "mtp", None)
    if head is not None:
        out["head_params"] = {k: [list(v.shape), str(v.dtype)] for k, v in tree_flatten(head.parameters())}
    try:
        out["plain"] = [generate_ar(rt, ids, max_tokens=max_tokens, **greedy).tokens for ids in prompts]
    except Exception as e:  # noqa: BLE001
        out.update(stage="plain decode", error=f"{type(e).__name__}: {e}", trace=traceback.format_exc()[-2500:])
        return out
    if out["mtp_enabled"] and entry.get("head_preds"):
        try:
            out["head_preds"], prev = [], None
            for ids, gen in zip(prompts, entry["head_preds"]):
                out["head_preds"].append(head_predictions(rt, ids, gen, prev))
                prev = out["head_preds"][-1].pop("_last_hidden")
        except Exception as e:  # noqa: BLE001
            out.update(head_preds_error=f"{type(e).__name__}: {e}", trace=traceback.format_exc()[-2500:])
    if out["mtp_enabled"]:
        try:
            res = [generate_mtpk(rt, ids, max_tokens=max_tokens, speculative_depth=1, mtp_hidden_variant="post_norm",
                                 mtp_cache_policy="persistent", mtp_history_policy="committed", **greedy)
                   for ids in prompts]
            out["mtp"] = [r.tokens for r in res]
            out["drafted"] = sum(int(r.stats.drafted_tokens) for r in res)
            out["accepted"] = sum(int(r.stats.accepted_drafts) for r in res)
            out["identical_to_plain"] = out["mtp"] == out["plain"]
        except Exception as e:  # noqa: BLE001
            out.update(stage="mtp decode", error=f"{type(e).__name__}: {e}", trace=traceback.format_exc()[-2500:])
    return out


def head_predictions(rt, prompt: list[int], generated: list[int], prev_hidden=None) -> dict:
    """The head's greedy draft at every generated position, in one causal pass: the trunk's
    post-norm hidden state at position j (MTPLX's ``return_hidden``) with token j+1 predicts
    token j+2 (``mtp_forward`` over the whole sequence with a fresh head cache, as a head that
    was prefilled over the prompt and then fed one pair per step). Returns the predictions for
    the pairs (last prompt position, first generated token), ... — the order in which a decoder
    drafting one token per step proposes them — and each one's margin (top-1 minus top-2 logit)."""
    import mlx.core as mx

    seq = mx.array([list(prompt) + list(generated)])
    _, hidden = rt.model(seq, cache=None, return_hidden=True)
    logits = rt.model.mtp_forward(hidden[:, :-1], seq[:, 1:], mtp_cache=rt.model.make_mtp_cache())
    lg = logits[0].astype(mx.float32)
    preds = mx.argmax(lg, axis=-1).tolist()
    top2 = mx.sort(lg, axis=-1)[:, -2:]
    margins = (top2[:, 1] - top2[:, 0]).tolist()
    k = len(prompt) - 1
    # the same pairs with a head cache that starts at the last prompt position (no prefill of
    # the head over the prompt's earlier pairs): tells which history a decoder gave its head
    tail = rt.model.mtp_forward(hidden[:, k:-1], seq[:, k + 1:], mtp_cache=rt.model.make_mtp_cache())
    out = {"preds": preds[k:], "margins": [round(float(m), 5) for m in margins[k:]],
           "preds_no_prompt_prefill": mx.argmax(tail[0], axis=-1).tolist()}
    out["preds_llama_history"] = _llama_history_drafts(rt, seq, hidden, len(prompt), len(generated))
    # the committed history plus llama.cpp's first pair: the prompt's first token with a zero hidden
    hz = mx.concatenate([mx.zeros_like(hidden[:, :1]), hidden[:, :-1]], axis=1)
    zl = rt.model.mtp_forward(hz, seq, mtp_cache=rt.model.make_mtp_cache())
    out["preds_zero_first_pair"] = mx.argmax(zl[0], axis=-1).tolist()[len(prompt):]
    # llama.cpp keeps its pending hidden state between requests of one server: the first pair of
    # a later prompt gets the previous request's last pending row instead of zeros
    stale = prev_hidden if prev_hidden is not None else mx.zeros_like(hidden[:, :1])
    hs = mx.concatenate([stale, hidden[:, :-1]], axis=1)
    sl = rt.model.mtp_forward(hs, seq, mtp_cache=rt.model.make_mtp_cache())
    out["preds_stale_first_pair"] = mx.argmax(sl[0], axis=-1).tolist()[len(prompt):]
    out["_last_hidden"] = hidden[:, -2:-1]
    last = rt.model.mtp.layers[-1]
    if hasattr(last, "final_layernorm"):
        # Nemotron-H: the same head with its final norm applied as LayerNorm (mean removed, no
        # bias) instead of RMSNorm — llama.cpp's graph builds it with LLM_NORM
        import mlx.nn as nn

        rms = last.final_layernorm
        ln = nn.LayerNorm(rms.weight.shape[0], eps=rms.eps, affine=True, bias=False)
        ln.weight = rms.weight
        last.final_layernorm = ln
        try:
            alt = rt.model.mtp_forward(hidden[:, :-1], seq[:, 1:], mtp_cache=rt.model.make_mtp_cache())
        finally:
            last.final_layernorm = rms
        out["preds_final_layernorm"] = mx.argmax(alt[0], axis=-1).tolist()[k:]
        last.final_layernorm = ln
        try:
            out["preds_llama_history_layernorm"] = _llama_history_drafts(rt, seq, hidden, len(prompt), len(generated))
            zl = rt.model.mtp_forward(hz, seq, mtp_cache=rt.model.make_mtp_cache())
            out["preds_zero_first_pair_layernorm"] = mx.argmax(zl[0], axis=-1).tolist()[len(prompt):]
            sl = rt.model.mtp_forward(hs, seq, mtp_cache=rt.model.make_mtp_cache())
            out["preds_stale_first_pair_layernorm"] = mx.argmax(sl[0], axis=-1).tolist()[len(prompt):]
        finally:
            last.final_layernorm = rms
    return out


def _llama_history_drafts(rt, seq, hidden, n_prompt: int, n_gen: int) -> list[int]:
    """The drafts a head produces when its KV history is fed the way llama.cpp's draft-mtp feeds
    it (read in common/speculative.cpp, not confirmed there), every draft rejected as in these
    runs: the prompt's pairs (token j with the hidden of j-1, zeros for the first token); then per
    step the draft call (last token, pending hidden), and the verify batch's catch-up, which adds
    the same pair again and the rejected draft's pair. Entries are only appended (positions in
    the cache follow insertion, so this is exact only for a head without RoPE)."""
    import mlx.core as mx

    cache = rt.model.make_mtp_cache()
    h0 = mx.zeros_like(hidden[:, :1])
    hp = mx.concatenate([h0, hidden[:, : n_prompt - 1]], axis=1)
    rt.model.mtp_forward(hp, seq[:, :n_prompt], mtp_cache=cache)
    drafts = []
    for i in range(n_gen):
        pos = n_prompt + i
        tok = seq[:, pos:pos + 1]
        h_prev = hidden[:, pos - 1:pos]
        logits = rt.model.mtp_forward(h_prev, tok, mtp_cache=cache)
        d = int(mx.argmax(logits[0, -1]).item())
        drafts.append(d)
        pair_h = mx.concatenate([h_prev, hidden[:, pos:pos + 1]], axis=1)
        pair_t = mx.concatenate([tok, mx.array([[d]], dtype=tok.dtype)], axis=1)
        rt.model.mtp_forward(pair_h, pair_t, mtp_cache=cache)
    return drafts


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    results = {e["id"]: run(e, spec["max_tokens"], spec["prompts"]) for e in spec["cells"]}
    results["_standins"] = standins.APPLIED
    Path(sys.argv[2]).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
