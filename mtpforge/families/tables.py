"""What an MTP head must look like, per family, as data.

Functions over the family specs (``families/<family>.py``): the dimensions a config gives, the
head a config implies, which keys are zero-centred norms. They never name a family.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..errors import CorruptFileError, InputError
from ..inputs.model_config import as_config
from .spec import STACKED, FamilySpec, Role, Row


def family_spec(config: Mapping[str, Any]) -> FamilySpec:
    """The spec whose rows describe this config's head. An unknown ``model_type`` is refused
    here, in one line, as every command refuses it where it reads config.json: guessing another
    family's rows is how heads get written into the wrong model."""
    from . import FAMILIES
    from .detect import detect_family

    name = detect_family(config)
    if name is None:
        cfg = as_config(config)
        raise InputError(f"{cfg.file} is not a model of a family mtpforge knows (model_type {cfg.model_type!r})",
                         f"mtpforge handles the model types {', '.join(sorted({t for s in FAMILIES.values() for t in s.model_types}))}")
    return FAMILIES[name]


def spec_named(family: "str | FamilySpec") -> FamilySpec:
    """A family's spec from its name (what plans and reports carry) or the spec itself."""
    from . import FAMILIES

    return family if isinstance(family, FamilySpec) else FAMILIES[family]


def _all_specs() -> tuple[FamilySpec, ...]:
    from . import FAMILIES

    return tuple(FAMILIES.values())


def _norm_groups() -> tuple[str, ...]:
    """Every family's zero-centred norm kinds as bare key suffixes (the MTP layer's ``…{i}.``
    stripped), in canonical Role order, each once."""
    roles = sorted({r for s in _all_specs() for r in s.norm_roles}, key=list(Role).index)
    out: list[str] = []
    for role in roles:
        for s in _all_specs():
            k = next((r.key for r in s.rows() if r.role == role), None)
            if k is not None and (g := k.split("{i}.")[-1]) not in out:
                out.append(g)
    return tuple(out)


#: the zero-centred norm kinds of every family as bare key suffixes (head norms, then
#: per-layer ones), built from the rows
NORM_SUFFIXES: tuple[str, ...] = _norm_groups()


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's config: nested ``text_config`` (Qwen3.5/3.6) or the flat config."""
    return dict(as_config(config).text_raw)


def _lookup(text: Any, key: str) -> Any:
    """A text-config value; a dotted key reads into a nested object (Step-3.5's sliding-window
    head counts sit in ``attention_other_setting``)."""
    first, *rest = key.split(".")
    one = getattr(text, first, None)
    for part in rest:
        one = one.get(part) if isinstance(one, Mapping) else getattr(one, part, None)
    return one


def _family_dim(cfg: Any, key: str) -> Any:
    """A dimension key of the text config: a validated one (``inputs/model_config.py``), else a
    key only one family has (Qwen3.8-Flash-Next's ``hc_count``), read from the file as written
    and taken only as an integer in 0..MAX_DIM (anything else reads as unset, so the head is
    refused naming the key): per-family keys stay in their family's ``dim_keys``."""
    from ..inputs.model_config import MAX_DIM

    if key.startswith("#"):  # a list's length (DSpark's target layers)
        listed = cfg.text_raw.get(key[1:])
        return len(listed) if isinstance(listed, list) else None
    one = _lookup(cfg.text, key)
    if one is not None or "." in key or key in type(cfg.text).model_fields:
        return one
    raw = cfg.text_raw.get(key)
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw <= MAX_DIM else None


def dims(config: Mapping[str, Any]) -> dict[str, int]:
    """Config dimensions that the shape templates use (validated when config.json was read)."""
    cfg = as_config(config)
    spec = family_spec(cfg)
    k = spec.dim_keys

    def v(name: str, default: int | None = None) -> int:
        keys = k.get(name, ())
        got: int | None = 1
        for key in (keys,) if isinstance(keys, str) else keys:
            one = _family_dim(cfg, key)
            got = None if one is None or got is None else got * one
        if got is None or not keys:
            if default is None:
                raise CorruptFileError(f"{cfg.file} has no {keys if isinstance(keys, str) else ' / '.join(keys)}",
                                       f"pass the config.json of a {spec.name} model as released")
            return default
        return got

    h, nh = v("H"), v("NH")
    d = v("D", 0) or h // nh
    kv = v("KV", nh)
    im = v("IM", 0)
    out = {
        "H": h, "2H": 2 * h, "NH": nh, "KV": kv, "D": d, "QD": nh * d, "KD": kv * d,
        "I": v("I", 0), "E": v("E", 0), "IM": im, "2IM": 2 * im,
        "IS": v("IS", 0), "1": 1, "V": v("V", 0),
    }
    # the family's own symbols (MLA's ranks and head widths; 0 for an optional one left unset),
    # then those built from them
    out.update({sym: v(sym, 0 if sym in spec.optional_dims else None) for sym in k if sym not in out})
    return {**out, **(spec.derived_dims(out) if spec.derived_dims else {})}


