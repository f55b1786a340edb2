"""The suite's xdist groups hold: with the pytest and pytest-xdist installed, ``--dist
loadgroup`` runs every test of a group on one worker. pytest 9.2 with pytest-xdist 3.8 silently
did not (the group never reached the node id), so the GGUF tests ran two llama-server thread
pools at once and each conformance group was decoded on both workers; pyproject.toml's dev extra
keeps pytest below 9.2, and tests/conftest.py fails grouped tests where grouping is lost."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GROUPED = """
import time, pytest
pytestmark = pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    time.sleep(0.2)
"""
LOOSE = """
import time, pytest
@pytest.mark.parametrize("i", range(6))
def test_loose(i):
    time.sleep(0.2)
"""


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_loose.py").write_text(LOOSE)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                        "-v", "-o", "addopts=", "--rootdir", str(tmp_path), str(tmp_path)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ran = re.findall(r"\[(gw\d+)\].*PASSED .*::(test_\w+)\[", r.stdout)
    workers = {w for w, name in ran if name == "test_grouped"}
    assert len([1 for _, n in ran if n == "test_grouped"]) == 6 and len(workers) == 1, ran
    assert len({w for w, name in ran}) == 2, ran  # the other tests spread: two workers were there
