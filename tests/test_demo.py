"""`mtpforge demo` and the runnable API examples, on the bundled tiny trained model, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtpforge.demo import MIN_ACCEPTANCE, run_demo, tiny_model_path

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = ROOT / "mtpforge" / "data" / "tiny-qwen3_5"
OFFLINE_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}



def run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=OFFLINE_ENV, timeout=900)


def test_demo_json_end_to_end(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    proc = run(["-m", "mtpforge", "demo", str(work), "--json"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)  # with --json, stdout is exactly one JSON object
    assert r["ok"] is True and r["directory"] == str(work.resolve())
    s = r["steps"]
    assert s["convert"]["mtp_tensors"] == 0 and s["convert"]["config_mtp_layers"] == 1
    assert "MTP_CONFIG_WITHOUT_WEIGHTS" in r["before"] and s["inspect_before"]["exit_code"] == 1
    assert s["add_mtp"]["status"] == "written" and s["add_mtp"]["layout"] == "sidecar"
    assert s["add_mtp"]["mlx_lm_logits_unchanged"] is True
    assert r["after"] == "clean" and s["inspect_after"]["norm_convention"] == "shifted"
    assert r["identical"] is True and r["acceptance"] >= MIN_ACCEPTANCE
    assert s["verify"]["drafted"] > 0 and s["verify"]["accepted"] <= s["verify"]["drafted"]
    assert (work / "tiny-qwen3_5-4bit" / "mtp.safetensors").is_file()


def test_demo_refuses_a_folder_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    proc = run(["-m", "mtpforge", "demo", str(tmp_path)])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()] == [
        f"error: {tmp_path} is not empty — fix: pass a new or empty folder (the demo never overwrites files), or none for a temporary one"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_demo_fails_when_the_head_does_not_draft(make_hf, tmp_path: Path) -> None:
    """An untrained (random) head passes every structural step and keeps greedy output
    identical, but drafts far below the demo's floor: the demo must say so and exit 1."""
    r = run_demo(str(tmp_path / "d"), progress=False, source=str(make_hf("qwen3_5")))
    s = r["steps"]
    assert all(s[k]["ok"] for k in ("convert", "inspect_before", "add_mtp", "inspect_after"))
    assert s["verify"]["ok"] is False and s["verify"]["identical"] is True
    assert r["ok"] is False and r["exit_code"] == 1


def test_bundled_model_is_found_through_the_package() -> None:
    assert tiny_model_path() == TINY_MODEL


EXAMPLES = ["add_mtp_api.py", "inspect_api.py", "verify_api.py"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_examples_run_offline(example: str, tmp_path: Path) -> None:
    proc = run([str(ROOT / "examples" / example), str(tmp_path / "work")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_demo_keep_refuses_a_folder_that_is_not_empty_before_doing_anything(tmp_path: Path) -> None:
    keep = tmp_path / "tour"
    keep.mkdir()
    (keep / "mine.txt").write_text("mine")
    work = tmp_path / "work"
    proc = run(["-m", "mtpforge", "demo", str(work), "--keep", str(keep)])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and f"{keep} is not empty" in proc.stderr
    assert sorted(p.name for p in keep.iterdir()) == ["mine.txt"] and not work.exists()
