"""A tiny DeepSeek-V3 / R1 (``deepseek_v3``, ``DeepseekV3ForCausalLM``) in the release's Hugging Face
layout, NextN (MTP) layer included, in bf16 or block-FP8 as released.

The tensors are GLM-4.7-Flash's (tests/support/synth/glm4_moe_lite.py: MLA attention with a
low-rank query, a dense first layer, then a sigmoid-routed MoE with ``e_score_correction_bias``
and one shared expert, experts stored one by one; the NextN layer at
``model.layers.{num_hidden_layers}`` with ``eh_proj``, ``enorm``, ``hnorm``, ``shared_head`` and an
``embed_tokens`` copy): transformers' ``modeling_deepseek_v3`` ignores that layer as it ignores
GLM's, so it is added the same way. What is DeepSeek's is the config: group-limited routing
(8 experts in 4 groups, 2 groups per token), ``routed_scaling_factor`` 2.5 and YaRN
``rope_scaling`` with ``mscale_all_dim``, as the release's config.json spells them.

``fp8=True`` stores the NextN layer's projections as the release does: F8_E4M3 with a
``weight_scale_inv`` per 128x128 block, the router, the norms and the vocabulary-sized
``embed_tokens`` / ``shared_head.head`` left in bf16 (``quantization_config`` says ``fp8``).

Vocabulary: the synthetic byte-level BPE (503 tokens) plus 9 DeepSeek-style special tokens, 512 in
all as in the GLM-4.7-Flash builder, so the same tensors can also be written under GLM-4.7-Flash's
config (``glm_shaped``), which llama.cpp's converter exports with its NextN block.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

from .family_common import build_family_tokenizer, random_tensors, scratch_dir, write_family_checkpoint, write_generation_config
from .glm4_moe_lite import tensor_specs

DEEPSEEK_SPECIAL = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                    "<｜tool▁sep｜>")
TRAINED_VOCAB = 503

#: config.json, spelled as DeepSeek-V3's release spells it (tiny values)
CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 503,
    "eos_token_id": 504,
    "ep_size": 1,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "kv_lora_rank": 64,
    "max_position_embeddings": 16384,
    "moe_intermediate_size": 64,
    "moe_layer_freq": 1,
    "n_group": 4,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 2,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 64,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 16,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 4, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 2,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "use_cache": True,
    "v_head_dim": 64,
    "vocab_size": 512,
}
#: the release's block-FP8 declaration
FP8_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
#: NextN tensors the release keeps in bf16 beside its FP8 projections
FP8_KEEP = ("mlp.gate.weight", "embed_tokens.weight", "shared_head.head.weight")


def tiny_config(**overrides: Any) -> dict[str, Any]:
    c = copy.deepcopy(CONFIG)
    c.update(overrides)
    return c


def nextn_keys(config: dict[str, Any]) -> list[str]:
    p = f"model.layers.{config['num_hidden_layers']}."
    return sorted(k for k in tensor_specs(config) if k.startswith(p))


def build_deepseek_v3(out_dir: str | Path, *, seed: int = 0, n_shards: int = 2, fp8: bool = False,
                      head: bool = True, **overrides: Any) -> Path:
    """Write the tiny DeepSeek-V3 checkpoint into ``out_dir`` and return it; ``overrides`` are
    config.json keys. The NextN ``embed_tokens`` / ``shared_head.head`` are copies of the trunk's
    embedding and ``lm_head``, as in the release. ``head=False`` leaves the NextN layer out (the
    config still declares it): the folder mlx-lm converts, whose ``deepseek_v3`` sanitize drops
    the release's NextN layer by its index (``model.layers.61``) and so fails on a tiny one; the
    trunk's tensors are the same (each is drawn from its own name)."""
    config = tiny_config(**overrides)
    tensors = random_tensors(tensor_specs(config, nextn=head), seed=seed, float32=("e_score_correction_bias",))
    p = f"model.layers.{config['num_hidden_layers']}."
    if head:
        tensors[p + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"]
        tensors[p + "shared_head.head.weight"] = tensors["lm_head.weight"]
    with scratch_dir() as tmp:
        ids = build_family_tokenizer(Path(tmp), TRAINED_VOCAB, DEEPSEEK_SPECIAL, eos=DEEPSEEK_SPECIAL[1],
                                     bos=DEEPSEEK_SPECIAL[0])
        assert ids[DEEPSEEK_SPECIAL[0]] == config["bos_token_id"] and ids[DEEPSEEK_SPECIAL[1]] == config["eos_token_id"]
        out = write_family_checkpoint(out_dir if not fp8 else Path(str(out_dir) + ".bf16"), config, tensors, Path(tmp),
                                      n_shards=n_shards)
    write_generation_config(out, config)
    if not fp8:
        return out
    return to_fp8_release(out, Path(out_dir), config)


def to_fp8_release(bf16: Path, dst: Path, config: dict[str, Any]) -> Path:
    """The block-FP8 form of a bf16 build: its NextN projections FP8 with ``weight_scale_inv``,
    ``quantization_config`` declared; ``bf16`` is removed."""
    from .fp8 import to_block_fp8

    p = f"model.layers.{config['num_hidden_layers']}."
    keep = {p + k for k in FP8_KEEP}

    def fp8(name: str) -> bool:
        return (name.startswith(p) and name not in keep
                and not name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")))

    out = to_block_fp8(bf16, dst, fp8)
    shutil.rmtree(bf16)
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = dict(FP8_CONFIG)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def glm_shaped(src: Path, glm_tokenizer: Path, dst: Path) -> Path:
    """The same tensors under GLM-4.7-Flash's config and tokenizer (from ``glm_tokenizer``, a
    tiny GLM-4.7-Flash folder of the same vocabulary size): the checkpoint llama.cpp's converter
    exports a NextN block for (``Glm4MoeLiteModel``), where for DeepSeek-V3 it drops it."""
    from .glm4_moe_lite import CONFIG as GLM

    shutil.copytree(src, dst)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update({k: GLM[k] for k in ("architectures", "model_type", "bos_token_id", "eos_token_id", "pad_token_id",
                                    "partial_rotary_factor")})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(glm_tokenizer / name, dst / name)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_generation_config(dst, cfg)
    return dst
