"""Qwen3-Next: a flat text config, the same MTP head as Qwen3.5 MoE under ``mtp.*`` at the top
level, and a release that ships the head without declaring it in the config."""

from __future__ import annotations

from .qwen3_5 import DIM_KEYS, EXPERT_ROWS, HEAD_ROWS, LAYER_ROWS, MOE_SHARED_ROWS, RAW_MARKERS, gated_query, is_raw_tensor
from .spec import QWEN3_NORM_ROLES, FamilySpec, mlx_lm_class, mlx_lm_model


QWEN3_NEXT = FamilySpec(
    name="qwen3_next",
    model_types=("qwen3_next",),
    text_model_types=(),
    moe=True,
    head_rows=HEAD_ROWS,
    layer_rows=LAYER_ROWS,
    mlp_rows=MOE_SHARED_ROWS,
    expert_rows=EXPERT_ROWS,
    norm_roles=QWEN3_NORM_ROLES,
    norm_offset=1.0,
    hf_head_prefix="mtp.",
    head_file_prefix="mtp.",
    mlx_head_prefixes=("mtp.",),
    count_keys=("num_nextn_predict_layers", "mtp_num_hidden_layers"),
    count_keys_written=("num_nextn_predict_layers",),
    ships_head_undeclared=True,
    nested_text_config=False,
    layouts=("sidecar", "vllm-mlx"),
    mlx_lm_classes=mlx_lm_model("qwen3_next"),
    lm_module_path=(),
    head_layer=mlx_lm_class("qwen3_next", "Qwen3NextDecoderLayer"),
    dim_keys=DIM_KEYS,
    derived_dims=gated_query,
    gguf_arch="qwen3next",
    example_repo="Qwen/Qwen3-Next-80B-A3B-Instruct",
    raw_marker_suffixes=RAW_MARKERS,
    is_raw_tensor=is_raw_tensor,
)
