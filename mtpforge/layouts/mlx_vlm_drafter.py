"""mlx-vlm drafter: a separate folder (``<target>-mtp-drafter``) with bare keys and its own
config (``model_type: qwen3_5_mtp``) that mlx-vlm's ``--draft-kind mtp`` loads."""

from __future__ import annotations

from ..families.spec import FamilySpec
from .spec import LayoutSpec, Placement

DRAFTER_MODEL_TYPE = "qwen3_5_mtp"
DRAFTER_FILE = "model.safetensors"


def place(family: FamilySpec) -> Placement:
    return Placement("mlx-vlm-drafter", DRAFTER_FILE, "", False, "", separate_folder=True)


LAYOUT = LayoutSpec("mlx-vlm-drafter", "mlx-vlm", place, has_backbone=False, source_experts=False,
                    separate_folder=True)
