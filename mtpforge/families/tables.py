"""What an MTP head must look like, per family, as data.

Functions over the family specs (``families/<family>.py``): the dimensions a config gives, the
head a config implies, which keys are zero-centred norms. They never name a family.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

from ..errors import CorruptFileError
from .spec import FamilySpec, Row


def _spec_for(config: Mapping[str, Any]) -> FamilySpec:
    """The spec whose rows describe this config's head (an unknown config: Qwen3.5's rows,
    which every family here shares)."""
    from . import FAMILIES
    from .detect import detect_family
    from .qwen3_5 import QWEN3_5, QWEN3_5_MOE

    spec = FAMILIES.get(detect_family(config) or "")
    moe = is_moe(config)
    if spec is None or spec.moe != moe:
        spec = QWEN3_5_MOE if moe else QWEN3_5
    return spec


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
    k = _spec_for(config).dim_keys
    h = config_int(tc, k["H"], lo=1)
    nh = config_int(tc, k["NH"], lo=1)
    d = config_int(tc, k["D"], 0) or h // nh
    kv = config_int(tc, k["KV"], nh)
    im = config_int(tc, k["IM"], 0)
    return {
        "H": h, "2H": 2 * h, "D": d, "QD": nh * d, "2QD": 2 * nh * d, "KD": kv * d,
        "I": config_int(tc, k["I"], 0),
        "E": config_int(tc, k["E"], 0), "IM": im, "2IM": 2 * im,
        "IS": config_int(tc, k["IS"], 0), "1": 1,
        "V": config_int(tc, k["V"], 0),
    }


def is_moe(config: Mapping[str, Any]) -> bool:
    return config_int(text_config(config), "num_experts", 0) > 0


def declared_mtp_layers(config: Mapping[str, Any], family: str | None) -> int:
    """How many MTP layers the config declares (0 when it declares none)."""
    from . import FAMILIES

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
    spec = _spec_for(config)
    rows: tuple[Row, ...] = spec.head_rows
    per_layer: tuple[Row, ...] = spec.layer_rows + spec.mlp_rows
    expert_rows = spec.expert_rows[expert_format or "switch_mlp"] if spec.moe else ()
    out: dict[str, tuple[int, ...]] = {r.key: tuple(dm[s] for s in r.shape) for r in rows}
    for i in range(n_layers):
        for r in per_layer:
            out[r.key.format(i=i)] = tuple(dm[s] for s in r.shape)
        for r in expert_rows:
            shape = tuple(dm[s] for s in r.shape)
            if "{e}" in r.key:
                for e in range(dm["E"]):
                    out[r.key.format(i=i, e=e)] = shape
            else:
                out[r.key.format(i=i)] = shape
    return out


def is_norm_key(bare: str) -> bool:
    """One of the family's zero-centred MTP norm kinds (never ``linear_attn.norm``)."""
    templ = bare
    if bare.startswith("layers."):
        parts = bare.split(".", 2)
        templ = "layers.{i}." + parts[2] if len(parts) == 3 else bare
    return templ in _norm_templates()


@lru_cache(maxsize=None)
def _norm_templates() -> frozenset[str]:
    from . import FAMILIES

    return frozenset().union(*(s.norm_keys for s in FAMILIES.values()))


def norm_offset(bare: str) -> float:
    """What MLX adds to a zero-centred norm of the raw release (0 for any other tensor)."""
    from . import FAMILIES

    return next((s.norm_offset for s in FAMILIES.values() if is_norm_key(bare)), 0.0)


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
