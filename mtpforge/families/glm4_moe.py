"""GLM-4.5 / 4.6 / 4.7 (``glm4_moe``): a NextN head, one more decoder layer appended at index
``num_hidden_layers`` (docs/families/glm4_moe.md).

Its keys sit under ``model.layers.{N}.`` in the release and in the sidecar MTPLX's ``glm_mtp``
backend reads (the source's own names); the layer is the trunk's MoE layer (attention with
biases when ``attention_bias``, sigmoid router with its score-correction bias, per-expert
experts, shared experts) plus the NextN tensors. Its norms are raw: GLM's RMSNorm multiplies by
the weight as stored, and llama.cpp's converter copies the bytes (measured), so no offset.
GLM-4.5 ships its own ``shared_head.head`` and ``embed_tokens``; GLM-4.6 leaves them out.
"""

from __future__ import annotations

from .spec import FamilySpec, Role, Row, Topology, backbone_marker, mlx_lm_class, mlx_lm_model

#: the NextN layer's own tensors (one MTP layer: no ``{i}``, the layer index is in the prefix)
HEAD_ROWS = (
    Row(Role.FC, "eh_proj.weight", ("H", "2H")),
    Row(Role.PRE_FC_NORM_EMBEDDING, "enorm.weight", ("H",)),
    Row(Role.PRE_FC_NORM_HIDDEN, "hnorm.weight", ("H",)),
    Row(Role.FINAL_NORM, "shared_head.norm.weight", ("H",)),
    Row(Role.SHARED_HEAD, "shared_head.head.weight", ("V", "H"), optional=True),
    Row(Role.EMBED_TOKENS, "embed_tokens.weight", ("V", "H"), optional=True),
)
LAYER_ROWS = (
    Row(Role.INPUT_NORM, "input_layernorm.weight", ("H",)),
    Row(Role.POST_ATTENTION_NORM, "post_attention_layernorm.weight", ("H",)),
    Row(Role.Q_PROJ, "self_attn.q_proj.weight", ("QD", "H")),
    Row(Role.K_PROJ, "self_attn.k_proj.weight", ("KD", "H")),
    Row(Role.V_PROJ, "self_attn.v_proj.weight", ("KD", "H")),
    Row(Role.O_PROJ, "self_attn.o_proj.weight", ("H", "QD")),
    Row(Role.Q_BIAS, "self_attn.q_proj.bias", ("QD",), when="attention_bias"),
    Row(Role.K_BIAS, "self_attn.k_proj.bias", ("KD",), when="attention_bias"),
    Row(Role.V_BIAS, "self_attn.v_proj.bias", ("KD",), when="attention_bias"),
    Row(Role.Q_NORM, "self_attn.q_norm.weight", ("D",), when="use_qk_norm"),
    Row(Role.K_NORM, "self_attn.k_norm.weight", ("D",), when="use_qk_norm"),
)
MLP_ROWS = (
    Row(Role.ROUTER, "mlp.gate.weight", ("E", "H")),
    Row(Role.ROUTER_BIAS, "mlp.gate.e_score_correction_bias", ("E",)),
    Row(Role.SHARED_GATE, "mlp.shared_experts.gate_proj.weight", ("IS", "H")),
    Row(Role.SHARED_UP, "mlp.shared_experts.up_proj.weight", ("IS", "H")),
    Row(Role.SHARED_DOWN, "mlp.shared_experts.down_proj.weight", ("H", "IS")),
)
EXPERT_ROWS = {
    "per-expert": (
        Row(Role.EXPERT_GATE, "mlp.experts.{e}.gate_proj.weight", ("IM", "H")),
        Row(Role.EXPERT_UP, "mlp.experts.{e}.up_proj.weight", ("IM", "H")),
        Row(Role.EXPERT_DOWN, "mlp.experts.{e}.down_proj.weight", ("H", "IM")),
    ),
    "switch_mlp": (
        Row(Role.EXPERT_GATE, "mlp.switch_mlp.gate_proj.weight", ("E", "IM", "H")),
        Row(Role.EXPERT_UP, "mlp.switch_mlp.up_proj.weight", ("E", "IM", "H")),
        Row(Role.EXPERT_DOWN, "mlp.switch_mlp.down_proj.weight", ("E", "H", "IM")),
    ),
}
DIM_KEYS: dict[str, "str | tuple[str, ...]"] = {
    "H": "hidden_size", "NH": "num_attention_heads", "D": "head_dim", "KV": "num_key_value_heads",
    "I": "intermediate_size", "E": "n_routed_experts", "IM": "moe_intermediate_size",
    "IS": ("n_shared_experts", "moe_intermediate_size"), "V": "vocab_size",
}


RAW_MARKERS = (".mlp.experts.0.up_proj.weight",)

GLM4_MOE = FamilySpec(
    mlx_float_roles=frozenset({Role.ROUTER}),
    name="glm4_moe",
    model_types=("glm4_moe",),
    text_model_types=(),
    moe=True,
    head_rows=HEAD_ROWS,
    layer_rows=LAYER_ROWS,
    mlp_rows=MLP_ROWS,
    expert_rows=EXPERT_ROWS,
    norm_roles=frozenset(),
    norm_offset=0.0,
    hf_head_prefix="model.layers.{N}.",
    topology=Topology(index_key="num_hidden_layers"),
    # MTPLX's glm_mtp reads the sidecar in the source's own names
    head_file_prefix="model.layers.{N}.",
    mlx_head_prefixes=("model.layers.{N}.",),
    count_keys=("num_nextn_predict_layers",),
    count_keys_written=("num_nextn_predict_layers",),
    ships_head_undeclared=False,
    nested_text_config=False,
    # the sidecar in the form MTPLX's glm_mtp backend loads (docs/families/glm4_moe.md)
    layouts=("sidecar",),
    mlx_lm_classes=mlx_lm_model("glm4_moe"),
    lm_module_path=(),
    head_layer=mlx_lm_class("glm4_moe", "DecoderLayer"),
    dim_keys=DIM_KEYS,
    gguf_arch="glm4moe",
    example_repo="zai-org/GLM-4.5-Air",
    unread_in_mlx=frozenset({Role.EMBED_TOKENS}),
    raw_marker_suffixes=RAW_MARKERS,
    # a per-expert backbone expert: the release stores them so, mlx-lm stacks them
    is_raw_tensor=backbone_marker("model.layers.", RAW_MARKERS),
)
