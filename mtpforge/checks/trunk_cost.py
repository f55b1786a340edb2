"""Advice after a measurement: acceptance well below what a head of this precision drafts, on a
quantized trunk — the trunk's quantization is the likely cost, and ``mtpforge align`` its fix.

docs/PERFORMANCE.md measured it: the same trained head loses 1-4 points on a 4-bit MLX trunk and
up to 33 on a 2-bit one, and re-fitting the head to the trunk wins most of it back. The reference
is the precision table (``mtpforge/data/head_precision.json``: acceptance of the trained tiny
model of the head's shape with its head at each precision, on a full-precision trunk). A real
model's figure is not the tiny model's, so only a gap well beyond the table's tolerance, on a
trunk quantized to 4 bits or fewer, is named — as a note, never a failure; a dead head (under 10%)
is not: its cause is the head's own (checks/drafts.py).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Optional

#: the trunk bits at and below which the measurement showed a cost
TRUNK_BITS = 4
#: how far below the table a head must draft before the trunk is named (the table's own tolerance
#: is 3 points; a real model differs from the tiny one)
GAP = 0.10


def trunk_bits(folder: Path) -> Optional[int]:
    """The trunk's default quantization bits from ``config.json`` (None: not quantized or unreadable)."""
    try:
        config = json.loads((folder / "config.json").read_text("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    for key in ("quantization", "quantization_config"):
        q = config.get(key) if isinstance(config, dict) else None
        if isinstance(q, dict) and isinstance(q.get("bits"), int) and not isinstance(q.get("bits"), bool):
            return int(q["bits"])
    return None


def expected_acceptance(family: str, head_quant: Mapping[str, Mapping[str, Any]]) -> Optional[tuple[str, float]]:
    """(precision label, acceptance) the table measured for this family's shape at the head's
    precision (its lowest bits; bf16 for a float head); None where the shape or precision is unmeasured."""
    path = resources.files("mtpforge").joinpath("data", "head_precision.json")
    if not path.is_file():
        return None
    table = json.loads(path.read_text(encoding="utf-8"))
    row = next((r for r in table["shapes"].values() if family in r["families"]), None)
    if row is None:
        return None
    bits = sorted({int(q["bits"]) for q in head_quant.values() if isinstance(q.get("bits"), int)})
    label = str(bits[0]) if bits else "bf16"
    cell = row["mlx"].get(label)
    return None if cell is None else (("bf16" if label == "bf16" else f"{label}-bit"), float(cell["acceptance"]))


def align_note(folder: Path, family: str, head_quant: Mapping[str, Mapping[str, Any]], acceptance: float) -> Optional[str]:
    """A note naming ``mtpforge align`` when a quantized trunk is the likely cost, else None."""
    from .drafts import DEAD_AGREEMENT

    bits = trunk_bits(folder)
    # a head that drafts almost nothing is dead (precision, norms, hidden state: checks/drafts.py), not
    # merely mis-fitted to its trunk: re-fitting would hide what is wrong with it
    if bits is None or bits > TRUNK_BITS or acceptance < DEAD_AGREEMENT:
        return None
    expected = expected_acceptance(family, head_quant)
    if expected is None or acceptance >= expected[1] - GAP:
        return None
    label, want = expected
    return (f"acceptance {acceptance:.1%} is {(want - acceptance) * 100:.0f} points below what a {label} head of this shape "
            f"drafted on a full-precision trunk ({want:.1%}, docs/PRECISION.md), and this trunk is {bits}-bit: a "
            f"quantized trunk costs a head acceptance (docs/PERFORMANCE.md). `mtpforge align {folder}` re-fits the head "
            "to this trunk and keeps it only if acceptance rises")


__all__ = ["GAP", "TRUNK_BITS", "align_note", "expected_acceptance", "trunk_bits"]
