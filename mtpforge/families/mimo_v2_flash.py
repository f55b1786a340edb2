"""MiMo-V2-Flash (``mimo_v2_flash``) and MiMo-V2.5 / V2.5-Pro (``mimo_v2``), llama.cpp ``mimo2``: three MTP layers under
``model.mtp.layers.{0,1,2}``, each a dense sliding-window decoder layer with attention sinks plus
the NextN tensors (docs/families/mimo_v2_flash.md).

Each layer holds ``enorm``, ``hnorm``, ``eh_proj`` [H, 2H] (embedding first, as everywhere), a
sliding-window attention (the trunk's ``swa_*`` head counts; the value head ``v_head_dim`` is
narrower than the query/key head) with its per-head sink logits ``attention_sink_bias``, a dense
SwiGLU MLP, and ``final_layernorm`` (the norm before the shared lm_head; llama.cpp's converter
names it ``layer_output_norm``). Norms are raw. The config declares no MTP layer count (the
converter hard-codes three): the count is read from the tensors.

llama.cpp's ``mimo2`` MTP graph reads the attention's projections as one fused ``attn_qkv``
(query rows, then key, then value: the offsets ``mimo2.cpp`` views), while its converter writes
them separately, so its own ``--mtp`` export cannot draft. mtpforge writes them fused
(``gguf_fused``); every other tensor is the converter's, bit for bit.

MiMo-V2.5 is the same text model (its vision and audio towers are not the head's) with each
attention's projections stored as one ``qkv_proj`` — the fused tensor llama.cpp reads, taken as it
is — and, in the FP8 release, that matrix's rows lie rank by rank over the tensor-parallel ranks
it was trained on (``rank_sharded``: unsharded as the converter unshards it). Its GGUF files are
MiMo-V2-Flash's, tensor for tensor (``gguf_same_as``).

GGUF only (``layouts = ()``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from .spec import FamilySpec, Role, Row, Topology, backbone_marker, mlx_lm_class, mlx_lm_model

LAYER_ROWS = (
    Row(Role.FC, "layers.{i}.eh_proj.weight", ("H", "2H")),
    Row(Role.PRE_FC_NORM_EMBEDDING, "layers.{i}.enorm.weight", ("H",)),
    Row(Role.PRE_FC_NORM_HIDDEN, "layers.{i}.hnorm.weight", ("H",)),
    Row(Role.LAYER_OUT_NORM, "layers.{i}.final_layernorm.weight", ("H",)),
    Row(Role.INPUT_NORM, "layers.{i}.input_layernorm.weight", ("H",)),
    Row(Role.POST_ATTENTION_NORM, "layers.{i}.post_attention_layernorm.weight", ("H",)),
    Row(Role.Q_PROJ, "layers.{i}.self_attn.q_proj.weight", ("QD", "H")),
    Row(Role.K_PROJ, "layers.{i}.self_attn.k_proj.weight", ("KD", "H")),
    Row(Role.V_PROJ, "layers.{i}.self_attn.v_proj.weight", ("KVD", "H")),
    Row(Role.O_PROJ, "layers.{i}.self_attn.o_proj.weight", ("H", "QVD")),
    Row(Role.ATTN_SINKS, "layers.{i}.self_attn.attention_sink_bias", ("NH",)),
)
MLP_ROWS = (
    Row(Role.MLP_GATE, "layers.{i}.mlp.gate_proj.weight", ("I", "H")),
    Row(Role.MLP_UP, "layers.{i}.mlp.up_proj.weight", ("I", "H")),
    Row(Role.MLP_DOWN, "layers.{i}.mlp.down_proj.weight", ("H", "I")),
)
#: the MTP layers are sliding-window ones: their kv heads are the ``swa_`` count (the release
#: asserts the query heads and head dims equal the full-attention ones); no expert is a row's
DIM_KEYS: dict[str, "str | tuple[str, ...]"] = {
    "H": "hidden_size", "NH": "num_attention_heads", "D": "head_dim", "KV": "swa_num_key_value_heads",
    "VD": "v_head_dim", "I": "intermediate_size", "V": "vocab_size",
}


def _value_dims(d: Mapping[str, int]) -> dict[str, int]:
    """The value projection's rows (kv heads x value head), the output projection's input (heads
    x value head) and the fused projection's rows (query, key and value)."""
    kvd = d["KV"] * d["VD"]
    return {"KVD": kvd, "QVD": d["NH"] * d["VD"], "QKVD": d["QD"] + d["KD"] + kvd}


