"""A tiny Qwen3.8-Flash-Next (``qwen4_exp``, ``Qwen4ExpForConditionalGeneration``) in the
release's Hugging Face layout, MTP head included.

The release is a vision-language model: ``model.language_model.*`` (the text model),
``model.visual.*`` (a Qwen3-VL vision tower), ``lm_head``, and the MTP head under ``mtp.*``.
The text model carries every residual as ``hc_count`` hyper-connection streams: each decoder
layer has no RMSNorm of its own but two gated residuals (``attn_hyper_connection``,
``mlp_hyper_connection``: a grouped ``hc_norm`` over the streams, a low-rank input mixer
``input_mix_weight_down`` / ``input_mix_weight_up`` and ``block_inject_weight``, which spreads
the branch back over the streams), and a final ``hyper_connection_mixer`` (no inject) folds the
streams before ``lm_head``. Layers are Gated DeltaNet (``linear_attn``) and, every
``full_attention_interval``-th, Qwen Sparse Attention (``self_attn`` with its token indexer
``indexer.{index_qk_proj,q_layernorm,k_layernorm}``); every MLP is a routed MoE with fused expert
stacks (``experts.gate_up_proj`` [E, 2·IM, H], ``experts.down_proj`` [E, H, IM]), a shared expert
and its sigmoid gate.

The MTP head (31 tensors): ``pre_fc_norm_embedding`` [H] and ``pre_fc_norm_hidden`` [hc·H] (one
RMS over every stream), ``fc_embedding`` and ``fc_hidden`` [H, H] (the streams projected one by
one), one QSA + MoE decoder layer ``layers.0`` with its two gated residuals, and its own
``hyper_connection_mixer``. Every RMSNorm but the DeltaNet's gated one is zero-centred (applied
as ``(1 + w) · x̂``) in the release and in mlx-vlm alike, so the values are drawn around 0.

Dimensions: hidden 64, 2 streams, low rank 32, 4 layers (``linear, qsa, linear, qsa``), 4 experts
(2 per token); every matrix's input dimension is a multiple of 32, so mlx-vlm's ``convert``
quantizes each one at group size 32.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import mlx.core as mx

from .family_common import Spec, build_family_tokenizer, linear, random_tensors, scratch_dir, write_family_checkpoint, \
    write_generation_config

TRAINED_VOCAB = 512  # every id below vocab_size is a token
#: the synthetic tokenizer's Qwen role tokens (config.SPECIAL_TOKENS, ids 0..6)
EOS, VISION_START, VISION_END, IMAGE, VIDEO = 2, 3, 4, 5, 6

#: the text config, spelled as the release spells it (tiny values)
TEXT_CONFIG: dict[str, Any] = {
    "model_type": "qwen4_exp_text",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "dtype": "bfloat16",
    "eos_token_id": EOS,
    "full_attention_interval": 2,
    "hc_count": 2,
    "hc_lowrank": 32,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "indexer_budget": 16,
    "indexer_compress_ratio": 4,
    "indexer_head_dim": 32,
    "indexer_kv_heads": 1,
    "indexer_n_heads": 2,
    "initializer_range": 0.02,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 32,
    "max_position_embeddings": 4096,
    "moe_intermediate_size": 32,
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "output_gate_type": "sigmoid",
    "ple_layer_ids": [],
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.25,
                        "rope_theta": 10000000, "rope_type": "default"},
    "shared_expert_intermediate_size": 64,
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": TRAINED_VOCAB,
}
#: config.json (the vision tower is Qwen3-VL's, one block)
CONFIG: dict[str, Any] = {
    "architectures": ["Qwen4ExpForConditionalGeneration"],
    "model_type": "qwen4_exp",
    "image_token_id": IMAGE,
    "video_token_id": VIDEO,
    "vision_start_token_id": VISION_START,
    "vision_end_token_id": VISION_END,
    "tie_word_embeddings": False,
    "transformers_version": "5.24.0",
    "text_config": TEXT_CONFIG,
    "vision_config": {
        "deepstack_visual_indexes": [], "depth": 1, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 64,
        "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 128, "model_type": "qwen4_exp",
        "num_heads": 2, "num_position_embeddings": 64, "out_hidden_size": 64, "patch_size": 16,
        "spatial_merge_size": 2, "temporal_patch_size": 2,
    },
}


def tiny_config(**text_overrides: Any) -> dict[str, Any]:
    c = copy.deepcopy(CONFIG)
    c["text_config"].update(text_overrides)
    return c


def _centred(n: int) -> Spec:
    """A zero-centred RMSNorm weight (applied as ``(1 + w) · x̂``): values around 0."""
    return ((n,), "norm", 0.0, 0.1)


def _hyper(p: str, t: dict[str, Any], inject: bool = True) -> dict[str, Spec]:
    """One gated residual over the ``hc_count`` streams (``inject``: it spreads a branch back)."""
    h, hc, r = t["hidden_size"], t["hc_count"], t["hc_lowrank"]
    out = {p + "hc_norm.weight": _centred(hc * h), p + "input_mix_weight_down.weight": linear(r, hc * h),
           p + "input_mix_weight_up.weight": linear(hc * h, r)}
    if inject:
        out[p + "block_inject_weight.weight"] = linear(hc, hc * h)
    return out


def _qsa(p: str, t: dict[str, Any]) -> dict[str, Spec]:
    """Qwen Sparse Attention: gated queries (2·NH·D rows), q/k norms, the token indexer."""
    h, d, nh, kv, idx = t["hidden_size"], t["head_dim"], t["num_attention_heads"], t["num_key_value_heads"], \
        t["indexer_head_dim"]
    return {p + "q_proj.weight": linear(2 * nh * d, h), p + "k_proj.weight": linear(kv * d, h),
            p + "v_proj.weight": linear(kv * d, h), p + "o_proj.weight": linear(h, nh * d),
            p + "q_norm.weight": _centred(d), p + "k_norm.weight": _centred(d),
            p + "indexer.index_qk_proj.weight": linear((t["indexer_n_heads"] + t["indexer_kv_heads"]) * idx, h),
            p + "indexer.q_layernorm.weight": _centred(idx), p + "indexer.k_layernorm.weight": _centred(idx)}


def _deltanet(p: str, t: dict[str, Any]) -> dict[str, Spec]:
    """Gated DeltaNet as the release stores it (``conv1d`` [C, 1, K], unsanitized)."""
    h, nk, nv, dk, dv = (t["hidden_size"], t["linear_num_key_heads"], t["linear_num_value_heads"],
                         t["linear_key_head_dim"], t["linear_value_head_dim"])
    c = 2 * nk * dk + nv * dv
    return {p + "conv1d.weight": ((c, 1, t["linear_conv_kernel_dim"]), "linear", 0.0, 0.5),
            p + "in_proj_qkv.weight": linear(c, h), p + "in_proj_z.weight": linear(nv * dv, h),
            p + "in_proj_b.weight": linear(nv, h), p + "in_proj_a.weight": linear(nv, h),
            p + "dt_bias": ((nv,), "norm", 1.0, 0.1), p + "A_log": ((nv,), "uniform", 0.0, 1.0),
            p + "norm.weight": ((dv,), "norm", 1.0, 0.1), p + "out_proj.weight": linear(h, nv * dv)}


def _moe(p: str, t: dict[str, Any]) -> dict[str, Spec]:
    h, e, im, s = t["hidden_size"], t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
    return {p + "gate.weight": linear(e, h),
            p + "experts.gate_up_proj": ((e, 2 * im, h), "linear", 0.0, 1 / math.sqrt(h)),
            p + "experts.down_proj": ((e, h, im), "linear", 0.0, 1 / math.sqrt(im)),
            p + "shared_expert.gate_proj.weight": linear(s, h), p + "shared_expert.up_proj.weight": linear(s, h),
            p + "shared_expert.down_proj.weight": linear(h, s), p + "shared_expert_gate.weight": linear(1, h)}


def _layer(p: str, t: dict[str, Any], kind: str) -> dict[str, Spec]:
    mixer = _deltanet(p + "linear_attn.", t) if kind == "linear_attention" else _qsa(p + "self_attn.", t)
    return {**mixer, **_moe(p + "mlp.", t), **_hyper(p + "attn_hyper_connection.", t),
            **_hyper(p + "mlp_hyper_connection.", t)}


def _vision(c: dict[str, Any]) -> dict[str, Spec]:
    """Qwen3-VL's vision tower, one block (``patch_embed`` a Conv3d [D, C, T, P, P])."""
    v = c["vision_config"]
    d, i, p, t = v["hidden_size"], v["intermediate_size"], v["patch_size"], v["temporal_patch_size"]
    m = d * v["spatial_merge_size"] ** 2
    out: dict[str, Spec] = {"model.visual.patch_embed.proj.weight": ((d, v["in_channels"], t, p, p), "linear", 0.0, 0.02),
                            "model.visual.patch_embed.proj.bias": ((d,), "zeros", 0.0, 0.0),
                            "model.visual.pos_embed.weight": ((v["num_position_embeddings"], d), "linear", 0.0, 0.02),
                            "model.visual.merger.norm.weight": ((d,), "ones", 0.0, 0.0),
                            "model.visual.merger.norm.bias": ((d,), "zeros", 0.0, 0.0),
                            "model.visual.merger.linear_fc1.weight": linear(m, m),
                            "model.visual.merger.linear_fc1.bias": ((m,), "zeros", 0.0, 0.0),
                            "model.visual.merger.linear_fc2.weight": linear(v["out_hidden_size"], m),
                            "model.visual.merger.linear_fc2.bias": ((v["out_hidden_size"],), "zeros", 0.0, 0.0)}
    for b in range(v["depth"]):
        q = f"model.visual.blocks.{b}."
        out.update({q + "norm1.weight": ((d,), "ones", 0.0, 0.0), q + "norm1.bias": ((d,), "zeros", 0.0, 0.0),
                    q + "norm2.weight": ((d,), "ones", 0.0, 0.0), q + "norm2.bias": ((d,), "zeros", 0.0, 0.0),
                    q + "attn.qkv.weight": linear(3 * d, d), q + "attn.qkv.bias": ((3 * d,), "zeros", 0.0, 0.0),
                    q + "attn.proj.weight": linear(d, d), q + "attn.proj.bias": ((d,), "zeros", 0.0, 0.0),
                    q + "mlp.linear_fc1.weight": linear(i, d), q + "mlp.linear_fc1.bias": ((i,), "zeros", 0.0, 0.0),
                    q + "mlp.linear_fc2.weight": linear(d, i), q + "mlp.linear_fc2.bias": ((d,), "zeros", 0.0, 0.0)})
    return out


