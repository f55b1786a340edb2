"""A trained Qwen3.8-Flash-Next-shaped head, judged by mlx-vlm: acceptance that tells a working
drafter.

On random weights (tests/test_family_qwen4_exp.py) mlx-vlm accepts next to none of the drafts.
``tests/data/tiny-qwen4_exp-trained`` (``scripts/train_tiny_family.py qwen4_exp``: mlx-vlm's own
language model trained on the synthetic corpus, then its own ``Qwen4ExpMTPDraftModel`` as its
speculative loop runs it, on the hyper-connection streams before the trunk's final mixer) drafts
what the trunk would say. mlx-vlm's ``convert`` makes the 4-bit target (dropping ``mtp.*``), add-mtp
``--runtime mlx-vlm`` writes the drafter, and mlx-vlm's ``stream_generate`` decodes exactly as
plain with it and accepts most of its drafts, at the target's 4 bits and at ``--precision bf16``,
where it accepts as mlx-vlm's own drafter split from the whole trained source does (figures in
docs/families/qwen4_exp.md).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests import mlx_judged as judged
from tests import mlx_vlm_judged as vlm

pytestmark = pytest.mark.xdist_group("conformance")
MODEL = Path(__file__).resolve().parent / "data" / "tiny-qwen4_exp-trained"
#: measured well above this (docs/families/qwen4_exp.md); random weights accept next to none
ACCEPTANCE_FLOOR = 0.5


def _prompts() -> list[list[int]]:
    """Eight held-out prompts of the synthetic corpus, as the trainer measured its head on."""
    from tokenizers import Tokenizer

    from tests.support.synth.train import heldout_prompts
    from tests.support.synth.train_qwen4_exp import settings

    return heldout_prompts(Tokenizer.from_file(str(MODEL / "tokenizer.json")), settings(), n=8)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vlm.convert(MODEL, tmp_path_factory.mktemp("qwen4_trained") / "tiny-qwen4_exp-trained-4bit")


def test_the_committed_model_is_qwen4_exp_shaped_and_small() -> None:
    cfg = json.loads((MODEL / "config.json").read_text())
    assert cfg["model_type"] == "qwen4_exp" and cfg["text_config"]["hc_count"] == 2
    keys = json.loads((MODEL / "model.safetensors.index.json").read_text())["weight_map"]
    assert len([k for k in keys if k.startswith("mtp.")]) == 31 and any(k.startswith("model.visual.") for k in keys)
    assert sum(p.stat().st_size for p in MODEL.iterdir()) <= 4 * 2**20


@pytest.mark.parametrize("precision", ["default", "bf16"])
def test_mlx_vlm_drafts_well_with_the_drafter_mtpforge_writes(target: Path, precision: str, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(target, folder)
    judged.add_mtp(MODEL, folder, "--runtime", "mlx-vlm", *(("--precision", precision) if precision != "default" else ()))
    drafter = folder.parent / f"{folder.name}-mtp-drafter"
    got = vlm.probe(target, drafter, prompts=_prompts())
    assert got["identical"] and not (got["missing"] or got["unused"] or got["unequal"]), got
    assert got["drafted"] > 100 and got["accepted"] >= ACCEPTANCE_FLOOR * got["drafted"], got
    if precision == "bf16":  # against mlx-vlm's own drafter, split from the whole (float32) source
        theirs = vlm.probe(target, vlm.split(MODEL, tmp_path / "theirs"), prompts=_prompts())
        assert theirs["identical"], theirs
        assert abs(got["accepted"] / got["drafted"] - theirs["accepted"] / theirs["drafted"]) <= 0.03, (got, theirs)