#: the trunk states the value head (``value_length``); its kv heads per layer (the sliding-window
#: count is the largest entry); no expert count or width is a row's
GGUF_DIM_KEYS: dict[str, "str | None"] = {"VD": "attention.value_length", "E": None, "IM": None}
#: the converter extends these per-layer arrays by each MTP layer's entry (measured)
GGUF_LAYER_ARRAYS: dict[str, "str | bool | float"] = {
    "attention.head_count_kv": "KV", "attention.sliding_window_pattern": True,
}

RAW_MARKERS = (".mlp.experts.0.up_proj.weight",)

MIMO_V2_FLASH = FamilySpec(
    name="mimo_v2_flash",
    model_types=("mimo_v2_flash",),
    text_model_types=(),
    # the MTP layers are dense (the trunk's MoE has no rows here)
    moe=False,
    head_rows=(),
    layer_rows=LAYER_ROWS,
    mlp_rows=MLP_ROWS,
    expert_rows={},
    norm_roles=frozenset(),
    norm_offset=0.0,
    hf_head_prefix="model.mtp.",
    topology=Topology(),
    head_file_prefix="model.mtp.",
    mlx_head_prefixes=(),
    # not in the release's config (vLLM reads this key; the count comes from the tensors)
    count_keys=("num_nextn_predict_layers",),
    count_keys_written=("num_nextn_predict_layers",),
    ships_head_undeclared=False,
    nested_text_config=False,
    # no MLX layout: the GGUF output formats only
    layouts=(),
    mlx_lm_classes=mlx_lm_model("mimo_v2_flash"),
    lm_module_path=(),
    head_layer=mlx_lm_class("mimo_v2_flash", "DecoderLayer"),
    dim_keys=DIM_KEYS,
    derived_dims=_value_dims,
    gguf_arch="mimo2",
    example_repo="XiaomiMiMo/MiMo-V2-Flash",
    mlx_drafted_by="no MLX runtime installed here drafts MiMo-V2's three-layer head (MTPLX's mimo_mtp is MiMo-7B's)",
    raw_marker_suffixes=RAW_MARKERS,
    # per-expert backbone tensors (mlx-lm's sanitize stacks them)
    is_raw_tensor=backbone_marker("model.layers.", RAW_MARKERS),
    gguf_dim_keys=GGUF_DIM_KEYS,
    gguf_layer_arrays=GGUF_LAYER_ARRAYS,
    # the converter adds nextn_predict_layers after the family's own keys
    gguf_nextn_before=("general.quantization_version",),
    # mimo2.cpp's MTP graph reads only the fused projection ("MIMO2 MTP requires fused attn_qkv")
    gguf_fused={Role.QKV_PROJ: (Role.Q_PROJ, Role.K_PROJ, Role.V_PROJ)},
    # mimo2.cpp emits the trunk's last hidden state before output_norm as t_h_nextn
    gguf_mtp_hidden="pre",
)

#: MiMo-V2.5: the query, key and value projections as the one ``qkv_proj`` the release stores
FUSED_LAYER_ROWS = tuple(r for r in LAYER_ROWS if r.role not in (Role.Q_PROJ, Role.K_PROJ, Role.V_PROJ)) + (
    Row(Role.QKV_PROJ, "layers.{i}.self_attn.qkv_proj.weight", ("QKVD", "H")),
)

MIMO_V2 = replace(
    MIMO_V2_FLASH,
    name="mimo_v2",
    model_types=("mimo_v2",),
    layer_rows=FUSED_LAYER_ROWS,
    example_repo="XiaomiMiMo/MiMo-V2.5",
    gguf_fused={},
    rank_sharded={Role.QKV_PROJ: ("QD", "KD", "KVD")},
    gguf_same_as=MIMO_V2_FLASH.name,
)
