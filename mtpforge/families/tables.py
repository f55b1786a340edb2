"""What an MTP head must look like, per family, as data.

Functions over the family specs (``families/<family>.py``): the dimensions a config gives, the
head a config implies, which keys are zero-centred norms. They never name a family.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

from ..errors import CorruptFileError
from ..inputs.model_config import as_config
from .qwen3_5 import QWEN3_5
from .spec import FamilySpec, Role, Row


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


def _norm_suffix(role: Role) -> str:
    key = next(r.key for r in QWEN3_5.head_rows + QWEN3_5.layer_rows if r.role == role)
    return key.replace("layers.{i}.", "")


#: the seven zero-centred norm kinds as bare key suffixes (head norms, then per-layer ones)
NORM_SUFFIXES: tuple[str, ...] = tuple(_norm_suffix(r) for r in (
    Role.PRE_FC_NORM_HIDDEN, Role.PRE_FC_NORM_EMBEDDING, Role.FINAL_NORM, Role.INPUT_NORM,
    Role.POST_ATTENTION_NORM, Role.Q_NORM, Role.K_NORM))


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's config: nested ``text_config`` (Qwen3.5/3.6) or the flat config."""
    return dict(as_config(config).text_raw)


def dims(config: Mapping[str, Any]) -> dict[str, int]:
    """Config dimensions that the shape templates use (validated when config.json was read)."""
    cfg = as_config(config)
    k = _spec_for(cfg).dim_keys

    def v(name: str, default: int | None = None) -> int:
        got = getattr(cfg.text, k[name], None)
        if got is None:
            if default is None:
                raise CorruptFileError(f"{cfg.file} has no {k[name]}",
                                       "pass a config.json of a Qwen3.5, Qwen3.6 or Qwen3-Next model")
            return default
        return got

    h, nh = v("H"), v("NH")
    d = v("D", 0) or h // nh
    kv = v("KV", nh)
    im = v("IM", 0)
    return {
        "H": h, "2H": 2 * h, "D": d, "QD": nh * d, "2QD": 2 * nh * d, "KD": kv * d,
        "I": v("I", 0), "E": v("E", 0), "IM": im, "2IM": 2 * im,
        "IS": v("IS", 0), "1": 1, "V": v("V", 0),
    }


def is_moe(config: Mapping[str, Any]) -> bool:
    return (as_config(config).text.num_experts or 0) > 0


def declared_mtp_layers(config: Mapping[str, Any], family: str | None) -> int:
    """How many MTP layers the config declares (0 when it declares none)."""
    from . import FAMILIES

    cfg = as_config(config)
    keys = FAMILIES[family].count_keys if family in FAMILIES else ("mtp_num_hidden_layers", "num_nextn_predict_layers")
    for k in keys:
        for level in (cfg.text, cfg.top):
            n = getattr(level, k, None)
            if n:
                return n
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
