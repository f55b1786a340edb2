"""Plain decoding and MTP speculative decoding on one backbone (docs/SPEC.md §3).

Invariant of :func:`mtp_decode`, between steps: the backbone's caches hold every confirmed token
except the newest one (``tok``), and the head's KV cache holds one entry per pair
``(H[i], x[i+1])`` for every position ``i`` before the newest confirmed hidden state. The pairs
not yet fed to the head (``pend_h`` / ``pend_x``) go in with the first draft call of the next
step, so the head is prefilled on the prompt and caught up on accepted tokens in the same call
that drafts — no extra pass. Drafts at depth j > 1 feed the head's own normed output as the
hidden state; their cache entries are dropped after the step because a real backbone hidden
state replaces them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import mlx.core as mx

from .backbone import Backbone
from .head import MTPHead
from .rollback import rollback, snapshot, trim
from .sampling import Chooser


@dataclass
class Run:
    """One decode of one prompt."""

    tokens: list[int]
    seconds: float  # decode time after the first token (prefill excluded)
    drafted: list[int] = field(default_factory=list)  # per draft position
    accepted: list[int] = field(default_factory=list)
    verify_passes: int = 0
    rollbacks: int = 0


def _finish(tokens: list[int], max_tokens: int, eos: set[int]) -> list[int]:
    out = tokens[:max_tokens]
    for i, t in enumerate(out):
        if t in eos:
            return out[: i + 1]
    return out


def plain_decode(bb: Backbone, prompt: list[int], *, max_tokens: int, chooser: Chooser) -> Run:
    """Plain decoding with mlx-lm's own ``generate_step`` — the baseline a user gets today."""
    from mlx_lm.generate import generate_step

    if chooser.greedy:
        sampler = lambda lp: mx.argmax(lp, axis=-1)  # noqa: E731 - mlx-lm's sampler signature
    else:
        sampler = lambda lp: mx.array([chooser.pick(lp[0])])  # noqa: E731
    tokens: list[int] = []
    t0 = 0.0
    for tok, _ in generate_step(mx.array(prompt), bb.model, max_tokens=max_tokens, sampler=sampler):
        tokens.append(int(tok))
        if len(tokens) == 1:
            t0 = time.perf_counter()
        if tokens[-1] in bb.eos_ids:
            break
    return Run(tokens, time.perf_counter() - t0)


class Drafter(Protocol):
    """Proposes draft tokens; told every confirmed pair once, in order (see module docstring)."""

    def reset(self) -> None: ...

    def draft(self, pend_h: mx.array, pend_x: list[int], k: int, chooser: Chooser) -> tuple[mx.array, list[Any]]:
        """``k`` draft tokens as an int array [k] (may be lazy) and, when sampling, the
        distribution each was drawn from."""
        ...


class HeadDrafter:
    """The MTP head as a drafter, with its own KV cache (docs/SPEC.md §3)."""

    def __init__(self, bb: Backbone, head: MTPHead) -> None:
        self.bb, self.head = bb, head
        self.cache = head.make_cache()

    def reset(self) -> None:
        self.cache = self.head.make_cache()

    def draft(self, pend_h: mx.array, pend_x: list[int], k: int, chooser: Chooser) -> tuple[mx.array, list[Any]]:
        """``k`` draft tokens; the head's cache ends holding the real pairs only."""
        bb, head = self.bb, self.head
        steps = getattr(head, "steps", 1)  # depth j runs step (j - 1) mod steps (Step-3.5's layers)
        z = head(pend_h, bb.embed(pend_x), cache=self.cache)[:, -1:]
        drafts: list[mx.array] = []
        qs: list[Any] = []
        for j in range(k):
            if j:
                z = head(z, bb.embed(drafts[-1]), cache=self.cache, layer=j % steps)
            d, q = chooser.draft(head.logits(z, bb, j % steps)[0, -1])
            drafts.append(d)
            qs.append(q)
        if steps == 1:
            trim(self.cache, k - 1)
        else:  # each step's cache loses the rows of this round's deeper drafts that it ran
            for i, c in enumerate(self.cache):
                trim([c], sum(1 for j in range(1, k) if j % steps == i))
        return mx.concatenate(drafts), qs


def mtp_decode(
    bb: Backbone, drafter: Drafter, prompt: list[int], *, max_tokens: int, depth: int, hidden: str, chooser: Chooser,
) -> Run:
    """Speculative decoding: draft ``depth`` tokens, verify them with one backbone pass over
    [last confirmed, drafts], keep the agreed prefix plus the backbone's own next token."""
    eos = bb.eos_ids
    cache = bb.make_cache()
    drafter.reset()
    logits, hid = bb(prompt, cache, hidden)
    tok = chooser.pick(logits[0, -1])
    out = [tok]
    t0 = time.perf_counter()
    run = Run(out, 0.0, [0] * depth, [0] * depth)
    pend_h, pend_x = hid, prompt[1:] + [tok]
    while len(out) < max_tokens and tok not in eos:
        k = min(depth, max_tokens - len(out))
        draft_arr, qs = drafter.draft(pend_h, pend_x, k, chooser)
        snap = snapshot(cache)
        logits, hid = bb(mx.concatenate([mx.array([tok], dtype=mx.int32), draft_arr.astype(mx.int32)]), cache, hidden)
        n, nxt, drafts = chooser.judge(logits[0], draft_arr, qs)
        run.verify_passes += 1
        for i in range(k):
            run.drafted[i] += 1
            run.accepted[i] += i < n
        if n < k:
            # the backbone saw k - n tokens that did not happen: back to before the verify pass,
            # then the confirmed ones again (their hidden states from the verify pass stay valid)
            rollback(cache, snap, k + 1)
            bb([tok] + drafts[:n], cache, hidden)
            run.rollbacks += 1
        pend_h, pend_x = hid[:, : n + 1], drafts[:n] + [nxt]
        out.extend(pend_x)
        tok = nxt
        if any(t in eos for t in drafts[:n]):
            break
    mx.eval([c.state for c in cache])
    run.seconds = time.perf_counter() - t0
    run.tokens = _finish(out, max_tokens, eos)
    return run


def draft_once(bb: Backbone, head: MTPHead, prompt: list[int], hidden: str = "post") -> tuple[int, mx.array]:
    """One draft step after a prompt: the head loads and runs (``verify`` without ``--generate``)."""
    cache = bb.make_cache()
    logits, hid = bb(prompt, cache, hidden)
    tok = int(mx.argmax(logits[0, -1]).item())
    z = head(hid, bb.embed(prompt[1:] + [tok]), cache=head.make_cache())
    draft_logits = head.logits(z[:, -1:], bb)[0, -1]
    mx.eval(draft_logits)
    return int(mx.argmax(draft_logits).item()), draft_logits
