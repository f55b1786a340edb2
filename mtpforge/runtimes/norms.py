"""How runtimes re-decide a head's RMSNorm convention from the values (``NormRule``): given the
mean of every stored norm, the keys the runtime adds +1 to. docs/SPEC.md §4 says never to decide from
values; these rules describe runtimes that do, so ``inspect --runtime`` can warn when a
correctly shifted head is shifted a second time."""

from __future__ import annotations

from typing import Mapping

#: MTPLX's two norm families (mtplx/compressed_tensors.py) and its thresholds
_QK = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
_LOW = ("input_layernorm.weight", "post_attention_layernorm.weight", "pre_fc_norm_hidden.weight",
        "pre_fc_norm_embedding.weight")
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
    qk = [m for k, m in means.items() if k.endswith(_QK)]
    low = [m for k, m in means.items() if k.endswith(_LOW)]
    if qk and low and max(qk) < MTPLX_QK_MAX and min(low) < MTPLX_LOW_MAX:
        return sorted(means)
    return []
