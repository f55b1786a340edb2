"""A GGUF head without --source or mtpforge's record: its norm convention told by the trunk's own
norms of the same kind where their level tells, else said undecided — never the family's rule
as if it had been measured.

llama.cpp's converter writes a trunk's norms with the same offset as the head's (+1 on Qwen's
zero-centred ones, none on GLM's), so a head norm whose kind the trunk's blocks carry
(``attn_norm`` ...) sits at their level when it is right, one above when it got one shift too
many. The trunk here is the synthetic one (tests/support/synth/gguf_trunk.py: every block norm
at 1, the level of a shifted Qwen norm); the head is add-mtp's, its record removed, as a head
from another tool comes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mtpforge.gguf.names import block_of

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "mtpforge" / "data" / "tiny-qwen3_5"


def _inspect(trunk: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    r = subprocess.run([sys.executable, "-m", "mtpforge", "inspect", str(trunk), "--json", *args], cwd=ROOT,
                       capture_output=True, text=True)
    t = subprocess.run([sys.executable, "-m", "mtpforge", "inspect", str(trunk), *args], cwd=ROOT, capture_output=True,
                       text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    return r.returncode, json.loads(r.stdout), t.stdout


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(trunk, head) in one folder, the head written by add-mtp and its record deleted."""
    from tests.support.synth.gguf_trunk import synthetic_trunk

    d = tmp_path_factory.mktemp("gguf-foreign")
    trunk = synthetic_trunk(SRC, d / "Tiny-Qwen3_5-F32.gguf")
    r = subprocess.run([sys.executable, "-m", "mtpforge", "add-mtp", "--source", str(SRC), "--target", str(trunk),
                        "--json"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    head = Path(json.loads(r.stdout)["output"])
    Path(str(head) + ".mtpforge.json").unlink()
    return trunk, head


def _with_head(foreign: tuple[Path, Path], tmp_path: Path, offset: float) -> Path:
    """The trunk beside a copy of the head whose norms carry ``offset`` more."""
    from tests.test_gguf import _rewrite

    trunk, head = foreign
    t = Path(shutil.copyfile(trunk, tmp_path / trunk.name))
    _rewrite(head, tmp_path / head.name, edit=lambda k, a: (a + offset) if offset and block_of(k) is not None
             and k.endswith("norm.weight") and block_of(k) >= 4 else None)
    return t


def test_a_correct_head_is_measured_against_the_trunk(foreign, tmp_path: Path) -> None:
    code, rep, text = _inspect(_with_head(foreign, tmp_path, 0))
    assert code == 0 and rep["findings"] == [], rep["findings"]
    assert (rep["norm_convention"], rep["norm_convention_from"]) == ("shifted", "trunk")
    assert "shifted (measured: trunk)" in text, text


@pytest.mark.parametrize(("offset", "code", "conv"), [(1, "MTP_NORMS_DOUBLE_SHIFTED", "double-shifted"),
                                                     (-1, "MTP_NORMS_RAW", "raw")])
def test_a_wrong_head_is_found_from_the_trunk(foreign, tmp_path: Path, offset: int, code: str, conv: str) -> None:
    rc, rep, _ = _inspect(_with_head(foreign, tmp_path, offset))
    assert rc == 1 and [f["code"] for f in rep["findings"]] == [code], rep["findings"]
    assert (rep["norm_convention"], rep["norm_convention_from"]) == (conv, "trunk")


def test_a_level_the_trunk_does_not_tell_is_undecided(foreign, tmp_path: Path) -> None:
    """Half a unit off: no convention's level fits, so nothing is claimed."""
    code, rep, text = _inspect(_with_head(foreign, tmp_path, 0.5))
    assert code == 0 and rep["findings"] == [] and rep["norm_convention"] == "unknown", rep
    assert "undecided" in text and "(from" not in text, text


def test_source_still_decides_exactly(foreign, tmp_path: Path) -> None:
    code, rep, _ = _inspect(_with_head(foreign, tmp_path, 0), "--source", str(SRC))
    assert code == 0 and (rep["norm_convention"], rep["norm_convention_from"]) == ("shifted", "source")
    assert np.isfinite(rep["mtp_bytes"])
