"""A tiny GLM-4.5-style checkpoint (``glm4_moe``) in the Hugging Face layout, NextN head included.

The trunk's keys and shapes are taken from mlx-lm's own ``glm4_moe.Model`` built at tiny
dimensions (so mlx-lm loads what is written), with its stacked experts written back per expert
as the release stores them. The NextN head is one more decoder layer at
``model.layers.{num_hidden_layers}``: the MoE layer's keys plus ``eh_proj`` [H, 2H], ``enorm``,
``hnorm``, ``shared_head.norm`` and, in GLM-4.5's shape, its own ``shared_head.head`` and
``embed_tokens`` (GLM-4.6 leaves those two out and shares the trunk's: ``with_shared_head=False``).

The tokenizer is the synthetic byte-level BPE with GLM's four special tokens appended
(llama.cpp's GLM vocabulary reads ``[gMASK]``, ``<|user|>``, ``<|endoftext|>`` and
``<|observation|>``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from .tokenizer import build_tokenizer
from .write import write_hf_checkpoint

#: GLM's special tokens that llama.cpp's converter looks up (``<|endoftext|>`` is already id 0)
GLM_SPECIAL = ("[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|observation|>")
BASE_VOCAB = 505


def tiny_glm4_moe_config(vocab_size: int, **overrides: Any) -> dict[str, Any]:
    """GLM-4.5's config keys at tiny dimensions: a dense first layer, then MoE layers."""
    cfg: dict[str, Any] = {
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
        "vocab_size": vocab_size, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
        "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
        "num_nextn_predict_layers": 1, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_scaling": None, "use_qk_norm": False,
        "attention_bias": True, "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "float32",
        "bos_token_id": None, "eos_token_id": 0, "pad_token_id": 0,
    }
    cfg.update(overrides)
    return cfg


def _trunk_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """mlx-lm's parameter names and shapes for this config, experts unstacked as released."""
    from mlx.utils import tree_flatten
    from mlx_lm.models import glm4_moe

    args = glm4_moe.ModelArgs.from_dict(config)
    model = glm4_moe.Model(args)
    out: dict[str, tuple[int, ...]] = {}
    for k, v in tree_flatten(model.parameters()):
        if ".switch_mlp." in k:
            pre, proj = k.split(".switch_mlp.")
            for e in range(v.shape[0]):
                out[f"{pre}.experts.{e}.{proj}"] = tuple(v.shape[1:])
        else:
            out[k] = tuple(v.shape)
    return out


def nextn_shapes(config: dict[str, Any], trunk: dict[str, tuple[int, ...]], with_shared_head: bool) -> dict[str, tuple[int, ...]]:
    """The NextN layer: the last MoE layer's keys re-indexed to N, and the NextN-only tensors."""
    n, h, v = config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]
    last = f"model.layers.{n - 1}."
    out = {f"model.layers.{n}." + k[len(last):]: s for k, s in trunk.items() if k.startswith(last)}
    p = f"model.layers.{n}."
    out.update({p + "eh_proj.weight": (h, 2 * h), p + "enorm.weight": (h,), p + "hnorm.weight": (h,),
                p + "shared_head.norm.weight": (h,)})
    if with_shared_head:
        out.update({p + "shared_head.head.weight": (v, h), p + "embed_tokens.weight": (v, h)})
    return out


def _random(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, mx.array]:
    """Linear weights ~ N(0, 1/fan_in), raw RMSNorm weights near 1 (GLM's norms are raw), biases small."""
    rng = np.random.default_rng(seed)
    out: dict[str, mx.array] = {}
    for k in sorted(shapes):
        s = shapes[k]
        if k.endswith("norm.weight") or "layernorm" in k:
            a = 1.0 + 0.1 * rng.standard_normal(s)
        elif k.endswith("e_score_correction_bias") or k.endswith(".bias"):
            a = 0.02 * rng.standard_normal(s)
        else:
            a = rng.standard_normal(s) / np.sqrt(s[-1])
        out[k] = mx.array(a.astype(np.float32))
    return out


def _glm_tokenizer(folder: Path) -> int:
    """The synthetic BPE plus GLM's special tokens; returns the vocabulary size."""
    from tokenizers import AddedToken, Tokenizer

    build_tokenizer(None, BASE_VOCAB, folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GLM_SPECIAL])
    tok.save(str(folder / "tokenizer.json"), pretty=True)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    for t in GLM_SPECIAL:
        cfg["added_tokens_decoder"][str(tok.token_to_id(t))] = {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    cfg["eos_token"] = "<|endoftext|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return tok.get_vocab_size()


def build_glm4_moe(folder: str | Path, *, seed: int = 0, with_shared_head: bool = True, n_shards: int = 2,
                   **overrides: Any) -> Path:
    """Write a complete tiny GLM-4.5-style checkpoint (trunk + NextN head) into ``folder``."""
    folder = Path(folder)
    tok_dir = folder / ".tokenizer"
    vocab = _glm_tokenizer(tok_dir)
    config = tiny_glm4_moe_config(vocab, **overrides)
    trunk = _trunk_shapes(config)
    tensors = _random({**trunk, **nextn_shapes(config, trunk, with_shared_head)}, seed)
    write_hf_checkpoint(folder, config, tensors, n_shards=n_shards, tokenizer_dir=tok_dir)
    for p in tok_dir.iterdir():
        p.unlink()
    tok_dir.rmdir()
    return folder
