"""vllm-mlx: Qwen3.5/3.6 read ``mtp/weights.safetensors`` + ``mtp/manifest.json``; Qwen3-Next
reads ``mtp.*`` from ``model-mtp.safetensors`` (indexed), which released mlx-lm refuses."""

from __future__ import annotations

from ..families.spec import FamilySpec
from .embedded import EMBEDDED_FILE
from .spec import LayoutSpec, Placement

VLLM_MLX_DIR = "mtp"
VLLM_MLX_WEIGHTS = "mtp/weights.safetensors"
VLLM_MLX_MANIFEST = "mtp/manifest.json"


#: vllm-mlx reads the layer count from this flat key, whatever the family writes itself
VLLM_MLX_COUNT_KEY = "num_nextn_predict_layers"


def place(family: FamilySpec) -> Placement:
    keys = (VLLM_MLX_COUNT_KEY,) + tuple(k for k in family.count_keys_written if k != VLLM_MLX_COUNT_KEY)
    if family.nested_text_config:
        return Placement("vllm-mlx", VLLM_MLX_WEIGHTS, family.head_file_prefix, False, family.mlx_head_prefixes[0],
                         count_keys=keys, vllm_manifest=True)
    return Placement("vllm-mlx", EMBEDDED_FILE, family.head_file_prefix, True, family.mlx_head_prefixes[0],
                     count_keys=keys)


LAYOUT = LayoutSpec("vllm-mlx", "vllm-mlx", place)
