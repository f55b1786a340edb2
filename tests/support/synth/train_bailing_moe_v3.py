"""Train the tiny Ling-3-shaped model (``bailing_moe_v3``) and its MTP block, so that llama.cpp's
acceptance with a head mtpforge wrote means something (random weights accept ~0%).

The trunk is mlx-lm's own ``bailing_moe_v3.Model`` at the shapes of ``synth.bailing_moe_v3`` (a
KDA linear-attention layer with a dense MLP, an MLA layer with a head-wise output gate and a
sigmoid-routed MoE), trained as a language model on the synthetic corpus in float32. Then the
MTP block, trunk frozen, as llama.cpp's ``bailingmoe3`` MTP graph (``src/models/bailingmoe3.cpp``,
``graph_mtp``) runs it:

    h_t   = the trunk's hidden state after ``output_norm`` (bailingmoe3's ``t_h_nextn``)
    x     = eh_proj(concat([enorm(word_embeddings(x[t+1])), hnorm(h_t)]))
    x     = DecoderLayer(x)           # mlx-lm's layer at index N: MLA (gated) + MoE
    logit = lm_head(final_layernorm(x))   # drafts x[t+2]

Norms are raw, exported as trained; the export is the inverse of mlx-lm's ``sanitize`` (experts
one by one, ``embed_q`` / ``unembed_out`` joined back into ``kv_b_proj``, the KDA convolutions'
axes as the release stores them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .bailing_moe_v3 import TRAINED_VOCAB, tensor_specs, tiny_config
from .train_family import Recipe, add_nextn_parts, train_and_write
from .train_glm import GlmTrainSettings, unstack_experts

FOLDER = "tiny-bailing_moe_v3-trained"


def settings(**given: Any) -> GlmTrainSettings:
    """GLM-4.5's settings, shortened (the committed model: a few minutes on a busy 2-core machine)."""
    return GlmTrainSettings(**{"backbone_steps": 300, "head_steps": 200, "seq_len": 64, "corpus_docs": 4000, **given})


def make_mtp_block(args: Any) -> nn.Module:
    """The MTP block as the release names its tensors: mlx-lm's decoder layer at index N (full
    attention, MoE) with ``enorm``, ``hnorm``, ``eh_proj`` and ``final_layernorm`` around it."""
    from mlx_lm.models import bailing_moe_v3
    from mlx_lm.models.base import create_attention_mask

    class MtpBlock(bailing_moe_v3.BailingDecoderLayer):
        def __init__(self) -> None:
            super().__init__(args, args.num_hidden_layers)
            add_nextn_parts(self, args.hidden_size, args.rms_norm_eps)

        def __call__(self, hidden: mx.array, emb: mx.array) -> mx.array:  # type: ignore[override]
            x = self.eh_proj(mx.concatenate([self.enorm(emb), self.hnorm(hidden)], axis=-1))
            return self.final_layernorm(super().__call__(x, create_attention_mask(x, None, return_array=True)))

    block = MtpBlock()
    assert not block.is_linear, "the MTP block is a full-attention layer"
    return block


def _release_keys(params: dict[str, mx.array], config: dict[str, Any]) -> dict[str, mx.array]:
    """mlx-lm's parameters -> the release's (the inverse of ``bailing_moe_v3.Model.sanitize``)."""
    out = unstack_experts(params)
    for k in [k for k in out if k.endswith("attention.embed_q.weight")]:
        pre = k[: -len("embed_q.weight")]
        wk, wv = out.pop(k), out.pop(pre + "unembed_out.weight")  # [h, r, nope], [h, v, r]
        out[pre + "kv_b_proj.weight"] = mx.concatenate([wk.swapaxes(-1, -2), wv], axis=1).reshape(-1, config["kv_lora_rank"])
    for k in [k for k in out if k.endswith("_conv1d.weight")]:
        out[k] = out[k].moveaxis(2, 1)  # mlx's [channels, kernel, 1] -> the release's [channels, 1, kernel]
    return out


def hf_tensors(model: nn.Module, head: nn.Module, config: dict[str, Any]) -> dict[str, mx.array]:
    """The release layout: the trunk as mlx-lm holds it, sanitized back, the MTP block under
    ``model.layers.{N}.``."""
    n = config["num_hidden_layers"]
    trunk = _release_keys(dict(tree_flatten(model.parameters())), config)
    block = _release_keys(dict(tree_flatten(head.parameters())), config)
    return {**trunk, **{f"model.layers.{n}.{k}": v for k, v in block.items()}}


def build_trained(out_root: str | Path, s: GlmTrainSettings, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Train and write ``out_root/tiny-bailing_moe_v3-trained`` (float32); returns the record."""
    from mlx_lm.models import bailing_moe_v3

    return train_and_write(out_root, Recipe(
        FOLDER, "bailing_moe_v3", tiny_config(torch_dtype="float32"),
        model=lambda config: bailing_moe_v3.Model(bailing_moe_v3.ModelArgs.from_dict(config)),
        head=lambda model: make_mtp_block(model.args), export=hf_tensors, specs=tensor_specs,
        head_notes={"hidden": "post-norm (bailingmoe3's t_h_nextn)"}, head_key="mtp", trained_vocab=TRAINED_VOCAB), s, log)
