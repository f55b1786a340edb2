"""Train the tiny MLA-shaped models (DeepSeek-V3 ``deepseek_v3``, GLM-4.7-Flash ``glm4_moe_lite``,
GLM-5 ``glm_moe_dsa``) and their NextN heads, so that acceptance with a head mtpforge wrote means something (random
weights accept ~0%).

GLM-4.5's trainer (``train_glm``) at MLA shapes (``synth.glm4_moe_lite``'s tensors: MLA attention
with a low-rank query, a dense first layer, a sigmoid-routed MoE layer; DeepSeek-V3's config adds
group-limited routing and YaRN): the trunk is mlx-lm's own ``Model`` of the shape's module trained
as a language model on the synthetic corpus in float32, then the NextN layer (mtpforge's own head,
``decoder/nextn.py``, over mlx-lm's decoder layer of that module) with the trunk frozen, fed the
trunk's post-norm hidden state. mlx-lm holds MLA's ``kv_b_proj`` as the absorbed ``embed_q`` /
``unembed_out``; the export joins them back into the release's ``kv_b_proj`` (the inverse of its
sanitize) and unstacks the experts. A shape is a row of ``SHAPES``: the trainer has no branch
per family.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from . import deepseek_v3, deepseek_v32, glm4_moe_lite, glm_moe_dsa
from .family_common import build_family_tokenizer
from .train_family import Recipe, train_and_write
from .train_glm import GlmTrainSettings, unstack_experts


@dataclass(frozen=True)
class MlaShape:
    """One MLA family's tiny trained model: where it goes, mlx-lm's module and decoder layer, its
    config.json and its tokenizer (the synthetic BPE, ``TRAINED_VOCAB`` ids, then the family's
    special tokens)."""

    folder: str
    architecture: str
    layer_class: str
    config: Callable[[], dict[str, Any]]
    trained_vocab: int
    special: tuple[str, ...]
    eos: str
    bos: str | None = None
    #: mlx-lm's module holding ``layer_class`` where it is not the model's own (GLM-5's is DeepSeek-V3.2's)
    layer_module: str | None = None
    #: the release's tensors (name -> shape ...) and the NextN layer's keys among them
    specs: Callable[[dict[str, Any]], dict[str, Any]] = glm4_moe_lite.tensor_specs
    nextn: Callable[[dict[str, Any]], list[str]] = glm4_moe_lite.nextn_keys
    #: rewrites the written folder's tokenizer as the release stores it (DeepSeek-V3.2's vocabulary files)
    finish: Callable[[Path], None] | None = None

    def tokenizer(self, folder: Path) -> None:
        build_family_tokenizer(folder, self.trained_vocab, self.special, eos=self.eos, bos=self.bos)


SHAPES: dict[str, MlaShape] = {
    "deepseek_v3": MlaShape("tiny-deepseek_v3-trained", "deepseek_v3", "DeepseekV3DecoderLayer",
                            lambda: deepseek_v3.tiny_config(torch_dtype="float32"), deepseek_v3.TRAINED_VOCAB,
                            deepseek_v3.DEEPSEEK_SPECIAL, deepseek_v3.DEEPSEEK_SPECIAL[1], deepseek_v3.DEEPSEEK_SPECIAL[0]),
    "glm4_moe_lite": MlaShape("tiny-glm4_moe_lite-trained", "glm4_moe_lite", "Glm4MoeLiteDecoderLayer",
                              lambda: glm4_moe_lite.tiny_config(torch_dtype="float32"), glm4_moe_lite.TRAINED_VOCAB,
                              glm4_moe_lite.GLM_SPECIAL, "<|endoftext|>"),
    # GLM-5: GLM-4.7-Flash's layers with DeepSeek Sparse Attention's indexer in each (its top-k,
    # 2048, is above every context here, so the indexer selects every key and is not trained)
    "glm_moe_dsa": MlaShape("tiny-glm_moe_dsa-trained", "glm_moe_dsa", "DeepseekV32DecoderLayer",
                            lambda: glm_moe_dsa.tiny_config(torch_dtype="float32"), glm4_moe_lite.TRAINED_VOCAB,
                            glm4_moe_lite.GLM_SPECIAL, "<|endoftext|>", layer_module="deepseek_v32",
                            specs=deepseek_v32.tensor_specs, nextn=deepseek_v32.nextn_keys),
    # DeepSeek-V3.2: the same layers under its own config; its tokenizer as vocabulary files, so
    # that llama.cpp's converter sees the BOS it asserts (synth.deepseek_v32.vocabulary_files)
    "deepseek_v32": MlaShape("tiny-deepseek_v32-trained", "deepseek_v32", "DeepseekV32DecoderLayer",
                             lambda: deepseek_v32.tiny_config(torch_dtype="float32"), deepseek_v32.TRAINED_VOCAB,
                             (deepseek_v32.BOS, deepseek_v32.EOS), deepseek_v32.EOS, deepseek_v32.BOS,
                             specs=deepseek_v32.tensor_specs, nextn=deepseek_v32.nextn_keys,
                             finish=deepseek_v32.vocabulary_files),
}


def settings(**given: Any) -> GlmTrainSettings:
    """GLM-4.5's settings, shortened (the committed DeepSeek-V3 model: about 6 minutes on a busy
    2-core machine; llama-server accepts about two thirds of its drafts)."""
    return GlmTrainSettings(**{"backbone_steps": 100, "head_steps": 80, "seq_len": 64, "corpus_docs": 4000, **given})


def _module(shape: MlaShape, layer: bool = False) -> Any:
    import importlib

    return importlib.import_module(f"mlx_lm.models.{(layer and shape.layer_module) or shape.architecture}")


def _head(model: nn.Module, s: GlmTrainSettings, shape: MlaShape) -> nn.Module:
    """A fresh NextN layer (seeded), its norms spread as GLM's trainer spreads them."""
    from mtpforge.decoder.nextn import nextn_head

    eh_proj = nn.Linear(2 * model.args.hidden_size, model.args.hidden_size, bias=False)
    head = nextn_head(getattr(_module(shape, layer=True), shape.layer_class), model.args, own_head=False, mask_as_array=True)
    head.eh_proj = eh_proj
    rng = np.random.default_rng(s.seed + 3)
    for norm in (head.enorm, head.hnorm, head.input_layernorm, head.post_attention_layernorm, head.shared_head.norm):
        gain = s.head_mlp_gain if norm is head.post_attention_layernorm else 1.0
        norm.weight = mx.array((gain * np.exp(s.head_norm_spread * rng.standard_normal(norm.weight.shape))).astype(np.float32))
    return head


