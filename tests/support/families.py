"""The tiny checkpoint of every registered family, found by the family's name.

Tests that run once per family take their families from ``mtpforge.families.FAMILIES`` and their
checkpoints from here, so a family added to the registry is tested without editing a hand-kept
list (one was left behind when five families were added). The builders follow one convention:
the Qwen variants are ``build_hf_variant(name)``, every other family's is
``tests.support.synth.<name>.build_<name>``; a family without one fails here by name.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from mtpforge.families import FAMILIES


def tiny_source(family: str, folder: Path, **kw: Any) -> Path:
    """The tiny Hugging Face checkpoint of ``family``, head included, built into ``folder``."""
    from tests.support.synth import VARIANTS, build_hf_variant

    if family not in FAMILIES:
        raise KeyError(f"{family} is not a registered family")
    if family in VARIANTS:
        return build_hf_variant(family, folder, **kw)
    try:
        module = importlib.import_module(f"tests.support.synth.{family}")
    except ModuleNotFoundError as e:
        raise AssertionError(f"no tiny checkpoint for {family}: add tests/support/synth/{family}.py "
                             f"with build_{family}(folder)") from e
    return Path(getattr(module, f"build_{family}")(folder, **kw))


def mlx_trunk(family: str, src: Path, folder: Path) -> Path:
    """``mlx_lm.convert`` of the family's tiny model at 4 bits: the MLX folder add-mtp writes into
    (DeepSeek-V3's from a head-less build: mlx-lm's sanitize drops its NextN layer only at the
    release's index, 61)."""
    from tests.support.synth import convert_to_mlx

    base = tiny_source(family, folder.with_name(folder.name + "-headless"), head=False) \
        if family == "deepseek_v3" else src
    return convert_to_mlx(base, folder, q_bits=4, q_group_size=32, dtype="float32")


def _mlx_lm_has(family: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(f"mlx_lm.models.{family}") is not None


#: the families mtpforge writes into MLX folders whose target ``mlx_lm.convert`` makes, with their
#: layouts, from the registry (Qwen3.8-Flash-Next's target is mlx-vlm's convert, in mlx-vlm's own
#: virtualenv: tests/test_family_qwen4_exp.py drives it, undo included)
MLX_LAYOUTS: dict[str, tuple[str, ...]] = {n: s.layouts for n, s in FAMILIES.items() if s.layouts and _mlx_lm_has(n)}
#: the GGUF outputs each family's head has: the sibling where llama.cpp has its architecture, the
#: tail too unless the head keeps tensors outside its block (one set per file: DeepSeek-V4)
GGUF_LAYOUTS: dict[str, tuple[str, ...]] = {
    n: ("gguf-mtp",) + (() if s.gguf_root_names else ("gguf-tail",)) for n, s in FAMILIES.items() if s.gguf_arch}

__all__ = ["GGUF_LAYOUTS", "MLX_LAYOUTS", "mlx_trunk", "tiny_source"]
