"""A trained MiMo-V2-Flash-shaped head, judged by llama.cpp: acceptance that tells a working head.

On random weights (tests/test_mimo_v2_flash_gguf.py) llama-server accepts ~0% of the drafts.
``tests/data/tiny-mimo_v2_flash-trained`` (``scripts/train_tiny_family.py mimo_v2_flash``: the trunk
trained as a language model, MTP layer 0 as the next-next-token predictor on the trunk's pre-norm
hidden state, as mimo2.cpp feeds it) drafts well: on the converter's ``--no-mtp`` f32 and Q4_K_M
trunks, mtpforge's default (f16) MTP file — q/k/v fused into the ``attn_qkv`` llama.cpp's mimo2
graph requires — decodes exactly as plain and llama-server accepts most of its drafts (figures in
docs/families/mimo_v2_flash.md).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests import gguf_env
from tests.gguf_env import mtpforge, official

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
MODEL = Path(__file__).resolve().parent / "data" / "tiny-mimo_v2_flash-trained"
PRE = "qwen35"
#: measured well above this on both trunks (docs/families/mimo_v2_flash.md); random weights accept ~0%
ACCEPTANCE_FLOOR = 0.5


def test_the_committed_model_is_mimo_v2_flash_shaped_and_small() -> None:
    cfg = json.loads((MODEL / "config.json").read_text())
    assert cfg["model_type"] == "mimo_v2_flash" and cfg["hybrid_layer_pattern"] == [0, 1]
    keys = json.loads((MODEL / "model.safetensors.index.json").read_text())["weight_map"]
    assert {f"model.mtp.layers.{k}.self_attn.attention_sink_bias" for k in range(3)} <= set(keys)
    assert sum(p.stat().st_size for p in MODEL.iterdir()) <= 3 * 2**20


@pytest.mark.parametrize("qtype", ["f32", "Q4_K_M"])
def test_our_head_decodes_as_plain_and_drafts_well(qtype: str, tmp_path: Path) -> None:
    plain, ours, _ = gguf_env.trained_head_runs(MODEL, qtype, PRE, tmp_path)
    assert ours["tokens"] == plain["tokens"]
    assert ours["drafted"] > 300 and ours["acceptance"] >= ACCEPTANCE_FLOOR, ours["acceptance"]


def test_verify_decodes_as_plain_and_says_mimo2_reads_the_pre_norm_state(tmp_path: Path) -> None:
    gguf_env.need("server")
    trunk = Path(shutil.copyfile(official(MODEL, "trunk", "f32", pre=PRE), tmp_path / "trained.gguf"))
    assert mtpforge("add-mtp", "--source", str(MODEL), "--target", str(trunk)).returncode == 0
    r = mtpforge("verify", str(trunk), "--json", "--prompt", "Count: 3, 4, 5, 6, 7, 8.", "--max-tokens", "24")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    assert v["identical"] is True and v["drafted"] > 0 and v["hidden"] == "pre"
    assert v["notes"] == ["llama.cpp feeds its MTP head the pre-norm hidden state"]
