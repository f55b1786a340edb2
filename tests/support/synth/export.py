"""Export a trained mlx-lm Qwen3.5 model and its MTP head in the Hugging Face layout of the releases.

The bundled model must look to every tool exactly like a real Qwen3.5 / Qwen3.6 checkpoint
(docs/SPEC.md §2), because it is the source the demo and the tests feed to ``mlx_lm.convert`` and ``add-mtp``.
So this undoes what mlx-lm's ``sanitize`` does on load, tensor by tensor:

- ``language_model.model.*`` -> ``model.language_model.*``, ``language_model.lm_head`` -> ``lm_head``;
- zero-centred norms: stored ``w - 1`` for the backbone norms mlx-lm shifts (never
  ``linear_attn.norm``) and for the head's seven norm kinds;
- conv1d [C, K, 1] -> [C, 1, K] (the shape by which mlx-lm recognises a raw checkpoint);
- stacked ``switch_mlp`` experts -> fused ``experts.gate_up_proj`` (gate rows first) and
  ``experts.down_proj``, in the backbone and (Qwen3.6 style) in the head;
- bf16, except ``A_log`` which the releases keep in float32.

The key set and shapes are checked against ``synth.tensors.hf_tensor_specs``, the codebase's
table of what a release of this config contains.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mtpforge.passes.experts import from_switch_mlp
from mtpforge.passes.norms import shift_norm, shift_norms
from .tensors import hf_tensor_specs
from .write import write_hf_checkpoint

#: Backbone norms that mlx-lm's qwen3_5 ``sanitize`` shifts by +1 on a raw checkpoint.
_BACKBONE_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight")


def _params(module: nn.Module) -> dict[str, mx.array]:
    return dict(tree_flatten(module.parameters()))


def backbone_to_hf(model: nn.Module) -> dict[str, mx.array]:
    """Release names, norms zero-centred, conv1d [C,1,K], fused experts; float32 values."""
    bare: dict[str, mx.array] = {}
    other: dict[str, mx.array] = {}
    for k, v in _params(model).items():
        if k.startswith("language_model.model."):
            bare[k[len("language_model.model.") :]] = v
        elif k.startswith("language_model."):
            other[k[len("language_model.") :]] = v
        else:
            raise ValueError(f"unexpected parameter {k}")
    bare = from_switch_mlp(bare, "fused")
    out: dict[str, mx.array] = {}
    for k, v in bare.items():
        if k == "norm.weight" or (k.endswith(_BACKBONE_NORMS) and v.ndim == 1):
            v = shift_norm(v, -1.0)
        if k.endswith("conv1d.weight"):
            v = v.moveaxis(2, 1)
        out[f"model.language_model.{k}"] = v
    out.update(other)  # lm_head.weight
    return out


def head_to_hf(head: nn.Module) -> dict[str, mx.array]:
    """``mtp.*`` keys, the seven norm kinds zero-centred, experts fused (Qwen3.6 style)."""
    bare = from_switch_mlp(shift_norms(_params(head), -1.0), "fused")
    return {f"mtp.{k}": v for k, v in bare.items()}


def hf_tensors(model: nn.Module, head: nn.Module, config: dict[str, Any]) -> dict[str, mx.array]:
    """The whole checkpoint in bf16 (``A_log`` float32), checked against the release table."""
    tensors = {**backbone_to_hf(model), **head_to_hf(head)}
    specs = hf_tensor_specs(config)
    missing, extra = sorted(set(specs) - set(tensors)), sorted(set(tensors) - set(specs))
    if missing or extra:
        raise ValueError(f"export does not match the release layout: missing {missing[:5]}, unexpected {extra[:5]}")
    for k, v in tensors.items():
        if tuple(v.shape) != specs[k][0]:
            raise ValueError(f"{k}: exported shape {tuple(v.shape)}, the release layout says {specs[k][0]}")
    out = {k: v.astype(mx.float32 if k.endswith("A_log") else mx.bfloat16) for k, v in tensors.items()}
    mx.eval(out)
    return out


def export_checkpoint(
    folder: str | Path,
    model: nn.Module,
    head: nn.Module,
    config: dict[str, Any],
    tokenizer_dir: str | Path,
    training: Mapping[str, Any],
    card: str,
) -> Path:
    """Write the folder: shards + index (head spread over the last two shards, mixed with
    backbone tensors, as the releases do), config, tokenizer, training.json and README.md."""
    folder = Path(folder)
    write_hf_checkpoint(folder, config, hf_tensors(model, head, config), n_shards=3, mtp_shards=2,
                        tokenizer_dir=tokenizer_dir)
    (folder / "training.json").write_text(json.dumps(training, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (folder / "README.md").write_text(card, encoding="utf-8")
    return folder
