"""A tiny GLM-4.7-Flash (``glm4_moe_lite``, ``Glm4MoeLiteForCausalLM``) in the release's Hugging
Face layout, NextN (MTP) layer included.

The trunk follows transformers' ``modeling_glm4_moe_lite`` (MLA attention with a low-rank query,
a dense first layer, then DeepSeek-style MoE with a sigmoid router, ``e_score_correction_bias``
and one shared expert), with the experts stored one by one as the release stores them
(``mlp.experts.{e}.{gate,up,down}_proj.weight``; transformers fuses them on load). The NextN
layer is one more decoder layer at ``model.layers.{num_hidden_layers}`` (always MoE) plus
``eh_proj``, ``enorm``, ``hnorm``, ``shared_head.norm``, ``shared_head.head`` and its own
``embed_tokens`` copy (docs/families/glm4_moe_lite.md). Every norm is raw (values around 1).

Dimensions: hidden 64, 2 trunk layers, 2 heads, 4 experts (2 per token); every matrix's input
dimension is a multiple of 64 so ``mlx_lm.convert`` quantizes each one at group size 64
(including mlx-lm's absorbed MLA ``embed_q`` [heads, kv_lora_rank, qk_nope] and ``unembed_out``).
The tokenizer is the synthetic byte-level BPE with GLM's role tokens appended, which llama.cpp's
GLM vocabulary code looks up by name (``[gMASK]``, ``<|user|>``, ``<|observation|>``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from .family_common import (Spec, build_family_tokenizer, linear, random_tensors, raw_norm, scratch_dir,
                            write_family_checkpoint, write_generation_config)

#: appended after the 503 trained tokens (ids 503..511, so every id below vocab_size 512 is a
#: token, as in the releases); <|endoftext|> is id 0 already
GLM_SPECIAL = ("[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>",
               "<|observation|>")
TRAINED_VOCAB = 503

#: config.json, spelled as the release spells it (tiny values)
CONFIG: dict[str, Any] = {
    "architectures": ["Glm4MoeLiteForCausalLM"],
    "model_type": "glm4_moe_lite",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": [0, 509, 511],  # <|endoftext|>, <|user|>, <|observation|>
    "pad_token_id": 0,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 64,
    "intermediate_size": 128,
    "kv_lora_rank": 64,
    "max_position_embeddings": 4096,
    "moe_intermediate_size": 64,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 2,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_nextn_predict_layers": 1,
    "partial_rotary_factor": 1.0,
    "q_lora_rank": 64,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 16,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "routed_scaling_factor": 1.8,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "5.0.0.dev0",
    "use_cache": True,
    "v_head_dim": 64,
    "vocab_size": 512,
}

#: the NextN layer's own keys besides the decoder layer (suffixes after ``model.layers.{N}.``)
NEXTN_EXTRA = ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight",
               "shared_head.head.weight", "embed_tokens.weight")


def tiny_config(**overrides: Any) -> dict[str, Any]:
    c = copy.deepcopy(CONFIG)
    c.update(overrides)
    return c


def _attention(p: str, c: dict[str, Any]) -> dict[str, Spec]:
    h, nh = c["hidden_size"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    s: dict[str, Spec] = {}
    if c.get("q_lora_rank"):
        s[p + "q_a_proj.weight"] = linear(c["q_lora_rank"], h)
        s[p + "q_a_layernorm.weight"] = raw_norm(c["q_lora_rank"])
        s[p + "q_b_proj.weight"] = linear(nh * qk, c["q_lora_rank"])
    else:
        s[p + "q_proj.weight"] = linear(nh * qk, h)
    s[p + "kv_a_proj_with_mqa.weight"] = linear(c["kv_lora_rank"] + c["qk_rope_head_dim"], h)
    s[p + "kv_a_layernorm.weight"] = raw_norm(c["kv_lora_rank"])
    s[p + "kv_b_proj.weight"] = linear(nh * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"])
    s[p + "o_proj.weight"] = linear(h, nh * c["v_head_dim"], 0.5)
    return s


def _mlp(p: str, c: dict[str, Any], sparse: bool) -> dict[str, Spec]:
    h = c["hidden_size"]
    if not sparse:
        i = c["intermediate_size"]
        return {p + "gate_proj.weight": linear(i, h), p + "up_proj.weight": linear(i, h),
                p + "down_proj.weight": linear(h, i, 0.5)}
    im, ne = c["moe_intermediate_size"], c["n_routed_experts"]
    ish = im * c["n_shared_experts"]
    s: dict[str, Spec] = {
        p + "gate.weight": linear(ne, h),
        p + "gate.e_score_correction_bias": ((ne,), "norm", 0.0, 0.01),
        p + "shared_experts.gate_proj.weight": linear(ish, h),
        p + "shared_experts.up_proj.weight": linear(ish, h),
        p + "shared_experts.down_proj.weight": linear(h, ish, 0.5),
    }
    for e in range(ne):
        s[p + f"experts.{e}.gate_proj.weight"] = linear(im, h)
        s[p + f"experts.{e}.up_proj.weight"] = linear(im, h)
        s[p + f"experts.{e}.down_proj.weight"] = linear(h, im, 0.5)
    return s


def _decoder_layer(i: int, c: dict[str, Any]) -> dict[str, Spec]:
    p = f"model.layers.{i}."
    s = {p + "input_layernorm.weight": raw_norm(c["hidden_size"]),
         p + "post_attention_layernorm.weight": raw_norm(c["hidden_size"])}
    s.update(_attention(p + "self_attn.", c))
    sparse = c.get("n_routed_experts") and i >= c["first_k_dense_replace"] and i % c.get("moe_layer_freq", 1) == 0
    s.update(_mlp(p + "mlp.", c, bool(sparse)))
    return s


def tensor_specs(config: dict[str, Any], *, nextn: bool = True) -> dict[str, Spec]:
    """name -> (shape, kind, loc, scale): the trunk, then (``nextn``) the NextN layers."""
    c = config
    h, v, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    s: dict[str, Spec] = {"model.embed_tokens.weight": ((v, h), "linear", 0.0, 1.0),
                          "model.norm.weight": raw_norm(h)}
    if not c.get("tie_word_embeddings"):
        s["lm_head.weight"] = linear(v, h)
    for i in range(n):
        s.update(_decoder_layer(i, c))
    if nextn:
        for k in range(int(c.get("num_nextn_predict_layers") or 0)):
            i = n + k
            p = f"model.layers.{i}."
            s.update(_decoder_layer(i, c))
            s[p + "eh_proj.weight"] = linear(h, 2 * h)
            s[p + "enorm.weight"] = raw_norm(h)
            s[p + "hnorm.weight"] = raw_norm(h)
            s[p + "shared_head.norm.weight"] = raw_norm(h)
            s[p + "shared_head.head.weight"] = linear(v, h)
            s[p + "embed_tokens.weight"] = ((v, h), "linear", 0.0, 1.0)
    return s


def nextn_keys(config: dict[str, Any]) -> list[str]:
    n = config["num_hidden_layers"]
    prefixes = tuple(f"model.layers.{n + k}." for k in range(int(config.get("num_nextn_predict_layers") or 0)))
    return sorted(k for k in tensor_specs(config) if k.startswith(prefixes))


def build_glm4_moe_lite(out_dir: str | Path, *, seed: int = 0, n_shards: int = 2, distinct_copies: bool = False,
                        **overrides: Any) -> Path:
    """Write the tiny GLM-4.7-Flash checkpoint into ``out_dir`` and return it. ``overrides`` are
    config.json keys (``q_lora_rank=None`` makes the ``q_proj`` variant of the attention).

    The NextN layer's ``embed_tokens`` and ``shared_head.head`` are copies of the trunk's
    ``model.embed_tokens`` and ``lm_head`` (as the releases' NextN copies are meant to be);
    ``distinct_copies=True`` draws them independently, which shows which of the two tensors a
    runtime actually reads (llama.cpp prefers the NextN copies, MTPLX the trunk's embedding)."""
    config = tiny_config(**overrides)
    tensors = random_tensors(tensor_specs(config), seed=seed, float32=("e_score_correction_bias",))
    if not distinct_copies:
        for k in range(int(config.get("num_nextn_predict_layers") or 0)):
            p = f"model.layers.{config['num_hidden_layers'] + k}."
            tensors[p + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"]
            if "lm_head.weight" in tensors:
                tensors[p + "shared_head.head.weight"] = tensors["lm_head.weight"]
    with scratch_dir() as tmp:
        ids = build_family_tokenizer(Path(tmp), TRAINED_VOCAB, GLM_SPECIAL, eos="<|endoftext|>")
        assert ids["<|user|>"] == 509 and ids["<|observation|>"] == 511, ids
        out = write_family_checkpoint(out_dir, config, tensors, Path(tmp), n_shards=n_shards)
    write_generation_config(out, config)
    return out
