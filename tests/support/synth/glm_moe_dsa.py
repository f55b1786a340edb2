"""A tiny GLM-5 (``glm_moe_dsa``, ``GlmMoeDsaForCausalLM``) in the release's Hugging Face layout,
NextN (MTP) layer included.

The layers are DeepSeek-V3.2's (tests/support/synth/deepseek_v32.py: GLM-4.7-Flash's MLA and MoE
with DeepSeek Sparse Attention's indexer in every layer, ``index_head_dim`` 64 for llama.cpp's
Hadamard rotation); every indexer is ``full`` (transformers' default schedule for this config).
The tokenizer is GLM-4.7-Flash's (its role tokens, which llama.cpp's GLM vocabulary code looks up
by name).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .deepseek_v32 import as_fp8_release, tensor_specs
from .family_common import (build_family_tokenizer, random_tensors, scratch_dir, write_family_checkpoint,
                            write_generation_config)
from .glm4_moe_lite import CONFIG as GLM_CONFIG
from .glm4_moe_lite import GLM_SPECIAL, TRAINED_VOCAB

#: config.json, spelled as the release spells it (tiny values)
CONFIG: dict[str, Any] = {
    **GLM_CONFIG,
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "index_n_heads": 2,
    "index_head_dim": 64,
    "index_topk": 2048,
    # transformers 5's spelling, which GLM-5's config.json uses and mlx-lm's glm_moe_dsa requires
    "rope_parameters": {"rope_type": "default", "rope_theta": GLM_CONFIG["rope_theta"]},
}


def tiny_config(**overrides: Any) -> dict[str, Any]:
    return {**json.loads(json.dumps(CONFIG)), **overrides}


def build_glm_moe_dsa(out_dir: str | Path, *, seed: int = 0, n_shards: int = 2, **overrides: Any) -> Path:
    """Write the tiny GLM-5 checkpoint into ``out_dir`` and return it (``overrides``: config.json
    keys). The NextN layer's ``embed_tokens`` / ``shared_head.head`` are the trunk's."""
    config = tiny_config(**overrides)
    tensors = random_tensors(tensor_specs(config), seed=seed, float32=("e_score_correction_bias",))
    for k in range(int(config.get("num_nextn_predict_layers") or 0)):
        p = f"model.layers.{config['num_hidden_layers'] + k}."
        tensors[p + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"]
        tensors[p + "shared_head.head.weight"] = tensors["lm_head.weight"]
    with scratch_dir() as tmp:
        build_family_tokenizer(Path(tmp), TRAINED_VOCAB, GLM_SPECIAL, eos="<|endoftext|>")
        out = write_family_checkpoint(out_dir, config, tensors, Path(tmp), n_shards=n_shards)
    write_generation_config(out, config)
    return out


def build_glm_moe_dsa_fp8(out_dir: str | Path, **kwargs: Any) -> Path:
    """The tiny checkpoint as GLM-5-FP8 releases it: the NextN layer's projections block-FP8,
    ``quantization_config`` in config.json."""
    out = Path(out_dir)
    return as_fp8_release(build_glm_moe_dsa(out.with_name(out.name + "-bf16"), **kwargs), out)
