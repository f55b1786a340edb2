"""A trained Step-3.5-shaped head, judged by llama.cpp and MTPLX: acceptance that tells a working
head for the appended-layer shape.

On random weights (tests/test_step3p5_gguf.py, tests/test_family_step3p5.py) both runtimes accept
~0% of the drafts. ``tests/data/tiny-step3p5-trained`` (``scripts/train_tiny_family.py step3p5``:
the trunk trained as a language model, the appended layer ``model.layers.2`` as the next-next-token
predictor on the post-norm hidden state, its norms stored zero-centred as the release stores
them) drafts well: llama-server with mtpforge's default (f16) MTP file beside the converter's
``--no-mtp`` trunks decodes exactly as plain and accepts as many drafts as with the converter's own
``--mtp`` file; MTPLX's ``step3p5_mtp`` with mtpforge's sidecar in an ``mlx_lm.convert`` folder
decodes as its plain decode and accepts most drafts, and verify measures what MTPLX measures
(figures in docs/families/step3p5.md).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests import gguf_env
from tests.gguf_env import mtpforge, official

MODEL = Path(__file__).resolve().parent / "data" / "tiny-step3p5-trained"
PRE = "qwen35"
#: measured well above this in both runtimes (docs/families/step3p5.md); random weights accept ~0%
ACCEPTANCE_FLOOR = 0.5


def test_the_committed_model_is_step3p5_shaped_and_small() -> None:
    cfg = json.loads((MODEL / "config.json").read_text())
    assert cfg["model_type"] == "step3p5" and cfg["num_nextn_predict_layers"] == 1
    keys = json.loads((MODEL / "model.safetensors.index.json").read_text())["weight_map"]
    assert {"model.layers.2.eh_proj.weight", "model.layers.2.self_attn.g_proj.weight",
            "model.layers.2.transformer.shared_head.output.weight", "model.layers.1.moe.gate_proj.weight"} <= set(keys)
    assert sum(p.stat().st_size for p in MODEL.iterdir()) <= 3 * 2**20


@pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
@pytest.mark.parametrize("qtype", ["f32", "Q4_K_M"])
def test_our_head_decodes_as_plain_and_drafts_as_the_converters(qtype: str, tmp_path: Path) -> None:
    gguf_env.need("server")
    trunk = gguf_env.trunk_copy(MODEL, tmp_path, qtype, pre=PRE)
    r = mtpforge("add-mtp", "--source", str(MODEL), "--target", str(trunk), "--json")
    assert r.returncode == 0, r.stderr
    plain = gguf_env.measure(trunk)
    ours = gguf_env.measure(trunk, draft=Path(json.loads(r.stdout)["output"]))
    theirs = gguf_env.measure(trunk, draft=official(MODEL, "mtp", "f32", pre=PRE))
    assert ours["tokens"] == plain["tokens"] == theirs["tokens"]
    assert ours["drafted"] > 300 and ours["acceptance"] >= ACCEPTANCE_FLOOR, ours["acceptance"]
    # f16 against the converter's f32: the same drafts but for a near-tie or two
    assert abs(ours["acceptance"] - theirs["acceptance"]) <= 0.03, (ours, theirs)


@pytest.mark.xdist_group("conformance")
def test_mtplx_drafts_well_with_our_sidecar_and_verify_measures_the_same(tmp_path: Path) -> None:
    from tests import mlx_judged as judged
    from tests.support.synth import convert_to_mlx

    judged.require_mtplx()
    mlx = convert_to_mlx(MODEL, tmp_path / "tiny-step3p5-trained-mlx", dtype="float32")
    folder = tmp_path / "m"
    shutil.copytree(mlx, folder)
    judged.add_mtp(MODEL, folder)
    got = judged.mtplx_drafts(folder)
    assert got["mtp_enabled"] and got["identical"] and got["drafted"] >= 24, got
    assert got["accepted"] / got["drafted"] >= ACCEPTANCE_FLOOR, got
    v = mtpforge("verify", str(folder), "--generate", "--json")
    rep = json.loads(v.stdout)
    assert v.returncode == 0 and rep["acceptance"] >= ACCEPTANCE_FLOOR, v.stdout + v.stderr
    # depth 2 chains the block's output before the shared head's norm, as MTPLX does: with that
    # norm spread out (a trained one is near 1, where feeding the normed state drafts the same),
    # verify's decoder drafts MTPLX's tokens at both depths at every position (measured: 12 of 19
    # at depth 2 when the normed state was chained)
    _spread_shared_head_norm(folder / "mtp.safetensors")
    mine, theirs = _chained_drafts(folder), json.loads(
        judged.mtplx_run(MTPLX_CHAIN, folder, json.dumps(SEQ)).stdout.strip().splitlines()[-1])
    assert mine == theirs and len(mine["d2"]) == len(SEQ) - 1, (mine, theirs)


SEQ = [5, 17, 99, 230, 12, 40, 41, 42, 7, 300, 301, 8, 9, 10, 11, 250, 3, 77, 91, 400]
#: MTPLX's head over SEQ at depth 1, then depth 2 fed depth 1's hidden and drafts (no caches)
MTPLX_CHAIN = """
import json, sys
sys.path.insert(0, sys.argv[2])
import standins
standins.libsystem()
import mlx.core as mx
from mtplx import runtime as R
rt = R.load(sys.argv[1], mtp=True)
seq = mx.array([json.loads(sys.argv[3])])
_, hidden = rt.model(seq, cache=None, return_hidden=True, hidden_variant="post_norm")
lg1, h1 = rt.model.mtp_forward(hidden[:, :-1], seq[:, 1:], mtp_cache=None, return_hidden=True, mtp_depth=1)
d1 = mx.argmax(lg1, axis=-1)
lg2 = rt.model.mtp_forward(h1, d1, mtp_cache=None, mtp_depth=2)
print(json.dumps({"d1": d1[0].tolist(), "d2": mx.argmax(lg2, axis=-1)[0].tolist()}))
"""


def _spread_shared_head_norm(path: Path) -> None:
    import mlx.core as mx
    import numpy as np

    tensors, meta = mx.load(str(path), return_metadata=True)
    (key,) = [k for k in tensors if k.endswith("shared_head.norm.weight")]
    spread = np.exp(np.random.default_rng(0).normal(0.0, 1.0, tensors[key].shape[0])).astype(np.float32)
    tensors[key] = (tensors[key].astype(mx.float32) * mx.array(spread)).astype(tensors[key].dtype)
    mx.save_safetensors(str(path), tensors, metadata=meta)


def _chained_drafts(folder: Path) -> dict[str, list[int]]:
    """verify's decoder (mtpforge's backbone and head) as MTPLX_CHAIN runs MTPLX's."""
    import mlx.core as mx

    from mtpforge.decoder.backbone import load_backbone
    from mtpforge.decoder.head import build_head
    from mtpforge.layouts.read import load_head_weights

    hw = load_head_weights(folder)
    bb = load_backbone(folder, hw.family)
    head = build_head(hw.family, bb.args, hw.tensors, hw.quant, compute_dtype=bb.dtype)
    _, h = bb(SEQ, bb.make_cache(), "post")
    z1 = head(h[:, :-1], bb.embed(SEQ[1:]), cache=None)
    d1 = mx.argmax(head.logits(z1, bb), axis=-1)
    z2 = head(z1, bb.embed(d1[0].tolist()), cache=None)
    return {"d1": d1[0].tolist(), "d2": mx.argmax(head.logits(z2, bb), axis=-1)[0].tolist()}
