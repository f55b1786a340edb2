"""Train the tiny Hy3-shaped model (``hy_v3``) and its MTP layer, so that llama.cpp's acceptance
with a head mtpforge wrote means something (the built-to-echo head of ``synth.hy_v3`` drafts by
construction, not by learning the trunk's next-next token).

mlx-lm has no Hy3 model, and needs none: a Hy3 block is GLM-4.5's as mlx-lm's ``glm4_moe`` holds
it with the whole head dimension rotated (NEOX order, as llama.cpp's ``hy-v3`` ropes it) — grouped
query attention with ``q_norm`` / ``k_norm`` per head before the rotation, a dense first layer,
then the sigmoid router whose bias only selects, the chosen weights normalised (``route_norm``) and
scaled (``router_scaling_factor``), and the shared expert added. So the trunk is ``glm4_moe.Model``
at the shapes of ``synth.hy_v3``, trained as a language model in float32, and the MTP layer is then
trained, trunk frozen, as llama.cpp's ``hy-v3`` MTP graph (``src/models/hy-v3.cpp``,
``graph_mtp``) runs it:

    h_t   = the trunk's hidden state after ``output_norm`` (hy-v3's ``t_h_nextn``)
    x     = eh_proj(concat([enorm(embed_tokens(x[t+1])), hnorm(h_t)]))
    x     = DecoderLayer(x)                    # the MoE kind, at index N
    logit = lm_head(final_layernorm(x))        # the trunk's own lm_head: drafts x[t+2]

Norms are raw (``HYV3RMSNorm``), exported as trained; the export renames mlx-lm's MoE back to the
release's (``mlp.router.gate``, ``mlp.expert_bias``, ``mlp.shared_mlp``, experts one by one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .hy_v3 import TRAINED_VOCAB, tensor_specs, tiny_config
from .train_family import Recipe, add_nextn_parts, train_and_write
from .train_glm import GlmTrainSettings, unstack_experts

FOLDER = "tiny-hy_v3-trained"

#: mlx-lm's glm4_moe names -> the release's
_RELEASE_NAMES = ((".mlp.gate.e_score_correction_bias", ".mlp.expert_bias"), (".mlp.gate.weight", ".mlp.router.gate.weight"),
                  (".mlp.shared_experts.", ".mlp.shared_mlp."))


def settings(**given: Any) -> GlmTrainSettings:
    """GLM-4.5's settings, shortened as the other families' (a few minutes on a busy 2-core machine)."""
    return GlmTrainSettings(**{"backbone_steps": 300, "head_steps": 200, "seq_len": 64, "corpus_docs": 4000, **given})


def glm_args(config: dict[str, Any]) -> Any:
    """The Hy3 config in glm4_moe's terms: every rotary dimension, one expert group."""
    from mlx_lm.models import glm4_moe

    c = config
    return glm4_moe.ModelArgs(
        model_type="hy_v3", vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"], max_position_embeddings=c["max_position_embeddings"],
        moe_intermediate_size=c["moe_intermediate_size"], norm_topk_prob=bool(c["route_norm"]),
        num_attention_heads=c["num_attention_heads"], n_group=1, head_dim=c["head_dim"], topk_group=1,
        n_shared_experts=c["num_shared_experts"], n_routed_experts=c["num_experts"],
        routed_scaling_factor=float(c["router_scaling_factor"]), num_experts_per_tok=c["num_experts_per_tok"],
        first_k_dense_replace=c["first_k_dense_replace"], num_hidden_layers=c["num_hidden_layers"],
        num_key_value_heads=c["num_key_value_heads"], rms_norm_eps=c["rms_norm_eps"],
        rope_theta=float(c["rope_parameters"]["rope_theta"]), rope_scaling=None, use_qk_norm=bool(c["qk_norm"]),
        tie_word_embeddings=bool(c["tie_word_embeddings"]), attention_bias=bool(c["attention_bias"]),
        partial_rotary_factor=1.0)


def make_mtp_layer(args: Any) -> nn.Module:
    """The MTP layer as the release names its tensors: glm4_moe's decoder layer at index N (the MoE
    kind) with ``enorm``, ``hnorm``, ``eh_proj`` and ``final_layernorm`` around it."""
    from mlx_lm.models import glm4_moe
    from mlx_lm.models.base import create_attention_mask

    class MtpLayer(glm4_moe.DecoderLayer):
        def __init__(self) -> None:
            super().__init__(args, args.num_hidden_layers)
            add_nextn_parts(self, args.hidden_size, args.rms_norm_eps)

        def __call__(self, hidden: mx.array, emb: mx.array) -> mx.array:  # type: ignore[override]
            x = self.eh_proj(mx.concatenate([self.enorm(emb), self.hnorm(hidden)], axis=-1))
            return self.final_layernorm(super().__call__(x, create_attention_mask(x, None)))

    layer = MtpLayer()
    assert isinstance(layer.mlp, glm4_moe.MoE), "Hy3's MTP layer is a MoE layer"
    return layer


def _release_keys(params: dict[str, mx.array]) -> dict[str, mx.array]:
    out = {}
    for k, v in unstack_experts(params).items():
        k = "." + k  # the MTP layer's own keys begin at its modules
        for mine, theirs in _RELEASE_NAMES:
            k = k.replace(mine, theirs)
        out[k[1:]] = v
    return out


def hf_tensors(model: nn.Module, head: nn.Module, config: dict[str, Any]) -> dict[str, mx.array]:
    """The release layout: the trunk under ``model.`` / ``lm_head``, the MTP layer under
    ``model.layers.{N}.``; norms raw; float32."""
    n = config["num_hidden_layers"]
    trunk = _release_keys(dict(tree_flatten(model.parameters())))
    layer = _release_keys(dict(tree_flatten(head.parameters())))
    return {**trunk, **{f"model.layers.{n}.{k}": v for k, v in layer.items()}}


def build_trained(out_root: str | Path, s: GlmTrainSettings, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Train and write ``out_root/tiny-hy_v3-trained`` (float32); returns the record."""
    from mlx_lm.models import glm4_moe

    return train_and_write(out_root, Recipe(
        FOLDER, "hy_v3", tiny_config(torch_dtype="float32"),
        model=lambda config: glm4_moe.Model(glm_args(config)),
        head=lambda model: make_mtp_layer(model.args), export=hf_tensors, specs=tensor_specs,
        head_notes={"hidden": "post-norm (hy-v3's t_h_nextn)",
                    "trunk": "mlx-lm's glm4_moe.Model: Hy3's block with every rotary dimension"},
        head_key="mtp", trained_vocab=TRAINED_VOCAB), s, log)
