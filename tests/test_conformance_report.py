"""The printed runtime conformance matrix holds every cell this run decoded, whichever process
decoded it: each (runtime, family) group is written by the pytest-xdist worker that ran it, and
the run's summary joins the groups of this run only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conformance import harness as H

REPO = Path(__file__).resolve().parents[1]
#: one group's rows written by another process, as a worker writes them
WRITE = """
import sys
from tests.conformance import harness as H
rt = sys.argv[1]
H.record_group(rt, "qwen3_5", [{"cell": f"{rt}-qwen3_5-{p}", "add_mtp": "add-mtp --runtime " + rt, "kind": "runtime",
                                "runtime": rt, "family": "qwen3_5", "outcome": "add-mtp refused", "verdict": "fails",
                                "error": "refused in " + rt} for p in ("4", "8")], 1.5)
"""


def test_the_matrix_joins_the_groups_every_process_wrote(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "matrix.json"
    monkeypatch.setenv("MTPFORGE_CONFORMANCE_JSON", str(out))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    stale = H.matrix_path().with_name("matrix-groups") / "old--qwen3_5.json"
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"seconds": 9, "cells": [{"cell": "from-an-earlier-run"}]}))
    time.sleep(0.05)
    since = time.time()
    time.sleep(0.05)
    for rt in ("mtplx", "vllm-mlx"):
        subprocess.run([sys.executable, "-c", WRITE, rt], env=env, cwd=REPO, check=True)
    lines = H.matrix_summary(since)
    assert lines[0] == "runtime conformance matrix (4 cells, 3 s)", lines
    cells = [line.split()[0] for line in lines[2:6]]
    assert cells == ["mtplx-qwen3_5-4", "mtplx-qwen3_5-8", "vllm-mlx-qwen3_5-4", "vllm-mlx-qwen3_5-8"], lines
    assert all("add-mtp refused: refused in" in line for line in lines[2:6])
    assert [c["cell"] for c in json.loads(out.read_text())["cells"]] == cells
    assert lines[-1] == f"matrix written to {out}"
    assert H.matrix_summary(time.time() + 60) == []  # nothing decoded by a later run
