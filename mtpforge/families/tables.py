"""What an MTP head must look like, per family, as data.

Tensor names are rows, not code paths (the gguf-py ``tensor_mapping`` idea): each row is a bare
head key (relative to ``mtp.``) with ``{i}`` for the MTP layer and ``{e}`` for the expert, and a
shape written in config dimensions. A new family or expert format adds rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import CorruptFileError

Shape = tuple[str, ...]


@dataclass(frozen=True)
class Family:
    """How one model family spells its checkpoints."""

    name: str
    hf_backbone_prefix: str  # raw HF checkpoint
    mlx_backbone_prefix: str  # after mlx_lm sanitize / convert
    #: prefix of MTP keys when embedded in model*.safetensors of an MLX folder
    mlx_mtp_prefix: str
    #: the config keys runtimes read for the number of MTP layers, first one preferred
    count_keys: tuple[str, ...]
    #: does the family's source release ship a head even when its config declares none
    ships_head_undeclared: bool
    nested_text_config: bool
    default_layout: str
    layouts: tuple[str, ...]


FAMILIES: dict[str, Family] = {
    "qwen3_5": Family(
        "qwen3_5", "model.language_model.", "language_model.model.", "language_model.mtp.",
        ("mtp_num_hidden_layers",), False, True, "embedded",
        ("embedded", "sidecar", "vllm-mlx", "mlx-vlm-drafter"),
    ),
    "qwen3_5_moe": Family(
        "qwen3_5_moe", "model.language_model.", "language_model.model.", "language_model.mtp.",
        ("mtp_num_hidden_layers",), False, True, "embedded",
        ("embedded", "sidecar", "vllm-mlx", "mlx-vlm-drafter"),
    ),
    "qwen3_next": Family(
        "qwen3_next", "model.", "model.", "mtp.",
        ("num_nextn_predict_layers", "mtp_num_hidden_layers"), True, False, "sidecar",
        ("sidecar", "vllm-mlx"),
    ),
}

#: The seven RMSNorm kinds of the head that are zero-centred in the source (SPEC §4).
NORM_SUFFIXES: tuple[str, ...] = (
    "pre_fc_norm_hidden.weight",
    "pre_fc_norm_embedding.weight",
    "norm.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
)

HEAD_ROWS: tuple[tuple[str, Shape], ...] = (
    ("fc.weight", ("H", "2H")),
    ("pre_fc_norm_embedding.weight", ("H",)),
    ("pre_fc_norm_hidden.weight", ("H",)),
    ("norm.weight", ("H",)),
)

LAYER_ROWS: tuple[tuple[str, Shape], ...] = (
    ("layers.{i}.input_layernorm.weight", ("H",)),
    ("layers.{i}.post_attention_layernorm.weight", ("H",)),
    ("layers.{i}.self_attn.q_proj.weight", ("2QD", "H")),
    ("layers.{i}.self_attn.k_proj.weight", ("KD", "H")),
    ("layers.{i}.self_attn.v_proj.weight", ("KD", "H")),
    ("layers.{i}.self_attn.o_proj.weight", ("H", "QD")),
    ("layers.{i}.self_attn.q_norm.weight", ("D",)),
    ("layers.{i}.self_attn.k_norm.weight", ("D",)),
)

DENSE_MLP_ROWS: tuple[tuple[str, Shape], ...] = (
    ("layers.{i}.mlp.gate_proj.weight", ("I", "H")),
    ("layers.{i}.mlp.up_proj.weight", ("I", "H")),
    ("layers.{i}.mlp.down_proj.weight", ("H", "I")),
)

MOE_SHARED_ROWS: tuple[tuple[str, Shape], ...] = (
    ("layers.{i}.mlp.gate.weight", ("E", "H")),
    ("layers.{i}.mlp.shared_expert.gate_proj.weight", ("IS", "H")),
    ("layers.{i}.mlp.shared_expert.up_proj.weight", ("IS", "H")),
    ("layers.{i}.mlp.shared_expert.down_proj.weight", ("H", "IS")),
    ("layers.{i}.mlp.shared_expert_gate.weight", ("1", "H")),
)

EXPERT_ROWS: dict[str, tuple[tuple[str, Shape], ...]] = {
    "per-expert": (
        ("layers.{i}.mlp.experts.{e}.gate_proj.weight", ("IM", "H")),
        ("layers.{i}.mlp.experts.{e}.up_proj.weight", ("IM", "H")),
        ("layers.{i}.mlp.experts.{e}.down_proj.weight", ("H", "IM")),
    ),
    # Fused tensors carry no ".weight" suffix in the source (SPEC §2).
    "fused": (
        ("layers.{i}.mlp.experts.gate_up_proj", ("E", "2IM", "H")),
        ("layers.{i}.mlp.experts.down_proj", ("E", "H", "IM")),
    ),
    "switch_mlp": (
        ("layers.{i}.mlp.switch_mlp.gate_proj.weight", ("E", "IM", "H")),
        ("layers.{i}.mlp.switch_mlp.up_proj.weight", ("E", "IM", "H")),
        ("layers.{i}.mlp.switch_mlp.down_proj.weight", ("E", "H", "IM")),
    ),
}

EXPERT_FORMATS = tuple(EXPERT_ROWS)


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's config: nested ``text_config`` (Qwen3.5/3.6) or the flat config."""
    tc = config.get("text_config")
    return dict(tc) if isinstance(tc, dict) else dict(config)


