"""Choosing tokens: greedy, sampled, and the speculative acceptance rule (SPEC §3).

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

    def draft(self, logits: mx.array) -> tuple[int, np.ndarray | None]:
        """A draft token from the head's logits [V], and q (None when greedy)."""
        if self.greedy:
            return int(mx.argmax(logits).item()), None
        q = _probs(logits, self.temp)
        return self._draw(q), q

    def judge(self, logits: mx.array, drafts: list[int], qs: list[np.ndarray | None]) -> tuple[int, int]:
        """(number of drafts accepted, the token that follows them) given the backbone's
        logits [k+1, V] over [last confirmed, drafts...]."""
        if self.greedy:
            best = mx.argmax(logits, axis=-1).tolist()
            n = 0
            while n < len(drafts) and drafts[n] == best[n]:
                n += 1
            return n, int(best[n])
        p = _probs(logits, self.temp)
        for i, (d, q) in enumerate(zip(drafts, qs)):
            assert q is not None
            if self.rng.random() < min(1.0, p[i, d] / q[d]):
                continue
            residual = np.maximum(p[i] - q, 0.0)
            return i, self._draw(residual if residual.sum() > 0 else p[i])
        return len(drafts), self._draw(p[len(drafts)])
