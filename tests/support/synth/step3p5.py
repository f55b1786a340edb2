"""A tiny Step-3.5 (``step3p5``, ``Step3p5ForCausalLM``) checkpoint in the release's Hugging Face
layout, MTP head included.

The trunk follows llama.cpp's converter (conversion/step3.py) and its tensor map: blocks
``model.layers.{i}`` with ``input_layernorm`` / ``post_attention_layernorm``, attention
``self_attn.{q,k,v,o}_proj`` with ``q_norm`` / ``k_norm`` and the head-wise gate ``g_proj``
[heads, H], then either a dense SwiGLU ``mlp.{gate,up,down}_proj`` (the leading dense blocks, before
the first index of ``moe_layers_enum``) or a MoE: the router ``moe.gate`` with its selection bias
``moe.router_bias`` (float32), the routed experts stored stacked as ``moe.{gate,up,down}_proj.weight``
[E, ...], and the shared expert ``share_expert.{gate,up,down}_proj``. Layers alternate full and
sliding-window attention (``layer_types``), with their own head counts
(``attention_other_setting``) and rotary fractions (0.5 full, 1.0 sliding).

The MTP head is ``num_nextn_predict_layers`` more layers appended at ``model.layers.{N+k}``: a dense
sliding-window decoder layer (the release's MTP layers have a dense MLP) plus ``eh_proj`` [H, 2H],
``enorm``, ``hnorm`` and the per-layer shared head ``transformer.shared_head.{norm,output}``
(docs/families/step3p5.md). Every norm is stored zero-centred (applied as ``(1 + w) · x̂``; the
converter adds 1), so the norm weights here are drawn around 0.

Dimensions: hidden 64, 2 trunk layers (dense full-attention, MoE sliding), 4 experts (2 per token).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from .family_common import Spec, build_random_checkpoint, linear

TRAINED_VOCAB = 512  # every id below vocab_size is a token

#: config.json, spelled as the release spells it (tiny values)
CONFIG: dict[str, Any] = {
    "architectures": ["Step3p5ForCausalLM"],
    "model_type": "step3p5",
    "attention_other_setting": {"attention_type": "sliding_attention", "num_attention_heads": 4,
                                "num_attention_groups": 2, "head_dim": 32, "true_head_dim": 32},
    "bos_token_id": 1,
    "eos_token_id": 2,
    "head_dim": 32,
    "hidden_size": 64,
    "intermediate_size": 128,
    "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
    "max_position_embeddings": 4096,
    "max_seq_len": 4096,
    "moe_every_n_layer": 1,
    "moe_intermediate_size": 64,
    "moe_layers_enum": "1",
    "moe_num_experts": 4,
    "moe_router_activation": "sigmoid",
    "moe_router_scaling_factor": 3.0,
    "moe_top_k": 2,
    "need_fp32_gate": True,
    "norm_expert_weight": True,
    "num_attention_groups": 1,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "num_nextn_predict_layers": 1,
    "pad_token_id": 0,
    "partial_rotary_factors": [0.5, 1.0, 1.0],
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "share_expert_dim": 64,
    "sliding_window": 128,
    "swiglu_limits": [0.0, 7.0],
    "swiglu_limits_shared": [0.0, 0.0],
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_head_wise_attn_gate": True,
    "use_moe": True,
    "use_qk_norm": True,
    "vocab_size": 512,
}

#: tensors the release keeps in float32 (everything else bf16)
FLOAT32 = ("moe.router_bias",)


def tiny_config(**overrides: Any) -> dict[str, Any]:
    """The config with ``overrides``; ``layer_types`` / ``partial_rotary_factors`` are re-sized to
    the trunk plus the MTP layers (an MTP layer is sliding-window, as in the release)."""
    c = copy.deepcopy(CONFIG)
    c.update(overrides)
    n, k = c["num_hidden_layers"], int(c.get("num_nextn_predict_layers") or 0)
    if "layer_types" not in overrides:
        trunk = [("full_attention" if i % 2 == 0 else "sliding_attention") for i in range(n)]
        c["layer_types"] = trunk + ["sliding_attention"] * k
    c["partial_rotary_factors"] = [1.0 if t == "sliding_attention" else 0.5 for t in c["layer_types"]]
    if "swiglu_limits" not in overrides:
        c["swiglu_limits"] = [0.0 if i == 0 else 7.0 for i in range(n)]
        c["swiglu_limits_shared"] = [0.0] * n
    return c


def zc_norm(n: int) -> Spec:
    """A zero-centred norm weight (applied as ``(1 + w) · x̂``): values around 0."""
    return ((n,), "norm", 0.0, 0.1)


def _heads(c: dict[str, Any], i: int) -> tuple[int, int]:
    if c["layer_types"][i] == "sliding_attention":
        o = c["attention_other_setting"]
        return o["num_attention_heads"], o["num_attention_groups"]
    return c["num_attention_heads"], c["num_attention_groups"]


def _layer(i: int, c: dict[str, Any], moe: bool) -> dict[str, Spec]:
    h, d = c["hidden_size"], c["head_dim"]
    nh, kv = _heads(c, i)
    p = f"model.layers.{i}."
    s: dict[str, Spec] = {
        p + "input_layernorm.weight": zc_norm(h), p + "post_attention_layernorm.weight": zc_norm(h),
        p + "self_attn.q_proj.weight": linear(nh * d, h), p + "self_attn.k_proj.weight": linear(kv * d, h),
        p + "self_attn.v_proj.weight": linear(kv * d, h), p + "self_attn.o_proj.weight": linear(h, nh * d, 0.5),
        p + "self_attn.q_norm.weight": zc_norm(d), p + "self_attn.k_norm.weight": zc_norm(d),
        p + "self_attn.g_proj.weight": linear(nh, h),
    }
    if moe:
        ne, im, sh = c["moe_num_experts"], c["moe_intermediate_size"], c["share_expert_dim"]
        s.update({
            p + "moe.gate.weight": linear(ne, h), p + "moe.router_bias": ((ne,), "norm", 0.0, 0.01),
            p + "moe.gate_proj.weight": ((ne, im, h), "linear", 0.0, h ** -0.5),
            p + "moe.up_proj.weight": ((ne, im, h), "linear", 0.0, h ** -0.5),
            p + "moe.down_proj.weight": ((ne, h, im), "linear", 0.0, 0.5 * im ** -0.5),
            p + "share_expert.gate_proj.weight": linear(sh, h), p + "share_expert.up_proj.weight": linear(sh, h),
            p + "share_expert.down_proj.weight": linear(h, sh, 0.5),
        })
    else:
        ff = c["intermediate_size"]
        s.update({p + "mlp.gate_proj.weight": linear(ff, h), p + "mlp.up_proj.weight": linear(ff, h),
                  p + "mlp.down_proj.weight": linear(h, ff, 0.5)})
    return s


def tensor_specs(config: dict[str, Any], *, mtp: bool = True) -> dict[str, Spec]:
    """name -> (shape, kind, loc, scale): the trunk, then (``mtp``) the appended MTP layers."""
    c = config
    h, v, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    first_moe = min(int(x) for x in c["moe_layers_enum"].split(","))
    s: dict[str, Spec] = {"model.embed_tokens.weight": ((v, h), "linear", 0.0, 1.0), "model.norm.weight": zc_norm(h)}
    if not c.get("tie_word_embeddings"):
        s["lm_head.weight"] = linear(v, h)
    for i in range(n):
        s.update(_layer(i, c, moe=i >= first_moe))
    if mtp:
        for k in range(int(c.get("num_nextn_predict_layers") or 0)):
            i = n + k
            p = f"model.layers.{i}."
            s.update(_layer(i, c, moe=False))
            s.update({p + "eh_proj.weight": linear(h, 2 * h), p + "enorm.weight": zc_norm(h),
                      p + "hnorm.weight": zc_norm(h), p + "transformer.shared_head.norm.weight": zc_norm(h),
                      p + "transformer.shared_head.output.weight": linear(v, h)})
    return s


def mtp_keys(config: dict[str, Any]) -> list[str]:
    """The head's keys: every tensor of the layers at index ``num_hidden_layers`` and after."""
    n = config["num_hidden_layers"]
    return sorted(k for k in tensor_specs(config)
                  if k.startswith("model.layers.") and int(k.split(".")[2]) >= n)


def build_step3p5(out_dir: str | Path, *, seed: int = 0, n_shards: int = 2, **overrides: Any) -> Path:
    """Write the tiny Step-3.5 checkpoint into ``out_dir`` and return it. ``overrides`` are
    config.json keys (``num_nextn_predict_layers=3`` as the release ships)."""
    config = tiny_config(**overrides)
    return build_random_checkpoint(out_dir, config, tensor_specs(config), seed=seed, float32=FLOAT32,
                                   trained_vocab=TRAINED_VOCAB, eos="<|im_end|>", n_shards=n_shards)
