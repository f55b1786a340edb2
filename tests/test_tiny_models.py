"""The bundled trained tiny models are what the demo and the acceptance tests stand on: check
that each folder is a faithful release-layout source and that its head still drafts well.

Fast (seconds): no conversion here; ``scripts/train_tiny.py`` runs the full convert + add-mtp
self-check when it trains and records it in ``training.json``.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import mlx.core as mx
import pytest

from mtpforge.checkpoint.catalogue import load_catalogue
from mtpforge.checkpoint.store import LocalStore
from tests.support.synth.tensors import hf_tensor_specs

#: folder -> (depth-1 acceptance floor of the issue, target of the model)
MODELS = {"tiny-qwen3_5": (0.60, 0.70), "tiny-qwen3_5_moe": (0.50, 0.55)}


def _folder(name: str) -> Path:
    path = Path(str(resources.files("mtpforge").joinpath("data", name)))
    if not (path / "config.json").is_file():
        pytest.skip(f"{name} is not bundled in this checkout")
    return path


@pytest.mark.parametrize("name", sorted(MODELS))
def test_release_layout(name: str) -> None:
    folder = _folder(name)
    config = json.loads((folder / "config.json").read_text())
    cat = load_catalogue(LocalStore(folder))
    # the MoE model is Qwen3.6-style (fused head experts), which its config cannot say
    specs = hf_tensor_specs(config, mtp_experts="fused" if config["text_config"].get("num_experts") else None)
    assert set(cat.tensors) == set(specs)
    assert config["text_config"]["mtp_num_hidden_layers"] == 1
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    mtp_files = {f for k, f in index["weight_map"].items() if k.startswith("mtp.")}
    assert len(mtp_files) == 2  # spread over shards and mixed with backbone tensors, as released
    tensors: dict[str, mx.array] = {}
    for f in sorted(set(index["weight_map"].values())):
        tensors.update(mx.load(str(folder / f)))
    for k, v in tensors.items():
        assert tuple(v.shape) == specs[k][0], k
        assert v.dtype == (mx.float32 if k.endswith("A_log") else mx.bfloat16), k
    # zero-centred: stored w - 1 sits near 0 (a trained RMSNorm gain is of order 1), while the
    # gated linear-attention norm is stored as is. (The head's post_attention_layernorm is left
    # out: it was trained from gain 4, see synth/train.py.)
    for k, v in tensors.items():
        if k == "mtp.layers.0.post_attention_layernorm.weight":
            continue
        if k.endswith(("input_layernorm.weight", "post_attention_layernorm.weight", "pre_fc_norm_hidden.weight",
                       "pre_fc_norm_embedding.weight")):
            assert abs(float(v.astype(mx.float32).mean())) < 0.6, k
        if k.endswith("linear_attn.norm.weight"):
            assert float(v.astype(mx.float32).mean()) > 0.4, k


@pytest.mark.parametrize("name", sorted(MODELS))
def test_head_drafts_on_heldout_text(name: str) -> None:
    """A float32 reference head straight from the source tensors, on mlx-lm's load of the source."""
    from tokenizers import Tokenizer

    from tests.support.synth.train import TrainSettings, draft_acceptance, heldout_prompts
    from tests.support.synth.train_check import load_backbone, source_head

    folder = _folder(name)
    record = json.loads((folder / "training.json").read_text())
    floor, _ = MODELS[name]
    prompts = heldout_prompts(Tokenizer.from_file(str(folder / "tokenizer.json")), TrainSettings(**record["settings"]), n=8)
    model = load_backbone(folder)
    head = source_head(folder, model)
    res = draft_acceptance(model, head, prompts, n_new=32)
    assert res["drafted"] > 100
    assert res["acceptance"] >= floor, res


@pytest.mark.parametrize("name", sorted(MODELS))
def test_recorded_acceptance_meets_target(name: str) -> None:
    record = json.loads((_folder(name) / "training.json").read_text())
    _, target = MODELS[name]
    acc = record["acceptance"]
    for key in ("trained_float32", "converted_bf16_backbone", "converted_4bit_backbone"):
        assert acc[key]["post"]["acceptance"] >= target, (key, acc[key])
