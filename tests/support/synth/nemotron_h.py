"""A tiny Nemotron-H (``nemotron_h``, ``NemotronHForCausalLM``) MoE checkpoint in the release's
Hugging Face layout, MTP head included.

The trunk follows transformers' ``modeling_nemotron_h``: ``backbone.embeddings``, blocks
``backbone.layers.{i}`` (one pre-norm ``norm`` and one ``mixer`` each) of the kinds named by
``hybrid_override_pattern`` — ``M`` Mamba-2, ``*`` attention (no rotary embedding), ``E`` MoE
(sigmoid router with ``e_score_correction_bias``, ReLU² experts stored one by one as
``mixer.experts.{e}.{up,down}_proj.weight``, one shared expert; optionally the latent projections
``fc1_latent_proj``/``fc2_latent_proj``), ``-`` dense ReLU² MLP — then ``backbone.norm_f`` and
``lm_head``. The MTP head is ``mtp.layers.{k}``, one block per character of
``mtp_hybrid_override_pattern`` (``*E``): the first also carries ``enorm``, ``hnorm`` and
``eh_proj`` [H, 2H], the last ``final_layernorm`` (docs/families/nemotron_h.md). Every norm is
raw (values around 1).

Dimensions: hidden 64, 4 trunk layers (``ME*E``), 4 experts (2 per token); every matrix's input
dimension is a multiple of 64 so ``mlx_lm.convert`` quantizes each one at group size 64.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

from .family_common import Spec, build_random_checkpoint, linear, raw_norm

TRAINED_VOCAB = 512  # every id below vocab_size is a token

#: config.json, spelled as the releases spell it (tiny values)
CONFIG: dict[str, Any] = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "chunk_size": 128,
    "conv_kernel": 4,
    "eos_token_id": 2,
    "head_dim": 32,
    "hidden_dropout": 0.0,
    "hidden_size": 64,
    "hybrid_override_pattern": "ME*E",
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "layer_norm_epsilon": 1e-05,
    "mamba_head_dim": 16,
    "mamba_hidden_act": "silu",
    "mamba_num_heads": 4,
    "mamba_proj_bias": False,
    "max_position_embeddings": 4096,
    "mlp_bias": False,
    "mlp_hidden_act": "relu2",
    "moe_intermediate_size": 64,
    "moe_latent_size": None,
    "moe_shared_expert_intermediate_size": 128,
    "mtp_hybrid_override_pattern": "*E",
    "n_group": 1,
    "n_groups": 2,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 2,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 1,
    "num_logits_to_keep": 1,
    "num_nextn_predict_layers": 1,
    "pad_token_id": 0,
    "rescale_prenorm_residual": True,
    "residual_in_fp32": False,
    "routed_scaling_factor": 2.5,
    "ssm_state_size": 16,
    "tie_word_embeddings": False,
    "time_step_floor": 0.0001,
    "time_step_max": 0.1,
    "time_step_min": 0.001,
    "topk_group": 1,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.55.4",
    "use_bias": False,
    "use_cache": True,
    "use_conv_bias": True,
    "use_mamba_kernels": True,
    "vocab_size": 512,
}

#: tensors the releases keep in float32 (everything else bf16)
FLOAT32 = ("e_score_correction_bias", "A_log")


def tiny_config(**overrides: Any) -> dict[str, Any]:
    c = copy.deepcopy(CONFIG)
    c.update(overrides)
    c["num_hidden_layers"] = len(c["hybrid_override_pattern"])
    return c


def _mamba(p: str, c: dict[str, Any]) -> dict[str, Spec]:
    h, nh, hd = c["hidden_size"], c["mamba_num_heads"], c["mamba_head_dim"]
    d_inner = nh * hd
    conv_dim = d_inner + 2 * c["n_groups"] * c["ssm_state_size"]
    k = c["conv_kernel"]
    s: dict[str, Spec] = {
        p + "in_proj.weight": linear(d_inner + conv_dim + nh, h),
        p + "conv1d.weight": ((conv_dim, 1, k), "linear", 0.0, 0.5 / math.sqrt(k)),
        # dt = softplus(x + dt_bias) starts in [0.001, 0.1]; A = -exp(A_log) in [-16, -1]
        p + "dt_bias": ((nh,), "uniform", -6.9, -2.25),
        p + "A_log": ((nh,), "uniform", 0.0, math.log(16.0)),
        p + "D": ((nh,), "norm", 1.0, 0.1),
        p + "norm.weight": raw_norm(d_inner),
        p + "out_proj.weight": linear(h, d_inner, 0.5),
    }
    if c.get("use_conv_bias", True):
        s[p + "conv1d.bias"] = ((conv_dim,), "norm", 0.0, 0.05)
    return s


def _attention(p: str, c: dict[str, Any]) -> dict[str, Spec]:
    h, nh, kv, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    return {p + "q_proj.weight": linear(nh * d, h), p + "k_proj.weight": linear(kv * d, h),
            p + "v_proj.weight": linear(kv * d, h), p + "o_proj.weight": linear(h, nh * d, 0.5)}


def _moe(p: str, c: dict[str, Any]) -> dict[str, Spec]:
    h, ne, im, ish = c["hidden_size"], c["n_routed_experts"], c["moe_intermediate_size"], c["moe_shared_expert_intermediate_size"]
    latent = c.get("moe_latent_size")
    d = latent or h
    s: dict[str, Spec] = {
        p + "gate.weight": linear(ne, h),
        p + "gate.e_score_correction_bias": ((ne,), "norm", 0.0, 0.01),
        p + "shared_experts.up_proj.weight": linear(ish, h),
        p + "shared_experts.down_proj.weight": linear(h, ish, 0.5),
    }
    if latent:
        s[p + "fc1_latent_proj.weight"] = linear(latent, h)
        s[p + "fc2_latent_proj.weight"] = linear(h, latent)
    for e in range(ne):
        s[p + f"experts.{e}.up_proj.weight"] = linear(im, d)
        s[p + f"experts.{e}.down_proj.weight"] = linear(d, im, 0.5)
    return s


def _mlp(p: str, c: dict[str, Any]) -> dict[str, Spec]:
    h, i = c["hidden_size"], c["intermediate_size"]
    return {p + "up_proj.weight": linear(i, h), p + "down_proj.weight": linear(h, i, 0.5)}


_MIXERS = {"M": _mamba, "*": _attention, "E": _moe, "-": _mlp}


def _block(p: str, kind: str, c: dict[str, Any]) -> dict[str, Spec]:
    s = {p + "norm.weight": raw_norm(c["hidden_size"])}
    s.update(_MIXERS[kind](p + "mixer.", c))
    return s


def tensor_specs(config: dict[str, Any], *, mtp: bool = True) -> dict[str, Spec]:
    """name -> (shape, kind, loc, scale): the trunk, then (``mtp``) the ``mtp.layers.*`` head."""
    c = config
    h, v = c["hidden_size"], c["vocab_size"]
    s: dict[str, Spec] = {"backbone.embeddings.weight": ((v, h), "linear", 0.0, 1.0),
                          "backbone.norm_f.weight": raw_norm(h)}
    if not c.get("tie_word_embeddings"):
        s["lm_head.weight"] = linear(v, h)
    for i, kind in enumerate(c["hybrid_override_pattern"]):
        s.update(_block(f"backbone.layers.{i}.", kind, c))
    if mtp and int(c.get("num_nextn_predict_layers") or 0) > 0:
        pattern = c["mtp_hybrid_override_pattern"]
        for k, kind in enumerate(pattern):
            p = f"mtp.layers.{k}."
            s.update(_block(p, kind, c))
            if k == 0:
                s[p + "eh_proj.weight"] = linear(h, 2 * h)
                s[p + "enorm.weight"] = raw_norm(h)
                s[p + "hnorm.weight"] = raw_norm(h)
            if k == len(pattern) - 1:
                s[p + "final_layernorm.weight"] = raw_norm(h)
    return s


def mtp_keys(config: dict[str, Any]) -> list[str]:
    return sorted(k for k in tensor_specs(config) if k.startswith("mtp."))


def build_nemotron_h(out_dir: str | Path, *, seed: int = 0, n_shards: int = 2, **overrides: Any) -> Path:
    """Write the tiny Nemotron-H checkpoint into ``out_dir`` and return it. ``overrides`` are
    config.json keys (``moe_latent_size=64`` adds the latent MoE projections, as Nemotron 3
    Super's config declares them)."""
    config = tiny_config(**overrides)
    return build_random_checkpoint(out_dir, config, tensor_specs(config), seed=seed, float32=FLOAT32,
                                   trained_vocab=TRAINED_VOCAB, eos="<|im_end|>", n_shards=n_shards)
