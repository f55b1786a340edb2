"""DeepSeek-V4 (``deepseek_v4``, llama.cpp ``deepseek4``): a NextN head in the release's own
namespace, ``mtp.{i}.`` (docs/families/deepseek_v4.md).

The release does not use Hugging Face's ``model.layers.*`` names, and neither do these rows:
each MTP step is a whole decoder layer — manifold-constrained hyper-connections around the
attention and the MLP (``hc_attn_*``, ``hc_ffn_*``), attention with a low-rank query, one
key/value projection shared by every head (``wkv``), per-head sinks and a grouped output
projection (``wo_a`` per head group, then ``wo_b``), a sqrt-softplus-routed MoE with its
selection bias and one shared expert — plus the NextN projection stored as two halves
(``e_proj`` for the embedding, ``h_proj`` for the hidden state; llama.cpp's converter lays them
side by side as ``nextn.eh_proj``), their norms, the head's own ``norm`` and its own output
hyper-connection ``hc_head_*``, which the converter writes as the MTP file's ``output_hc_*``.
The MTP layer does not compress its cache (``compress_ratios``' last entry is 0 in the release),
so it has no compressor or indexer. Norms are raw, copied as stored.

The converter keeps its own types whatever ``--outtype`` says: block-FP8 matrices (E4M3 with an
E8M0 exponent per 128x128 block in ``<module>.scale``) dequantized to Q8_0, bf16 matrices BF16,
F32 tensors F32, the FP4 routed experts repacked to MXFP4 bit for bit, ``eh_proj`` Q8_0
(``gguf_type_of``); so a head mtpforge writes is the converter's at every ``--precision``.
mtpforge writes this head for llama.cpp only (``layouts = ()``): no installed MLX runtime both makes a
head-less DeepSeek-V4 target and drafts from a separate form (mlx-vlm 0.7.10's convert fails on the
release's FP8/FP4 spelling; MTPLX binds ``mtp.{i}.*`` from the checkpoint's own shards), so there is
no MLX form to write yet; mlx-vlm's own splitter builds its drafter from the release.
"""

from __future__ import annotations

from typing import Mapping

from .spec import FamilySpec, Role, Row, Topology, backbone_marker, mlx_lm_class, mlx_lm_model

