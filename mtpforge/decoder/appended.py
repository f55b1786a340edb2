"""A head of appended layers (Step-3.5): MTP step ``i`` is the layer the release appends at
``num_hidden_layers + i``, each a decoder layer of the backbone's own kind with the NextN tensors
and a shared head of its own around it (what MTPLX's ``step3p5_mtp`` and vLLM's ``step3p5_mtp``
run):

    e = enorm(embed(x[t+1]))           # the trunk's embedding
    h = hnorm(H[t])
    z = eh_proj(concat([e, h]))        # embedding first, then hidden
    z = layer(z)                       # the backbone's decoder layer at index N + i, own KV cache
    logits = transformer.shared_head.output(transformer.shared_head.norm(z))

The next depth is fed ``z``, the block's output before the shared head's norm, as MTPLX's
``step3p5_mtp`` (and vLLM's predictor it follows) chains it; ``logits`` applies the norm.

mlx-lm has no such head, so this one is built over the family's mlx-lm decoder layer (a subclass,
so its parameters are the family's bare keys after ``{i}.``); the stored keys ``{i}.rest`` load as
``layers.{i}.rest``. Depth ``j`` runs step ``(j - 1) mod k`` with that step's own cache and shared
head (``steps``: the decoder loop cycles through them), as MTPLX's ``step3p5_mtp`` and vLLM's
predictor choose the layer; a head of one step re-applies it at every depth. Norms multiply as
stored: written +1, as mlx-lm's ``ZeroCenteredRMSNorm`` takes them.
"""

from __future__ import annotations

from typing import Any, Mapping

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

#: the head's parameters sit under this list (``layers.{i}.``); the stored bare keys lack it
STEPS = "layers."


class SharedHead(nn.Module):
    """Each step's final norm and output projection (the release's ``shared_head.{norm,output}``)."""

    def __init__(self, hidden: int, vocab: int, eps: float) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.output = nn.Linear(hidden, vocab, bias=False)


class _Transformer(nn.Module):
    """The release's ``transformer.`` infix in front of the shared head."""

    def __init__(self, hidden: int, vocab: int, eps: float) -> None:
        super().__init__()
        self.shared_head = SharedHead(hidden, vocab, eps)


def appended_head(layer_class: type, args: Any, n_steps: int) -> nn.Module:
    """A head of ``n_steps`` appended layers over ``layer_class`` (the backbone's decoder layer),
    each built at the index the release stores it under."""

    class Step(layer_class):  # type: ignore[misc, valid-type]
        def __init__(self, index: int) -> None:
            super().__init__(args, layer_idx=index)
            h, eps = args.hidden_size, args.rms_norm_eps
            self.enorm = nn.RMSNorm(h, eps=eps)
            self.hnorm = nn.RMSNorm(h, eps=eps)
            self.eh_proj = nn.Linear(2 * h, h, bias=False)
            self.transformer = _Transformer(h, args.vocab_size, eps)

    window = getattr(args, "sliding_window", None)

    class AppendedHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = [Step(args.num_hidden_layers + i) for i in range(n_steps)]
            #: the steps a chain of drafts cycles through, one a depth (the decoder loop reads it)
            self.steps = n_steps

        def load_weights(self, weights: Any, strict: bool = True) -> nn.Module:
            """Takes the stored bare keys (``{i}.rest``) as they are, for every caller (the norm
            checks load a head's stored norms onto it)."""
            return super().load_weights(list(under_steps(dict(weights)).items()), strict=strict)

        def make_cache(self) -> list[KVCache]:
            """A plain KV cache per step, its sliding window applied by the mask: trimmable
            whatever the length, as the decoder's rollback needs (a rotating cache is not, once
            full)."""
            return [KVCache() for _ in self.layers]

        def __call__(self, hidden: mx.array, embeddings: mx.array, cache: list[Any] | None = None,
                     layer: int = 0) -> mx.array:
            s = self.layers[layer]
            z = s.eh_proj(mx.concatenate([s.enorm(embeddings), s.hnorm(hidden)], axis=-1))
            c = cache[layer] if cache is not None else None
            sliding = getattr(s, "is_sliding", False) and window
            return s(z, mask=create_attention_mask(z, c, window_size=window if sliding else None), cache=c)

        def logits(self, z: mx.array, backbone: Any, layer: int = 0) -> mx.array:
            """Through the shared head of the step that made ``z``: each step has its own."""
            shared = self.layers[layer].transformer.shared_head
            return shared.output(shared.norm(z))

    return AppendedHead()


def under_steps(named: Mapping[str, Any]) -> dict[str, Any]:
    """Stored bare keys (``{i}.rest``, or module paths) as the head's parameter names."""
    return {(k if k.startswith(STEPS) else STEPS + k): v for k, v in named.items()}
