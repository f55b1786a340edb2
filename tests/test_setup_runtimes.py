"""scripts/setup_runtimes.py: a finished venv is reused, an interrupted build is never mistaken for
one and its leftovers go on the next run (without touching a build in progress)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import setup_runtimes as S  # noqa: E402


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MTPFORGE_CACHE", str(tmp_path))
    return tmp_path / "runtimes"


def _fake_finished(name: str) -> Path:
    d = S.venv_dir(name)
    (d / "bin").mkdir(parents=True)
    (d / "bin" / "python").symlink_to(sys.executable)
    (d / S.STAMP).write_text(json.dumps({"name": name, "version": S.RUNTIMES[name]["version"],
                                         "install_seconds": 1.0, "size_bytes": 1, "freeze": []}))
    return d


def test_venvs_live_outside_the_repo_by_name_and_version(cache: Path) -> None:
    assert S.venv_dir("mtplx") == cache / "mtplx-2.12.2"
    assert S.venv_dir("vllm-mlx") == cache / "vllm-mlx-0.6.0"
    assert S.venv_dir("mlx-vlm") == cache / "mlx-vlm-0.7.10"


def test_a_finished_venv_is_reused_without_pip(cache: Path) -> None:
    _fake_finished("mtplx")
    r = subprocess.run([sys.executable, S.__file__, "mtplx", "--json"], capture_output=True, text=True,
                       env={**os.environ, "MTPFORGE_CACHE": str(cache.parent), "PIP_NO_INDEX": "1"}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["mtplx"]["install_seconds"] == 1.0
    assert "building" not in r.stderr


def test_a_folder_without_its_stamp_is_not_finished(cache: Path) -> None:
    d = _fake_finished("mlx-vlm")
    (d / S.STAMP).unlink()
    assert not S.is_ready("mlx-vlm")


def test_leftovers_of_an_interrupted_build_are_removed_but_a_live_build_is_kept(cache: Path) -> None:
    cache.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = cache / f".mtplx-2.12.2.tmp-{dead.pid}"
    live = cache / f".mtplx-2.12.2.tmp-{os.getpid()}"
    for d in (stale, live):
        (d / "bin").mkdir(parents=True)
    S._clean_leftovers("mtplx")
    assert not stale.exists()
    assert live.exists()


def test_unknown_runtime_is_one_line_and_exit_2(cache: Path) -> None:
    r = subprocess.run([sys.executable, S.__file__, "nope"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "unknown runtime 'nope'" in r.stderr
