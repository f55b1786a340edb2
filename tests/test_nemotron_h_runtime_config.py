"""A Nemotron-H folder made by released mlx-lm, written with ``--runtime mtplx`` / ``mlx-lm-mtp``,
decodes in that runtime's own code.

Nemotron-H's releases carry ``"time_step_limit": [0.0, Infinity]``; released mlx-lm 0.32.2's
``convert`` saves it tagged, ``[0.0, {"__float__": "Infinity"}]``. MTPLX 2.12.2 and mlx-lm #1533
are built on mlx-lm 0.31.x, which has no decoder for the tag: the folder loads, and the first
decode step stops (``Invalid type dict received in array initialization``). ``--runtime R``
promises what R loads and drafts, so for those rows add-mtp writes config.json as their mlx-lm
reads it (the key left out: its value is mlx-lm's own default in 0.31 and 0.32 alike), records
that in mtpforge.json, and remove-mtp gives the tagged file back byte for byte. Plain add-mtp
(the portable default) leaves config.json's values alone. MTPLX's own code judges (a cell beside
the conformance matrix: skipped without its virtualenv, failing under MTPFORGE_CI=1).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from mtpforge.runtimes import RUNTIMES
from mtpforge.runtimes.config import untagged_config
from tests import mlx_judged as judged
from tests.checkers import folder_state

TAGGED = [0.0, {"__float__": "Infinity"}]


@pytest.fixture(scope="module")
def nemotron(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.support.synth import convert_to_mlx
    from tests.support.synth.nemotron_h import build_nemotron_h

    root = tmp_path_factory.mktemp("nemotron_h-tagged")
    src = build_nemotron_h(root / "tiny-nemotron_h", time_step_limit=[0.0, math.inf])
    mlx = convert_to_mlx(src, root / "tiny-nemotron_h-4bit", q_bits=4, q_group_size=32, dtype="float32")
    return {"root": root, "src": src, "mlx": mlx}


def _cfg(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text())


def test_released_mlx_lm_tags_the_infinity() -> None:
    """The premise, held by mlx-lm 0.32.2 itself (mtpforge's own dependency)."""
    from mlx_lm.utils import _encode_tagged_floats

    assert _encode_tagged_floats([0.0, math.inf]) == TAGGED


def test_the_rows_built_on_mlx_lm_031_read_no_tags() -> None:
    assert {n for n, r in RUNTIMES.items() if not r.reads_tagged_floats} >= {"mtplx", "mlx-lm-mtp"}
    assert RUNTIMES["mlx-lm"].reads_tagged_floats


def test_untagging_leaves_a_default_out_and_writes_any_other_value() -> None:
    cfg = {"a": 1, "time_step_limit": TAGGED, "text_config": {"time_step_limit": [0.1, {"__float__": "Infinity"}]},
           "other": {"__float__": "NaN"}}
    out, done = untagged_config(cfg, "nemotron_h")
    assert "time_step_limit" not in out and out["text_config"]["time_step_limit"] == [0.1, math.inf]
    assert out["other"] == {"__float__": "NaN"}  # a key add-mtp never rewrites stays as it was
    assert done == {"time_step_limit": "left out (mlx-lm's default)", "text_config.time_step_limit": "bare float"}
    assert cfg["time_step_limit"] == TAGGED  # the input is not changed


def test_the_released_mlx_lm_folder_holds_the_tag(nemotron) -> None:
    assert _cfg(nemotron["mlx"])["time_step_limit"] == TAGGED


@pytest.mark.parametrize("runtime", ["mtplx", "mlx-lm-mtp"])
def test_runtime_writes_a_config_its_mlx_lm_reads_and_remove_mtp_restores_it(nemotron, tmp_path: Path, runtime: str) -> None:
    folder = Path(shutil.copytree(nemotron["mlx"], tmp_path / runtime))
    before = folder_state(folder)
    rep = judged.add_mtp(nemotron["src"], folder, "--runtime", runtime)
    cfg = _cfg(folder)
    assert "time_step_limit" not in cfg and "__float__" not in (folder / "config.json").read_text()
    m = json.loads((folder / "mtpforge.json").read_text())
    assert m["config_for_runtime"]["keys"] == {"time_step_limit": "left out (mlx-lm's default)"}
    assert m["config_for_runtime"]["runtime"] == runtime
    assert any("time_step_limit" in n for n in rep["notes"]), rep["notes"]
    r = judged.mtpforge("remove-mtp", str(folder), "--json")
    assert r.returncode == 0, r.stderr
    assert folder_state(folder) == before


def test_plain_add_mtp_leaves_the_values_alone(nemotron, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(nemotron["mlx"], tmp_path / "plain"))
    judged.add_mtp(nemotron["src"], folder)
    assert _cfg(folder)["time_step_limit"] == TAGGED
    assert "config_for_runtime" not in json.loads((folder / "mtpforge.json").read_text())


@pytest.mark.xdist_group("conformance")
def test_mtplx_decodes_the_runtime_folder_and_not_the_tagged_one(nemotron, tmp_path: Path) -> None:
    """MTPLX's own code: the ``--runtime mtplx`` folder loads with MTP, drafts and decodes as its
    plain decode; the same head beside the tagged config.json (plain add-mtp) stops at its
    first decode step — what the rewrite is for (a fixed MTPLX makes this fail: drop the rewrite)."""
    judged.require_mtplx()
    ours = Path(shutil.copytree(nemotron["mlx"], tmp_path / "runtime-mtplx"))
    judged.add_mtp(nemotron["src"], ours, "--runtime", "mtplx")
    got = judged.mtplx_drafts(ours)
    assert got["mtp_enabled"] and got["identical"] and got["drafted"] > 0, got
    tagged = Path(shutil.copytree(nemotron["mlx"], tmp_path / "plain"))
    judged.add_mtp(nemotron["src"], tagged)
    r = judged.mtplx_run(judged.MTPLX_PROBE, tagged)
    assert r.returncode != 0 and "Invalid type dict" in r.stderr, r.stdout + r.stderr[-1500:]
