"""Tiny configs that spell every key the way the real Qwen3.5 / 3.6 / Qwen3-Next releases do.

Dimensions are chosen so that the real ``mlx_lm.convert`` quantizes every projection with group
sizes 32, 64 and 128 (every input dimension is a multiple of 128), head dimensions are multiples
of 32 (mlx-lm's gated-delta Metal kernel needs it) and the partial rotary dimension is even.
"""

from __future__ import annotations

import copy
from typing import Any

VARIANTS: tuple[str, ...] = ("qwen3_5", "qwen3_5_moe", "qwen3_6_moe", "qwen3_next")

#: The only non-release key: which variant built the config. Qwen3.5 MoE and Qwen3.6 MoE share
#: every config key and differ in the MTP expert layout of their weights, so the tensor builder
#: needs to be told. ``write_hf_checkpoint`` strips it from config.json.
VARIANT_KEY = "_synth_variant"

#: Special tokens, always in this order at ids 0.. of every synthetic tokenizer, so a config can
#: name them before the tokenizer exists.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
)
PAD_ID, EOS_ID = 0, 2
VISION_START_ID, VISION_END_ID, IMAGE_ID, VIDEO_ID = 3, 4, 5, 6

#: keys that live in ``rope_parameters`` for Qwen3.5/3.6 (flat in Qwen3-Next)
_ROPE_KEYS = ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved", "rope_type")

_COMMON_TEXT: dict[str, Any] = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "full_attention_interval": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 128,
    "initializer_range": 0.02,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 32,
    "max_position_embeddings": 4096,
    "num_attention_heads": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 512,
}

_MOE_TEXT: dict[str, Any] = {
    "moe_intermediate_size": 128,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "shared_expert_intermediate_size": 128,
    "norm_topk_prob": True,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
    "decoder_sparse_step": 1,
}


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config (``text_config`` for Qwen3.5/3.6, the flat config for
    Qwen3-Next). Returns the same dict, not a copy, so callers can edit it in place."""
    tc = config.get("text_config")
    return tc if isinstance(tc, dict) else config


def variant_of(config: dict[str, Any]) -> str:
    """The synthetic variant a config describes; falls back to the release family for configs
    read back from disk (where Qwen3.6 MoE cannot be told from Qwen3.5 MoE)."""
    v = config.get(VARIANT_KEY)
    if v in VARIANTS:
        return v
    mt = config.get("model_type")
    if mt == "qwen3_next":
        return "qwen3_next"
    if mt in ("qwen3_5", "qwen3_5_moe"):
        return "qwen3_5_moe" if int(text_config(config).get("num_experts") or 0) > 0 else "qwen3_5"
    raise ValueError(f"not a synthetic Qwen config: model_type={mt!r}")


def layer_types(n_layers: int, interval: int) -> list[str]:
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]


def tiny_config(variant: str, **text_overrides: Any) -> dict[str, Any]:
    """The config.json dict of a tiny model of ``variant`` (one of VARIANTS).

    ``text_overrides`` replace keys of the text config (the flat config for Qwen3-Next); rope keys
    (``rope_theta``, ``partial_rotary_factor``, ``mrope_section``) go into ``rope_parameters`` for
    Qwen3.5/3.6. ``layer_types`` follows ``num_hidden_layers`` / ``full_attention_interval`` unless
    given. ``tie_word_embeddings`` is mirrored at the top level, where the releases also put it.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    overrides = dict(text_overrides)
    if variant == "qwen3_next":
        cfg = _qwen3_next_config()
        tc = cfg
    else:
        cfg = _qwen3_5_config(variant)
        tc = cfg["text_config"]
        rope = tc["rope_parameters"]
        for k in _ROPE_KEYS:
            if k in overrides:
                rope[k] = overrides.pop(k)
    tc.update(copy.deepcopy(overrides))
    if variant != "qwen3_next" and "mrope_section" not in text_overrides:
        tc["rope_parameters"]["mrope_section"] = _mrope_section(tc)
    if "layer_types" not in overrides:
        tc["layer_types"] = layer_types(int(tc["num_hidden_layers"]), int(tc["full_attention_interval"]))
    if "eos_token_id" not in overrides:
        tc["eos_token_id"] = EOS_ID
    cfg["tie_word_embeddings"] = bool(tc.get("tie_word_embeddings", False))
    _check_dims(tc)
    cfg[VARIANT_KEY] = variant
    return cfg


