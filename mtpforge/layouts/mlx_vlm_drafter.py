"""mlx-vlm drafter: a separate folder (``<target>-mtp-drafter``) with its own config
(``model_type``: the family's ``mlx_vlm_drafter_type``, e.g. ``qwen3_5_mtp``, ``nemotron_h_mtp``)
that mlx-vlm's ``--draft-kind mtp`` loads strictly, its keys as the family's drafter model holds
them: bare (Qwen, Nemotron-H), or GLM-5's ``mtp.``-prefixed, renamed and MLA-split spelling."""

from __future__ import annotations

from ..families import FAMILIES
from ..families.spec import FamilySpec, Role
from .spec import LayoutSpec, Placement

#: the ``model_type`` values of the drafter folders mtpforge writes (one per family that has one)
DRAFTER_MODEL_TYPES = frozenset(f.mlx_vlm_drafter_type for f in FAMILIES.values() if f.mlx_vlm_drafter_type)
DRAFTER_FILE = "model.safetensors"


def is_drafter_type(model_type: object) -> bool:
    """A config's ``model_type`` names a drafter folder mtpforge writes (any other value, a
    non-string included, does not)."""
    return isinstance(model_type, str) and model_type in DRAFTER_MODEL_TYPES


#: what every mlx-vlm drafter binds from the target model (``bind``: its embedding and
#: ``lm_head``), so a NextN layer's own copies have no parameter there and its strict load refuses them
FROM_TARGET = frozenset({Role.EMBED_TOKENS, Role.SHARED_HEAD})


def place(family: FamilySpec) -> Placement:
    """The drafter's spelling: the family's drafter prefix and renames, and the tensors mlx-vlm's
    model holds split (``mlx_layer_parts``) stored split, as its splitter writes them."""
    prefix = family.mlx_vlm_drafter_prefix
    return Placement("mlx-vlm-drafter", DRAFTER_FILE, prefix, False, prefix, separate_folder=True,
                     renames=tuple(family.mlx_vlm_drafter_renames.items()),
                     parts=tuple(family.mlx_layer_parts.items()), skip_roles=FROM_TARGET)


LAYOUT = LayoutSpec("mlx-vlm-drafter", "mlx-vlm", place, has_backbone=False, source_experts=False,
                    separate_folder=True)
