"""A trained DeepSeek-V3-shaped head, judged by llama.cpp: acceptance that tells a working head.

On random weights (tests/test_deepseek_v3_gguf.py) llama-server accepts ~0% of the drafts.
``tests/data/tiny-deepseek_v3-trained`` (``scripts/train_tiny_family.py deepseek_v3``: the trunk trained
as a language model, the NextN layer as the next-next-token predictor on the trunk's post-norm
hidden state) drafts well: on the converter's f32, Q8_0 and Q4_K_M DeepSeek-V3 trunks (which have
no head: the converter drops it), mtpforge's default (f16) MTP file decodes exactly as plain and
llama-server accepts about two thirds of its drafts (24 prompts x 64 tokens, depth 1: 67.0%,
68.2%, 66.4%; mlx float32: 62.2%; docs/families/deepseek_v3.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import gguf_env

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
MODEL = Path(__file__).resolve().parent / "data" / "tiny-deepseek_v3-trained"
PRE = "deepseek-v3"
#: measured ~0.67 on every trunk type; random weights accept ~0%
ACCEPTANCE_FLOOR = 0.5


def test_the_committed_model_is_deepseek_v3_shaped_and_small() -> None:
    cfg = json.loads((MODEL / "config.json").read_text())
    assert cfg["model_type"] == "deepseek_v3" and cfg["num_nextn_predict_layers"] == 1 and cfg["n_group"] == 4
    assert "model.layers.2.eh_proj.weight" in json.loads((MODEL / "model.safetensors.index.json").read_text())["weight_map"]
    assert sum(p.stat().st_size for p in MODEL.iterdir()) <= 3 * 2**20


@pytest.mark.parametrize("qtype", ["f32", "Q8_0", "Q4_K_M"])
def test_our_head_decodes_as_plain_and_drafts_well(qtype: str, tmp_path: Path) -> None:
    plain, ours, _ = gguf_env.trained_head_runs(MODEL, qtype, PRE, tmp_path, mode="full")
    assert ours["tokens"] == plain["tokens"]
    assert ours["drafted"] > 300 and ours["acceptance"] >= ACCEPTANCE_FLOOR, ours["acceptance"]