def mtp_specs(config: dict[str, Any]) -> dict[str, Spec]:
    """The release's ``mtp.*`` tensors (31 for one MTP layer)."""
    t = config["text_config"]
    h, hc = t["hidden_size"], t["hc_count"]
    out = {"mtp.pre_fc_norm_embedding.weight": _centred(h), "mtp.pre_fc_norm_hidden.weight": _centred(hc * h),
           "mtp.fc_embedding.weight": linear(h, h), "mtp.fc_hidden.weight": linear(h, h),
           **_hyper("mtp.hyper_connection_mixer.", t, inject=False)}
    for i in range(int(t.get("mtp_num_hidden_layers") or 0)):
        out.update(_layer(f"mtp.layers.{i}.", t, "full_attention"))
    return out


def tensor_specs(config: dict[str, Any], *, mtp: bool = True) -> dict[str, Spec]:
    t = config["text_config"]
    h, v = t["hidden_size"], t["vocab_size"]
    out: dict[str, Spec] = {"model.language_model.embed_tokens.weight": ((v, h), "embed", 0.0, 1.0),
                            "lm_head.weight": linear(v, h),
                            **_hyper("model.language_model.hyper_connection_mixer.", t, inject=False),
                            **_vision(config)}
    for i, kind in enumerate(t["layer_types"]):
        out.update(_layer(f"model.language_model.layers.{i}.", t, kind))
    return {**out, **(mtp_specs(config) if mtp else {})}


