"""A tiny Hy3 (``hy_v3``, ``HYV3ForCausalLM``) checkpoint in the release's Hugging Face layout,
MTP layer included.

The names are the release's own (tencent-native), which llama.cpp's converter (conversion/
hunyuan.py ``HYV3Model`` and gguf-py's tensor map) and MTPLX's ``hy_v3_mtp`` graft read as
stored; transformers renames three of them when it loads the checkpoint (its conversion
mapping: ``mlp.router.gate`` -> ``mlp.gate``, ``mlp.expert_bias`` ->
``mlp.e_score_correction_bias``, ``mlp.shared_mlp.`` -> ``mlp.shared_experts.``). Blocks
``model.layers.{i}``: ``input_layernorm`` / ``post_attention_layernorm``, attention
``self_attn.{q,k,v,o}_proj`` with ``q_norm`` / ``k_norm``, then a dense SwiGLU
``mlp.{gate,up,down}_proj`` (the first ``first_k_dense_replace`` blocks) or the MoE: the sigmoid
router ``mlp.router.gate`` with its selection bias ``mlp.expert_bias`` (float32, as
transformers' ``HYV3TopKRouter`` and buffer keep them), experts one by one
``mlp.experts.{e}.{gate,up,down}_proj`` and the shared expert ``mlp.shared_mlp.*``.

The MTP layer is one more MoE block at ``model.layers.{N}`` (N = ``num_hidden_layers``) with
``eh_proj`` [H, 2H], ``enorm``, ``hnorm`` and its trailing ``final_layernorm``; it shares the
trunk's embedding and ``lm_head``. Norms are raw (``w · x̂``, transformers' ``HYV3RMSNorm``).
The config carries both spellings of the expert width the readers use: ``moe_intermediate_size``
(llama.cpp's converter, transformers) and ``expert_hidden_dim`` (MTPLX's vendored model).

The weights are random but for the MTP layer's, which is built to draft (``drafting_tensors``), so
llama-server accepts some of its drafts. Dimensions: hidden 64, 2 trunk layers (dense, MoE), 4
experts (2 per token).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import mlx.core as mx

from .family_common import (Spec, build_family_tokenizer, echo_head_tensors, linear, raw_norm, scratch_dir,
                            write_family_checkpoint, write_generation_config)

TRAINED_VOCAB = 512  # every id below vocab_size is a token

#: config.json, spelled as the release spells it (tiny values)
CONFIG: dict[str, Any] = {
    "architectures": ["HYV3ForCausalLM"],
    "model_type": "hy_v3",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_shared_experts": 1,
    "moe_intermediate_size": 32,
    "expert_hidden_dim": 32,
    "first_k_dense_replace": 1,
    "mlp_layer_types": ["dense", "sparse"],
    "router_scaling_factor": 2.5,
    "route_norm": True,
    "moe_router_use_sigmoid": True,
    "moe_router_enable_expert_bias": True,
    "qk_norm": True,
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 512,
}

#: tensors the release keeps in float32 (everything else bf16)
FLOAT32 = ("mlp.router.gate.weight", "mlp.expert_bias")


def tiny_config(**overrides: Any) -> dict[str, Any]:
    c = copy.deepcopy(CONFIG)
    c.update(overrides)
    n = c["num_hidden_layers"]
    if "mlp_layer_types" not in overrides:
        c["mlp_layer_types"] = ["dense" if i < c["first_k_dense_replace"] else "sparse" for i in range(n)]
    return c


def _layer(i: int, c: dict[str, Any], moe: bool) -> dict[str, Spec]:
    h, d, nh, kv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    p = f"model.layers.{i}."
    s: dict[str, Spec] = {
        p + "input_layernorm.weight": raw_norm(h), p + "post_attention_layernorm.weight": raw_norm(h),
        p + "self_attn.q_proj.weight": linear(nh * d, h), p + "self_attn.k_proj.weight": linear(kv * d, h),
        p + "self_attn.v_proj.weight": linear(kv * d, h), p + "self_attn.o_proj.weight": linear(h, nh * d, 0.5),
        p + "self_attn.q_norm.weight": raw_norm(d), p + "self_attn.k_norm.weight": raw_norm(d),
    }
    if not moe:
        ff = c["intermediate_size"]
        s.update({p + "mlp.gate_proj.weight": linear(ff, h), p + "mlp.up_proj.weight": linear(ff, h),
                  p + "mlp.down_proj.weight": linear(h, ff, 0.5)})
        return s
    ne, im = c["num_experts"], c["moe_intermediate_size"]
    sh = im * c["num_shared_experts"]
    s.update({
        p + "mlp.router.gate.weight": linear(ne, h), p + "mlp.expert_bias": ((ne,), "norm", 0.0, 0.01),
        p + "mlp.shared_mlp.gate_proj.weight": linear(sh, h), p + "mlp.shared_mlp.up_proj.weight": linear(sh, h),
        p + "mlp.shared_mlp.down_proj.weight": linear(h, sh, 0.5),
    })
    for e in range(ne):
        q = f"{p}mlp.experts.{e}."
        s.update({q + "gate_proj.weight": linear(im, h), q + "up_proj.weight": linear(im, h),
                  q + "down_proj.weight": linear(h, im, 0.5)})
    return s


def tensor_specs(config: dict[str, Any], *, mtp: bool = True) -> dict[str, Spec]:
    """name -> (shape, kind, loc, scale): the trunk, then (``mtp``) the appended MTP layer(s)."""
    c = config
    h, v, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    s: dict[str, Spec] = {"model.embed_tokens.weight": ((v, h), "linear", 0.0, 1.0), "model.norm.weight": raw_norm(h)}
    if not c.get("tie_word_embeddings"):
        s["lm_head.weight"] = linear(v, h)
    for i in range(n):
        s.update(_layer(i, c, moe=i >= c["first_k_dense_replace"]))
    if mtp:
        for k in range(int(c.get("num_nextn_predict_layers") or 0)):
            p = f"model.layers.{n + k}."
            s.update(_layer(n + k, c, moe=True))
            s.update({p + "eh_proj.weight": linear(h, 2 * h), p + "enorm.weight": raw_norm(h),
                      p + "hnorm.weight": raw_norm(h), p + "final_layernorm.weight": raw_norm(h)})
    return s


def mtp_keys(config: dict[str, Any]) -> list[str]:
    """The head's keys: every tensor of the layers at index ``num_hidden_layers`` and after."""
    n = config["num_hidden_layers"]
    return sorted(k for k in tensor_specs(config) if k.startswith("model.layers.") and int(k.split(".")[2]) >= n)


def drafting_tensors(config: dict[str, Any], *, seed: int) -> dict[str, mx.array]:
    """The tensors, with an MTP layer that drafts (``family_common.echo_head_tensors``)."""
    return echo_head_tensors(tensor_specs(config), config, seed=seed, float32=FLOAT32)


def build_hy_v3(out_dir: str | Path, *, seed: int = 0, n_shards: int = 2, **overrides: Any) -> Path:
    """Write the tiny Hy3 checkpoint into ``out_dir`` and return it (``overrides``: config.json
    keys); its MTP layer drafts (``drafting_tensors``)."""
    config = tiny_config(**overrides)
    with scratch_dir() as tmp:
        build_family_tokenizer(Path(tmp), TRAINED_VOCAB, (), eos="<|im_end|>")
        out = write_family_checkpoint(out_dir, config, drafting_tensors(config, seed=seed), Path(tmp), n_shards=n_shards)
    write_generation_config(out, config)
    return out
