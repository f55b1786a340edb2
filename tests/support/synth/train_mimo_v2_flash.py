"""Train the tiny MiMo-V2-Flash-shaped model (``mimo_v2_flash``) and its MTP layers, so that
llama.cpp's acceptance with a head mtpforge wrote means something (random weights accept ~0%).

The trunk is mlx-lm's own ``mimo_v2_flash.Model`` at the shapes of ``synth.mimo_v2_flash`` (a
dense full-attention layer, a MoE sliding-window layer with sinks), trained as a language model
on the synthetic corpus in float32. Then MTP layer 0 is trained, trunk frozen, as llama.cpp's
``mimo2`` MTP graph (``src/models/mimo2.cpp``, ``graph_mtp``) runs it:

    h_t   = the trunk's hidden state BEFORE ``output_norm`` (mimo2's ``t_h_nextn``)
    x     = eh_proj(concat([enorm(embed_tokens(x[t+1])), hnorm(h_t)]))
    x     = DecoderLayer(x)           # mlx-lm's mimo_v2_flash.DecoderLayer, dense, sliding-window
    logit = lm_head(final_layernorm(x))   # drafts x[t+2]

llama-server drafts one token per step here (depth 1: ``nextn_layer_offset`` 0), so only layer 0
is trained; layers 1 and 2 are written as copies of it (the release's count, which the converter
hard-codes). Norms are raw, exported as trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .mimo_v2_flash import N_MTP, TRAINED_VOCAB, tensor_specs, tiny_config
from .train_family import Recipe, add_nextn_parts, train_and_write
from .train_glm import Feed, GlmTrainSettings, unstack_experts


FOLDER = "tiny-mimo_v2_flash-trained"


def settings(**given: Any) -> GlmTrainSettings:
    """GLM-4.5's settings, shortened (the committed model: a few minutes on a busy 2-core machine)."""
    return GlmTrainSettings(**{"backbone_steps": 300, "head_steps": 200, "seq_len": 64, "corpus_docs": 4000, **given})


def _args(config: dict[str, Any]) -> Any:
    from mlx_lm.models import mimo_v2_flash

    # mlx-lm's args require the shared-expert count, which MiMo-V2 has none of
    return mimo_v2_flash.ModelArgs.from_dict({**config, "n_shared_experts": None})


def make_mtp_layer(args: Any) -> nn.Module:
    """One MTP layer as the release names its tensors: mlx-lm's dense sliding-window
    ``DecoderLayer`` with ``enorm``, ``hnorm``, ``eh_proj`` and ``final_layernorm`` around it."""
    from mlx_lm.models import mimo_v2_flash
    from mlx_lm.models.base import create_attention_mask

    class MtpLayer(mimo_v2_flash.DecoderLayer):
        def __init__(self) -> None:
            super().__init__(args, is_moe=False, is_sliding_window=True)
            add_nextn_parts(self, args.hidden_size, args.layernorm_epsilon)

        def __call__(self, hidden: mx.array, emb: mx.array) -> mx.array:  # type: ignore[override]
            x = self.eh_proj(mx.concatenate([self.enorm(emb), self.hnorm(hidden)], axis=-1))
            mask = create_attention_mask(x, None, window_size=args.sliding_window_size)
            return self.final_layernorm(super().__call__(x, mask))

    return MtpLayer()


def trunk_hidden(model: nn.Module, tokens: mx.array) -> mx.array:
    """The trunk's last hidden state before its final norm: what mimo2 hands the MTP layer."""
    from mlx_lm.models.base import create_attention_mask

    lm = model.model
    h = lm.embed_tokens(tokens)
    full = create_attention_mask(h, None)
    swa = create_attention_mask(h, None, window_size=lm.sliding_window_size)
    for layer in lm.layers:
        h = layer(h, swa if layer.is_sliding_window else full)
    return h


#: the pre-norm state into layer 0; the trunk's own next-token logits go through its final norm
FEED = Feed(hidden=trunk_hidden, teacher=lambda model, h: model.lm_head(model.model.norm(h)))


def hf_tensors(model: nn.Module, head: nn.Module, config: dict[str, Any]) -> dict[str, mx.array]:
    """The release layout: the trunk's experts one by one, MTP layer 0 under
    ``model.mtp.layers.0.`` and its copies under ``.1.`` / ``.2.``."""
    trunk = unstack_experts(dict(tree_flatten(model.parameters())))
    mtp = dict(tree_flatten(head.parameters()))
    tensors = {**trunk, **{f"model.mtp.layers.{k}.{n}": v for k in range(N_MTP) for n, v in mtp.items()}}
    return tensors


def build_trained(out_root: str | Path, s: GlmTrainSettings, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Train and write ``out_root/tiny-mimo_v2_flash-trained`` (float32); returns the record."""
    from mlx_lm.models import mimo_v2_flash

    return train_and_write(out_root, Recipe(
        FOLDER, "mimo_v2_flash", tiny_config(torch_dtype="float32"),
        model=lambda config: mimo_v2_flash.Model(_args(config)), head=lambda model: make_mtp_layer(model.args),
        export=hf_tensors, specs=tensor_specs, head_notes={"hidden": "pre-norm (mimo2's t_h_nextn)",
                                       "layers": "layer 0 trained; layers 1 and 2 are copies of it"},
        head_key="mtp", feed=FEED, trained_vocab=TRAINED_VOCAB), s, log)
