"""Step-3.5 (``step3p5``, llama.cpp ``step35``): MTP layers appended at ``model.layers.{N+j}``,
each a dense sliding-window Step-3.5 decoder layer plus the NextN tensors and its own shared head
(docs/families/step3p5.md).

Each MTP step is one appended layer (``Topology.appended_steps``): the release declares three
(``num_nextn_predict_layers``), llama.cpp's converter writes them as ``blk.{N+i}``, and so does
mtpforge. The layer's attention is the sliding-window kind: its head counts are
``attention_other_setting``'s, which is also what the converter appends to the per-layer arrays
(measured), with ``sliding_window_pattern`` ``True`` and SwiGLU clamps ``0.0`` (MTP layers are not
clamped). Its query heads carry the head-wise gate ``g_proj`` [heads, H]. Every norm is stored
zero-centred (``(1 + w) · x̂``): llama.cpp's converter adds 1 to all seven (measured, bitwise).

In MLX folders the head is the sidecar MTPLX's ``step3p5_mtp`` backend reads: the source's own
``model.layers.{N+i}.*`` names (``Placement.first_step`` spells step ``i`` at ``N + i``), unquantized
(its loader builds float linears and checks their names strictly before it would quantize), the
norms +1 as mlx-lm's ``ZeroCenteredRMSNorm`` multiplies them (its ``step3p5.sanitize`` adds the 1
to a raw release). MTPLX also adds 1 to any stored norm whose mean is below 0.5.
"""

from __future__ import annotations

from .spec import QWEN3_NORM_ROLES, FamilySpec, Role, Row, Topology, backbone_marker, mlx_lm_class, mlx_lm_model

#: each appended layer carries its own NextN tensors and shared head (``transformer.`` is the
#: release's infix), so every row is per MTP step (``{i}``: the layer ``N + i``)
NEXTN_ROWS = (
    Row(Role.FC, "{i}.eh_proj.weight", ("H", "2H")),
    Row(Role.PRE_FC_NORM_EMBEDDING, "{i}.enorm.weight", ("H",)),
    Row(Role.PRE_FC_NORM_HIDDEN, "{i}.hnorm.weight", ("H",)),
    Row(Role.FINAL_NORM, "{i}.transformer.shared_head.norm.weight", ("H",)),
    Row(Role.SHARED_HEAD, "{i}.transformer.shared_head.output.weight", ("V", "H")),
)
#: sliding-window attention with q/k norms and the head-wise gate
LAYER_ROWS = (
    *NEXTN_ROWS,
    Row(Role.INPUT_NORM, "{i}.input_layernorm.weight", ("H",)),
    Row(Role.POST_ATTENTION_NORM, "{i}.post_attention_layernorm.weight", ("H",)),
    Row(Role.Q_PROJ, "{i}.self_attn.q_proj.weight", ("QD", "H")),
    Row(Role.K_PROJ, "{i}.self_attn.k_proj.weight", ("KD", "H")),
    Row(Role.V_PROJ, "{i}.self_attn.v_proj.weight", ("KD", "H")),
    Row(Role.O_PROJ, "{i}.self_attn.o_proj.weight", ("H", "QD")),
    Row(Role.Q_NORM, "{i}.self_attn.q_norm.weight", ("D",)),
    Row(Role.K_NORM, "{i}.self_attn.k_norm.weight", ("D",)),
    Row(Role.ATTN_GATE, "{i}.self_attn.g_proj.weight", ("NH", "H")),
)
#: the MTP layer's MLP is dense (SwiGLU)
MLP_ROWS = (
    Row(Role.MLP_GATE, "{i}.mlp.gate_proj.weight", ("I", "H")),
    Row(Role.MLP_UP, "{i}.mlp.up_proj.weight", ("I", "H")),
    Row(Role.MLP_DOWN, "{i}.mlp.down_proj.weight", ("H", "I")),
)
#: the MTP layer's attention is the sliding-window kind, so its heads are those counts; the
#: trunk's MoE sizes are no row's (the MTP layers are dense), so they are not read
DIM_KEYS: dict[str, "str | tuple[str, ...]"] = {
    "H": "hidden_size", "NH": "attention_other_setting.num_attention_heads", "D": "head_dim",
    "KV": "attention_other_setting.num_attention_groups", "I": "intermediate_size", "V": "vocab_size",
}
#: the trunk states its head counts per layer (full and sliding-window layers differ; the
#: sliding-window ones are the larger, and an array reads as its largest entry); no expert
#: count or width is a row's
GGUF_DIM_KEYS: dict[str, "str | None"] = {"E": None, "IM": None}
#: the converter extends these per-layer arrays by the MTP layer's entry (measured)
GGUF_LAYER_ARRAYS: dict[str, "str | bool | float"] = {
    "attention.head_count": "NH", "attention.head_count_kv": "KV", "attention.sliding_window_pattern": True,
    "swiglu_clamp_exp": 0.0, "swiglu_clamp_shexp": 0.0,
}


RAW_MARKERS = (".moe.up_proj.weight",)

STEP3P5 = FamilySpec(
    name="step3p5",
    model_types=("step3p5",),
    text_model_types=(),
    # the MTP layer is dense (the trunk's MoE has no rows here)
    moe=False,
    head_rows=(),
    layer_rows=LAYER_ROWS,
    mlp_rows=MLP_ROWS,
    expert_rows={},
    norm_roles=QWEN3_NORM_ROLES,
    norm_offset=1.0,
    hf_head_prefix="model.layers.{N}.",
    topology=Topology(index_key="num_hidden_layers", appended_steps=True),
    head_file_prefix="model.layers.{N}.",
    # MTPLX's step3p5_mtp reads the sidecar in the source's own names
    mlx_head_prefixes=("model.layers.{N}.",),
    count_keys=("num_nextn_predict_layers",),
    count_keys_written=("num_nextn_predict_layers",),
    ships_head_undeclared=False,
    nested_text_config=False,
    # the sidecar in the form MTPLX's step3p5_mtp backend loads (docs/families/step3p5.md §6)
    layouts=("sidecar",),
    mlx_lm_classes=mlx_lm_model("step3p5"),
    lm_module_path=(),
    head_layer=mlx_lm_class("step3p5", "Step3p5DecoderLayer"),
    dim_keys=DIM_KEYS,
    gguf_arch="step35",
    example_repo="stepfun-ai/Step-3.5-Flash",
    raw_marker_suffixes=RAW_MARKERS,
    # a backbone MoE tensor under the release's moe. name (mlx-lm's sanitize renames the stacked experts to mlp.switch_mlp.)
    is_raw_tensor=backbone_marker("model.layers.", RAW_MARKERS),
    gguf_dim_keys=GGUF_DIM_KEYS,
    gguf_layer_arrays=GGUF_LAYER_ARRAYS,
    # the converter adds nextn_predict_layers after the family's own keys
    gguf_nextn_before=("general.quantization_version",),
)
