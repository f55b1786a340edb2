"""Family detection from config and keys — never from the repo name (SPEC §2)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from .tables import is_moe


def detect_family(config: Mapping[str, Any], keys: Iterable[str] = ()) -> str | None:
    """``qwen3_5`` | ``qwen3_5_moe`` | ``qwen3_next`` | None for anything else.

    The top-level ``model_type`` decides; a Qwen3.5 config that names experts is MoE whatever its
    model_type says, and an unknown model_type whose keys look like Qwen3-Next is still refused
    (returns None) — guessing a family is how heads get written into the wrong model.
    """
    mt = config.get("model_type")
    tc = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    if mt == "qwen3_5_mtp":  # an mlx-vlm drafter folder: family of the text config it carries
        return "qwen3_5_moe" if is_moe(config) else "qwen3_5"
    if mt in ("qwen3_5", "qwen3_5_moe"):
        return "qwen3_5_moe" if is_moe(config) else "qwen3_5"
    if mt == "qwen3_next" and tc is None:
        return "qwen3_next"
    if tc is not None and tc.get("model_type") in ("qwen3_5_text", "qwen3_5_moe_text"):
        return "qwen3_5_moe" if is_moe(config) else "qwen3_5"
    return None
