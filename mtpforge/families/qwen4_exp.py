"""Qwen3.8-Flash-Next (``qwen4_exp``): a vision-language release whose text model carries every
residual as ``hc_count`` hyper-connection streams; its MTP head sits under ``mtp.*``
(docs/families/qwen4_exp.md).

The head (31 tensors for one MTP layer) fuses the token embedding and the trunk's streams with
two projections (``fc_embedding``, and ``fc_hidden`` applied to each stream after one RMS over
all of them, ``pre_fc_norm_hidden`` [hc·H]), runs one Qwen Sparse Attention + MoE decoder layer
whose residuals are gated hyper-connections (no RMSNorm of its own), and folds the streams with
its own ``hyper_connection_mixer`` before the trunk's ``lm_head``. The experts are fused stacks
in the bf16 release (Qwen3.6's spelling) and one by one, block-FP8, in the FP8 release (what
mlx-vlm's ``convert_qwen4_exp_fp8_weights`` reads); the drafter stacks them per projection.

MLX: the one runtime that drafts it is mlx-vlm (0.7.10: drafter ``qwen4_exp_mtp``), from a
separate drafter folder; mlx-lm has no ``qwen4_exp`` model. Its RMSNorms apply ``(1 + w)`` to
the release's zero-centred weights themselves, so MLX stores the release's values: no norm
offset here (``norm_roles`` empty), unlike Qwen3.5, whose MLX convention adds 1.
"""

from __future__ import annotations

from typing import Mapping

from ..errors import RefusedError
from .qwen3_5 import EXPERT_ROWS, MOE_SHARED_ROWS, RAW_MARKERS
from .spec import FamilySpec, Role, Row


def _hyper(prefix: str, norm: Role, down: Role, up: Role, inject: Role | None) -> tuple[Row, ...]:
    """One gated residual's rows: the grouped norm over the streams, the low-rank input mixer
    and (but the final mixer) the projection that spreads the branch back over the streams."""
    rows = (Row(norm, f"{prefix}hc_norm.weight", ("CH",)),
            Row(down, f"{prefix}input_mix_weight_down.weight", ("R", "CH")),
            Row(up, f"{prefix}input_mix_weight_up.weight", ("CH", "R")))
    return rows + ((Row(inject, f"{prefix}block_inject_weight.weight", ("HC", "CH")),) if inject else ())


#: the input fusion and the head's own stream mixer (``mtp.`` stripped)
HEAD_ROWS = (
    Row(Role.PRE_FC_NORM_EMBEDDING, "pre_fc_norm_embedding.weight", ("H",)),
    Row(Role.PRE_FC_NORM_HIDDEN, "pre_fc_norm_hidden.weight", ("CH",)),
    Row(Role.FC_EMBEDDING, "fc_embedding.weight", ("H", "H")),
    Row(Role.FC_HIDDEN, "fc_hidden.weight", ("H", "H")),
    *_hyper("hyper_connection_mixer.", Role.OUT_HC_NORM, Role.OUT_HC_DOWN, Role.OUT_HC_UP, None),
)
#: the MTP layer: Qwen Sparse Attention (gated queries, q/k norms, the token indexer) and its two
#: gated residuals
LAYER_ROWS = (
    Row(Role.Q_PROJ, "layers.{i}.self_attn.q_proj.weight", ("2QD", "H")),
    Row(Role.K_PROJ, "layers.{i}.self_attn.k_proj.weight", ("KD", "H")),
    Row(Role.V_PROJ, "layers.{i}.self_attn.v_proj.weight", ("KD", "H")),
    Row(Role.O_PROJ, "layers.{i}.self_attn.o_proj.weight", ("H", "QD")),
    Row(Role.Q_NORM, "layers.{i}.self_attn.q_norm.weight", ("D",)),
    Row(Role.K_NORM, "layers.{i}.self_attn.k_norm.weight", ("D",)),
    Row(Role.INDEXER_QK, "layers.{i}.self_attn.indexer.index_qk_proj.weight", ("IX", "H")),
    Row(Role.INDEXER_Q_NORM, "layers.{i}.self_attn.indexer.q_layernorm.weight", ("ID",)),
    Row(Role.INDEXER_K_NORM, "layers.{i}.self_attn.indexer.k_layernorm.weight", ("ID",)),
    *_hyper("layers.{i}.attn_hyper_connection.", Role.ATTN_HC_NORM, Role.ATTN_HC_DOWN, Role.ATTN_HC_UP,
            Role.ATTN_HC_INJECT),
    *_hyper("layers.{i}.mlp_hyper_connection.", Role.MLP_HC_NORM, Role.MLP_HC_DOWN, Role.MLP_HC_UP,
            Role.MLP_HC_INJECT),
)
#: a backbone expert stack as the release fuses it (converted folders hold ``switch_mlp``)
FUSED_MARKER = ".mlp.experts.gate_up_proj"
#: config dimension -> text-config key; ``hc_count`` .. ``indexer_*`` are this family's own
DIM_KEYS = {
    "H": "hidden_size", "NH": "num_attention_heads", "D": "head_dim", "KV": "num_key_value_heads",
    "E": "num_experts", "IM": "moe_intermediate_size", "IS": "shared_expert_intermediate_size",
    "V": "vocab_size", "HC": "hc_count", "R": "hc_lowrank", "ID": "indexer_head_dim",
    "IQ": "indexer_n_heads", "IK": "indexer_kv_heads",
}


