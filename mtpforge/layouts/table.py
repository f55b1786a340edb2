"""Where each runtime expects the MTP tensors (SPEC §5), as data."""

from __future__ import annotations

from dataclasses import dataclass

MANIFEST = "mtpforge.json"
VLLM_MLX_DIR = "mtp"
VLLM_MLX_WEIGHTS = "mtp/weights.safetensors"
VLLM_MLX_MANIFEST = "mtp/manifest.json"
SIDECAR_FILE = "mtp.safetensors"
EMBEDDED_FILE = "model-mtp.safetensors"
DRAFTER_MODEL_TYPE = "qwen3_5_mtp"
LAYOUT_NAMES = ("embedded", "sidecar", "vllm-mlx", "mlx-vlm-drafter")

#: Runtimes inspect knows (CONTRACT `--runtime`).
RUNTIMES = ("mlx-lm", "mlx-lm-mtp", "vllm-mlx", "exo", "mtplx", "mlx-vlm")


@dataclass(frozen=True)
class Placement:
    """Where one layout puts a family's head: file, key prefix, and whether the index lists it."""

    layout: str
    file: str
    prefix: str
    in_index: bool


def placement(layout: str, family: str) -> Placement:
    """The file and key spelling of ``layout`` for ``family``."""
    nested = family in ("qwen3_5", "qwen3_5_moe")
    if layout == "embedded":
        if not nested:
            raise ValueError("the embedded layout is for Qwen3.5/3.6; for Qwen3-Next use vllm-mlx")
        return Placement(layout, EMBEDDED_FILE, "language_model.mtp.", True)
    if layout == "sidecar":
        return Placement(layout, SIDECAR_FILE, "mtp.", False)
    if layout == "vllm-mlx":
        if nested:
            return Placement(layout, VLLM_MLX_WEIGHTS, "mtp.", False)
        return Placement(layout, EMBEDDED_FILE, "mtp.", True)
    if layout == "mlx-vlm-drafter":
        return Placement(layout, "model.safetensors", "", False)
    raise ValueError(f"unknown layout {layout!r}")


def runtime_module_path(bare_module: str, layout: str, family: str) -> str:
    """The module path a runtime builds for a head module (bare, no ``.weight``) — the key its
    loader looks up in ``config["quantization"]`` (SPEC §4: paths after sanitize)."""
    if layout == "mlx-vlm-drafter":
        return bare_module
    if family in ("qwen3_5", "qwen3_5_moe"):
        return f"language_model.mtp.{bare_module}"
    return f"mtp.{bare_module}"


def loads_in_mlx_lm_glob(rel: str) -> bool:
    """mlx_lm.utils.load_model loads every ``model*.safetensors`` in the folder root."""
    return "/" not in rel and rel.startswith("model") and rel.endswith(".safetensors")
