"""``mtpforge align``'s refusals and its rule that a head is never made worse: fast (no real
fine-tune). What align wins back is measured in tests/test_align_measured.py (a full run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtpforge.align import align
from mtpforge.community import convert_to_mlx
from mtpforge.pipeline import add_mtp
from mtpforge.verify import verify
from tests.checkers import folder_state

MODEL = Path(__file__).resolve().parent.parent / "mtpforge" / "data" / "tiny-qwen3_5"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "mtpforge", "align", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def one_line_error(r: subprocess.CompletedProcess[str], code: int) -> dict:
    assert r.returncode == code, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and " — fix: " in lines[0], r.stderr
    return json.loads(r.stdout)["error"]


@pytest.fixture(scope="module")
def headed(bare: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 2-bit trunk with its full-precision head put back (a copy: ``bare`` stays headless)."""
    target = tmp_path_factory.mktemp("align-headed") / "t"
    target.mkdir()
    for p in bare.iterdir():
        (target / p.name).write_bytes(p.read_bytes())
    add_mtp(source=str(MODEL), target=str(target), precision="bf16", progress=False)
    return target


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained dense model through mlx_lm.convert at 2 bits: no head."""
    return convert_to_mlx(MODEL, tmp_path_factory.mktemp("align") / "2bit", q_bits=2)


def test_a_gguf_is_refused_in_one_line_saying_align_is_mlx_only(tmp_path: Path) -> None:
    trunk = tmp_path / "model-Q4_K_M.gguf"
    trunk.write_bytes(b"GGUF" + bytes(60))
    err = one_line_error(cli(str(trunk), "--json"), 2)
    assert err["code"] == "BAD_INPUT" and "MLX-only" in err["message"] and "llama.cpp" in err["message"]
    assert trunk.read_bytes() == b"GGUF" + bytes(60)


def test_a_folder_without_a_head_is_refused_and_left_alone(bare: Path) -> None:
    before = folder_state(bare.parent)
    err = one_line_error(cli(str(bare), "--json"), 1)
    assert err["code"] in ("MTP_HEAD_MISSING", "MTP_CONFIG_WITHOUT_WEIGHTS") and "no MTP" in err["message"]
    assert folder_state(bare.parent) == before


def test_no_folder_and_bad_flags_are_bad_input(tmp_path: Path) -> None:
    assert one_line_error(cli(str(tmp_path / "nothing"), "--json"), 2)["code"] == "BAD_INPUT"
    r = cli(str(tmp_path), "--steps", "0")
    assert r.returncode == 2 and "--steps" in r.stderr


def test_a_run_that_does_not_improve_leaves_the_folder_byte_identical(headed: Path) -> None:
    """With one token a prompt nothing is drafted: 0% before and after, so nothing may be written
    (the same rule keeps any head whose fine-tune measured no better)."""
    before = folder_state(headed.parent)
    r = align(str(headed), steps=2, max_tokens=1, sequences=4, length=8, progress=False)
    assert r["status"] == "not-improved" and r["files_written"] == [] and r["exit_code"] == 0
    assert r["before"]["acceptance"] == r["after"]["acceptance"] == 0.0 and r["changed_tensors"] > 0
    assert folder_state(headed.parent) == before  # no stage left beside it either


def test_verify_names_align_where_a_2bit_trunk_costs_the_head(headed: Path) -> None:
    """The full-precision head drafts ~54% on the 2-bit trunk against ~91% on a full one (the
    precision table): verify says why and names align, as a note (the check still passes)."""
    r = verify(str(headed), generate=True, progress=False)
    assert r["ok"] and r["identical"] is True and r["acceptance"] < 0.75
    assert r.get("advice") == "align"
    assert any("mtpforge align" in n and "2-bit" in n for n in r["notes"]), r["notes"]
