"""SIGKILL ``add-mtp`` / ``remove-mtp`` at seeded moments: the folder is always exactly as before
or exactly as after (byte for byte, ``inspect`` clean, ``mlx_lm.load`` loads it), blobs behind
a Hub-cache snapshot never change, ``--output`` never leaves a half-written folder under its
name, and a re-run finishes the job. The harness is shared with ``scripts/soak_kill.py``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.checkers import folder_state
from tests.crash_harness import (
    ANCHORS,
    Bench,
    kill_once,
    leftovers,
    make_bench,
    plan_kills,
    run_cli,
    summarize,
)

SEED = 7
#: (scenario, variant, kills) — 26 kill moments, every scenario, both default layouts (the soak
#: script, scripts/soak_kill.py, runs hundreds)
MATRIX: list[tuple[str, str, int]] = [
    ("add", "qwen3_5", 5),
    ("add", "qwen3_next", 3),
    ("add-symlinked", "qwen3_5", 4),
    ("add-output", "qwen3_5", 3),
    ("remove", "qwen3_5", 3),
    ("remove-symlinked", "qwen3_next", 2),
    ("add-rename-fallback", "qwen3_5", 2),
    ("add-output-empty", "qwen3_5", 2),
    ("replace-force", "qwen3_5", 2),
]


@pytest.fixture(scope="module")
def benches(synth, tmp_path_factory) -> dict[str, Bench]:
    root = tmp_path_factory.mktemp("crash")
    out = {}
    for scenario, variant, _ in MATRIX:
        b = make_bench(scenario, synth.hf(variant), synth.target(variant), root, variant)
        out[b.name] = b
    return out


@pytest.fixture(scope="module")
def outcomes(benches, tmp_path_factory):
    work = tmp_path_factory.mktemp("kills")
    results = []
    for scenario, variant, n in MATRIX:
        bench = benches[f"{scenario}/{variant}"]
        for i, plan in enumerate(plan_kills(bench, n, SEED)):
            results.append(kill_once(bench, work / f"{scenario}-{variant}-{i}", plan))
            shutil.rmtree(work / f"{scenario}-{variant}-{i}", ignore_errors=True)
    return results


def test_every_kill_leaves_the_folder_old_or_new_and_a_rerun_finishes(outcomes):
    s = summarize(outcomes)
    print(s)
    assert s["failures"] == [], s["failures"]
    assert s["killed"] >= 20, s


def test_kills_landed_in_every_phase(outcomes):
    """A crash test whose kills all land during interpreter start-up proves nothing."""
    s = summarize(outcomes)
    phases = set(s["by_phase"])
    assert "before staging (start-up, reading, fetching)" in phases, s
    assert "staging (mirror / convert / manifest)" in phases, s
    assert "staged and validated, before the swap" in phases, s
    assert s["by_state"].get("after", 0) >= 1, s
    assert {o.scenario for o in outcomes if o.killed} == {b for b in {f"{m[0]}/{m[1]}" for m in MATRIX}}


def test_the_anchors_were_seen(benches):
    for b in benches.values():
        if b.spec["cmd"] == "add":
            assert set(b.anchor_seconds) == set(ANCHORS) - {"staging"}, (b.name, b.anchor_seconds)
        else:
            assert set(b.anchor_seconds) == {"staging", "committing"}, (b.name, b.anchor_seconds)


def _dead_pid() -> int:
    """The pid of a process that has exited (leftovers of live runs are left alone)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_second_run_on_a_busy_folder_refuses_and_leaves_the_first_alone(synth, tmp_path):
    """Two runs on one folder: the second must neither delete the first's stage under its feet
    nor race it to the swap (the last swap would silently drop the first run's change)."""
    target = tmp_path / "model"
    shutil.copytree(synth.target("qwen3_5"), target)
    before = folder_state(target)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stage = tmp_path / f".model.mtpforge-stage-{live.pid}"
        stage.mkdir()
        r = run_cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(target)])
        assert r.returncode == 1 and "another mtpforge run" in r.stderr, r.stderr
        assert stage.is_dir() and folder_state(target) == before
    finally:
        live.kill()
        live.wait()
    r = run_cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(target)])
    assert r.returncode == 0 and not stage.exists(), r.stderr  # the dead run's stage is cleaned up


def test_leftovers_of_a_killed_run_are_removed_by_the_next_run(synth, tmp_path):
    """What a kill leaves beside the target — a half-written stage and a half-deleted old copy —
    is hidden from mlx-lm and removed by the next run, whatever its outcome."""
    target = tmp_path / "model"
    shutil.copytree(synth.target("qwen3_5"), target)
    stage = tmp_path / f".model.mtpforge-stage-{_dead_pid()}"
    shutil.copytree(target, stage)
    (stage / "model-mtp.safetensors").write_bytes(b"\0" * 100)  # half-written
    old = tmp_path / f".model.mtpforge-stage-{_dead_pid()}"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"old")
    # a sibling whose name merely starts like ours: not ours to delete
    other = tmp_path / ".model2.mtpforge-stage-999997"
    other.mkdir()
    r = run_cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(target)])
    assert r.returncode == 0, r.stderr
    assert leftovers(tmp_path) == [other.name]
    r = run_cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(target)])
    assert r.returncode == 0 and "already" in (r.stdout + r.stderr)
    stage.mkdir()
    r = run_cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(target)])
    assert r.returncode == 0 and leftovers(tmp_path) == [other.name], "an already-present run must clean up too"


def test_fallback_swap_interrupted_between_its_two_renames_is_rolled_back(synth, tmp_path):
    """Without an exchange primitive the swap is two renames; killed between them, the target
    is briefly absent and the old folder waits beside it. The next run puts it back first."""
    target = tmp_path / "model"
    shutil.copytree(synth.target("qwen3_5"), target)
    before = folder_state(target)
    old = tmp_path / f".model.mtpforge-old-{_dead_pid()}"
    os.rename(target, old)
    staged = tmp_path / f".model.mtpforge-stage-{_dead_pid()}"
    shutil.copytree(old, staged)
    r = run_cli(["remove-mtp", str(target)])
    assert r.returncode == 1 and "no mtpforge.json" in r.stderr, r.stderr  # found the folder again
    assert target.is_dir() and folder_state(target) == before
    assert leftovers(tmp_path) == []


def test_output_into_an_existing_empty_folder_swaps_it(synth, tmp_path):
    """An empty --output folder the user made is replaced in one step, never removed first."""
    target = tmp_path / "model"
    shutil.copytree(synth.target("qwen3_5"), target)
    out = tmp_path / "out"
    out.mkdir()
    r = run_cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(target), "--output", str(out)])
    assert r.returncode == 0, r.stderr
    assert (out / "mtp.safetensors").is_file() and leftovers(tmp_path) == []
