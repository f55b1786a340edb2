"""A NextN head (GLM-4.5/4.6/4.7, DeepSeek): one more decoder layer of the backbone's own kind,
built from mlx-lm's decoder layer class, with the NextN tensors around it.

    e = enorm(embed(x[t+1]))        # the trunk's embedding (MTPLX shares it; releases ship an
    h = hnorm(H[t])                 #   equal ``embed_tokens`` copy, which llama.cpp reads)
    z = eh_proj(concat([e, h]))     # embedding first, then hidden
    z = layer(z)                    # attention + MoE, own KV cache
    out = shared_head.norm(z)       # -> shared_head.head, or the backbone's lm_head without one

The layer is a subclass of the family's mlx-lm decoder layer, so its parameters are named as the
family spells the bare head keys (``self_attn.q_proj.weight``, ``mlp.switch_mlp.…``,
``eh_proj.weight``, ``shared_head.norm.weight``) and a ``HeadWeights`` loads with
``load_weights`` as is. The norms multiply as stored: a NextN family's norms are raw.
"""

from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache


class SharedHead(nn.Module):
    """The head's final norm and, where the release ships one, its own output projection."""

    def __init__(self, hidden: int, vocab: int, eps: float, own_head: bool) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(hidden, eps=eps)
        if own_head:
            self.head = nn.Linear(hidden, vocab, bias=False)


def nextn_head(layer_class: type, args: Any, own_head: bool, mask_as_array: bool = False,
               layer_cache: Callable[[], Any] | None = None) -> nn.Module:
    """A NextN head over ``layer_class`` (the backbone's decoder layer), at the layer index the
    release stores it under (``num_hidden_layers``: an MoE layer where the backbone has them).
    ``mask_as_array``: the layer needs its causal mask as an array (MLA: ``FamilySpec.mask_as_array``);
    ``layer_cache``: the layer's cache where one ``KVCache`` is not it (``FamilySpec.head_cache``:
    DeepSeek Sparse Attention's layer keeps its indexer's keys beside the attention's)."""

    class NextNHead(layer_class):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__(args, layer_idx=args.num_hidden_layers)
            h, eps = args.hidden_size, args.rms_norm_eps
            self.enorm = nn.RMSNorm(h, eps=eps)
            self.hnorm = nn.RMSNorm(h, eps=eps)
            self.eh_proj = nn.Linear(2 * h, h, bias=False)
            self.shared_head = SharedHead(h, args.vocab_size, eps, own_head)

        def make_cache(self) -> list[Any]:
            return [layer_cache() if layer_cache is not None else KVCache()]

        def __call__(self, hidden: mx.array, embeddings: mx.array, cache: list[KVCache] | None = None,
                     layer: int = 0) -> mx.array:
            z = self.eh_proj(mx.concatenate([self.enorm(embeddings), self.hnorm(hidden)], axis=-1))
            c = cache[0] if cache is not None else None
            attn = c[0] if layer_cache is not None and c is not None else c  # the attention's own cache
            z = super().__call__(z, mask=create_attention_mask(z, attn, return_array=mask_as_array), cache=c)
            return self.shared_head.norm(z)

        def logits(self, z: mx.array, backbone: Any, layer: int = 0) -> mx.array:
            return self.shared_head.head(z) if "head" in self.shared_head else backbone.lm_head(z)

    return NextNHead()
