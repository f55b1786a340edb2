"""Runtimes as data: one row per runtime (``table.py``), quantization both ways in
``quant.py``, norm re-shift rules in ``norms.py``."""

from __future__ import annotations

from .spec import HeadFacts, OutputFormat, QuantAsk, QuantRule, RuntimeSpec, WriteRule
from .table import LAYOUT_WRITES, PORTABLE, RUNTIME_NAMES, RUNTIMES

__all__ = ["LAYOUT_WRITES", "PORTABLE", "RUNTIMES", "RUNTIME_NAMES", "HeadFacts", "OutputFormat", "QuantAsk",
           "QuantRule", "RuntimeSpec", "WriteRule"]