#: the head's own tensors, per MTP step (bare keys under ``mtp.``)
HEAD_ROWS = (
    Row(Role.E_PROJ, "{i}.e_proj.weight", ("H", "H")),
    Row(Role.H_PROJ, "{i}.h_proj.weight", ("H", "H")),
    Row(Role.PRE_FC_NORM_EMBEDDING, "{i}.enorm.weight", ("H",)),
    Row(Role.PRE_FC_NORM_HIDDEN, "{i}.hnorm.weight", ("H",)),
    Row(Role.FINAL_NORM, "{i}.norm.weight", ("H",)),
    Row(Role.HC_HEAD_FN, "{i}.hc_head_fn", ("HC", "HCH")),
    Row(Role.HC_HEAD_BASE, "{i}.hc_head_base", ("HC",)),
    Row(Role.HC_HEAD_SCALE, "{i}.hc_head_scale", ("1",)),
)
LAYER_ROWS = (
    Row(Role.INPUT_NORM, "{i}.attn_norm.weight", ("H",)),
    Row(Role.POST_ATTENTION_NORM, "{i}.ffn_norm.weight", ("H",)),
    Row(Role.ATTN_SINKS, "{i}.attn.attn_sink", ("NH",)),
    Row(Role.Q_A_PROJ, "{i}.attn.wq_a.weight", ("RQ", "H")),
    Row(Role.Q_A_NORM, "{i}.attn.q_norm.weight", ("RQ",)),
    Row(Role.Q_B_PROJ, "{i}.attn.wq_b.weight", ("QD", "RQ")),
    Row(Role.KV_PROJ, "{i}.attn.wkv.weight", ("D", "H")),
    Row(Role.KV_A_NORM, "{i}.attn.kv_norm.weight", ("D",)),
    Row(Role.O_A_PROJ, "{i}.attn.wo_a.weight", ("OGR", "QDG")),
    Row(Role.O_B_PROJ, "{i}.attn.wo_b.weight", ("H", "OGR")),
    Row(Role.HC_ATTN_FN, "{i}.hc_attn_fn", ("MIX", "HCH")),
    Row(Role.HC_ATTN_BASE, "{i}.hc_attn_base", ("MIX",)),
    Row(Role.HC_ATTN_SCALE, "{i}.hc_attn_scale", ("3",)),
    Row(Role.HC_FFN_FN, "{i}.hc_ffn_fn", ("MIX", "HCH")),
    Row(Role.HC_FFN_BASE, "{i}.hc_ffn_base", ("MIX",)),
    Row(Role.HC_FFN_SCALE, "{i}.hc_ffn_scale", ("3",)),
)
MLP_ROWS = (
    Row(Role.ROUTER, "{i}.ffn.gate.weight", ("E", "H")),
    Row(Role.ROUTER_BIAS, "{i}.ffn.gate.bias", ("E",)),
    Row(Role.SHARED_GATE, "{i}.ffn.shared_experts.w1.weight", ("IS", "H")),
    Row(Role.SHARED_UP, "{i}.ffn.shared_experts.w3.weight", ("IS", "H")),
    Row(Role.SHARED_DOWN, "{i}.ffn.shared_experts.w2.weight", ("H", "IS")),
)
#: the routed experts one by one, FP4 two values a byte (``HP`` / ``IMP``: half the row's values)
EXPERT_ROWS = {
    "per-expert": (
        Row(Role.EXPERT_GATE, "{i}.ffn.experts.{e}.w1.weight", ("IM", "HP")),
        Row(Role.EXPERT_UP, "{i}.ffn.experts.{e}.w3.weight", ("IM", "HP")),
        Row(Role.EXPERT_DOWN, "{i}.ffn.experts.{e}.w2.weight", ("H", "IMP")),
    ),
    # the stacked form (what the plan builds; llama.cpp's ``ffn_*_exps``, in values)
    "switch_mlp": (
        Row(Role.EXPERT_GATE, "{i}.ffn.switch_mlp.gate_proj.weight", ("E", "IM", "H")),
        Row(Role.EXPERT_UP, "{i}.ffn.switch_mlp.up_proj.weight", ("E", "IM", "H")),
        Row(Role.EXPERT_DOWN, "{i}.ffn.switch_mlp.down_proj.weight", ("E", "H", "IM")),
    ),
}
DIM_KEYS: dict[str, "str | tuple[str, ...]"] = {
    "H": "hidden_size", "NH": "num_attention_heads", "D": "head_dim", "KV": "num_key_value_heads",
    "E": "n_routed_experts", "IM": "moe_intermediate_size", "IS": ("n_shared_experts", "moe_intermediate_size"),
    "V": "vocab_size", "RQ": "q_lora_rank", "HC": "hc_mult", "OG": "o_groups", "OR": "o_lora_rank",
    "SWL": "swiglu_limit",
}
#: what the converter states of them (``DeepseekV4Model.set_gguf_parameters``); no dense MLP width
GGUF_DIM_KEYS: dict[str, "str | None"] = {
    "I": None, "RQ": "attention.q_lora_rank", "HC": "hyper_connection.count",
    "OG": "attention.output_group_count", "OR": "attention.output_lora_rank",
}


