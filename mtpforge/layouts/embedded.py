"""embedded: ``model-mtp.safetensors`` beside the backbone shards, in the index, under the
language model's prefix — what mlx-lm #990 (and oMLX, exo's second probe) loads."""

from __future__ import annotations

from ..families.spec import FamilySpec
from .spec import LayoutSpec, Placement

EMBEDDED_FILE = "model-mtp.safetensors"


def place(family: FamilySpec) -> Placement:
    if not family.nested_text_config:
        raise ValueError("the embedded layout is for Qwen3.5/3.6; for Qwen3-Next use vllm-mlx")
    prefix = family.mlx_head_prefixes[0]
    return Placement("embedded", EMBEDDED_FILE, prefix, True, prefix, count_keys=family.count_keys_written)


LAYOUT = LayoutSpec("embedded", "mlx-lm-mtp", place)
