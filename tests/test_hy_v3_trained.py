"""A trained Hy3-shaped head, judged by llama.cpp: acceptance that tells a working head.

The tiny Hy3 checkpoint of tests/test_hy_v3_gguf.py drafts because its MTP layer is built to
echo, not because it learned the trunk. ``tests/data/tiny-hy_v3-trained``
(``scripts/train_tiny_family.py hy_v3``: the trunk — a dense layer, a sigmoid-routed MoE layer
with a shared expert — trained as a language model, the MTP layer as the next-next-token predictor
on the trunk's post-norm hidden state, as hy-v3.cpp feeds it) drafts what the trunk would say: on
the converter's ``--no-mtp`` f32 and Q4_K_M trunks, mtpforge's default (f16) MTP file decodes
exactly as plain, and llama-server drafts and accepts exactly as with the converter's own f16
``--mtp`` export beside the same trunk (figures in docs/families/hy_v3.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import gguf_env

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
MODEL = Path(__file__).resolve().parent / "data" / "tiny-hy_v3-trained"
PRE = "qwen35"  # the converter's pre-tokenizer for the synthetic byte-level vocabulary
#: measured well above this on both trunks (docs/families/hy_v3.md)
ACCEPTANCE_FLOOR = 0.5


def test_the_committed_model_is_hy3_shaped_and_small() -> None:
    cfg = json.loads((MODEL / "config.json").read_text())
    assert cfg["model_type"] == "hy_v3" and cfg["num_nextn_predict_layers"] == 1 and cfg["first_k_dense_replace"] == 1
    keys = json.loads((MODEL / "model.safetensors.index.json").read_text())["weight_map"]
    assert {"model.layers.1.mlp.router.gate.weight", "model.layers.2.mlp.expert_bias", "model.layers.2.eh_proj.weight",
            "model.layers.2.final_layernorm.weight", "model.layers.2.mlp.shared_mlp.up_proj.weight",
            "model.layers.2.mlp.experts.3.down_proj.weight"} <= set(keys)
    assert sum(p.stat().st_size for p in MODEL.iterdir()) <= 3 * 2**20


@pytest.mark.parametrize("qtype", ["f32", "Q4_K_M"])
def test_our_head_decodes_as_plain_and_drafts_as_the_converters(qtype: str, tmp_path: Path) -> None:
    plain, ours, theirs = gguf_env.trained_head_beside_converters(MODEL, qtype, PRE, tmp_path)
    assert ours["tokens"] == plain["tokens"]
    assert ours["drafted"] > 300 and ours["acceptance"] >= ACCEPTANCE_FLOOR, ours["acceptance"]
    assert (ours["drafted"], ours["accepted"]) == (theirs["drafted"], theirs["accepted"])
