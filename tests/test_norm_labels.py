"""What mtpforge.json, the model card and ``add-mtp --json`` say of a head's norms is what the
tensors are, per family: shifted (+1) only for a family whose release stores zero-centred norms
(Qwen), raw for GLM's and Nemotron-H's — whose tensors add-mtp rightly writes as stored — in
MLX folders and GGUF files alike."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mtpforge import model_card
from mtpforge.families import FAMILIES
from mtpforge.pipeline import add_mtp

TRAINED_GLM = Path(__file__).resolve().parent / "data" / "tiny-glm4_moe-trained"
#: the families whose release stores zero-centred norms, from the specs themselves
SHIFTED = {n for n, s in FAMILIES.items() if s.norm_offset and s.norm_roles}


def test_the_families_are_split_as_their_releases_store_norms() -> None:
    """The test below means something only if both kinds exist (Qwen shifted, GLM raw)."""
    assert {"qwen3_5", "qwen3_next"} <= SHIFTED and not {"glm4_moe", "glm4_moe_lite", "nemotron_h"} & SHIFTED


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_mlx_label_says_what_the_family_stores(family: str) -> None:
    conv, card, record = model_card.norms_said(family)
    spec = FAMILIES[family]
    if family in SHIFTED:
        assert conv == "shifted" and card.startswith("shifted (+1") and f"{len(spec.norm_roles)} zero-centred" in record
    else:
        assert conv == "raw" and card.startswith("raw") and "shift" not in card and not record.startswith("+")
    sec = model_card.section({"family": family, "source": {"repo": "org/m"}, "layout": "sidecar", "mtp_layers": 1,
                              "norm_convention": conv, "precision": {}})
    assert f"| norms | {card} |" in sec


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_gguf_label_says_what_the_family_stores(family: str) -> None:
    from mtpforge.gguf.addmtp import _norms_said

    conv, card, _ = _norms_said(family)
    assert conv == ("shifted" if family in SHIFTED else "raw") and card.startswith(conv)
    sec = model_card.section({"family": family, "source": {"repo": "org/m"}, "layout": "gguf-mtp", "mtp_layers": 1,
                              "norm_convention": conv, "precision": "f16"}, (card, "closing"))
    assert f"| norms | {card} |" in sec and "mlx-lm" not in sec


def test_a_recorded_convention_other_than_the_words_is_shown_by_name() -> None:
    """Words for one convention never label another (a repair's or an old record's)."""
    sec = model_card.section({"family": "qwen3_5", "source": {"repo": "org/m"}, "layout": "sidecar",
                              "mtp_layers": 1, "norm_convention": "raw", "precision": {}})
    assert "| norms | raw |" in sec and "mlx-lm's loaders" not in sec


def test_a_glm_folder_says_raw_in_every_place(tmp_path: Path) -> None:
    """End to end on the trained tiny GLM-4.5: the manifest, the card and the run's report."""
    from tests.support.synth import convert_to_mlx

    target = convert_to_mlx(TRAINED_GLM, tmp_path / "glm-4bit", q_bits=4, q_group_size=32, dtype="float32")
    r = add_mtp(source=str(TRAINED_GLM), target=str(target), progress=False)
    m = json.loads((target / "mtpforge.json").read_text())
    card = (target / "README.md").read_text()
    assert m["norm_convention"] == "raw" and not m["norm_shift"].startswith("+"), m["norm_shift"]
    assert "| norms | raw (as stored in the source" in card and "shifted" not in card
    assert r["inspect"]["norm_convention"] == "raw"


def test_a_qwen_folder_still_says_shifted(tmp_path: Path) -> None:
    from mtpforge.community import convert_to_mlx

    src = Path(__file__).resolve().parent.parent / "mtpforge" / "data" / "tiny-qwen3_5"
    target = convert_to_mlx(src, tmp_path / "q-4bit")
    r = add_mtp(source=str(src), target=str(target), progress=False)
    m = json.loads((target / "mtpforge.json").read_text())
    assert m["norm_convention"] == "shifted" and m["norm_shift"].startswith("+1 on the 7 zero-centred")
    assert "| norms | shifted (+1, as mlx-lm's loaders expect) |" in (target / "README.md").read_text()
    assert r["inspect"]["norm_convention"] == "shifted"
    shutil.rmtree(target)
