"""Random weights under the real Hugging Face names and shapes (docs/SPEC.md §2), as pure data.

Every tensor draws from its own key, derived from (seed, name), so a tensor's values do not
depend on which other tensors exist: changing the expert layout or the number of MTP layers
leaves the rest of the checkpoint bit-identical.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Iterable

import mlx.core as mx

from .config import text_config, variant_of

Spec = tuple[tuple[int, ...], str, float, float]  # shape, kind, loc, scale

#: Zero-centred RMSNorm weights (applied as x̂·(1+w)). Per kind, the means mimic the releases so
#: that value heuristics fail here as they do in the wild (docs/SPEC.md §4): raw q_norm/k_norm sit high
#: (a "mean < 0.5 means raw" rule calls them shifted) and raw pre_fc_norm_* sit low enough that,
#: correctly shifted, they stay below 0.5.
_NORM_LOC_SCALE = {
    "q_norm": (0.75, 0.3),
    "k_norm": (0.75, 0.3),
    "pre_fc_norm_embedding": (-0.55, 0.3),
    "pre_fc_norm_hidden": (-0.55, 0.3),
}
_NORM_DEFAULT = (-0.1, 0.3)


def mtp_tensor_names(tensors: Iterable[str]) -> list[str]:
    """Sorted keys of the MTP head (top-level ``mtp.`` prefix, as in every release)."""
    return sorted(k for k in tensors if k.startswith("mtp."))


def random_hf_tensors(
    config: dict[str, Any],
    seed: int = 0,
    dtype: mx.Dtype = mx.bfloat16,
    *,
    mtp_experts: str | None = None,
) -> dict[str, mx.array]:
    """Every backbone and MTP tensor of ``config`` with release names and shapes.

    Projections are scaled by 1/sqrt(fan_in) (residual outputs by half that) so a forward pass
    stays numerically sane; ``A_log`` is float32 as in the releases (mlx-lm never casts it).
    ``mtp_experts`` ("per-expert" | "fused") overrides the MoE head's expert layout that the
    variant implies (Qwen3.5 MoE and Qwen3-Next per-expert, Qwen3.6 MoE fused).
    """
    specs = hf_tensor_specs(config, mtp_experts=mtp_experts)
    out: dict[str, mx.array] = {}
    for name in sorted(specs):
        shape, kind, loc, scale = specs[name]
        key = mx.random.key((int(seed) * 0x9E3779B1 + zlib.crc32(name.encode())) % (1 << 63))
        if kind == "a_log":
            v = mx.log(mx.random.uniform(1.0, 16.0, shape, key=key))
            out[name] = v.astype(mx.float32)
            continue
        v = mx.random.normal(shape, mx.float32, loc=loc, scale=scale, key=key)
        out[name] = v.astype(dtype)
    mx.eval(out)
    return out


def hf_tensor_specs(config: dict[str, Any], *, mtp_experts: str | None = None) -> dict[str, Spec]:
    """name -> (shape, kind, loc, scale) for the whole checkpoint; no tensor data."""
    variant = variant_of(config)
    tc = text_config(config)
    next_ = variant == "qwen3_next"
    prefix = "model." if next_ else "model.language_model."
    h, v = int(tc["hidden_size"]), int(tc["vocab_size"])
    specs: dict[str, Spec] = {f"{prefix}embed_tokens.weight": ((v, h), "embed", 0.0, 1.0)}
    specs[f"{prefix}norm.weight"] = _norm((h,), "norm")
    if not tc.get("tie_word_embeddings", False):
        specs["lm_head.weight"] = _linear(v, h)
    interval = int(tc.get("full_attention_interval", 4))
    kinds = tc.get("layer_types") or [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(int(tc["num_hidden_layers"]))
    ]
    backbone_experts = "per-expert" if next_ else "fused"
    for i, kind in enumerate(kinds):
        p = f"{prefix}layers.{i}."
        specs.update(_block_norms(p, h))
        if kind == "linear_attention":
            specs.update(_linear_attention(p + "linear_attn.", tc, next_))
        else:
            specs.update(_attention(p + "self_attn.", tc))
        specs.update(_mlp(p + "mlp.", tc, i, backbone_experts))
    n_mtp = _mtp_layers(config, variant)
    if n_mtp:
        head_experts = mtp_experts or ("fused" if variant == "qwen3_6_moe" else "per-expert")
        specs["mtp.fc.weight"] = _linear(h, 2 * h)
        specs["mtp.pre_fc_norm_embedding.weight"] = _norm((h,), "pre_fc_norm_embedding")
        specs["mtp.pre_fc_norm_hidden.weight"] = _norm((h,), "pre_fc_norm_hidden")
        specs["mtp.norm.weight"] = _norm((h,), "norm")
        for i in range(n_mtp):
            p = f"mtp.layers.{i}."
            specs.update(_block_norms(p, h))
            specs.update(_attention(p + "self_attn.", tc))
            specs.update(_mlp(p + "mlp.", tc, None, head_experts))
    return specs


def _mtp_layers(config: dict[str, Any], variant: str) -> int:
    tc = text_config(config)
    if variant == "qwen3_next":
        # The release ships one head layer and declares no count; honour one if a test sets it.
        return int(tc.get("num_nextn_predict_layers", tc.get("mtp_num_hidden_layers", 1)) or 0)
    return int(tc.get("mtp_num_hidden_layers", 0) or 0)


def _linear(out_dim: int, in_dim: int, gain: float = 1.0) -> Spec:
    return ((out_dim, in_dim), "linear", 0.0, gain / math.sqrt(in_dim))


def _norm(shape: tuple[int, ...], kind: str) -> Spec:
    loc, scale = _NORM_LOC_SCALE.get(kind, _NORM_DEFAULT)
    return (shape, "norm", loc, scale)


def _block_norms(p: str, h: int) -> dict[str, Spec]:
    return {p + "input_layernorm.weight": _norm((h,), "norm"), p + "post_attention_layernorm.weight": _norm((h,), "norm")}


def _attention(p: str, tc: dict[str, Any]) -> dict[str, Spec]:
    """Gated full attention: q_proj holds [query | gate] per head, hence 2·heads·head_dim rows."""
    h, nh, kv, d = int(tc["hidden_size"]), int(tc["num_attention_heads"]), int(tc["num_key_value_heads"]), int(tc["head_dim"])
    return {
        p + "q_proj.weight": _linear(2 * nh * d, h),
        p + "k_proj.weight": _linear(kv * d, h),
        p + "v_proj.weight": _linear(kv * d, h),
        p + "o_proj.weight": _linear(h, nh * d, 0.5),
        p + "q_norm.weight": _norm((d,), "q_norm"),
        p + "k_norm.weight": _norm((d,), "k_norm"),
    }


def _linear_attention(p: str, tc: dict[str, Any], qwen3_next: bool) -> dict[str, Spec]:
    """Gated DeltaNet in source layout: conv1d [C, 1, K]; Qwen3-Next packs qkvz and ba."""
    h = int(tc["hidden_size"])
    nk, dk = int(tc["linear_num_key_heads"]), int(tc["linear_key_head_dim"])
    nv, dv = int(tc["linear_num_value_heads"]), int(tc["linear_value_head_dim"])
    k = int(tc["linear_conv_kernel_dim"])
    key_dim, value_dim = nk * dk, nv * dv
    conv_dim = 2 * key_dim + value_dim
    s: dict[str, Spec] = {}
    if qwen3_next:
        s[p + "in_proj_qkvz.weight"] = _linear(2 * key_dim + 2 * value_dim, h)
        s[p + "in_proj_ba.weight"] = _linear(2 * nv, h)
    else:
        s[p + "in_proj_qkv.weight"] = _linear(conv_dim, h)
        s[p + "in_proj_z.weight"] = _linear(value_dim, h)
        s[p + "in_proj_b.weight"] = _linear(nv, h)
        s[p + "in_proj_a.weight"] = _linear(nv, h)
    s[p + "conv1d.weight"] = ((conv_dim, 1, k), "linear", 0.0, 0.5 / math.sqrt(k))
    s[p + "dt_bias"] = ((nv,), "bias", 1.0, 0.1)
    s[p + "A_log"] = ((nv,), "a_log", 0.0, 1.0)
    # The gated norm is applied as-is (weight ~ 1), never shifted: not zero-centred.
    s[p + "norm.weight"] = ((dv,), "gated_norm", 1.0, 0.05)
    s[p + "out_proj.weight"] = _linear(h, value_dim, 0.5)
    return s


def _mlp(p: str, tc: dict[str, Any], layer: int | None, expert_format: str) -> dict[str, Spec]:
    """Dense SwiGLU, or sparse MoE with a sigmoid-gated shared expert."""
    h = int(tc["hidden_size"])
    n_exp = int(tc.get("num_experts") or 0)
    sparse = n_exp > 0
    if sparse and layer is not None:
        step = int(tc.get("decoder_sparse_step", 1) or 1)
        sparse = layer not in (tc.get("mlp_only_layers") or []) and (layer + 1) % step == 0
    if not sparse:
        i = int(tc["intermediate_size"])
        return {
            p + "gate_proj.weight": _linear(i, h),
            p + "up_proj.weight": _linear(i, h),
            p + "down_proj.weight": _linear(h, i, 0.5),
        }
    im, ish = int(tc["moe_intermediate_size"]), int(tc["shared_expert_intermediate_size"])
    s: dict[str, Spec] = {
        p + "gate.weight": _linear(n_exp, h),
        p + "shared_expert.gate_proj.weight": _linear(ish, h),
        p + "shared_expert.up_proj.weight": _linear(ish, h),
        p + "shared_expert.down_proj.weight": _linear(h, ish, 0.5),
        p + "shared_expert_gate.weight": _linear(1, h),
    }
    if expert_format == "fused":
        # No ".weight" suffix on fused expert stacks; gate rows first, then up (docs/SPEC.md §2).
        s[p + "experts.gate_up_proj"] = ((n_exp, 2 * im, h), "linear", 0.0, 1.0 / math.sqrt(h))
        s[p + "experts.down_proj"] = ((n_exp, h, im), "linear", 0.0, 0.5 / math.sqrt(im))
    elif expert_format == "per-expert":
        for e in range(n_exp):
            s[p + f"experts.{e}.gate_proj.weight"] = _linear(im, h)
            s[p + f"experts.{e}.up_proj.weight"] = _linear(im, h)
            s[p + f"experts.{e}.down_proj.weight"] = _linear(h, im, 0.5)
    else:
        raise ValueError(f"unknown expert format {expert_format!r}; use 'per-expert' or 'fused'")
    return s
