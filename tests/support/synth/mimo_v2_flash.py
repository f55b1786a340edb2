"""A tiny MiMo-V2-Flash (``mimo_v2_flash``, ``MiMoV2FlashForCausalLM``) checkpoint in the
release's Hugging Face layout, MTP layers included.

The config is spelled as the release's config.json spells it (what llama.cpp's converter,
``conversion/mimo.py``, reads): ``hybrid_layer_pattern`` (0 full attention, 1 sliding window),
the sliding-window layers' own head counts and dims (``swa_num_attention_heads``,
``swa_num_key_value_heads``, ``swa_head_dim``, ``swa_v_head_dim``), a value head narrower than the
query/key head (``v_head_dim``), partial rotary embedding, ``attention_value_scale``, and the
sigmoid-routed ``noaux_tc`` MoE (``n_routed_experts``, ``moe_intermediate_size``,
``moe_layer_freq``: the first layer dense). Sliding-window layers carry attention sinks
(``self_attn.attention_sink_bias`` [heads], float32), full-attention ones none.

The trunk: ``model.layers.{i}`` with ``input_layernorm`` / ``post_attention_layernorm``,
``self_attn.{q,k,v,o}_proj`` (q/k rows ``heads x head_dim``, v rows ``kv heads x v_head_dim``), a
dense SwiGLU ``mlp.{gate,up,down}_proj`` or the MoE: router ``mlp.gate.weight`` with its
``e_score_correction_bias`` (float32) and per-expert ``mlp.experts.{e}.{gate,up,down}_proj``.

The MTP head: ``model.mtp.layers.{0,1,2}`` (the converter hard-codes three; the config declares no
count), each a dense sliding-window decoder layer (sinks included) plus ``enorm``, ``hnorm``,
``eh_proj`` [H, 2H] and ``final_layernorm`` (the norm before the shared lm_head). Norms are raw
(``w · x̂``): values around 1.

Dimensions: hidden 64, 2 trunk layers (dense full-attention, MoE sliding-window), 4 experts (2 per
token), head_dim 32 / v_head_dim 16.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from .family_common import Spec, build_random_checkpoint, linear, raw_norm

TRAINED_VOCAB = 512
N_MTP = 3

#: config.json, spelled as the release spells it (tiny values)
CONFIG: dict[str, Any] = {
    "architectures": ["MiMoV2FlashForCausalLM"],
    "model_type": "mimo_v2_flash",
    "add_full_attention_sink_bias": False,
    "add_swa_attention_sink_bias": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attention_value_scale": 0.707,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "hybrid_layer_pattern": [0, 1],
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "layernorm_epsilon": 1e-05,
    "max_position_embeddings": 4096,
    "moe_intermediate_size": 32,
    "moe_layer_freq": [0, 1],
    "n_group": 1,
    "n_routed_experts": 4,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "partial_rotary_factor": 0.5,
    "rope_theta": 5000000.0,
    "routed_scaling_factor": None,
    "scoring_func": "sigmoid",
    "sliding_window": 128,
    "sliding_window_size": 128,
    "swa_head_dim": 32,
    "swa_num_attention_heads": 4,
    "swa_num_key_value_heads": 2,
    "swa_rope_theta": 10000.0,
    "swa_v_head_dim": 16,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "v_head_dim": 16,
    "vocab_size": 512,
}

#: tensors the release keeps in float32 (everything else bf16)
FLOAT32 = ("e_score_correction_bias", "attention_sink_bias")


def tiny_config(**overrides: Any) -> dict[str, Any]:
    """The config with ``overrides``; ``hybrid_layer_pattern`` / ``moe_layer_freq`` re-sized to the
    trunk (full attention first, then alternating; the first layer dense)."""
    c = copy.deepcopy(CONFIG)
    c.update(overrides)
    n = c["num_hidden_layers"]
    if "hybrid_layer_pattern" not in overrides:
        c["hybrid_layer_pattern"] = [i % 2 for i in range(n)]
    if "moe_layer_freq" not in overrides:
        c["moe_layer_freq"] = [0 if i == 0 else 1 for i in range(n)]
    return c


def _attention(p: str, c: dict[str, Any], swa: bool) -> dict[str, Spec]:
    h = c["hidden_size"]
    nh = c["swa_num_attention_heads" if swa else "num_attention_heads"]
    kv = c["swa_num_key_value_heads" if swa else "num_key_value_heads"]
    d, vd = c["swa_head_dim" if swa else "head_dim"], c["swa_v_head_dim" if swa else "v_head_dim"]
    s: dict[str, Spec] = {
        p + "input_layernorm.weight": raw_norm(h), p + "post_attention_layernorm.weight": raw_norm(h),
        p + "self_attn.q_proj.weight": linear(nh * d, h), p + "self_attn.k_proj.weight": linear(kv * d, h),
        p + "self_attn.v_proj.weight": linear(kv * vd, h), p + "self_attn.o_proj.weight": linear(h, nh * vd, 0.5),
    }
    if c["add_swa_attention_sink_bias" if swa else "add_full_attention_sink_bias"]:
        s[p + "self_attn.attention_sink_bias"] = ((nh,), "norm", 0.0, 0.5)
    return s


def _dense(p: str, c: dict[str, Any]) -> dict[str, Spec]:
    h, ff = c["hidden_size"], c["intermediate_size"]
    return {p + "mlp.gate_proj.weight": linear(ff, h), p + "mlp.up_proj.weight": linear(ff, h),
            p + "mlp.down_proj.weight": linear(h, ff, 0.5)}


def _moe(p: str, c: dict[str, Any]) -> dict[str, Spec]:
    h, ne, im = c["hidden_size"], c["n_routed_experts"], c["moe_intermediate_size"]
    s: dict[str, Spec] = {p + "mlp.gate.weight": linear(ne, h),
                          p + "mlp.gate.e_score_correction_bias": ((ne,), "norm", 0.0, 0.01)}
    for e in range(ne):
        q = f"{p}mlp.experts.{e}."
        s.update({q + "gate_proj.weight": linear(im, h), q + "up_proj.weight": linear(im, h),
                  q + "down_proj.weight": linear(h, im, 0.5)})
    return s


def tensor_specs(config: dict[str, Any], *, mtp: bool = True) -> dict[str, Spec]:
    """name -> (shape, kind, loc, scale): the trunk, then (``mtp``) the three MTP layers."""
    c = config
    h, v, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    s: dict[str, Spec] = {"model.embed_tokens.weight": ((v, h), "linear", 0.0, 1.0), "model.norm.weight": raw_norm(h)}
    if not c.get("tie_word_embeddings"):
        s["lm_head.weight"] = linear(v, h)
    for i in range(n):
        p = f"model.layers.{i}."
        s.update(_attention(p, c, swa=c["hybrid_layer_pattern"][i] == 1))
        s.update(_moe(p, c) if c["moe_layer_freq"][i] else _dense(p, c))
    if mtp:
        for k in range(N_MTP):
            p = f"model.mtp.layers.{k}."
            s.update(_attention(p, c, swa=True))
            s.update(_dense(p, c))
            s.update({p + "eh_proj.weight": linear(h, 2 * h), p + "enorm.weight": raw_norm(h),
                      p + "hnorm.weight": raw_norm(h), p + "final_layernorm.weight": raw_norm(h)})
    return s


def mtp_keys(config: dict[str, Any]) -> list[str]:
    """The head's keys: every tensor under ``model.mtp.``."""
    return sorted(k for k in tensor_specs(config) if k.startswith("model.mtp."))


def build_mimo_v2_flash(out_dir: str | Path, *, seed: int = 0, n_shards: int = 2, **overrides: Any) -> Path:
    """Write the tiny MiMo-V2-Flash checkpoint into ``out_dir`` and return it (``overrides``:
    config.json keys)."""
    config = tiny_config(**overrides)
    return build_random_checkpoint(out_dir, config, tensor_specs(config), seed=seed, float32=FLOAT32,
                                   trained_vocab=TRAINED_VOCAB, eos="<|im_end|>", n_shards=n_shards)
