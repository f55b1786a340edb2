"""Ling-3 (``bailing_moe_v3``, llama.cpp ``bailingmoe3``): a NextN head, one MLA + MoE layer
appended at index ``num_hidden_layers`` (docs/families/bailing_moe_v3.md).

The trunk is hybrid — Kimi delta attention (KDA) in most layers, MLA in the last of each
``layer_group_size`` group — and the MTP layer is always a full-attention one: its keys sit under
``model.layers.{N}.`` in the release's own names, which llama.cpp's converter
(``BailingMoeV3Model``) reads as stored: ``eh_proj`` [H, 2H], ``enorm``, ``hnorm``, the closing
``final_layernorm`` (llama.cpp's ``layer_output_norm``, not a ``shared_head`` norm), MLA attention
under ``attention.`` (``kv_b_proj`` split into ``attn_k_b`` / ``attn_v_b`` as for DeepSeek, a
head-wise output gate ``g_proj``, ``dense`` for the output projection), the sigmoid router
``mlp.gate`` with its ``expert_bias`` (``exp_probs_b.bias``), experts one by one and
``mlp.shared_experts``. No embedding or output copy: the head shares the trunk's. Norms are raw,
copied as stored. mtpforge writes this head for llama.cpp only (``layouts = ()``): mlx-lm 0.32.2
has the model and drops the layer, and no MLX runtime drafts it (docs/families/bailing_moe_v3.md).
"""

from __future__ import annotations

from .glm4_moe import EXPERT_ROWS
from .glm4_moe_lite import GGUF_DIM_KEYS as MLA_GGUF_DIM_KEYS, mla_dims
from .spec import FamilySpec, MlxBackbone, Role, Row, Topology, backbone_marker, mlx_lm_class, mlx_lm_model

HEAD_ROWS = (
    Row(Role.FC, "eh_proj.weight", ("H", "2H")),
    Row(Role.PRE_FC_NORM_EMBEDDING, "enorm.weight", ("H",)),
    Row(Role.PRE_FC_NORM_HIDDEN, "hnorm.weight", ("H",)),
    Row(Role.LAYER_OUT_NORM, "final_layernorm.weight", ("H",)),
)
LAYER_ROWS = (
    Row(Role.INPUT_NORM, "input_layernorm.weight", ("H",)),
    Row(Role.POST_ATTENTION_NORM, "post_attention_layernorm.weight", ("H",)),
    Row(Role.Q_A_PROJ, "attention.q_a_proj.weight", ("RQ", "H")),
    Row(Role.Q_A_NORM, "attention.q_a_layernorm.weight", ("RQ",)),
    Row(Role.Q_B_PROJ, "attention.q_b_proj.weight", ("QB", "RQ")),
    Row(Role.KV_A_PROJ, "attention.kv_a_proj_with_mqa.weight", ("KVA", "H")),
    Row(Role.KV_A_NORM, "attention.kv_a_layernorm.weight", ("RKV",)),
    Row(Role.KV_B_PROJ, "attention.kv_b_proj.weight", ("KVB", "RKV")),
    Row(Role.ATTN_GATE, "attention.g_proj.weight", ("NH", "H")),
    Row(Role.O_PROJ, "attention.dense.weight", ("H", "OV")),
)
MLP_ROWS = (
    Row(Role.ROUTER, "mlp.gate.weight", ("E", "H")),
    Row(Role.ROUTER_BIAS, "mlp.gate.expert_bias", ("E",)),
    Row(Role.SHARED_GATE, "mlp.shared_experts.gate_proj.weight", ("IS", "H")),
    Row(Role.SHARED_UP, "mlp.shared_experts.up_proj.weight", ("IS", "H")),
    Row(Role.SHARED_DOWN, "mlp.shared_experts.down_proj.weight", ("H", "IS")),
)
DIM_KEYS: dict[str, "str | tuple[str, ...]"] = {
    "H": "hidden_size", "NH": "num_attention_heads", "E": "num_experts", "IM": "moe_intermediate_size",
    "IS": "moe_shared_expert_intermediate_size", "V": "vocab_size", "RQ": "q_lora_rank", "RKV": "kv_lora_rank",
    "NOPE": "qk_nope_head_dim", "ROPE": "qk_rope_head_dim", "VD": "v_head_dim",
}
#: MLA as llama.cpp states it (families/glm4_moe_lite.py), and the shared expert's width
GGUF_DIM_KEYS: dict[str, "str | None"] = {**MLA_GGUF_DIM_KEYS, "IS": "expert_shared_feed_forward_length"}

RAW_MARKERS = (".mlp.experts.0.up_proj.weight", ".attention.kv_b_proj.weight")

BAILING_MOE_V3 = FamilySpec(
    name="bailing_moe_v3",
    model_types=("bailing_moe_v3",),
    text_model_types=(),
    moe=True,
    head_rows=HEAD_ROWS,
    layer_rows=LAYER_ROWS,
    mlp_rows=MLP_ROWS,
    # GLM-4.5's expert rows: per expert as released, ``mlp.switch_mlp`` stacked as mlx-lm's
    # bailing_moe_v3 sanitize builds them
    expert_rows=EXPERT_ROWS,
    norm_roles=frozenset(),
    norm_offset=0.0,
    hf_head_prefix="model.layers.{N}.",
    topology=Topology(index_key="num_hidden_layers"),
    head_file_prefix="model.layers.{N}.",
    mlx_head_prefixes=(),
    count_keys=("num_nextn_predict_layers",),
    count_keys_written=("num_nextn_predict_layers",),
    ships_head_undeclared=False,
    nested_text_config=False,
    # no MLX layout: the GGUF output formats only (docs/families/bailing_moe_v3.md says why)
    layouts=(),
    mlx_lm_classes=mlx_lm_model("bailing_moe_v3"),
    lm_module_path=(),
    head_layer=mlx_lm_class("bailing_moe_v3", "BailingDecoderLayer"),
    # mlx-lm's model keeps the embedding as the release names it
    mlx_backbone=MlxBackbone(embed="word_embeddings"),
    dim_keys=DIM_KEYS,
    gguf_arch="bailingmoe3",
    # gguf-py 0.19 (the newest release) predates bailingmoe3; its DeepSeek-2 list spells the
    # post-attention norm ``ffn_norm`` as llama.cpp's bailingmoe3 list does
    gguf_names_as="deepseek2",
    example_repo="inclusionAI/Ling-3.0-flash",
    mlx_drafted_by="mlx-lm 0.32.2 drops Ling-3's MTP layer and no MLX runtime drafts it (docs/families/bailing_moe_v3.md)",
    raw_marker_suffixes=RAW_MARKERS,
    # a per-expert backbone expert or an unsplit kv_b_proj: what an MLX conversion changes
    is_raw_tensor=backbone_marker("model.layers.", RAW_MARKERS),
    derived_dims=mla_dims,
    gguf_dim_keys=GGUF_DIM_KEYS,
    # the MTP layer is an MLA layer: one KV head in the per-layer array (KDA layers have 0)
    gguf_layer_arrays={"attention.head_count_kv": 1},
    # the converter adds nextn_predict_layers after the family's own keys
    gguf_nextn_before=("general.quantization_version",),
)