def _qwen3_5_config(variant: str) -> dict[str, Any]:
    moe = variant != "qwen3_5"
    tc: dict[str, Any] = dict(copy.deepcopy(_COMMON_TEXT))
    tc.update(
        {
            "attn_output_gate": True,
            "dtype": "bfloat16",
            "mamba_ssm_dtype": "float32",
            "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
            "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": False,
            "rope_parameters": {
                "mrope_interleaved": True,
                "mrope_section": [3, 3, 2],
                "partial_rotary_factor": 0.25,
                "rope_theta": 10000000,
                "rope_type": "default",
            },
        }
    )
    if moe:
        tc.update(copy.deepcopy(_MOE_TEXT))
        del tc["decoder_sparse_step"]  # Qwen3.5 MoE is sparse in every layer and does not say so
    else:
        tc["intermediate_size"] = 256
    model_type = "qwen3_5_moe" if moe else "qwen3_5"
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
        "image_token_id": IMAGE_ID,
        "model_type": model_type,
        "text_config": tc,
        "tie_word_embeddings": False,
        "transformers_version": "4.57.0.dev0",
        "video_token_id": VIDEO_ID,
        "vision_config": {
            "deepstack_visual_indexes": [],
            "depth": 1,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": 64,
            "in_channels": 3,
            "initializer_range": 0.02,
            "intermediate_size": 128,
            "model_type": model_type,
            "num_heads": 2,
            "num_position_embeddings": 64,
            "out_hidden_size": tc["hidden_size"],
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        "vision_end_token_id": VISION_END_ID,
        "vision_start_token_id": VISION_START_ID,
    }


def _qwen3_next_config() -> dict[str, Any]:
    """Flat, with no MTP layer count: the real Qwen3-Next-80B config declares none."""
    cfg: dict[str, Any] = dict(copy.deepcopy(_COMMON_TEXT))
    cfg.update(copy.deepcopy(_MOE_TEXT))
    cfg.update(
        {
            "architectures": ["Qwen3NextForCausalLM"],
            "bos_token_id": PAD_ID,
            "intermediate_size": 256,
            "mlp_only_layers": [],
            "model_type": "qwen3_next",
            "partial_rotary_factor": 0.25,
            "rope_scaling": None,
            "rope_theta": 10000000,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.57.0.dev0",
            "use_sliding_window": False,
        }
    )
    return cfg


def _mrope_section(tc: dict[str, Any]) -> list[int]:
    """Split half the rotary dimension over (t, h, w) the way the releases do: 32 -> [11, 11, 10]."""
    half = int(int(tc["head_dim"]) * float(tc["rope_parameters"].get("partial_rotary_factor", 0.25))) // 2
    a = (half + 2) // 3
    return [a, a, half - 2 * a]


def _check_dims(tc: dict[str, Any]) -> None:
    """Refuse configs mlx-lm could not build, with the reason, instead of a shape error later."""
    nk, nv = int(tc["linear_num_key_heads"]), int(tc["linear_num_value_heads"])
    if nv % nk:
        raise ValueError(f"linear_num_value_heads ({nv}) must be a multiple of linear_num_key_heads ({nk})")
    nh, kv = int(tc["num_attention_heads"]), int(tc["num_key_value_heads"])
    if nh % kv:
        raise ValueError(f"num_attention_heads ({nh}) must be a multiple of num_key_value_heads ({kv})")
    rope = tc.get("rope_parameters") or tc
    rot = int(tc["head_dim"]) * float(rope.get("partial_rotary_factor", 0.25))
    if rot != int(rot) or int(rot) % 2:
        raise ValueError(f"head_dim x partial_rotary_factor = {rot}: the rotary dimension must be an even integer")
    if int(tc["vocab_size"]) < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size {tc['vocab_size']} cannot hold a byte-level tokenizer (>= {len(SPECIAL_TOKENS) + 256})")
