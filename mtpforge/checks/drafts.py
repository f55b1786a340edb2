"""A dead head: its drafts agree with its own backbone on almost nothing.

Heads in the wild have been published with 0% acceptance (a 4-bit MLX head, an int4 head where
int8 gave 59%); nothing told their users before they benchmarked. When inspect runs the head
against the folder's backbone (the norm check by behaviour, offline: a head no manifest or source
vouches for), it also counts how often the head's greedy draft is the backbone's greedy token
two ahead — what depth-1 greedy acceptance counts. A head below ``DEAD_AGREEMENT`` (or no better than a draft that always names the
most frequent token) that no norm assignment revives is reported with the figure and the likely causes, most likely first:
precision, norms, hidden state. A head a norm assignment revives is the norm finding's (with
``repair-norms`` as its fix), not this one's.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..findings import DEAD_AGREEMENT, Finding, finding
from .context import InspectContext

#: head matrices below these bits collapse first (docs/FINDINGS.md, measured on the trained tiny models)
LOW_BITS = 4


def _head_bits(q: Mapping[str, Any]) -> list[int]:
    mods = (q or {}).get("mtp_modules") or {}
    return sorted({int(m["bits"]) for m in mods.values() if isinstance(m, dict) and isinstance(m.get("bits"), int)})


def causes(ctx: InspectContext, nb: Mapping[str, Any]) -> list[str]:
    """The likely causes, in order: precision, norms, hidden state, each with what was measured."""
    bits = _head_bits(ctx.report.get("quantization") or {})
    low = [b for b in bits if b < LOW_BITS]
    out = [f"precision: the head's matrices are {'/'.join(map(str, bits))}-bit"
           + (" — below 4 bits heads collapse; re-create it at 8 bits or bf16" if low else
              " — re-create it at 8 bits or bf16 to rule this out")
           if bits else "precision: the head is not quantized, so its values themselves are off (a damaged or untrained head)"]
    out.append("norms: every norm group was also tried shifted ±1 against the backbone and none revives the drafts "
               f"({nb['agreement'].get('best_norms', 0):.1%} at best), so a norm convention alone is not it; "
               "pass --source to compare the norms exactly")
    out.append(f"hidden state: both the pre- and the post-norm hidden state were tried ({nb.get('hidden')}-norm drafted "
               "best); a head trained on another model's hidden states, or fed the wrong layer's, drafts like this")
    return out


def check(ctx: InspectContext) -> list[Finding]:
    """MTP_HEAD_DEAD, when the head was run against its backbone and agrees on almost nothing."""
    nb = ctx.report.get("norm_behaviour")
    if not ctx.has_head or not isinstance(nb, dict):
        return []
    ag = nb.get("agreement") or {}
    stored, best = ag.get("as_stored"), ag.get("best_norms")
    if stored is None or best is None:
        return []
    # almost nothing: under DEAD_AGREEMENT, or no better than always naming the most frequent token
    floor = max(DEAD_AGREEMENT, float(ag.get("most_frequent_token") or 0.0))
    if stored >= floor or best >= floor:
        return []
    why = causes(ctx, nb)
    ctx.report["dead_head"] = {"agreement": stored, "best_norms": best,
                               "most_frequent_token": ag.get("most_frequent_token"), "positions": nb["cost"]["positions"],
                               "causes": why}
    return [finding(
        "MTP_HEAD_DEAD",
        f"the head's drafts agree with its backbone's next-next token on {stored:.1%} of {nb['cost']['positions']} "
        f"positions (a draft that always names the most frequent token: {ag.get('most_frequent_token', 0):.1%}): "
        f"acceptance will be about that, and MTP decoding slower than plain. Likely causes, in order: "
        + "; ".join(f"({i}) {c}" for i, c in enumerate(why, 1)),
        f"re-create the head from the original checkpoint: {ctx.add_fix} --precision 8 --force",
    )]
