"""A tiny MiMo-V2.5 (``mimo_v2``, ``MiMoV2ForCausalLM``) checkpoint in the release's Hugging Face
layout, MTP layers included, and its FP8 release.

MiMo-V2-Flash's text model (``synth.mimo_v2_flash``), configured flat at the top level as the
release's config.json is (its vision and audio towers are not the head's and not written here),
with every attention's projections stored as one ``self_attn.qkv_proj`` [q | k | v] rows. The FP8
release shards that matrix across tensor-parallel ranks: its rows lie rank by rank, each rank's
own [q | k | v] share, each rank quantized in 128-row blocks of its own (``fp8_qkv``) — the layout
llama.cpp's converter regroups (``conversion/mimo.py``, ``_tp_aware_qkv_dequant``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .family_common import Spec, build_random_checkpoint, linear
from .mimo_v2_flash import FLOAT32, TRAINED_VOCAB
from .mimo_v2_flash import tensor_specs as flash_specs
from .mimo_v2_flash import tiny_config as flash_config

#: config.json's keys that differ from MiMo-V2-Flash's
OVERRIDES: dict[str, Any] = {"architectures": ["MiMoV2ForCausalLM"], "model_type": "mimo_v2",
                             "attention_projection_layout": "fused_qkv"}
#: the tiny FP8 release's tensor-parallel ranks (V2.5 ships 4, V2.5-Pro 8)
TP = 4


def tiny_config(**overrides: Any) -> dict[str, Any]:
    return flash_config(**{**OVERRIDES, **overrides})


def tensor_specs(config: dict[str, Any], *, mtp: bool = True) -> dict[str, Spec]:
    """MiMo-V2-Flash's tensors with each attention's q / k / v as one ``qkv_proj``."""
    s = flash_specs(config, mtp=mtp)
    for q in [k for k in s if k.endswith("self_attn.q_proj.weight")]:
        p = q[: -len("q_proj.weight")]
        parts = [s.pop(p + f"{x}_proj.weight") for x in "qkv"]
        s[p + "qkv_proj.weight"] = linear(sum(sh[0][0] for sh in parts), config["hidden_size"])
    return s


def build_mimo_v2(out_dir: str | Path, *, seed: int = 0, n_shards: int = 2, **overrides: Any) -> Path:
    """Write the tiny MiMo-V2.5 checkpoint (bf16, ``qkv_proj`` unsharded) into ``out_dir``."""
    config = tiny_config(**overrides)
    return build_random_checkpoint(out_dir, config, tensor_specs(config), seed=seed, float32=FLOAT32,
                                   trained_vocab=TRAINED_VOCAB, eos="<|im_end|>", n_shards=n_shards)


def qkv_sizes(config: dict[str, Any]) -> tuple[int, int, int]:
    """Rows of the MTP layers' q, k and v (sliding-window dims)."""
    nh, kv = config["swa_num_attention_heads"], config["swa_num_key_value_heads"]
    return nh * config["swa_head_dim"], kv * config["swa_head_dim"], kv * config["swa_v_head_dim"]


def fp8_qkv(w: Any, sizes: tuple[int, int, int], tp: int = TP) -> tuple[Any, Any]:
    """An unsharded [q | k | v] matrix as the FP8 release stores it: rows rank by rank (each
    rank's share of q, of k, of v), then each rank's rows block-FP8 on their own; returns the
    float32 matrix to encode (rank order, scaled to E4M3) and the stacked inverse scales."""
    import numpy as np

    from .fp8 import BLOCK, E4M3_MAX

    q, k, v = (np.split(part, tp) for part in np.split(w, np.cumsum(sizes)[:2]))
    ranks = [np.concatenate([q[r], k[r], v[r]]) for r in range(tp)]
    scaled, scales = [], []
    for rows in ranks:
        bo, bi = -(-rows.shape[0] // BLOCK), -(-rows.shape[1] // BLOCK)
        s = np.ones((bo, bi), np.float32)
        out = np.empty_like(rows, dtype=np.float32)
        for a in range(bo):
            for b in range(bi):
                blk = rows[a * BLOCK:(a + 1) * BLOCK, b * BLOCK:(b + 1) * BLOCK]
                s[a, b] = float(np.abs(blk).max()) / E4M3_MAX or 1.0
                out[a * BLOCK:(a + 1) * BLOCK, b * BLOCK:(b + 1) * BLOCK] = blk / s[a, b]
        scaled.append(out)
        scales.append(s)
    return np.concatenate(scaled), np.concatenate(scales)


def build_mimo_v2_fp8(out_dir: str | Path, **kwargs: Any) -> Path:
    """The tiny MiMo-V2.5 as the FP8 release stores its MTP layers: ``qkv_proj`` sharded over
    ``TP`` ranks (``fp8_qkv``), the other projections block-FP8, ``quantization_config``
    in config.json."""
    import json

    from .fp8 import to_block_fp8

    out = Path(out_dir)
    bf16 = build_mimo_v2(out.with_name(out.name + "-bf16"), **kwargs)
    config = json.loads((bf16 / "config.json").read_text())

    def fp8(name: str) -> bool:
        return name.startswith("model.mtp.layers.") and name.endswith("proj.weight")

    def encode(name: str, w: Any) -> Any:
        return fp8_qkv(w, qkv_sizes(config)) if name.endswith("qkv_proj.weight") else None

    return to_block_fp8(bf16, out, fp8, announce=True, encode=encode)