def build_qwen4_exp(out_dir: str | Path, *, seed: int = 0, n_shards: int = 3, **text_overrides: Any) -> Path:
    """Write the tiny checkpoint into ``out_dir`` (the head spread over the last two shards,
    between backbone tensors, as the release interleaves them) and return it."""
    config = tiny_config(**text_overrides)
    tensors: dict[str, mx.array] = random_tensors(tensor_specs(config), seed=seed, float32=("A_log",))
    with scratch_dir() as tmp:
        build_family_tokenizer(Path(tmp), TRAINED_VOCAB, (), eos="<|im_end|>")
        out = write_family_checkpoint(out_dir, config, tensors, Path(tmp), n_shards=n_shards, mtp_shards=2)
    write_generation_config(out, {**config, "eos_token_id": [EOS]})
    return out


def unfused_experts(tensors: dict[str, mx.array]) -> dict[str, mx.array]:
    """The fused expert stacks one expert at a time (``experts.{e}.{gate,up,down}_proj.weight``),
    as the FP8 release stores them (mlx-vlm's ``convert_qwen4_exp_fp8_weights`` reads that)."""
    out: dict[str, mx.array] = {}
    for k, v in tensors.items():
        if k.endswith(".experts.gate_up_proj"):
            p, im = k[: -len("gate_up_proj")], v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{p}{e}.gate_proj.weight"], out[f"{p}{e}.up_proj.weight"] = v[e, :im], v[e, im:]
        elif k.endswith(".experts.down_proj"):
            out.update({f"{k[: -len('down_proj')]}{e}.down_proj.weight": v[e] for e in range(v.shape[0])})
        else:
            out[k] = v
    return out


def build_qwen4_exp_fp8(out_dir: str | Path, *, seed: int = 0) -> Path:
    """The FP8 release of the same tiny model (``seed``): every expert one by one, block-FP8 with
    its ``weight_scale_inv`` (128x128 blocks), the rest as in the bf16 release, and the
    ``quantization_config`` that says so. Which tensors the real FP8 release quantizes is read in
    mlx-vlm's converter (experts, and the per-layer embeddings this tiny model lacks), not in a
    downloaded checkpoint."""
    from .fp8 import to_block_fp8

    config = tiny_config()
    tensors = unfused_experts(random_tensors(tensor_specs(config), seed=seed, float32=("A_log",)))
    out = Path(out_dir)
    with scratch_dir() as tmp:
        build_family_tokenizer(Path(tmp), TRAINED_VOCAB, (), eos="<|im_end|>")
        bf16 = write_family_checkpoint(Path(tmp) / "bf16", config, tensors, Path(tmp), n_shards=3, mtp_shards=2)
        write_generation_config(bf16, {**config, "eos_token_id": [EOS]})
        return to_block_fp8(bf16, out, fp8=lambda name: ".mlp.experts." in name, announce=True)

