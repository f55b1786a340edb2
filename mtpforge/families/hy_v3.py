"""Hy3 (``hy_v3``, llama.cpp ``hy_v3``): a NextN head, one MoE decoder layer appended at index
``num_hidden_layers`` (docs/families/hy_v3.md).

Its keys sit under ``model.layers.{N}.`` in the release (N = ``num_hidden_layers``), in the
release's own names, which llama.cpp's converter (``HYV3Model``) and MTPLX's vendored ``hy_v3`` model
read as stored: ``eh_proj`` [H, 2H], ``enorm``, ``hnorm``, the trailing ``final_layernorm`` (the
converter renames it ``nextn.shared_head_norm``), attention with q/k norms, the sigmoid router
``mlp.router.gate`` with its selection bias ``mlp.expert_bias``, experts one by one (192 in the
release) and the shared expert ``mlp.shared_mlp``. No embedding or output copy: the head shares
the trunk's. Norms are raw (``w · x̂``), copied as stored. mtpforge writes this head for llama.cpp
only so far (``layouts = ()``): no released tool converts Hy3 to MLX (mlx-lm, mlx-vlm and MTPLX's
own ``forge build`` all stop at "Model type hy_v3 not supported"), so there is no MLX target to put
a head into; MTPLX 2.12.2 serves the release folder itself, head included, and refuses a folder that
declares the head without its tensors (docs/families/hy_v3.md §6, measured).
"""

from __future__ import annotations

from .glm4_moe import EXPERT_ROWS
from .spec import FamilySpec, Role, Row, Topology, backbone_marker, mlx_lm_class, mlx_lm_model

HEAD_ROWS = (
    Row(Role.FC, "eh_proj.weight", ("H", "2H")),
    Row(Role.PRE_FC_NORM_EMBEDDING, "enorm.weight", ("H",)),
    Row(Role.PRE_FC_NORM_HIDDEN, "hnorm.weight", ("H",)),
    Row(Role.FINAL_NORM, "final_layernorm.weight", ("H",)),
)
LAYER_ROWS = (
    Row(Role.INPUT_NORM, "input_layernorm.weight", ("H",)),
    Row(Role.POST_ATTENTION_NORM, "post_attention_layernorm.weight", ("H",)),
    Row(Role.Q_PROJ, "self_attn.q_proj.weight", ("QD", "H")),
    Row(Role.K_PROJ, "self_attn.k_proj.weight", ("KD", "H")),
    Row(Role.V_PROJ, "self_attn.v_proj.weight", ("KD", "H")),
    Row(Role.O_PROJ, "self_attn.o_proj.weight", ("H", "QD")),
    Row(Role.Q_NORM, "self_attn.q_norm.weight", ("D",)),
    Row(Role.K_NORM, "self_attn.k_norm.weight", ("D",)),
)
MLP_ROWS = (
    Row(Role.ROUTER, "mlp.router.gate.weight", ("E", "H")),
    Row(Role.ROUTER_BIAS, "mlp.expert_bias", ("E",)),
    Row(Role.SHARED_GATE, "mlp.shared_mlp.gate_proj.weight", ("IS", "H")),
    Row(Role.SHARED_UP, "mlp.shared_mlp.up_proj.weight", ("IS", "H")),
    Row(Role.SHARED_DOWN, "mlp.shared_mlp.down_proj.weight", ("H", "IS")),
)
DIM_KEYS: dict[str, "str | tuple[str, ...]"] = {
    "H": "hidden_size", "NH": "num_attention_heads", "D": "head_dim", "KV": "num_key_value_heads",
    "I": "intermediate_size", "E": "num_experts", "IM": "moe_intermediate_size",
    "IS": ("num_shared_experts", "moe_intermediate_size"), "V": "vocab_size",
}

RAW_MARKERS = (".mlp.experts.0.up_proj.weight",)

HY_V3 = FamilySpec(
    name="hy_v3",
    model_types=("hy_v3",),
    text_model_types=(),
    moe=True,
    head_rows=HEAD_ROWS,
    layer_rows=LAYER_ROWS,
    mlp_rows=MLP_ROWS,
    # GLM-4.5's expert rows: per expert as released, ``mlp.switch_mlp`` stacked as MTPLX's vendored
    # hy_v3 model builds them
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
    # no MLX layout: the GGUF output formats only (docs/families/hy_v3.md says why)
    layouts=(),
    # no released mlx-lm has the model; MTPLX vendors one under this module name
    mlx_lm_classes=mlx_lm_model("hy_v3"),
    lm_module_path=(),
    head_layer=mlx_lm_class("hy_v3", "DecoderLayer"),
    dim_keys=DIM_KEYS,
    gguf_arch="hy_v3",
    # gguf-py 0.19 (the newest release) predates hy_v3; llama.cpp's own gguf-py lists for it the
    # post-attention norm as ffn_norm, as gguf-py 0.19's hunyuan-moe (Hy3's predecessor) does
    gguf_names_as="hunyuan-moe",
    # the converter maps the suffix-less ``mlp.expert_bias`` to a suffix-less name, which is
    # what llama.cpp's hy_v3 loader asks for (``tn(LLM_TENSOR_FFN_EXP_PROBS_B, i)``)
    gguf_names={Role.ROUTER_BIAS: "exp_probs_b"},
    example_repo="tencent/Hy3",
    # the one line add-mtp / repair-norms / verify end with on an MLX folder: what to run instead
    mlx_drafted_by="MTPLX 2.12.2 runs the HF release folder itself; no released tool converts Hy3 to MLX "
                   "(docs/families/hy_v3.md)",
    raw_marker_suffixes=RAW_MARKERS,
    # a per-expert backbone expert: the release stores them so, an MLX conversion stacks them
    is_raw_tensor=backbone_marker("model.layers.", RAW_MARKERS),
    # the converter adds nextn_predict_layers after the family's own keys
    gguf_nextn_before=("general.quantization_version",),
)
