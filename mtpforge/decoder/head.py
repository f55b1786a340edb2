"""The MTP head as docs/SPEC.md §3 computes it, built from mlx-lm's own blocks.

One implementation serves the decoder (``verify``), the trainer of the bundled tiny model and the
reference checks in tests, so "the head" means exactly one thing in this codebase:

    e = pre_fc_norm_embedding(embed(x[t+1]))
    h = pre_fc_norm_hidden(H[t])
    z = fc(concat([e, h]))          # embedding first, then hidden
    z = layers[0](z)                # the backbone's full-attention decoder layer, own KV cache
    out = norm(z)                   # -> the backbone's lm_head

Parameters are named as the canonical bare head keys (``fc.weight``,
``layers.0.self_attn.q_proj.weight``, ``layers.0.mlp.switch_mlp.gate_proj.weight`` …) so a
:class:`~mtpforge.layouts.read.HeadWeights` loads with ``load_weights`` as is. Norm weights are
in MLX's convention (``x̂·w``), i.e. already shifted.
"""

from __future__ import annotations

from typing import Any, Mapping

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from ..families.tables import mtp_layers_of
from ..passes.mla import to_mlx_layer


def _layer_factory(family: str, args: Any) -> Any:
    """The backbone family's decoder layer class, built as a full-attention layer."""
    from ..families import FAMILIES

    layer = FAMILIES[family].head_layer()
    return lambda: layer(args, layer_idx=args.full_attention_interval - 1)


class MTPHead(nn.Module):
    """``n_layers`` MTP layers over the backbone's hidden state and the next token's embedding.

    ``args`` are the backbone's text-model args (``TextModelArgs`` for Qwen3.5/3.6, the
    Qwen3-Next ``ModelArgs``): the layer is the backbone's own full-attention block with the
    backbone's rope settings.
    """

    def __init__(self, family: str, args: Any, n_layers: int = 1) -> None:
        super().__init__()
        h = args.hidden_size
        eps = args.rms_norm_eps
        self.family = family
        self.pre_fc_norm_embedding = nn.RMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(h, eps=eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        make = _layer_factory(family, args)
        self.layers = [make() for _ in range(n_layers)]
        self.norm = nn.RMSNorm(h, eps=eps)

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def logits(self, z: mx.array, backbone: Any, layer: int = 0) -> mx.array:
        """Logits of the head's normed output: through the backbone's lm_head (one for every
        layer)."""
        return backbone.lm_head(z)

    def __call__(
        self,
        hidden: mx.array,
        embeddings: mx.array,
        cache: list[KVCache] | None = None,
        layer: int = 0,
    ) -> mx.array:
        """Normed head output [B, L, H] for hidden states H[t] and embeddings of x[t+1].

        ``layer`` picks which MTP layer runs (released models have one: the decoder loop re-applies
        it at every depth, docs/SPEC.md §3; it cycles only through a head's ``steps``). The result
        goes through the backbone's lm_head for logits.
        """
        e = self.pre_fc_norm_embedding(embeddings)
        h = self.pre_fc_norm_hidden(hidden)
        z = self.fc(mx.concatenate([e, h], axis=-1))
        c = cache[layer] if cache is not None else None
        mask = create_attention_mask(z, c)
        z = self.layers[layer](z, mask=mask, cache=c)
        return self.norm(z)


def quantize_like(head: nn.Module, quant: Mapping[str, Mapping[str, Any]]) -> None:
    """Turn the head's Linear modules into the quantized modules the stored triplets need.

    ``quant`` maps bare module paths (``layers.0.self_attn.q_proj``) to
    ``{bits, group_size, mode}`` as inferred from the stored shapes.
    """
    if not quant:
        return

    def predicate(path: str, module: nn.Module) -> bool | dict[str, Any]:
        q = quant.get(path)
        if q is None or not hasattr(module, "to_quantized"):
            return False
        return {"bits": int(q["bits"]), "group_size": int(q["group_size"]), "mode": str(q.get("mode", "affine"))}

    nn.quantize(head, class_predicate=predicate)


def build_head(
    family: str,
    args: Any,
    tensors: Mapping[str, mx.array],
    quant: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    compute_dtype: mx.Dtype = mx.float32,
) -> nn.Module:
    """A head loaded from canonical tensors (bare keys, MLX norms, ``switch_mlp`` experts).

    Unquantized weights are cast to ``compute_dtype``: on the CPU build of MLX bf16 matmuls are
    slow and unquantized expert stacks (``gather_mm``) run only in float32 (docs/SPEC.md §4). Quantized
    triplets keep their stored form. Loading is strict: a missing or extra tensor is an error.
    """
    from ..families import FAMILIES
    from ..families.spec import Role

    spec = FAMILIES[family]
    head: nn.Module
    if spec.topology.appended_steps:  # one layer per step, each at N + i (Step-3.5)
        from .appended import appended_head, under_steps

        head = appended_head(spec.head_layer(), args, 1 + max(mtp_layers_of(tensors, family), default=0))
        quant = under_steps(quant or {})  # module paths; its load_weights takes the bare keys
    elif spec.topology.nextn:
        from .nextn import nextn_head

        # the head drafts with the trunk's embedding (as MTPLX does); a release's copy is not loaded
        def role(key: str) -> Role | None:  # of a weight and of its quantization triplet alike
            return spec.role_of(key.rsplit(".", 1)[0])

        tensors = {k: v for k, v in tensors.items() if role(k) != Role.EMBED_TOKENS}
        own = any(role(k) == Role.SHARED_HEAD for k in tensors)
        head = nextn_head(spec.head_layer(), args, own, spec.mask_as_array, spec.head_cache)
    elif spec.topology.mlx_blocks:
        from .hybrid import hybrid_head

        head = hybrid_head(spec.head_layer(), args, "".join(spec.topology.mlx_blocks))
    else:
        head = MTPHead(family, args, 1 + max(mtp_layers_of(tensors, family), default=0))
    # MLA's kv_b_proj is stored whole; mlx-lm's layer holds it split (as MTPLX splits it on load)
    tensors, quant = to_mlx_layer(spec, args, tensors, quant or {})
    quantize_like(head, quant)
    weights = []
    for k, v in tensors.items():
        if mx.issubdtype(v.dtype, mx.floating) and not k.endswith((".scales", ".biases")):
            v = v.astype(compute_dtype)
        weights.append((k, v))
    head.load_weights(weights, strict=True)
    head.eval()
    mx.eval(head.parameters())
    return head
