"""embedded: ``model-mtp.safetensors`` beside the backbone shards, in the index, under the
language model's prefix — what mlx-lm #990 (and oMLX, exo's second probe) loads, and for
Nemotron-H what mlx-lm #1533 loads (its sanitize keeps ``mtp.*`` keys once the config declares
the head)."""

from __future__ import annotations

from ..families.spec import FamilySpec
from .spec import LayoutSpec, Placement

EMBEDDED_FILE = "model-mtp.safetensors"


def place(family: FamilySpec) -> Placement:
    if "embedded" not in family.layouts:
        raise ValueError(f"the embedded layout is not written for {family.name}: its MLX runtimes read "
                         f"{' or '.join(family.layouts) or 'no MLX layout'}")
    prefix = family.mlx_head_prefixes[0]
    return Placement("embedded", EMBEDDED_FILE, prefix, True, prefix, count_keys=family.count_keys_written)


LAYOUT = LayoutSpec("embedded", "mlx-lm-mtp", place)
