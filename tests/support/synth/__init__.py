"""Synthetic tiny checkpoints in the real Hugging Face layout of Qwen3.5 / 3.6 / Qwen3-Next, and
MLX targets made from them with the real ``mlx_lm.convert``.

Used by the test suite, by benchmarks (synthetic repos that copy real shard layouts) and by the
script that exports the bundled trained tiny model. Nothing here is mocked: the files are real
safetensors shards with a real index, config and BPE tokenizer, and mlx-lm loads them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .config import (
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    VARIANTS,
    text_config,
    tiny_config,
    variant_of,
)
from mtpforge.community import convert_to_mlx
from .tensors import hf_tensor_specs, mtp_tensor_names, random_hf_tensors
from .tokenizer import build_tokenizer, default_corpus
from .write import plan_shards, write_hf_checkpoint

__all__ = [
    "EOS_ID", "PAD_ID", "SPECIAL_TOKENS", "VARIANTS",
    "build_hf_variant", "build_tokenizer", "convert_to_mlx", "default_corpus", "hf_tensor_specs",
    "mtp_tensor_names", "plan_shards", "random_hf_tensors", "text_config", "tiny_config",
    "variant_of", "write_hf_checkpoint",
]


def build_hf_variant(
    variant: str,
    folder: str | Path,
    *,
    seed: int = 0,
    n_shards: int = 3,
    mtp_shards: int = 2,
    **overrides: Any,
) -> Path:
    """A complete tiny HF checkpoint of ``variant`` in ``folder``; ``overrides`` go to
    ``tiny_config`` (text-config keys)."""
    config = tiny_config(variant, **overrides)
    tensors = random_hf_tensors(config, seed=seed)
    return write_hf_checkpoint(folder, config, tensors, n_shards=n_shards, mtp_shards=mtp_shards)