#: no released dimension comes near this; a config beyond it is hostile or corrupt, and sizes
#: computed from it would ask for absurd memory
MAX_DIM = 1 << 24
MAX_MTP_LAYERS = 64


def config_int(tc: Mapping[str, Any], key: str, default: int | None = None, *, lo: int = 0, hi: int = MAX_DIM) -> int:
    """An integer config value, strictly: JSON numbers like NaN, 1e30, true or "64" are refused
    with one clear error rather than crashing a computation later."""
    v = tc.get(key)
    if v is None:
        if default is not None:
            return default
        raise CorruptFileError(f"config.json has no {key}", "pass a config.json of a Qwen3.5, Qwen3.6 or Qwen3-Next model")
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise CorruptFileError(f"config.json: {key} is {v!r}, not an integer in {lo}..{hi}",
                               "repair config.json (or re-download it)")
    return v


def dims(config: Mapping[str, Any]) -> dict[str, int]:
    """Config dimensions that the shape templates use."""
    tc = text_config(config)
    h = config_int(tc, "hidden_size", lo=1)
    nh = config_int(tc, "num_attention_heads", lo=1)
    d = config_int(tc, "head_dim", 0) or h // nh
    kv = config_int(tc, "num_key_value_heads", nh)
    im = config_int(tc, "moe_intermediate_size", 0)
    return {
        "H": h, "2H": 2 * h, "D": d, "QD": nh * d, "2QD": 2 * nh * d, "KD": kv * d,
        "I": config_int(tc, "intermediate_size", 0),
        "E": config_int(tc, "num_experts", 0), "IM": im, "2IM": 2 * im,
        "IS": config_int(tc, "shared_expert_intermediate_size", 0), "1": 1,
        "V": config_int(tc, "vocab_size", 0),
    }


def is_moe(config: Mapping[str, Any]) -> bool:
    return config_int(text_config(config), "num_experts", 0) > 0


def declared_mtp_layers(config: Mapping[str, Any], family: str | None) -> int:
    """How many MTP layers the config declares (0 when it declares none)."""
    tc = text_config(config)
    keys = FAMILIES[family].count_keys if family in FAMILIES else ("mtp_num_hidden_layers", "num_nextn_predict_layers")
    for k in keys:
        for where in (tc, config):
            if where.get(k) is not None and config_int(where, k, hi=MAX_MTP_LAYERS) > 0:
                return where[k]
    return 0


def expected_head(config: Mapping[str, Any], n_layers: int, expert_format: str | None = None) -> dict[str, tuple[int, ...]]:
    """Bare head keys -> unquantized shapes, for ``n_layers`` MTP layers.

    ``expert_format`` is one of EXPERT_FORMATS for MoE configs and ignored for dense ones.
    """
    dm = dims(config)
    rows: list[tuple[str, Shape]] = list(HEAD_ROWS)
    per_layer: list[tuple[str, Shape]] = list(LAYER_ROWS)
    expert_rows: tuple[tuple[str, Shape], ...] = ()
    if is_moe(config):
        per_layer += MOE_SHARED_ROWS
        expert_rows = EXPERT_ROWS[expert_format or "switch_mlp"]
    else:
        per_layer += DENSE_MLP_ROWS
    out: dict[str, tuple[int, ...]] = {k: tuple(dm[s] for s in shp) for k, shp in rows}
    for i in range(n_layers):
        for k, shp in per_layer:
            out[k.format(i=i)] = tuple(dm[s] for s in shp)
        for k, shp in expert_rows:
            shape = tuple(dm[s] for s in shp)
            if "{e}" in k:
                for e in range(dm["E"]):
                    out[k.format(i=i, e=e)] = shape
            else:
                out[k.format(i=i)] = shape
    return out


def is_norm_key(bare: str) -> bool:
    """One of the seven zero-centred MTP norm kinds (never ``linear_attn.norm``)."""
    return bare in ("pre_fc_norm_hidden.weight", "pre_fc_norm_embedding.weight", "norm.weight") or (
        bare.startswith("layers.") and bare.split(".", 2)[2] in NORM_SUFFIXES[3:]
    )


def expert_format_of(keys: set[str] | list[str]) -> str:
    """Which expert layout a set of bare head keys uses ('none' for a dense head)."""
    ks = set(keys)
    if any(".mlp.switch_mlp." in k for k in ks):
        return "switch_mlp"
    if any(k.endswith("mlp.experts.gate_up_proj") for k in ks):
        return "fused"
    if any(".mlp.experts." in k for k in ks):
        return "per-expert"
    return "none"
