"""Will a runtime load and draft a head: its row applied to what a folder holds.

One function for ``add-mtp`` (a note when the result will not load where it is meant to, from
the plan, before anything is fetched) and ``inspect --runtime`` (findings). Pure: the caller
reads the folder and passes facts in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from .quant import is_expert
from .spec import HeadFacts, OutputFormat, RuntimeSpec
from .table import MLX_LM


#: predictions that mean the folder's backbone is harmed (not only that the head goes unread)
BACKBONE_HARM = ("LEGACY_LOADER_DOUBLE_SHIFT", "MLX_LM_LOAD_BREAKS")


@dataclass(frozen=True)
class Prediction:
    """One reason the runtime fails (or loses acceptance) on this head: a finding code of
    ``findings.CODES`` and the message, in the runtime's own words where it has them."""

    code: str
    message: str


@dataclass(frozen=True)
class Placed:
    """Where the head sits and in which form (what the loader sees besides precisions)."""

    layout: str
    expert_format: str
    #: the head's keys sit in a file mlx-lm's ``model*.safetensors`` glob loads
    in_glob: bool
    #: the top-level keys of the folder's config.json (some runtimes route by them)
    config_keys: frozenset[str]


def _reads(row: RuntimeSpec, family: str, placed: Placed) -> list[Prediction]:
    if row.output_format != OutputFormat.MLX_FOLDER:
        return [Prediction("LAYOUT_NOT_READ_BY_RUNTIME", f"{row.name} loads {row.output_format.value} files, not an MLX "
                                                          "folder: add-mtp writes its head when --target is the trunk")]
    if family in row.no_mtp:
        return [Prediction("RUNTIME_NO_MTP", row.no_mtp[family])]
    reads = row.layouts_for(family)
    if reads and placed.layout not in reads:
        return [Prediction("LAYOUT_NOT_READ_BY_RUNTIME", f"{row.name} reads its head from the {' / '.join(reads)} "
                                                          f"layout; this head is {placed.layout}, so it never drafts")]
    return []


def _experts(row: RuntimeSpec, head: HeadFacts, placed: Placed) -> list[Prediction]:
    allowed = row.experts_for(head.family)
    fmt = placed.expert_format
    if fmt == "none" or allowed is None:
        return []
    quant = any(p.get("quantized") for m, p in head.precisions.items() if is_expert(m, head.family))
    quantized_ok = row.loads_quantized_experts(head.family)
    if fmt in allowed and (quantized_ok or not quant):
        return []
    return [Prediction("EXPERT_LAYOUT_INCOMPATIBLE", f"MoE experts stored as {fmt}{' (quantized)' if quant else ''}; "
                                                     f"{row.name} loads {' or '.join(allowed)}"
                                                     f"{'' if quantized_ok else ', unquantized'}")]


def _backbone(row: RuntimeSpec, family: str, placed: Placed) -> list[Prediction]:
    """The mlx-lm the runtime pins, given the head's keys in ``model*.safetensors``."""
    if not placed.in_glob:
        return []
    if family in row.rejects_head_in_glob:
        return [Prediction("MLX_LM_LOAD_BREAKS", f"{row.name} loads {family} strictly with {row.mlx_lm}: the head's "
                                                 "keys in model*.safetensors fail the load (\"parameters not in model\")")]
    legacy = MLX_LM.double_shift_versions
    if legacy and family in MLX_LM.double_shift_families and row.pins_double_shift(legacy) \
            and not any(k in placed.config_keys for k in row.vl_route_keys):
        return [Prediction("LEGACY_LOADER_DOUBLE_SHIFT", f"{row.name} loads the backbone with {row.mlx_lm}, which adds +1 to every "
                                                         "backbone norm when the head's keys sit in model*.safetensors: "
                                                         "the backbone is corrupted there (greedy output changes)")]
    return []


def predict(row: RuntimeSpec, head: HeadFacts, placed: Placed) -> list[Prediction]:
    """Every reason ``row``'s runtime fails to load or draft this head (empty: it does)."""
    found = _reads(row, head.family, placed) + _backbone(row, head.family, placed)
    why = row.quant_failure(head)
    if why:
        found.append(Prediction("RUNTIME_QUANT_UNSUPPORTED", why))
    return found + _experts(row, head, placed)


def reshifted(row: RuntimeSpec, family: str, means: Mapping[str, float],
              read_marker: Callable[[str], Optional[object]]) -> list[str]:
    """The norms ``row``'s runtime adds +1 to (by their stored means), unless its marker file
    beside the head turns its rule off (``read_marker(name)``: that file's JSON, None when absent)."""
    rule = row.norm_rule_for(family)
    if rule is None:
        return []
    for name, want in row.norm_markers.items():
        marker = read_marker(name)
        if isinstance(marker, dict) and all(marker.get(k) == v for k, v in want.items()):
            return []
    return rule(means)
