"""Trained heads of the families whose llama.cpp converter exports the MTP block itself, judged by
llama.cpp beside that export: acceptance that tells a working head.

Each committed model (``scripts/train_tiny_family.py FAMILY``: the trunk trained as a language
model on the synthetic corpus, the MTP block as the next-next-token predictor on the trunk's
post-norm hidden state, as the family's llama.cpp graph feeds it) drafts what its trunk would say,
where the families' random or built-to-echo tiny heads accept next to nothing or by construction.
On the converter's ``--no-mtp`` f32 and Q4_K_M trunks, mtpforge's default (f16) MTP file decodes
exactly as plain, and llama-server drafts and accepts exactly as with the converter's own f16
``--mtp`` export beside the same trunk (figures in each family's page under docs/families/):

- Ling-3 (``bailing_moe_v3``): a KDA layer, a gated-MLA + MoE layer; mlx-lm's own model.
- Hy3 (``hy_v3``): a dense layer, a sigmoid-routed MoE layer with a shared expert; mlx-lm's
  ``glm4_moe``, which is Hy3's block with every head dimension rotated.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import gguf_env

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
DATA = Path(__file__).resolve().parent / "data"
PRE = "qwen35"  # the converter's pre-tokenizer for the synthetic byte-level vocabulary
#: measured well above this on both trunks for every family here
ACCEPTANCE_FLOOR = 0.5
#: family -> (config.json values, release keys the folder must hold)
SHAPES = {
    "bailing_moe_v3": ({"num_nextn_predict_layers": 1, "layer_group_size": 2},
                       {"model.layers.0.attention.q_conv1d.weight", "model.layers.2.attention.kv_b_proj.weight",
                        "model.layers.2.final_layernorm.weight", "model.layers.2.mlp.experts.3.down_proj.weight"}),
    "hy_v3": ({"num_nextn_predict_layers": 1, "first_k_dense_replace": 1},
              {"model.layers.1.mlp.router.gate.weight", "model.layers.2.mlp.expert_bias", "model.layers.2.eh_proj.weight",
               "model.layers.2.final_layernorm.weight", "model.layers.2.mlp.shared_mlp.up_proj.weight",
               "model.layers.2.mlp.experts.3.down_proj.weight"}),
}


@pytest.mark.parametrize("family", sorted(SHAPES))
def test_the_committed_model_has_the_familys_shape_and_is_small(family: str) -> None:
    model = DATA / f"tiny-{family}-trained"
    cfg = json.loads((model / "config.json").read_text())
    values, keys = SHAPES[family]
    assert cfg["model_type"] == family and {k: cfg.get(k) for k in values} == values
    assert keys <= set(json.loads((model / "model.safetensors.index.json").read_text())["weight_map"])
    assert sum(p.stat().st_size for p in model.iterdir()) <= 3 * 2**20


@pytest.mark.parametrize("qtype", ["f32", "Q4_K_M"])
@pytest.mark.parametrize("family", sorted(SHAPES))
def test_our_head_decodes_as_plain_and_drafts_as_the_converters(family: str, qtype: str, tmp_path: Path) -> None:
    plain, ours, theirs = gguf_env.trained_head_beside_converters(DATA / f"tiny-{family}-trained", qtype, PRE, tmp_path)
    assert ours["tokens"] == plain["tokens"]
    assert ours["drafted"] > 300 and ours["acceptance"] >= ACCEPTANCE_FLOOR, ours["acceptance"]
    assert (ours["drafted"], ours["accepted"]) == (theirs["drafted"], theirs["accepted"])
