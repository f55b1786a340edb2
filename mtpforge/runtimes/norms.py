"""How runtimes re-decide a head's RMSNorm convention from the values (``NormRule``): given the
mean of every stored norm, the keys the runtime adds +1 to. docs/SPEC.md §4 says never to decide from
values; these rules describe runtimes that do, so ``inspect --runtime`` can warn when a
correctly shifted head is shifted a second time."""

from __future__ import annotations

from typing import Mapping

from ..families.spec import Role
from ..families.tables import role_of

#: MTPLX's two norm families (mtplx/compressed_tensors.py), by role, and its thresholds
_QK = frozenset({Role.Q_NORM, Role.K_NORM})
_LOW = frozenset({Role.INPUT_NORM, Role.POST_ATTENTION_NORM, Role.PRE_FC_NORM_HIDDEN, Role.PRE_FC_NORM_EMBEDDING})
MTPLX_QK_MAX, MTPLX_LOW_MAX = 1.25, 0.5
#: vllm-mlx's (without its manifest marker) and exo's per-tensor threshold
MEAN_THRESHOLD = 0.5


def below_half(means: Mapping[str, float]) -> list[str]:
    """vllm-mlx 0.6.0 (Qwen3.5/3.6, no ``manifest.json`` marker) and exo #2110: +1 on every norm
    whose mean is below 0.5, one tensor at a time."""
    return sorted(k for k, m in means.items() if m < MEAN_THRESHOLD)


def mtplx_two_signal(means: Mapping[str, float]) -> list[str]:
    """MTPLX 2.12.2: +1 on all of them iff the largest q/k-norm mean is below 1.25 and the
    smallest of the other per-layer and pre-fc norms is below 0.5."""
    roles = {k: role_of(k) for k in means}
    qk = [m for k, m in means.items() if roles[k] in _QK]
    low = [m for k, m in means.items() if roles[k] in _LOW]
    if qk and low and max(qk) < MTPLX_QK_MAX and min(low) < MTPLX_LOW_MAX:
        return sorted(means)
    return []
