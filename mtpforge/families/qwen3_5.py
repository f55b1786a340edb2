"""Qwen3.5 / Qwen3.6 (dense and MoE): a vision-language release whose text model sits under
``text_config``; mlx-lm keys the language model ``language_model.*``."""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from .spec import QWEN3_NORM_ROLES, FamilySpec, Role, Row, mlx_lm_class, mlx_lm_model

HEAD_ROWS = (
    Row(Role.FC, "fc.weight", ("H", "2H")),
    Row(Role.PRE_FC_NORM_EMBEDDING, "pre_fc_norm_embedding.weight", ("H",)),
    Row(Role.PRE_FC_NORM_HIDDEN, "pre_fc_norm_hidden.weight", ("H",)),
    Row(Role.FINAL_NORM, "norm.weight", ("H",)),
)
LAYER_ROWS = (
    Row(Role.INPUT_NORM, "layers.{i}.input_layernorm.weight", ("H",)),
    Row(Role.POST_ATTENTION_NORM, "layers.{i}.post_attention_layernorm.weight", ("H",)),
    Row(Role.Q_PROJ, "layers.{i}.self_attn.q_proj.weight", ("2QD", "H")),
    Row(Role.K_PROJ, "layers.{i}.self_attn.k_proj.weight", ("KD", "H")),
    Row(Role.V_PROJ, "layers.{i}.self_attn.v_proj.weight", ("KD", "H")),
    Row(Role.O_PROJ, "layers.{i}.self_attn.o_proj.weight", ("H", "QD")),
    Row(Role.Q_NORM, "layers.{i}.self_attn.q_norm.weight", ("D",)),
    Row(Role.K_NORM, "layers.{i}.self_attn.k_norm.weight", ("D",)),
)
DENSE_MLP_ROWS = (
    Row(Role.MLP_GATE, "layers.{i}.mlp.gate_proj.weight", ("I", "H")),
    Row(Role.MLP_UP, "layers.{i}.mlp.up_proj.weight", ("I", "H")),
    Row(Role.MLP_DOWN, "layers.{i}.mlp.down_proj.weight", ("H", "I")),
)
MOE_SHARED_ROWS = (
    Row(Role.ROUTER, "layers.{i}.mlp.gate.weight", ("E", "H")),
    Row(Role.SHARED_GATE, "layers.{i}.mlp.shared_expert.gate_proj.weight", ("IS", "H")),
    Row(Role.SHARED_UP, "layers.{i}.mlp.shared_expert.up_proj.weight", ("IS", "H")),
    Row(Role.SHARED_DOWN, "layers.{i}.mlp.shared_expert.down_proj.weight", ("H", "IS")),
    Row(Role.SHARED_EXPERT_GATE, "layers.{i}.mlp.shared_expert_gate.weight", ("1", "H")),
)
EXPERT_ROWS = {
    "per-expert": (
        Row(Role.EXPERT_GATE, "layers.{i}.mlp.experts.{e}.gate_proj.weight", ("IM", "H")),
        Row(Role.EXPERT_UP, "layers.{i}.mlp.experts.{e}.up_proj.weight", ("IM", "H")),
        Row(Role.EXPERT_DOWN, "layers.{i}.mlp.experts.{e}.down_proj.weight", ("H", "IM")),
    ),
    # Fused tensors carry no ".weight" suffix in the source (docs/SPEC.md §2).
    "fused": (
        Row(Role.EXPERTS_GATE_UP, "layers.{i}.mlp.experts.gate_up_proj", ("E", "2IM", "H")),
        Row(Role.EXPERTS_DOWN, "layers.{i}.mlp.experts.down_proj", ("E", "H", "IM")),
    ),
    "switch_mlp": (
        Row(Role.EXPERT_GATE, "layers.{i}.mlp.switch_mlp.gate_proj.weight", ("E", "IM", "H")),
        Row(Role.EXPERT_UP, "layers.{i}.mlp.switch_mlp.up_proj.weight", ("E", "IM", "H")),
        Row(Role.EXPERT_DOWN, "layers.{i}.mlp.switch_mlp.down_proj.weight", ("E", "H", "IM")),
    ),
}
#: config dimension -> text-config key; the rest (2H, QD, ...) are derived in ``tables.dims``,
#: the gated query's width by ``gated_query``
DIM_KEYS = {
    "H": "hidden_size", "NH": "num_attention_heads", "D": "head_dim", "KV": "num_key_value_heads",
    "I": "intermediate_size", "E": "num_experts", "IM": "moe_intermediate_size",
    "IS": "shared_expert_intermediate_size", "V": "vocab_size",
}

#: a raw Qwen3.5/3.6/Next release: the linear-attention conv1d unsanitized [C, 1, K], or (Qwen3-Next,
#: whose converted experts are stacked) a per-expert backbone expert
RAW_MARKERS = ("conv1d.weight", ".mlp.experts.0.up_proj.weight")


def gated_query(d: Mapping[str, int]) -> dict[str, int]:
    """Qwen's attention output gate: ``q_proj`` holds the queries and their gates, 2·NH·D rows."""
    return {"2QD": 2 * d["QD"]}


def is_raw_tensor(key: str, shape: tuple[int, ...]) -> bool:
    """How mlx-lm tells a raw Qwen checkpoint (docs/SPEC.md §2: the backbone in source layout)."""
    if key.endswith(RAW_MARKERS[0]):
        return len(shape) == 3 and shape[-1] != 1
    return key.startswith("model.layers.") and key.endswith(RAW_MARKERS[1])


QWEN3_5 = FamilySpec(
    name="qwen3_5",
    model_types=("qwen3_5", "qwen3_5_moe", "qwen3_5_mtp"),
    text_model_types=("qwen3_5_text", "qwen3_5_moe_text"),
    moe=False,
    head_rows=HEAD_ROWS,
    layer_rows=LAYER_ROWS,
    mlp_rows=DENSE_MLP_ROWS,
    expert_rows={},
    norm_roles=QWEN3_NORM_ROLES,
    norm_offset=1.0,
    hf_head_prefix="mtp.",
    head_file_prefix="mtp.",
    mlx_head_prefixes=("language_model.mtp.", "model.language_model.mtp."),
    count_keys=("mtp_num_hidden_layers",),
    count_keys_written=("mtp_num_hidden_layers",),
    ships_head_undeclared=False,
    nested_text_config=True,
    layouts=("embedded", "sidecar", "vllm-mlx", "mlx-vlm-drafter"),
    mlx_vlm_drafter_type="qwen3_5_mtp",
    mlx_lm_classes=mlx_lm_model("qwen3_5"),
    lm_module_path=("language_model",),
    head_layer=mlx_lm_class("qwen3_5", "DecoderLayer"),
    dim_keys=DIM_KEYS,
    derived_dims=gated_query,
    gguf_arch="qwen35",
    raw_marker_suffixes=RAW_MARKERS,
    is_raw_tensor=is_raw_tensor,
)

QWEN3_5_MOE = replace(
    QWEN3_5, name="qwen3_5_moe", moe=True, mlp_rows=MOE_SHARED_ROWS, expert_rows=EXPERT_ROWS,
    mlx_lm_classes=mlx_lm_model("qwen3_5_moe"), gguf_arch="qwen35moe", example_repo="Qwen/Qwen3.5-35B-A3B",
)
