"""Train the tiny Nemotron-H-shaped model (``nemotron_h``) and its MTP head, so that acceptance
with a head mtpforge wrote means something (random weights accept ~0%).

GLM-4.5's trainer (``train_glm``: the same settings, loss, schedule and measurement) at
Nemotron-H's shapes (``synth.nemotron_h``: Mamba-2, attention without RoPE and ReLU² MoE blocks,
``ME*E``): the trunk is mlx-lm's own ``nemotron_h.Model`` trained as a language model on the
synthetic corpus in float32, then the two-block MTP head (mtpforge's own, ``decoder/hybrid.py``,
over mlx-lm's ``NemotronHBlock``: attention then MoE, ``enorm`` / ``hnorm`` / ``eh_proj`` on the
first, ``final_layernorm`` on the last) with the trunk frozen, fed the trunk's hidden state after
``norm_f`` as every runtime feeds it. The export is the inverse of mlx-lm's sanitize: experts one
by one (``switch_mlp.fc1`` / ``fc2`` -> ``experts.{e}.up_proj`` / ``down_proj``), the Mamba
convolution as [channels, 1, kernel]; the head under ``mtp.layers.{k}``; norms raw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from .nemotron_h import TRAINED_VOCAB, mtp_keys, tensor_specs, tiny_config
from .train_family import Recipe, train_and_write
from .train_glm import GlmTrainSettings
from .train_mla import settings  # noqa: F401 - the shortened settings, shared


FOLDER = "tiny-nemotron_h-trained"
EXPERT_NAMES = {"fc1": "up_proj", "fc2": "down_proj"}


def _head(model: nn.Module, pattern: str, s: GlmTrainSettings) -> nn.Module:
    """A fresh two-block head (seeded), its norms spread as GLM's trainer spreads them (the MoE
    block's pre-norm plays GLM's ``post_attention_layernorm``: the MLP gain)."""
    from mlx_lm.models import nemotron_h

    from mtpforge.decoder.hybrid import hybrid_head

    head = hybrid_head(nemotron_h.NemotronHBlock, model.args, pattern)
    first, last = head.layers[0], head.layers[-1]
    rng = np.random.default_rng(s.seed + 3)
    for block, name in ((first, "enorm"), (first, "hnorm"), (first, "norm"), (last, "norm"), (last, "final_layernorm")):
        norm = getattr(block, name)
        gain = s.head_mlp_gain if block is last and name == "norm" else 1.0
        norm.weight = mx.array((gain * np.exp(s.head_norm_spread * rng.standard_normal(norm.weight.shape))).astype(np.float32))
    return head


def _release_keys(params: dict[str, mx.array]) -> dict[str, mx.array]:
    """mlx-lm's parameters -> the release's (the inverse of ``nemotron_h.Model.sanitize``)."""
    out: dict[str, mx.array] = {}
    for k, v in params.items():
        if ".switch_mlp." in k:
            pre, rest = k.split(".switch_mlp.")
            proj, leaf = rest.split(".", 1)
            out.update({f"{pre}.experts.{e}.{EXPERT_NAMES[proj]}.{leaf}": v[e] for e in range(v.shape[0])})
        elif k.endswith("conv1d.weight"):
            out[k] = v.moveaxis(2, 1)  # mlx [C, K, 1] -> the release's [C, 1, K]
        else:
            out[k] = v
    return out


def _export(model: nn.Module, head: nn.Module, config: dict[str, Any]) -> dict[str, mx.array]:
    """The release's tensors, the head under ``mtp.``."""
    trunk = _release_keys(dict(tree_flatten(model.parameters())))
    mtp = {f"mtp.{k}": v for k, v in _release_keys(dict(tree_flatten(head.parameters()))).items()}
    if sorted(mtp) != mtp_keys(config):
        raise ValueError(f"the head's keys are not the release's: {sorted(set(mtp) ^ set(mtp_keys(config)))[:6]}")
    return {**trunk, **mtp}


def build_trained(out_root: str | Path, s: GlmTrainSettings, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Train and write ``out_root/tiny-nemotron_h-trained`` (float32); returns the record."""
    from mlx_lm.models import nemotron_h

    config = tiny_config(torch_dtype="float32")
    return train_and_write(out_root, Recipe(
        FOLDER, "nemotron_h", config, model=lambda config: nemotron_h.Model(nemotron_h.ModelArgs.from_dict(config)),
        head=lambda model: _head(model, config["mtp_hybrid_override_pattern"], s),
        export=_export, specs=tensor_specs, head_notes={"hidden": "post-norm (after norm_f)"}, trained_vocab=TRAINED_VOCAB), s, log)
