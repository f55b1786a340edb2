"""A tiny Ling-3 (inclusionAI/Ling-3.0-*, ``BailingMoeV3ForCausalLM``, model_type
``bailing_moe_v3``), text only, in the release's Hugging Face layout, MTP (NextN) block included.

transformers has no model for it, so the layout comes from llama.cpp's converter
(conversion/bailingmoe3.py) and its tensor map (gguf-py tensor_mapping.py, BAILINGMOE3):

* embeddings ``model.word_embeddings``, final norm ``model.norm``, head ``lm_head``;
* every layer: ``input_layernorm`` / ``post_attention_layernorm`` (raw RMSNorm weights);
* the layers are grouped by ``layer_group_size``: the last layer of each group (and the tail
  after the last full group) is full attention, MLA: ``attention.q_a_proj`` / ``q_a_layernorm`` /
  ``q_b_proj`` (``q_lora_rank``; ``attention.q_proj`` without it), ``attention.kv_a_proj_with_mqa``,
  ``kv_a_layernorm``, ``kv_b_proj``, a head-wise sigmoid output gate ``attention.g_proj``
  [heads, hidden] and ``attention.dense`` (o_proj);
* the other layers are KDA linear attention (Kimi Delta Attention without the gate LoRA,
  ``no_kda_lora``): ``attention.{q,k,v}_proj`` [heads*head_dim, hidden], short convolutions
  ``attention.{q,k,v}_conv1d`` [heads*head_dim, 1, short_conv_kernel_size], the forget gate
  ``attention.f_proj`` [heads*head_dim, hidden] with ``attention.dt_bias`` and ``attention.A_log``
  [heads], the beta ``attention.b_proj`` [heads, hidden], the output gate ``attention.g_proj``
  [heads*head_dim, hidden], the per-head output norm ``attention.o_norm`` [head_dim] and
  ``attention.o_proj``;
* MLP: the first ``first_k_dense_replace`` layers dense SwiGLU (``mlp.{gate,up,down}_proj``),
  the others a sigmoid-routed MoE (``mlp.gate.weight`` and ``mlp.gate.expert_bias``, float32;
  experts one by one ``mlp.experts.{e}.*``, ``mlp.shared_experts.*``).

The MTP block is ``model.layers.{N}`` (N = ``num_hidden_layers``, ``num_nextn_predict_layers``
of them): a full-attention (MLA) layer with a MoE MLP, plus ``eh_proj`` [H, 2H] (input
[embedding ; hidden], llama.cpp concatenates enorm(e) first), ``enorm``, ``hnorm`` and
``final_layernorm`` (the block's closing norm; BAILINGMOE3's tensor list has LAYER_OUT_NORM, which
maps ``final_layernorm``, not NEXTN_SHARED_HEAD_NORM / ``shared_head.norm``). It has no
embedding or head of its own: it shares ``model.word_embeddings`` and ``lm_head``.

Dimensions: hidden 64, 2 trunk layers (``layer_group_size`` 2: layer 0 KDA with a dense MLP,
layer 1 MLA with a MoE MLP); 2 heads; KDA head_dim 32; MLA q_lora 64, kv_lora 64, nope 32 + rope
16, v 32; 4 experts (2 per token) of 64 and one shared expert of 64.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from .family_common import (Spec, build_family_tokenizer, echo_head_tensors, linear, raw_norm, scratch_dir,
                            write_family_checkpoint, write_generation_config)

TRAINED_VOCAB = 512  # every id below vocab_size is a token

#: config.json, spelled as the release spells it (flat keys; tiny values)
CONFIG: dict[str, Any] = {
    "architectures": ["BailingMoeV3ForCausalLM"],
    "model_type": "bailing_moe_v3",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-06,
    "rope_theta": 600000.0,
    "tie_word_embeddings": False,
    "use_bias": False,
    "use_qkv_bias": False,
    # hybrid layout: the last layer of each group is full attention (MLA), the others KDA
    "layer_group_size": 2,
    # KDA
    "no_kda_lora": True,
    "kda_safe_gate": True,
    "kda_lower_bound": -5.0,
    "short_conv_kernel_size": 4,
    # MLA
    "q_lora_rank": 64,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "gated_attention_proj_granularity_type": "head_wise",
    # MoE
    "first_k_dense_replace": 1,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_shared_experts": 1,
    "moe_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 64,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "score_function": "sigmoid",
    "moe_router_enable_expert_bias": True,
    # MTP
    "num_nextn_predict_layers": 1,
    "torch_dtype": "bfloat16",
}

#: kept float32 (the router)
FLOAT32 = ("mlp.gate.weight", "mlp.gate.expert_bias")


def tiny_config(**overrides: Any) -> dict[str, Any]:
    c = copy.deepcopy(CONFIG)
    c.update(overrides)
    return c


def is_full_attention(i: int, c: dict[str, Any]) -> bool:
    """llama.cpp's rule (BailingMoeV3Model.is_full_attention): the MTP block, each group's last
    layer, and the layers after the last full group."""
    n, g = c["num_hidden_layers"], c["layer_group_size"]
    return i >= n or (i + 1) % g == 0 or i >= n // g * g


def _mla(p: str, c: dict[str, Any]) -> dict[str, Spec]:
    h, nh = c["hidden_size"], c["num_attention_heads"]
    nope, rope, v, rkv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    s: dict[str, Spec] = {}
    if c.get("q_lora_rank"):
        rq = c["q_lora_rank"]
        s[p + "q_a_proj.weight"] = linear(rq, h)
        s[p + "q_a_layernorm.weight"] = raw_norm(rq)
        s[p + "q_b_proj.weight"] = linear(nh * (nope + rope), rq)
    else:
        s[p + "q_proj.weight"] = linear(nh * (nope + rope), h)
    s.update({
        p + "kv_a_proj_with_mqa.weight": linear(rkv + rope, h),
        p + "kv_a_layernorm.weight": raw_norm(rkv),
        p + "kv_b_proj.weight": linear(nh * (nope + v), rkv),
        p + "g_proj.weight": linear(nh, h),
        p + "dense.weight": linear(h, nh * v, 0.5),
    })
    return s


def _kda(p: str, c: dict[str, Any]) -> dict[str, Spec]:
    h, nh, d, k = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["short_conv_kernel_size"]
    di = nh * d
    return {
        p + "q_proj.weight": linear(di, h), p + "k_proj.weight": linear(di, h), p + "v_proj.weight": linear(di, h),
        p + "q_conv1d.weight": ((di, 1, k), "norm", 0.0, 0.5),
        p + "k_conv1d.weight": ((di, 1, k), "norm", 0.0, 0.5),
        p + "v_conv1d.weight": ((di, 1, k), "norm", 0.0, 0.5),
        p + "f_proj.weight": linear(di, h),
        p + "dt_bias": ((di,), "norm", 0.0, 0.5),
        p + "A_log": ((nh,), "norm", 0.0, 0.5),
        p + "b_proj.weight": linear(nh, h),
        p + "g_proj.weight": linear(di, h),
        p + "o_norm.weight": raw_norm(d),
        p + "o_proj.weight": linear(h, di, 0.5),
    }


def _mlp(p: str, c: dict[str, Any], sparse: bool) -> dict[str, Spec]:
    h = c["hidden_size"]
    if not sparse:
        i = c["intermediate_size"]
        return {p + "gate_proj.weight": linear(i, h), p + "up_proj.weight": linear(i, h),
                p + "down_proj.weight": linear(h, i, 0.5)}
    im, ne = c["moe_intermediate_size"], c["num_experts"]
    ish = c.get("moe_shared_expert_intermediate_size") or im * c["num_shared_experts"]
    s: dict[str, Spec] = {
        p + "gate.weight": linear(ne, h),
        p + "gate.expert_bias": ((ne,), "norm", 0.0, 0.01),
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
    h = c["hidden_size"]
    s = {p + "input_layernorm.weight": raw_norm(h), p + "post_attention_layernorm.weight": raw_norm(h)}
    s.update((_mla if is_full_attention(i, c) else _kda)(p + "attention.", c))
    # the MTP block's MLP is a MoE (llama.cpp loads ffn_*_exps / *_shexp for it)
    sparse = i >= c["num_hidden_layers"] or i >= c["first_k_dense_replace"]
    s.update(_mlp(p + "mlp.", c, sparse))
    return s


def tensor_specs(config: dict[str, Any], *, nextn: bool = True) -> dict[str, Spec]:
    """name -> (shape, kind, loc, scale): the trunk, then (``nextn``) the MTP block(s)."""
    c = config
    h, v, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    s: dict[str, Spec] = {"model.word_embeddings.weight": ((v, h), "linear", 0.0, 1.0),
                          "model.norm.weight": raw_norm(h)}
    if not c.get("tie_word_embeddings"):
        s["lm_head.weight"] = linear(v, h)
    for i in range(n):
        s.update(_decoder_layer(i, c))
    if nextn:
        for k in range(int(c.get("num_nextn_predict_layers") or 0)):
            p = f"model.layers.{n + k}."
            s.update(_decoder_layer(n + k, c))
            s[p + "eh_proj.weight"] = linear(h, 2 * h)
            s[p + "enorm.weight"] = raw_norm(h)
            s[p + "hnorm.weight"] = raw_norm(h)
            s[p + "final_layernorm.weight"] = raw_norm(h)
    return s


def build_bailing_moe_v3(out_dir: str | Path, *, seed: int = 0, n_shards: int = 2, **overrides: Any) -> Path:
    """Write the tiny Ling-3 checkpoint into ``out_dir`` and return it (``overrides``: config.json
    keys); its MTP block drafts (``family_common.echo_head_tensors``, the attention's output
    projection being ``attention.dense``)."""
    config = tiny_config(**overrides)
    tensors = echo_head_tensors(tensor_specs(config), config, seed=seed, float32=FLOAT32,
                                damped=("dense.weight", "down_proj.weight"))
    with scratch_dir() as tmp:
        build_family_tokenizer(Path(tmp), TRAINED_VOCAB, (), eos="<|im_end|>")
        out = write_family_checkpoint(out_dir, config, tensors, Path(tmp), n_shards=n_shards)
    write_generation_config(out, config)
    return out
