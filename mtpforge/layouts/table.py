"""The layouts (docs/SPEC.md §5) by name, and the file names other modules need."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..families import FAMILIES
from . import embedded, mlx_vlm_drafter, sidecar, vllm_mlx
from .embedded import EMBEDDED_FILE
from .gguf import GGUF_LAYOUT_NAMES
from .mlx_vlm_drafter import is_drafter_type
from .sidecar import SIDECAR_FILE
from .spec import LayoutName, LayoutSpec, Placement
from .vllm_mlx import VLLM_MLX_DIR, VLLM_MLX_MANIFEST, VLLM_MLX_WEIGHTS

MANIFEST = "mtpforge.json"

LAYOUTS: dict[str, LayoutSpec] = {m.LAYOUT.name: m.LAYOUT for m in (embedded, sidecar, vllm_mlx, mlx_vlm_drafter)}
LAYOUT_NAMES = tuple(LAYOUTS)
assert LAYOUT_NAMES == tuple(n.value for n in LayoutName)


def placement(layout: str, family: str, config: Any = None) -> Placement:
    """The file and key spelling of ``layout`` for ``family``; a NextN family's prefixes carry
    the layer index, filled from ``config``."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}")
    spec = FAMILIES[family]
    if spec.gguf_only:
        raise ValueError(f"{family} has no MLX layout: mtpforge writes its head for llama.cpp only")
    pl = LAYOUTS[layout].place(spec)
    if not spec.topology.nextn:
        return pl
    if spec.topology.appended_steps:  # step i at N + i: the prefix stops before the index
        first = int(spec.fill("{N}", config))
        return replace(pl, prefix=pl.prefix.split("{N}")[0], module_prefix=pl.module_prefix.split("{N}")[0],
                       first_step=first)
    return replace(pl, prefix=spec.fill(pl.prefix, config), module_prefix=spec.fill(pl.module_prefix, config))


def runtime_module_path(bare_module: str, layout: str, family: str, config: Any = None) -> str:
    """The module path the layout's runtime builds for a head module: its per-path
    quantization key. A head found where no layout of its family puts it keeps the family's
    own prefix."""
    try:
        return placement(layout, family, config).module_path(bare_module)
    except (ValueError, KeyError):
        spec = FAMILIES[family]
        return spec.fill((spec.mlx_head_prefixes or (spec.hf_head_prefix,))[0], config) + bare_module


def loads_in_mlx_lm_glob(rel: str) -> bool:
    """mlx_lm.utils.load_model loads every ``model*.safetensors`` in the folder root."""
    return "/" not in rel and rel.startswith("model") and rel.endswith(".safetensors")


__all__ = [
    "EMBEDDED_FILE", "GGUF_LAYOUT_NAMES", "LAYOUTS", "LAYOUT_NAMES", "MANIFEST", "SIDECAR_FILE",
    "VLLM_MLX_DIR", "VLLM_MLX_MANIFEST", "VLLM_MLX_WEIGHTS", "LayoutName", "Placement", "is_drafter_type",
    "loads_in_mlx_lm_glob", "placement", "runtime_module_path",
]
