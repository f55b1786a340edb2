"""mlx-vlm drafter: a separate folder (``<target>-mtp-drafter``) with bare keys and its own
config (``model_type``: the family's ``mlx_vlm_drafter_type``, e.g. ``qwen3_5_mtp``,
``nemotron_h_mtp``) that mlx-vlm's ``--draft-kind mtp`` loads."""

from __future__ import annotations

from ..families import FAMILIES
from ..families.spec import FamilySpec
from .spec import LayoutSpec, Placement

#: the ``model_type`` values of the drafter folders mtpforge writes (one per family that has one)
DRAFTER_MODEL_TYPES = frozenset(f.mlx_vlm_drafter_type for f in FAMILIES.values() if f.mlx_vlm_drafter_type)
DRAFTER_FILE = "model.safetensors"


def is_drafter_type(model_type: object) -> bool:
    """A config's ``model_type`` names a drafter folder mtpforge writes (any other value, a
    non-string included, does not)."""
    return isinstance(model_type, str) and model_type in DRAFTER_MODEL_TYPES


def place(family: FamilySpec) -> Placement:
    return Placement("mlx-vlm-drafter", DRAFTER_FILE, "", False, "", separate_folder=True)


LAYOUT = LayoutSpec("mlx-vlm-drafter", "mlx-vlm", place, has_backbone=False, source_experts=False,
                    separate_folder=True)
