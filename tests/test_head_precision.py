"""The measured precision table (``mtpforge/data/head_precision.json``, written by
scripts/measure_precision.py, shown in docs/PRECISION.md) and the note add-mtp gives when asked
for fewer bits than a head shape's knee.

The knee is the lowest bit width from which every wider one kept the bf16 head's acceptance
within the table's tolerance: the table is checked to say what its own numbers say, and add-mtp
(on the trained tiny GLM-4.7-Flash, whose shape is MLA) to note exactly the precisions below it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtpforge.families import FAMILIES

ROOT = Path(__file__).resolve().parent.parent
TABLE = json.loads((ROOT / "mtpforge" / "data" / "head_precision.json").read_text())
MLA_MODEL = ROOT / "tests" / "data" / "tiny-glm4_moe_lite-trained"
BITS = (8, 6, 5, 4, 3, 2)


def _knee(mlx: dict) -> int | None:
    ref, best = mlx["bf16"]["acceptance"], None
    for b in BITS:
        if mlx[str(b)]["acceptance"] < ref - TABLE["tolerance"]:
            break
        best = b
    return best


def test_the_table_is_what_its_numbers_say() -> None:
    assert set(TABLE["shapes"]) == {"dense", "moe", "mla", "hybrid"}
    seen: list[str] = []
    for name, row in TABLE["shapes"].items():
        assert set(row["mlx"]) == {"bf16", *map(str, BITS)}, name
        assert all(c["identical"] for c in row["mlx"].values()), name
        assert row["knee_bits"] == _knee(row["mlx"]), name
        assert (ROOT / row["model"]).is_dir() and set(row["families"]) <= set(FAMILIES), name
        seen += row["families"]
    assert len(seen) == len(set(seen)), "a family belongs to one head shape"


def _dry_run(target: Path, precision: int | None, source: Path = MLA_MODEL) -> list[str]:
    asked = ["--precision", str(precision)] if precision is not None else []
    r = subprocess.run([sys.executable, "-m", "mtpforge", "add-mtp", "--source", str(source), "--target", str(target),
                        *asked, "--dry-run", "--json"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    return [n for n in json.loads(r.stdout)["notes"] if "measured knee" in n or "docs/PRECISION.md" in n]


def test_add_mtp_notes_a_precision_below_the_knee(tmp_path: Path) -> None:
    from tests.support.synth import convert_to_mlx

    knee = TABLE["shapes"]["mla"]["knee_bits"]
    if knee is None or knee <= min(BITS):
        pytest.skip(f"the MLA knee is {knee}: no measured precision is below it")
    target = convert_to_mlx(MLA_MODEL, tmp_path / "mla-4bit", q_bits=4, q_group_size=64, dtype="float32")
    below = _dry_run(target, knee - 1)
    assert len(below) == 1 and f"(mla: {knee}-bit)" in below[0] and "docs/PRECISION.md" in below[0], below
    assert _dry_run(target, knee) == []


def test_add_mtp_notes_a_default_head_matching_a_target_below_the_knee(tmp_path: Path) -> None:
    """A dense head's default precision matches the target's quantization (MoE, MLA and hybrid
    heads default to bf16): a target below the dense knee gets the note too — the common 4-bit
    folder is one — and a target at the knee none."""
    from tests.support.synth import convert_to_mlx

    dense = ROOT / TABLE["shapes"]["dense"]["model"]
    knee = TABLE["shapes"]["dense"]["knee_bits"]
    if knee is None or knee <= min(BITS):
        pytest.skip(f"the dense knee is {knee}: no measured precision is below it")
    below = convert_to_mlx(dense, tmp_path / "below", q_bits=knee - 1, q_group_size=64, dtype="float32")
    notes = _dry_run(below, None, dense)
    assert len(notes) == 1 and f"matches the target's {knee - 1} bits; dense heads measured" in notes[0], notes
    assert f"pass --precision {knee} or more" in notes[0]
    at = convert_to_mlx(dense, tmp_path / "at", q_bits=knee, q_group_size=64, dtype="float32")
    assert _dry_run(at, None, dense) == []


def _add(target: Path, source: Path, precision: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "mtpforge", "add-mtp", "--source", str(source), "--target", str(target),
                        "--precision", precision, "--json"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_bits_head_keeps_a_bare_parameter_router_float_and_decodes(tmp_path: Path) -> None:
    """GLM's router is mlx-lm's ``MoEGate``, a bare parameter: quantized, no loader takes it."""
    from mtpforge.families.spec import Role
    from mtpforge.layouts.read import load_head_weights
    from mtpforge.verify import verify
    from tests.support.synth import convert_to_mlx

    target = convert_to_mlx(MLA_MODEL, tmp_path / "mla-8bit", q_bits=8, q_group_size=64, dtype="float32")
    _add(target, MLA_MODEL, "4")
    hw = load_head_weights(target)
    spec = FAMILIES[hw.family]
    routers = [k for k in hw.tensors if spec.role_of(k.removesuffix(".weight")) == Role.ROUTER or spec.role_of(k) == Role.ROUTER]
    assert routers and not [k for k in hw.tensors if k.endswith(".scales") and k.removesuffix(".scales") + ".weight" in routers]
    assert any(k.endswith(".scales") for k in hw.tensors)  # the rest is at the 4 bits asked for
    r = verify(str(target), generate=True, prompts=["hello"], max_tokens=16, progress=False)
    assert r["identical"], r


def test_a_bits_head_on_an_unquantized_target_leaves_its_backbone_loadable(tmp_path: Path) -> None:
    """The per-module entries of a quantized head in a bf16 folder's config come with the
    top-level bits mlx-lm's loader reads first; inspect still calls the backbone unquantized."""
    from mlx_lm.utils import load_model

    from mtpforge.inspect import inspect_checkpoint
    from tests.support.synth import convert_to_mlx

    dense = ROOT / "mtpforge" / "data" / "tiny-qwen3_5"
    target = convert_to_mlx(dense, tmp_path / "bf16", q_bits=None)
    _add(target, dense, "4")
    load_model(target)  # raised KeyError: 'group_size' before
    r = inspect_checkpoint(str(target))
    assert r["quantization"]["default"] is None and r["exit_code"] == 0, r["quantization"]
    assert r["quantization"]["mtp_modules"]["fc"]["bits"] == 4
