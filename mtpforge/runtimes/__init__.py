"""Runtimes as data: one row per runtime (``table.py``), predicates in ``quant.py``."""

from __future__ import annotations

from .spec import OutputFormat, QuantAsk, QuantRule, RuntimeSpec
from .table import RUNTIME_NAMES, RUNTIMES

__all__ = ["RUNTIMES", "RUNTIME_NAMES", "OutputFormat", "QuantAsk", "QuantRule", "RuntimeSpec"]
