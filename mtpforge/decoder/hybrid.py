"""A hybrid multi-layer MTP head (Nemotron-H): several blocks of the backbone's own kinds, one
per character of the head's pattern (``*E``: attention, then MoE), with the NextN tensors on the
first block and the final norm on the last.

    e = enorm(embed(x[t+1]))              # the trunk's embedding
    h = hnorm(H[t])                       # the trunk's hidden state after its final norm
    z = eh_proj(concat([e, h]))           # embedding first, then hidden
    z = layers[k](z)  for each block      # pre-norm block; attention without RoPE, own KV cache
    out = final_layernorm(z)              # -> the backbone's lm_head; fed back for deeper drafts

This is what mlx-lm's pull request #1533 (``NemotronHMTPBlock``), MTPLX's ``nemotron_h_mtp``
backend and mlx-vlm's drafter compute (docs/families/nemotron_h.md §2): each block is a subclass
of the family's mlx-lm block class, so its parameters are named as the family spells the bare
head keys and a ``HeadWeights`` loads with ``load_weights`` as is. The final norm is an RMSNorm,
as in the MLX runtimes (llama.cpp applies a LayerNorm there: docs/families/nemotron_h.md §2).
Norms multiply as stored: the family's norms are raw.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

#: the block kinds with a KV cache of their own
ATTENTION = "*"


def hybrid_head(block_class: type, args: Any, pattern: str) -> nn.Module:
    """A head of ``len(pattern)`` blocks of ``block_class`` (the backbone's block, built with a
    block-type character), over ``args`` (the backbone's model args)."""
    h = args.hidden_size
    eps = args.layer_norm_epsilon

    class MTPBlock(block_class):  # type: ignore[misc, valid-type]
        def __init__(self, kind: str, first: bool, last: bool) -> None:
            super().__init__(args, kind)
            if first:
                self.enorm = nn.RMSNorm(h, eps=eps)
                self.hnorm = nn.RMSNorm(h, eps=eps)
                self.eh_proj = nn.Linear(2 * h, h, bias=False)
            if last:
                self.final_layernorm = nn.RMSNorm(h, eps=eps)

    class HybridHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            n = len(pattern)
            self.layers = [MTPBlock(kind, i == 0, i == n - 1) for i, kind in enumerate(pattern)]

        def make_cache(self) -> list[KVCache]:
            """One KV cache per attention block (the others keep no state)."""
            return [KVCache() for kind in pattern if kind == ATTENTION]

        def __call__(self, hidden: mx.array, embeddings: mx.array, cache: list[KVCache] | None = None,
                     layer: int = 0) -> mx.array:
            first = self.layers[0]
            z = first.eh_proj(mx.concatenate([first.enorm(embeddings), first.hnorm(hidden)], axis=-1))
            caches = iter(cache or [])
            for block in self.layers:
                c = next(caches, None) if block.block_type == ATTENTION else None
                mask = create_attention_mask(z, c) if block.block_type == ATTENTION else None
                z = block(z, mask=mask, cache=c)
            return self.layers[-1].final_layernorm(z)

        def logits(self, z: mx.array, backbone: Any, layer: int = 0) -> mx.array:
            return backbone.lm_head(z)

    return HybridHead()
