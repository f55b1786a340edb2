"""Family detection from config — never from the repo name (docs/SPEC.md §2)."""

from __future__ import annotations

from typing import Any, Mapping

from ..inputs.model_config import as_config
from . import FAMILIES
from .spec import FamilySpec
from .tables import is_moe


def detect_family(config: Mapping[str, Any]) -> str | None:
    """The name of the family whose spec claims this config's ``model_type``, else None.

    A config that names experts picks the MoE member of a dense/MoE pair whatever its
    model_type says; an unknown model_type is refused (None) even when the tensors look
    familiar — guessing a family is how heads get written into the wrong model.
    """
    cfg = as_config(config)
    mt, nested = cfg.model_type, cfg.nested
    cands = [s for s in FAMILIES.values() if mt in s.model_types and (s.nested_text_config or not nested)
             or mt is not None and mt == s.mlx_vlm_drafter_type]
    if not cands and nested:
        cands = [s for s in FAMILIES.values() if cfg.text_model_type in s.text_model_types]
    # a release whose config carries a family's marker key is that family's (DeepSeek-V4-DSpark)
    marked = [s for s in cands if s.config_marker is not None and s.config_marker in cfg.text_raw]
    cands = marked or [s for s in cands if s.config_marker is None]
    return _pick(cands, is_moe(cfg))


def _pick(cands: list[FamilySpec], moe: bool) -> str | None:
    if not cands:
        return None
    return next((s for s in cands if s.moe == moe), cands[0]).name
