"""What a runtime row says: where it reads a head from, which expert formats and precisions it
loads, how it treats the head's norms, the mlx-lm it loads the backbone with, and how add-mtp
writes a head for it.

``add-mtp --runtime``, ``inspect --runtime`` and recipes read the same rows. A runtime whose
output is not an MLX folder (llama.cpp: GGUF) sets ``output_format``. Facts measured with the
runtime's own released code say so in ``version_checked``; the rest cite docs/SPEC.md §5.1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Mapping, Optional

from ..passes.quantize import QSpec


class OutputFormat(str, Enum):
    """What a runtime loads: an MLX model folder (safetensors + config), or a GGUF file."""

    MLX_FOLDER = "mlx-folder"
    GGUF = "gguf"


@dataclass(frozen=True)
class QuantAsk:
    """Everything a quantization predicate may look at besides the module's path and shape."""

    family: str
    #: the precision the user asked for (None: a float head)
    base: Optional[QSpec]
    #: the target's default quantization (None: an unquantized target)
    default_q: Optional[QSpec]
    #: the output expert format
    out_fmt: str
    keep_fc: bool
    #: notes for the user (a module kept unquantized, and why) are appended here
    notes: list[str] = field(default_factory=list, compare=False)


#: ``(bare module path, unquantized shape, ask) -> precision | None`` (None: unquantized)
QuantPredicate = Callable[[str, tuple[int, ...], QuantAsk], Optional[QSpec]]


@dataclass(frozen=True)
class QuantRule:
    """A runtime's quantization predicate and the plan-level note it implies."""

    predicate: QuantPredicate
    #: said once when the user's ``--precision`` asks for a float head but the rule quantizes
    float_request_note: Optional[str] = None
    #: said once when MoE experts stay in the source format and float although a precision was asked
    source_experts_note: Optional[str] = None


@dataclass(frozen=True)
class WriteRule:
    """How add-mtp writes a head for one reader: the layout, the expert format ``--experts auto``
    picks, the precision ``--precision`` left unset means, and the precision of every module."""

    layout: str
    quant: QuantRule
    #: source expert formats kept as they are (any other is stacked to switch_mlp)
    keep_experts: tuple[str, ...] = ()
    #: per-family exceptions to ``layout`` / ``quant`` / ``keep_experts``
    layout_by_family: Mapping[str, str] = field(default_factory=dict)
    quant_by_family: Mapping[str, QuantRule] = field(default_factory=dict)
    keep_experts_by_family: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: what an unset ``--precision`` means, by family (``match`` where not listed)
    precision_by_family: Mapping[str, str] = field(default_factory=dict)

    def layout_for(self, family: str) -> str:
        return self.layout_by_family.get(family, self.layout)

    def quant_for(self, family: str) -> QuantRule:
        return self.quant_by_family.get(family, self.quant)

    def keeps(self, family: str) -> tuple[str, ...]:
        return self.keep_experts_by_family.get(family, self.keep_experts)

    def precision_for(self, family: str) -> str:
        return self.precision_by_family.get(family, "match")


@dataclass(frozen=True)
class HeadFacts:
    """What a runtime's loader sees of a head (built by ``inspect`` from the folder), for the
    row's predictions."""

    family: str
    #: bare module -> stored precision (``{"dtype"}`` or ``{"quantized", "bits", "group_size"}``)
    precisions: Mapping[str, Mapping[str, Any]]
    #: the target's default quantization (None: unquantized)
    default_q: Optional[QSpec]


#: ``(head) -> None | the runtime's failure``: would its loader refuse (or break on) this head's
#: precisions
QuantCheck = Callable[[HeadFacts], Optional[str]]
#: ``(bare norm key -> mean of the stored values) -> the keys the runtime adds +1 to``
NormRule = Callable[[Mapping[str, float]], list[str]]


