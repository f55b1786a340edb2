"""What a runtime row says: which layouts it reads, which expert formats and precisions it
loads, which norm markers it trusts, the mlx-lm it loads with.

``inspect --runtime`` and ``add-mtp`` read the same rows. A runtime whose output is not an MLX
folder (llama.cpp: GGUF) sets ``output_format`` and names the writer that produces it.
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
class RuntimeSpec:
    """One runtime (CONTRACT ``--runtime``)."""

    name: str
    summary: str
    quant: QuantRule
    output_format: OutputFormat = OutputFormat.MLX_FOLDER
    #: layouts it reads its head from (empty: it reads no head, e.g. released mlx-lm)
    layouts: tuple[str, ...] = ()
    #: MoE expert formats it loads (None: not known / not checked)
    expert_formats: Optional[tuple[str, ...]] = None
    #: per-family exceptions to ``expert_formats``
    expert_formats_by_family: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: per-family exceptions to ``quant``
    quant_by_family: Mapping[str, QuantRule] = field(default_factory=dict)
    #: loads quantized expert stacks (mlx-lm #990 does not)
    quantized_experts: bool = True
    #: what it is told about the norm convention, written beside the head (file -> keys)
    norm_markers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: families whose head inside ``model*.safetensors`` makes its loader fail
    rejects_head_in_glob: tuple[str, ...] = ()
    #: mlx-lm versions (inclusive range) that add +1 to every backbone norm when ``mtp.`` keys
    #: reach sanitize
    double_shift_versions: Optional[tuple[tuple[int, ...], tuple[int, ...]]] = None
    #: the mlx-lm it loads models with, as far as this row knows
    mlx_lm: Optional[str] = None
    #: the runtime version (or pull request) this row was checked against; None: not yet
    version_checked: Optional[str] = None

    def experts_for(self, family: str) -> Optional[tuple[str, ...]]:
        return self.expert_formats_by_family.get(family, self.expert_formats)

    def quant_for(self, family: str) -> QuantRule:
        return self.quant_by_family.get(family, self.quant)
