"""Choosing tokens: greedy, sampled, and the speculative acceptance rule (docs/SPEC.md §3).

Greedy: a draft is accepted iff it is the backbone's argmax. Sampling at temperature T: a draft
``d`` drawn from the head's distribution q is accepted with probability min(1, p(d)/q(d)); on
rejection the next token is drawn from normalise(max(p - q, 0)) — which makes the emitted
sequence distributed exactly as plain sampling from p. Randomness comes from one seeded numpy
generator so a run is reproducible from its seed on any platform.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np


def _probs(logits: mx.array, temp: float) -> np.ndarray:
    x = np.asarray(logits.astype(mx.float32), dtype=np.float64) / temp
    x = np.exp(x - x.max(axis=-1, keepdims=True))
    return x / x.sum(axis=-1, keepdims=True)


class Chooser:
    """Greedy when ``temp == 0``, else seeded sampling at ``temp``."""

    def __init__(self, temp: float = 0.0, seed: int | None = None) -> None:
        self.temp = float(temp)
        self.rng = np.random.default_rng(seed)

    @property
    def greedy(self) -> bool:
        return self.temp <= 0.0

    def _draw(self, p: np.ndarray) -> int:
        c = np.cumsum(p)
        return int(min(np.searchsorted(c, self.rng.random() * c[-1], side="right"), len(p) - 1))

    def pick(self, logits: mx.array) -> int:
        """The next token from one row of logits [V]."""
        if self.greedy:
            return int(mx.argmax(logits).item())
        return self._draw(_probs(logits, self.temp))

    def draft(self, logits: mx.array) -> tuple[mx.array, np.ndarray | None]:
        """A draft token [1] from the head's logits [V], and q (None when greedy).

        Greedy drafts stay lazy, so drafting and the verify pass run as one graph with a single
        synchronisation per step (tiny models are overhead-bound on the CPU, docs/SPEC.md §4).
        """
        if self.greedy:
            return mx.argmax(logits, keepdims=True).astype(mx.int32), None
        q = _probs(logits, self.temp)
        return mx.array([self._draw(q)], dtype=mx.int32), q

    def judge(self, logits: mx.array, drafts: mx.array, qs: list[np.ndarray | None]) -> tuple[int, int, list[int]]:
        """(number of drafts accepted, the token that follows them, the drafts) given the
        backbone's logits [k+1, V] over [last confirmed, drafts...] and the drafts [k]."""
        if self.greedy:
            best_a = mx.argmax(logits, axis=-1)
            mx.eval(best_a, drafts)
            best, ds = best_a.tolist(), drafts.tolist()
            n = 0
            while n < len(ds) and ds[n] == best[n]:
                n += 1
            return n, int(best[n]), ds
        ds = drafts.tolist()
        p = _probs(logits, self.temp)
        for i, (d, q) in enumerate(zip(ds, qs)):
            assert q is not None
            if self.rng.random() < min(1.0, p[i, d] / q[d]):
                continue
            residual = np.maximum(p[i] - q, 0.0)
            return i, self._draw(residual if residual.sum() > 0 else p[i]), ds
        return len(ds), self._draw(p[len(ds)]), ds