@dataclass(frozen=True)
class RuntimeSpec:
    """One runtime (docs/CONTRACT.md ``--runtime``)."""

    name: str
    summary: str
    #: how add-mtp writes a head for it (None: it reads no MLX folder head add-mtp can write)
    write: Optional[WriteRule]
    output_format: OutputFormat = OutputFormat.MLX_FOLDER
    #: layouts it reads a head from (empty: it reads no head, e.g. released mlx-lm)
    layouts: tuple[str, ...] = ()
    #: per-family exceptions to ``layouts``
    layouts_by_family: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: families it has no MTP path for, with the runtime's own words
    no_mtp: Mapping[str, str] = field(default_factory=dict)
    #: MoE expert formats it loads (None: not known / not checked)
    expert_formats: Optional[tuple[str, ...]] = None
    #: per-family exceptions to ``expert_formats``
    expert_formats_by_family: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: loads quantized expert stacks (mlx-lm #990 does not), and per-family exceptions (#1533
    #: loads Nemotron-H's quantized stacks)
    quantized_experts: bool = True
    quantized_experts_by_family: Mapping[str, bool] = field(default_factory=dict)
    #: precisions its loader refuses, per family (``None`` key: every family)
    quant_check: Mapping[Optional[str], QuantCheck] = field(default_factory=dict)
    #: how it re-shifts stored norms, per family (``None`` key: every family; absent: as written)
    norm_rule: Mapping[Optional[str], NormRule] = field(default_factory=dict)
    #: a marker file beside the head that turns ``norm_rule`` off (file -> keys and values)
    norm_markers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: families whose ``mtp.`` keys inside ``model*.safetensors`` make its (strict) loader fail
    rejects_head_in_glob: tuple[str, ...] = ()
    #: the mlx-lm it loads the backbone with (as its package pins it), and that pin as a range
    mlx_lm: Optional[str] = None
    mlx_lm_range: Optional[tuple[tuple[int, ...], tuple[int, ...]]] = None
    #: mlx-lm versions (inclusive range) that add +1 to every backbone norm when ``mtp.`` keys
    #: reach sanitize, and the families whose sanitize does it (the released-mlx-lm row holds
    #: the fact)
    double_shift_versions: Optional[tuple[tuple[int, ...], tuple[int, ...]]] = None
    double_shift_families: tuple[str, ...] = ()
    #: top-level config keys that make it load the checkpoint through mlx-vlm, which drops
    #: ``mtp.`` keys unchanged: its pinned mlx-lm never sees them (vllm-mlx's server routes
    #: vision-language checkpoints so)
    vl_route_keys: tuple[str, ...] = ()
    #: its pinned mlx-lm decodes config.json's tagged non-finite floats (``{"__float__":
    #: "Infinity"}``, as released mlx-lm >= 0.32 writes them); mlx-lm 0.31.x does not, and its
    #: first decode step fails on one (runtimes/config.py): add-mtp --runtime writes the value
    reads_tagged_floats: bool = True
    #: what its decode loop does that costs acceptance on every head (not the head's fault)
    loop_cost: Optional[str] = None
    #: the runtime version (or pull request) this row was checked against, and how
    version_checked: Optional[str] = None

    def loads_quantized_experts(self, family: str) -> bool:
        return self.quantized_experts_by_family.get(family, self.quantized_experts)

    def experts_for(self, family: str) -> Optional[tuple[str, ...]]:
        return self.expert_formats_by_family.get(family, self.expert_formats)

    def layouts_for(self, family: str) -> tuple[str, ...]:
        return self.layouts_by_family.get(family, self.layouts)

    def norm_rule_for(self, family: str) -> Optional[NormRule]:
        return self.norm_rule.get(family, self.norm_rule.get(None))

    def pins_double_shift(self, legacy: tuple[tuple[int, ...], tuple[int, ...]]) -> bool:
        """The mlx-lm it pins overlaps ``legacy`` (the releases that double-shift)."""
        r = self.mlx_lm_range
        return r is not None and r[0] <= legacy[1] and r[1] >= legacy[0]

    def quant_failure(self, head: HeadFacts) -> Optional[str]:
        check = self.quant_check.get(head.family, self.quant_check.get(None))
        return check(head) if check else None
