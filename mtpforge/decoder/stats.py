"""Turning decode runs into the numbers ``verify`` reports (docs/CONTRACT.md ``verify`` keys)."""

from __future__ import annotations

from typing import Any

from .loop import Run


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where two outputs differ (``None`` when identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _rate(num: int, den: int) -> float:
    return num / den if den else 0.0


def _tok_s(runs: list[Run]) -> float:
    steps = sum(max(len(r.tokens) - 1, 0) for r in runs)
    secs = sum(r.seconds for r in runs)
    return steps / secs if secs > 0 else 0.0


def summarize(mtp: list[Run], plain: list[Run]) -> dict[str, Any]:
    """Acceptance overall and per draft position, tokens per verify pass, and speeds.

    ``accepted_per_verify`` is accepted drafts per verify pass; ``tokens_per_verify`` adds the
    backbone's own token that every pass yields (what a user gains per backbone call).
    """
    depth = max((len(r.drafted) for r in mtp), default=0)
    drafted = [sum(r.drafted[i] for r in mtp if i < len(r.drafted)) for i in range(depth)]
    accepted = [sum(r.accepted[i] for r in mtp if i < len(r.accepted)) for i in range(depth)]
    passes = sum(r.verify_passes for r in mtp)
    base, fast = _tok_s(plain), _tok_s(mtp)
    return {
        "tokens": sum(len(r.tokens) for r in mtp),
        "drafted": sum(drafted),
        "accepted": sum(accepted),
        "acceptance": _rate(sum(accepted), sum(drafted)),
        "acceptance_by_position": [_rate(a, d) for a, d in zip(accepted, drafted)],
        "drafted_by_position": drafted,
        "verify_passes": passes,
        "rollbacks": sum(r.rollbacks for r in mtp),
        "accepted_per_verify": _rate(sum(accepted), passes),
        "tokens_per_verify": _rate(sum(accepted) + passes, passes),
        "baseline_tok_s": base,
        "mtp_tok_s": fast,
        "speedup": fast / base if base > 0 else 0.0,
    }


def tie_margin(bb: Any, prompt: list[int], prefix: list[int], a: int, b: int) -> tuple[float, float]:
    """How close tokens ``a`` and ``b`` were where two greedy outputs part: |logit a - logit b|
    from a fresh pass over ``prompt + prefix``, and the tolerance below which that is a tie.

    Plain decoding runs one token per pass, MTP verifies k+1 at once: the same sums in another
    order (other matmul shapes and kernels), equal up to a few ulps of the logits. When two
    logits are that close either argmax is right, so such a split is not a decoder bug. In
    float32 (the CPU) the tolerance is ~1e-6 of the largest logit; in bf16 it is wider.
    """
    import mlx.core as mx

    logits, _ = bb(prompt + prefix, bb.make_cache(), "post")
    row = logits[0, -1].astype(mx.float32)
    margin = abs(float((row[a] - row[b]).item()))
    tol = 8.0 * float(mx.finfo(bb.dtype).eps) * float(mx.abs(row).max().item())
    return margin, tol
