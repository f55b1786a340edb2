"""GLM-4.7-Flash (``glm4_moe_lite``): a NextN head like GLM-4.5's, over multi-head latent
attention (docs/families/glm4_moe_lite.md).

Its keys sit under ``model.layers.{N}.`` (N = ``num_hidden_layers``): GLM-4.5's NextN tensors
and MoE (sigmoid router with its score-correction bias, per-expert experts, one shared expert),
but DeepSeek-style MLA attention: a low-rank query (``q_a_proj`` -> ``q_a_layernorm`` ->
``q_b_proj``), a compressed key/value (``kv_a_proj_with_mqa`` -> ``kv_a_layernorm`` ->
``kv_b_proj``) and ``o_proj``. llama.cpp's converter writes it as ``deepseek2`` and splits
``kv_b_proj`` into ``attn_k_b`` / ``attn_v_b`` (passes/mla.py). In an MLX folder the head is
GLM-4.5's sidecar for MTPLX's ``glm_mtp``, ``kv_b_proj`` kept whole: MTPLX splits it into mlx-lm's
``embed_q`` / ``unembed_out`` on load, and so does the bundled decoder (``mlx_layer_parts``).
Norms are raw, copied as stored (measured). The release's ``q_lora_rank`` is set; the ``q_proj`` variant
(``q_lora_rank: null``) is not described: llama.cpp refuses such a trunk (measured).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from .glm4_moe import GLM4_MOE
from .spec import Role, Row, backbone_marker, mlx_lm_class, mlx_lm_model

LAYER_ROWS = (
    Row(Role.INPUT_NORM, "input_layernorm.weight", ("H",)),
    Row(Role.POST_ATTENTION_NORM, "post_attention_layernorm.weight", ("H",)),
    Row(Role.Q_A_PROJ, "self_attn.q_a_proj.weight", ("RQ", "H")),
    Row(Role.Q_A_NORM, "self_attn.q_a_layernorm.weight", ("RQ",)),
    Row(Role.Q_B_PROJ, "self_attn.q_b_proj.weight", ("QB", "RQ")),
    Row(Role.KV_A_PROJ, "self_attn.kv_a_proj_with_mqa.weight", ("KVA", "H")),
    Row(Role.KV_A_NORM, "self_attn.kv_a_layernorm.weight", ("RKV",)),
    Row(Role.KV_B_PROJ, "self_attn.kv_b_proj.weight", ("KVB", "RKV")),
    Row(Role.O_PROJ, "self_attn.o_proj.weight", ("H", "OV")),
)
DIM_KEYS: dict[str, "str | tuple[str, ...]"] = {
    "H": "hidden_size", "NH": "num_attention_heads", "KV": "num_key_value_heads",
    "E": "n_routed_experts", "IM": "moe_intermediate_size", "IS": ("n_shared_experts", "moe_intermediate_size"),
    "V": "vocab_size", "RQ": "q_lora_rank", "RKV": "kv_lora_rank", "NOPE": "qk_nope_head_dim",
    "ROPE": "qk_rope_head_dim", "VD": "v_head_dim",
}
#: llama.cpp writes MLA as MQA (``head_count_kv`` 1, ``key_length`` r_kv + d_rope): those two
#: state no config dimension; the MLA widths have their own keys (measured, docs/families/)
GGUF_DIM_KEYS: dict[str, "str | None"] = {
    "KV": None, "D": None, "RQ": "attention.q_lora_rank", "RKV": "attention.kv_lora_rank",
    "ROPE": "rope.dimension_count", "QKD": "attention.key_length_mla", "VD": "attention.value_length_mla",
}


def mla_dims(d: Mapping[str, int]) -> dict[str, int]:
    """MLA's composite widths from the base ones. A config states d_nope, a GGUF d_nope + d_rope
    (``key_length_mla``): each side gets the other's."""
    rope, nh, vd = d["ROPE"], d["NH"], d["VD"]
    nope = d["NOPE"] if "NOPE" in d else d["QKD"] - rope
    return {"NOPE": nope, "QKD": nope + rope, "QB": nh * (nope + rope), "KVA": d["RKV"] + rope,
            "KVB": nh * (nope + vd), "OV": nh * vd}


RAW_MARKERS = (".mlp.experts.0.up_proj.weight", ".self_attn.kv_b_proj.weight")
#: the absorbed MLA matrices mlx-lm's ``Glm4MoeLiteAttention`` holds instead of ``kv_b_proj``
#: (its sanitize, and MTPLX's glm_mtp on load, split the stored matrix into them): the decoder
#: layer's module paths of llama.cpp's ``attn_k_b`` / ``attn_v_b`` parts (passes/mla.py)
MLX_LAYER_PARTS = {Role.K_B: "self_attn.embed_q", Role.V_B: "self_attn.unembed_out"}

#: GLM-4.5's spec with MLA attention: the same NextN prefix, counts, raw norms and MoE rows
GLM4_MOE_LITE = replace(
    GLM4_MOE,
    name="glm4_moe_lite",
    model_types=("glm4_moe_lite",),
    layer_rows=LAYER_ROWS,
    # the sidecar MTPLX's glm_mtp reads, in the source's own names as for GLM-4.5: it splits
    # ``kv_b_proj`` itself on load, as mlx-lm's sanitize does (docs/families/glm4_moe_lite.md)
    mlx_layer_parts=MLX_LAYER_PARTS,
    mask_as_array=True,
    mlx_lm_classes=mlx_lm_model("glm4_moe_lite"),
    head_layer=mlx_lm_class("glm4_moe_lite", "Glm4MoeLiteDecoderLayer"),
    dim_keys=DIM_KEYS,
    gguf_arch="deepseek2",
    example_repo="zai-org/GLM-4.7-Flash",
    raw_marker_suffixes=RAW_MARKERS,
    # a per-expert backbone expert or an unsplit kv_b_proj: mlx-lm stacks / splits them
    is_raw_tensor=backbone_marker("model.layers.", RAW_MARKERS),
    derived_dims=mla_dims,
    gguf_dim_keys=GGUF_DIM_KEYS,
)