def _release_keys(params: dict[str, mx.array], config: dict[str, Any]) -> dict[str, mx.array]:
    """mlx-lm's parameters -> the release's: experts one by one, ``embed_q`` / ``unembed_out``
    joined back into ``kv_b_proj`` [heads x (nope + v), kv_lora_rank]."""
    out = unstack_experts(params)
    for k in [k for k in out if k.endswith("self_attn.embed_q.weight")]:
        pre = k[: -len("embed_q.weight")]
        wk, wv = out.pop(k), out.pop(pre + "unembed_out.weight")  # [h, r, nope], [h, v, r]
        kv_b = mx.concatenate([wk.swapaxes(-1, -2), wv], axis=1)
        out[pre + "kv_b_proj.weight"] = kv_b.reshape(-1, config["kv_lora_rank"])
    return out


def _export(sh: MlaShape) -> Callable[[nn.Module, nn.Module, dict[str, Any]], dict[str, mx.array]]:
    """The release's tensors: the trunk's and the NextN layer's under ``model.layers.{N}.`` with
    the trunk's ``lm_head`` and embedding as its own copies."""

    def export(model: nn.Module, head: nn.Module, config: dict[str, Any]) -> dict[str, mx.array]:
        n = config["num_hidden_layers"]
        trunk = _release_keys(dict(tree_flatten(model.parameters())), config)
        nextn = {f"model.layers.{n}.{k}": v for k, v in _release_keys(dict(tree_flatten(head.parameters())), config).items()}
        nextn[f"model.layers.{n}.shared_head.head.weight"] = trunk["lm_head.weight"]
        nextn[f"model.layers.{n}.embed_tokens.weight"] = trunk["model.embed_tokens.weight"]
        if sorted(nextn) != sh.nextn(config):
            raise ValueError(f"the NextN layer's keys are not the release's: {sorted(set(nextn) ^ set(sh.nextn(config)))[:6]}")
        return {**trunk, **nextn}

    return export


def build_trained(out_root: str | Path, s: GlmTrainSettings, log: Callable[[str], None] | None = print,
                  shape: str = "deepseek_v3") -> dict[str, Any]:
    """Train and write ``out_root/<the shape's folder>`` (float32); returns the record."""
    sh = SHAPES[shape]
    module = _module(sh)
    return train_and_write(out_root, Recipe(
        sh.folder, sh.architecture, sh.config(), model=lambda config: module.Model(module.ModelArgs.from_dict(config)),
        head=lambda model: _head(model, s, sh), export=_export(sh), specs=sh.specs, head_notes={"hidden": "post-norm"},
        tokenizer=sh.tokenizer, finish=sh.finish), s, log)