def is_moe(config: Mapping[str, Any]) -> bool:
    t = as_config(config).text
    return (t.num_experts or t.n_routed_experts or 0) > 0


def row_exists(row: Row, config: Mapping[str, Any]) -> bool:
    """A row the config switches on (``Row.when``) or one that is always there."""
    return row.when is None or bool(as_config(config).text_raw.get(row.when))


def declared_mtp_layers(config: Mapping[str, Any], family: "str | FamilySpec | None") -> int:
    """How many MTP layers the config declares (0 when it declares none). ``family`` None reads
    every family's count keys (a folder whose family is not settled yet)."""
    cfg = as_config(config)
    specs = (spec_named(family),) if family is not None else _all_specs()
    keys = dict.fromkeys(k for s in specs for k in s.count_keys)
    for k in keys:
        for level in (cfg.text, cfg.top):
            n = getattr(level, k, None)
            if n:
                return n
    return 0


def expected_head(config: Mapping[str, Any], n_layers: int, expert_format: str | None = None,
                  present: Iterable[str] = (), parts: Mapping[Role, str] | None = None) -> dict[str, tuple[int, ...]]:
    """Bare head keys -> unquantized shapes, for ``n_layers`` MTP layers. Optional rows (a copy
    a release may leave out) are expected only where ``present`` (the keys a head holds) has
    them: a head is complete without them, and of the right shape with them.

    ``expert_format`` is one of the family's expert formats for MoE configs (default: the
    stacked one) and ignored for dense ones. ``parts`` (part role -> module path: a layout that
    stores a tensor split, ``Placement.parts``) expects those parts in place of that tensor.
    """
    dm = dims(config)
    spec = family_spec(config)
    have = {k[: -len(".scales")] + ".weight" if k.endswith(".scales") else k for k in present}
    per_layer: tuple[Row, ...] = spec.layer_rows + spec.mlp_rows
    expert_rows = spec.expert_rows[expert_format or STACKED] if spec.moe else ()
    out: dict[str, tuple[int, ...]] = {}
    for i in range(n_layers):
        for r in (*(spec.head_rows if i == 0 else ()), *per_layer, *expert_rows):
            if not row_exists(r, config):
                continue
            shape = tuple(dm[s] for s in r.shape)
            if parts and (split := _split_parts(r.role, parts, dm)):
                out.update({k.format(i=i): v for k, v in split.items()})
                continue
            for e in range(dm["E"] if "{e}" in r.key else 1):
                key = r.key.format(i=i, e=e)
                if not r.optional or key in have:
                    out[key] = shape
    return out


def _split_parts(role: Role, parts: Mapping[Role, str], dm: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """The parts' keys and shapes of a tensor of ``role`` stored split (passes/mla.py); {} for one
    stored whole."""
    from ..passes.mla import SPLITS

    if role not in SPLITS or not all(r in parts for r, _ in SPLITS[role].parts):
        return {}
    return {parts[r] + ".weight": tuple(dm[s] for s in syms) for r, syms in SPLITS[role].parts}


def is_norm_key(bare: str, family: "str | FamilySpec | None" = None) -> bool:
    """One of the family's zero-centred MTP norm kinds (never ``linear_attn.norm``); ``family``
    None: of any family (for a key set read without its config)."""
    specs = (spec_named(family),) if family is not None else _all_specs()
    return any(s.is_norm_key(bare) for s in specs)


def norm_offset(bare: str, family: "str | FamilySpec") -> float:
    """What MLX adds to this tensor of the family's raw release (0 for any other tensor, and
    for every tensor of a raw-norm family)."""
    return spec_named(family).offset_of(bare)


def head_specs(config: Mapping[str, Any]) -> tuple[FamilySpec, ...]:
    """The config's family, or every family when it names none: checks that only set the head
    apart from the backbone run before (or without) a family's refusal."""
    from . import FAMILIES
    from .detect import detect_family

    name = detect_family(config)
    return (FAMILIES[name],) if name is not None else _all_specs()


def is_head_key(key: str, config: Mapping[str, Any]) -> bool:
    """A stored key (raw, head-file or any MLX layout) of an MTP head, not of the backbone."""
    return any(s.is_head_key(key, config) for s in head_specs(config))


def role_of(bare: str, family: "str | FamilySpec | None" = None) -> Role | None:
    """The canonical role of a bare key or module path (``family`` None: the first family that
    spells it)."""
    specs = (spec_named(family),) if family is not None else _all_specs()
    return next((r for s in specs if (r := s.role_of(bare)) is not None), None)


def expert_format_of(keys: Iterable[str], config: Mapping[str, Any]) -> str:
    """Which expert layout a set of bare head keys uses ('none' for a dense head)."""
    return family_spec(config).expert_format_of(keys)


def mtp_layers_of(keys: Iterable[str], family: "str | FamilySpec") -> set[int]:
    """The MTP layer indices a set of bare head keys holds (``{i}`` of the family's rows)."""
    spec = spec_named(family)
    return {hit[2] for k in keys if (hit := spec.match(k)) is not None and hit[2] is not None}
