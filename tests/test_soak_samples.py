"""A small seeded sample of the two soak scripts (``scripts/soak_interrupt.py``: SIGINT and
SIGKILL at random moments; ``scripts/soak_race.py``: racing pairs of runs on one folder), so
the suite fails when either invariant breaks; the scripts run hundreds for the numbers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _script(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_interrupt_sample_every_folder_old_or_new_and_ctrl_c_truthful(tmp_path):
    s = _script("soak_interrupt").run(6, seed=3, variants=["qwen3_5"], root=tmp_path, log=False)
    # each failure whole (its problems last), so a run that fails once can be read from the log
    assert s["failures"] == [], "\n".join(str(f) for f in s["failures"])
    assert s["killed"] >= 6 and set(s["by_signal"]) == {"SIGINT", "SIGKILL"}, s["by_signal"]


def test_racing_pairs_sample_never_lose_the_original(tmp_path):
    s = _script("soak_race").run(5, seed=3, root=tmp_path, log=False)
    assert s["failures"] == [], s["failures"]
    assert s["pairs"] == 5
