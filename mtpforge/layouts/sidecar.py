"""sidecar: ``mtp.safetensors`` at the root, outside the index and outside mlx-lm's
``model*.safetensors`` glob, referenced from config.json — released mlx-lm never sees it."""

from __future__ import annotations

from ..families.spec import FamilySpec
from .spec import LayoutSpec, Placement

SIDECAR_FILE = "mtp.safetensors"
#: config.json key that names the sidecar (read by MTPLX and exo)
SIDECAR_CONFIG_KEY = "mlx_lm_extra_tensors"


def place(family: FamilySpec) -> Placement:
    return Placement("sidecar", SIDECAR_FILE, family.head_file_prefix, False, family.mlx_head_prefixes[0],
                     count_keys=family.count_keys_written, sidecar_reference=True)


LAYOUT = LayoutSpec("sidecar", "mtplx", place)
