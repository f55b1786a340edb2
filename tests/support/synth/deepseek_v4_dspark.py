"""The tiny DeepSeek-V4 ``-DSpark`` release under its family's name (tests/support/families.py
finds every family's builder as ``tests.support.synth.<family>.build_<family>``)."""

from __future__ import annotations

from .deepseek_v4 import build_deepseek_v4_dspark

__all__ = ["build_deepseek_v4_dspark"]