def derived(d: Mapping[str, int]) -> dict[str, int]:
    """The gated query (2·NH·D rows), every stream side by side (hc·H), the indexer's query and
    key rows ((n_heads + kv_heads)·head_dim)."""
    return {"2QD": 2 * d["QD"], "CH": d["HC"] * d["H"], "IX": (d["IQ"] + d["IK"]) * d["ID"]}


def is_raw_tensor(key: str, shape: tuple[int, ...]) -> bool:
    """A raw release, told as mlx-vlm's sanitize tells it: a Gated DeltaNet ``conv1d`` still
    [C, 1, K] (converted: [C, K, 1]), or a fused expert stack it splits."""
    if key.endswith(RAW_MARKERS[0]):
        return len(shape) == 3 and shape[-1] != 1
    return key.startswith("model.language_model.layers.") and key.endswith(FUSED_MARKER)


def _no_mlx_lm() -> tuple[type, type]:
    """mtpforge's bundled decoder runs mlx-lm's model classes, and mlx-lm has no ``qwen4_exp``."""
    raise RefusedError("mlx-lm has no qwen4_exp model, so mtpforge's own decoder cannot run Qwen3.8-Flash-Next",
                       "decode with mlx-vlm and the drafter folder (mlx_vlm.generate --draft-model "
                       "<model>-mtp-drafter --draft-kind mtp)")


def _no_mlx_lm_layer() -> type:
    """The decoder layer of the same missing model (refused the same way)."""
    return _no_mlx_lm()[0]


QWEN4_EXP = FamilySpec(
    name="qwen4_exp",
    model_types=("qwen4_exp", "qwen4_exp_mtp"),
    text_model_types=("qwen4_exp_text",),
    moe=True,
    head_rows=HEAD_ROWS,
    layer_rows=LAYER_ROWS,
    mlp_rows=MOE_SHARED_ROWS,
    expert_rows={f: EXPERT_ROWS[f] for f in ("per-expert", "fused", "switch_mlp")},
    norm_roles=frozenset(),
    norm_offset=0.0,
    hf_head_prefix="mtp.",
    head_file_prefix="mtp.",
    # mlx-vlm's language-model namespace (its sanitize drops the head from converted folders)
    mlx_head_prefixes=("language_model.mtp.",),
    count_keys=("mtp_num_hidden_layers",),
    count_keys_written=("mtp_num_hidden_layers",),
    ships_head_undeclared=False,
    nested_text_config=True,
    # mlx-vlm's Qwen4ExpMTPDraftModel: bare keys, its own config (model_type qwen4_exp_mtp)
    layouts=("mlx-vlm-drafter",),
    mlx_vlm_drafter_type="qwen4_exp_mtp",
    mlx_lm_classes=_no_mlx_lm,
    lm_module_path=("language_model",),
    head_layer=_no_mlx_lm_layer,
    dim_keys=DIM_KEYS,
    derived_dims=derived,
    example_repo="Qwen/Qwen3.8-Flash-Next",
    raw_marker_suffixes=(RAW_MARKERS[0], FUSED_MARKER),
    is_raw_tensor=is_raw_tensor,
    mlx_drafted_by="mlx-vlm 0.7.10 drafts it from the drafter folder add-mtp --runtime mlx-vlm writes",
)