def v4_dims(d: Mapping[str, int]) -> dict[str, int]:
    """The widths built from the others: the hyper-connection stream (``HC`` copies of the hidden
    state) and its mixing rows ((2 + HC) x HC), the grouped output projection's, FP4 halves."""
    hc, og = d.get("HC", 0), d.get("OG", 0) or 1
    return {"HCH": hc * d["H"], "MIX": (2 + hc) * hc, "OGR": og * d.get("OR", 0), "QDG": d["NH"] * d["D"] // og,
            "HP": d["H"] // 2, "IMP": d["IM"] // 2, "3": 3}


#: llama.cpp's names (relative to ``blk.{n}.``) of the roles gguf-py 0.19 has no row for
GGUF_NAMES: dict[Role, str] = {
    Role.POST_ATTENTION_NORM: "ffn_norm.weight",
    Role.KV_PROJ: "attn_kv.weight",
    Role.O_A_PROJ: "attn_output_a.weight",
    Role.O_B_PROJ: "attn_output_b.weight",
    Role.HC_ATTN_FN: "hc_attn_fn.weight",
    Role.HC_ATTN_BASE: "hc_attn_base.weight",
    Role.HC_ATTN_SCALE: "hc_attn_scale.weight",
    Role.HC_FFN_FN: "hc_ffn_fn.weight",
    Role.HC_FFN_BASE: "hc_ffn_base.weight",
    Role.HC_FFN_SCALE: "hc_ffn_scale.weight",
}
#: the head's output hyper-connection, which llama.cpp's converter writes outside the block
GGUF_ROOT_NAMES: dict[Role, str] = {
    Role.HC_HEAD_FN: "output_hc_fn.weight",
    Role.HC_HEAD_BASE: "output_hc_base.weight",
    Role.HC_HEAD_SCALE: "output_hc_scale.weight",
}
#: a backbone expert as only the release stores it (its own ``layers.`` namespace, one by one)
RAW_MARKERS = (".ffn.experts.0.w1.weight",)
#: ``general.file_type`` of the converter's DeepSeek-V4 files (``LlamaFileType.MOSTLY_MXFP4_MOE``)
MOSTLY_MXFP4_MOE = 38


def converter_type(role: "Role | None", dtype: str, n_dims: int) -> "str | None":
    """The type llama.cpp's converter writes a DeepSeek-V4 tensor in, from the source's own type
    (``DeepseekV4Model.tensor_force_quant``): the NextN projection and every block-FP8 matrix
    Q8_0, FP4 experts MXFP4 as they are, F32 tensors F32, bf16 matrices BF16; 1-D bf16 tensors
    follow the general rule (F32)."""
    if role == Role.FC or (dtype == "F8_E4M3" and n_dims >= 2):
        return "Q8_0"
    if dtype in ("I8", "U8"):
        return "MXFP4"
    if dtype == "F32":
        return "F32"
    if dtype == "BF16" and n_dims >= 2:
        return "BF16"
    return None


DEEPSEEK_V4 = FamilySpec(
    name="deepseek_v4",
    model_types=("deepseek_v4",),
    text_model_types=(),
    moe=True,
    head_rows=HEAD_ROWS,
    layer_rows=LAYER_ROWS,
    mlp_rows=MLP_ROWS,
    expert_rows=EXPERT_ROWS,
    norm_roles=frozenset(),
    norm_offset=0.0,
    hf_head_prefix="mtp.",
    head_file_prefix="mtp.",
    mlx_head_prefixes=(),
    count_keys=("num_nextn_predict_layers",),
    count_keys_written=("num_nextn_predict_layers",),
    ships_head_undeclared=False,
    nested_text_config=False,
    # no MLX layout: docs/families/deepseek_v4.md says which MLX runtimes draft it
    layouts=(),
    # no released mlx-lm has the model (the names are for the day one does)
    mlx_lm_classes=mlx_lm_model("deepseek_v4"),
    lm_module_path=(),
    head_layer=mlx_lm_class("deepseek_v4", "DecoderLayer"),
    dim_keys=DIM_KEYS,
    topology=Topology(),
    example_repo="deepseek-ai/DeepSeek-V4-Flash",
    # mlx-vlm 0.7.10's convert cannot make the trunk, its splitter makes the drafter (the doc's §5)
    mlx_drafted_by="mlx-vlm splits it: python -m mlx_vlm.speculative.drafters.deepseek_v4_mtp.split "
                   "--model REPO --output DIR",
    raw_marker_suffixes=RAW_MARKERS,
    is_raw_tensor=backbone_marker("layers.", RAW_MARKERS),
    gguf_arch="deepseek4",
    gguf_names=GGUF_NAMES,
    gguf_root_names=GGUF_ROOT_NAMES,
    # the NextN projection: the embedding half's columns, then the hidden half's
    gguf_fused={Role.FC: (Role.E_PROJ, Role.H_PROJ)},
    gguf_fused_columns=frozenset({Role.FC}),
    gguf_type_of=converter_type,
    gguf_file_type=MOSTLY_MXFP4_MOE,
    derived_dims=v4_dims,
    gguf_dim_keys=GGUF_DIM_KEYS,
    # the converter writes the SwiGLU clamps for every block, the MTP block's included
    gguf_layer_arrays={"swiglu_clamp_exp": "SWL", "swiglu_clamp_shexp": "SWL"},
    # ... and nextn_predict_layers after all of the family's own keys
    gguf_nextn_before=("general.quantization_version",),
)
