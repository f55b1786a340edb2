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

import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from .family_common import build_family_tokenizer, write_generation_config
from .nemotron_h import TRAINED_VOCAB, mtp_keys, tensor_specs, tiny_config
from .train import encode_stream, heldout_prompts, train_backbone, training_corpus
from .train_glm import GlmTrainSettings, draft_acceptance, train_head
from .train_mla import settings  # noqa: F401 - the shortened settings, shared
from .write import write_hf_checkpoint

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


def build_trained(out_root: str | Path, s: GlmTrainSettings, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Train and write ``out_root/tiny-nemotron_h-trained`` (float32); returns the record."""
    from mlx_lm.models import nemotron_h
    from tokenizers import Tokenizer

    folder = Path(out_root) / FOLDER
    config = tiny_config(torch_dtype="float32")
    mx.random.seed(s.seed)
    np.random.seed(s.seed)
    with tempfile.TemporaryDirectory(prefix="mtpforge-nemotron_h-tok-") as tokdir:
        build_family_tokenizer(Path(tokdir), TRAINED_VOCAB, (), eos="<|im_end|>")
        tok = Tokenizer.from_file(str(Path(tokdir) / "tokenizer.json"))
        stream = encode_stream(tok, training_corpus(s))
        model = nemotron_h.Model(nemotron_h.ModelArgs.from_dict(config))
        b_losses, b_sec = train_backbone(model, stream, s, log)
        head = _head(model, config["mtp_hybrid_override_pattern"], s)
        h_losses, h_sec = train_head(model, head, stream, s, log)
        acc = draft_acceptance(model, head, heldout_prompts(tok, s))
        if log:
            log(f"nemotron_h: trained (float32) depth-1 acceptance {acc['acceptance']:.3f}")
        trunk = _release_keys(dict(tree_flatten(model.parameters())))
        mtp = {f"mtp.{k}": v for k, v in _release_keys(dict(tree_flatten(head.parameters()))).items()}
        tensors = {k: v.astype(mx.float32) for k, v in {**trunk, **mtp}.items()}
        want = {k: spec[0] for k, spec in tensor_specs(config).items()}
        if {k: tuple(v.shape) for k, v in tensors.items()} != want or sorted(mtp) != mtp_keys(config):
            raise ValueError(f"export does not match the release layout: {sorted(set(tensors) ^ set(want))[:6]}")
        mx.eval(tensors)
        write_hf_checkpoint(folder, config, tensors, n_shards=2, tokenizer_dir=Path(tokdir))
    write_generation_config(folder, config)
    record = {"model": FOLDER, "architecture": "nemotron_h", "settings": asdict(s),
              "trunk": {"seconds": round(b_sec, 1), "loss": b_losses[-1]},
              "nextn": {"seconds": round(h_sec, 1), "loss": h_losses[-1], "hidden": "post-norm (after norm_f)"},
              "acceptance_float32_mlx": acc}
    (folder / "training.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return record
