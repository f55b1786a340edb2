"""A tiny DeepSeek-V3.2 (``deepseek_v32``, ``DeepseekV32ForCausalLM``) in the release's Hugging Face
layout, NextN (MTP) layer included.

The layers are GLM-4.7-Flash's (tests/support/synth/glm4_moe_lite.py: MLA with a low-rank query,
a dense first layer, then sigmoid-routed MoE with ``e_score_correction_bias`` and one shared
expert, experts stored one by one) plus DeepSeek Sparse Attention's indexer in every layer, the
NextN layer included (``self_attn.indexer.{wq_b,wk,k_norm,weights_proj}``; ``k_norm`` is a
LayerNorm with a bias). ``index_head_dim`` is 64: llama.cpp rotates the indexer's q/k with a
Hadamard matrix of at least 64x64 and stops in ``ggml_can_mul_mat`` below that (measured).

The tokenizer is the synthetic byte-level BPE with DeepSeek's sentence tokens, stored as
``vocab.json`` + ``merges.txt`` (no ``tokenizer.json``): llama.cpp's ``DeepseekV32Model.set_vocab``
asserts the tokenizer adds a BOS, and transformers 5 drops ``add_bos_token`` from
tokenizer_config.json whenever a tokenizer.json exists; built from the vocabulary files, the
tokenizer keeps it (true, as DeepSeek's releases say).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from .family_common import (Spec, build_family_tokenizer, linear, random_tensors, raw_norm, scratch_dir,
                            write_family_checkpoint, write_generation_config)
from .glm4_moe_lite import CONFIG as GLM_CONFIG
from .glm4_moe_lite import tensor_specs as mla_specs

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
TRAINED_VOCAB = 503

#: config.json, spelled as the release spells it (tiny values)
CONFIG: dict[str, Any] = {
    **{k: v for k, v in GLM_CONFIG.items() if k not in ("partial_rotary_factor",)},
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "bos_token_id": 503,
    "eos_token_id": 504,
    "pad_token_id": 504,
    "n_group": 1,
    "topk_group": 1,
    "index_n_heads": 2,
    "index_head_dim": 64,
    "index_topk": 2048,
}


def tiny_config(**overrides: Any) -> dict[str, Any]:
    return {**json.loads(json.dumps(CONFIG)), **overrides}


def indexer_specs(config: dict[str, Any], layers: range) -> dict[str, Spec]:
    """The DSA indexer's tensors of each layer in ``layers``."""
    h, rq, n, d = config["hidden_size"], config["q_lora_rank"], config["index_n_heads"], config["index_head_dim"]
    s: dict[str, Spec] = {}
    for i in layers:
        p = f"model.layers.{i}.self_attn.indexer."
        s[p + "wq_b.weight"] = linear(n * d, rq)
        s[p + "wk.weight"] = linear(d, h)
        s[p + "k_norm.weight"] = raw_norm(d)
        s[p + "k_norm.bias"] = ((d,), "norm", 0.0, 0.05)
        s[p + "weights_proj.weight"] = linear(n, h)
    return s


def tensor_specs(config: dict[str, Any], *, nextn: bool = True) -> dict[str, Spec]:
    """name -> (shape, kind, loc, scale): GLM-4.7-Flash's layers with an indexer in each."""
    n = config["num_hidden_layers"] + (int(config.get("num_nextn_predict_layers") or 0) if nextn else 0)
    return {**mla_specs(config, nextn=nextn), **indexer_specs(config, range(n))}


def nextn_keys(config: dict[str, Any]) -> list[str]:
    n = config["num_hidden_layers"]
    prefixes = tuple(f"model.layers.{n + k}." for k in range(int(config.get("num_nextn_predict_layers") or 0)))
    return sorted(k for k in tensor_specs(config) if k.startswith(prefixes))


def vocabulary_files(folder: Path) -> None:
    """Replace ``folder``'s tokenizer.json by vocab.json + merges.txt (the same BPE) and have
    tokenizer_config.json name a class that builds from them and keeps ``add_bos_token``, padding
    with the end-of-sentence token."""
    tj_path, tc_path = folder / "tokenizer.json", folder / "tokenizer_config.json"
    model = json.loads(tj_path.read_text(encoding="utf-8"))["model"]
    (folder / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False), encoding="utf-8")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    tj_path.unlink()
    tc = json.loads(tc_path.read_text(encoding="utf-8"))
    # DeepSeek's releases pad with the end-of-sentence token, as config.json's pad_token_id says
    tc.update(tokenizer_class="GPT2Tokenizer", add_bos_token=True, add_eos_token=False, pad_token=EOS)
    tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def build_deepseek_v32(out_dir: str | Path, *, seed: int = 0, n_shards: int = 2, **overrides: Any) -> Path:
    """Write the tiny DeepSeek-V3.2 checkpoint into ``out_dir`` and return it (``overrides``:
    config.json keys). The NextN layer's ``embed_tokens`` / ``shared_head.head`` are the trunk's."""
    config = tiny_config(**overrides)
    tensors = random_tensors(tensor_specs(config), seed=seed, float32=("e_score_correction_bias",))
    for k in range(int(config.get("num_nextn_predict_layers") or 0)):
        p = f"model.layers.{config['num_hidden_layers'] + k}."
        tensors[p + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"]
        tensors[p + "shared_head.head.weight"] = tensors["lm_head.weight"]
    with scratch_dir() as tmp:
        ids = build_family_tokenizer(Path(tmp), TRAINED_VOCAB, (BOS, EOS), eos=EOS, bos=BOS)
        assert (ids[BOS], ids[EOS]) == (config["bos_token_id"], config["eos_token_id"]), ids
        vocabulary_files(Path(tmp))
        out = write_family_checkpoint(out_dir, config, tensors, Path(tmp), n_shards=n_shards)
    write_generation_config(out, config)
    return out


def release_fp8(config: dict[str, Any]) -> Callable[[str], bool]:
    """The NextN layer's tensors the FP8 releases (DeepSeek's, GLM-5's) store as F8_E4M3 with 128x128
    ``weight_scale_inv``: its attention (the indexer's query and key included) and MLP
    projections; the router, the indexer's head weights, norms and the NextN tensors stay bf16."""
    prefix = f"model.layers.{config['num_hidden_layers']}."

    def fp8(name: str) -> bool:
        return name.startswith((prefix + "self_attn.", prefix + "mlp.")) and (
            name.endswith(("proj.weight", "indexer.wq_b.weight", "indexer.wk.weight")) and not name.endswith("weights_proj.weight"))

    return fp8


def build_deepseek_v32_fp8(out_dir: str | Path, **kwargs: Any) -> Path:
    """The tiny checkpoint as DeepSeek releases it: the NextN layer's projections block-FP8,
    ``quantization_config`` in config.json (tests/support/synth/fp8.py)."""
    out = Path(out_dir)
    return as_fp8_release(build_deepseek_v32(out.with_name(out.name + "-bf16"), **kwargs), out)


def as_fp8_release(bf16: Path, out: Path) -> Path:
    """A copy of the bf16 checkpoint ``bf16`` whose NextN projections are block-FP8 (``release_fp8``)."""
    from .fp8 import to_block_fp8

    return to_block_fp8(bf16, out, release_fp8(json.loads((bf16 / "config.json").read_text())), announce=True)
