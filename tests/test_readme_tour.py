"""The README's tour, run as a newcomer runs it: ``mtpforge demo --keep ./tour``, then every
``$ mtpforge ...`` block in order, each output compared with what the README shows (at 100
columns, no colour). Only the tok/s rows of verify's table vary from run to run: their values are
not compared. Also the README's shape: a table of contents whose links resolve, no line over 120
characters outside code blocks."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
#: verify's rows whose values are timings
VARYING = ("baseline_tok_s", "mtp_tok_s", "speedup")


def _blocks() -> list[tuple[str, list[str]]]:
    """(command, expected output lines) of every ```text block that starts with ``$ mtpforge``."""
    out = []
    for body in re.findall(r"```text\n(.*?)```", README, flags=re.S):
        lines = body.rstrip("\n").split("\n")
        if lines[0].startswith("$ mtpforge "):
            out.append((lines[0][2:], lines[1:]))
    return out


def _masked(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        line = line.rstrip()
        key = line.strip("│ ").split(" ")[0] if line.startswith("│") else ""
        out.append(f"│ {key} <varies>" if key in VARYING else line)
    return out


def _run(cmd: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run([sys.executable, "-m", "mtpforge", *shlex.split(cmd)[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_tour_prints_what_the_readme_shows(tmp_path: Path) -> None:
    assert "mtpforge demo --keep ./tour" in README
    blocks = _blocks()
    assert len(blocks) >= 5, "the tour's command blocks"
    demo = _run("mtpforge demo --keep ./tour", tmp_path)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "['" not in demo.stdout and "demo passed: inspect before: MTP_CONFIG_WITHOUT_WEIGHTS;" in demo.stdout, \
        demo.stdout[-600:]  # the verdict names codes, not a Python list
    for cmd, want in blocks:
        r = _run(cmd, tmp_path)
        assert r.returncode in (0, 1), f"{cmd}: {r.stderr}"
        assert _masked(r.stdout.rstrip("\n").split("\n")) == _masked(want), f"{cmd} prints today:\n{r.stdout}"


def test_readme_lines_and_table_of_contents() -> None:
    in_code, long = False, []
    for n, line in enumerate(README.split("\n"), 1):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and len(line) > 120:
            long.append(n)
    assert not long, f"README lines over 120 characters: {long}"
    headings = re.findall(r"^## (.+)$", README, flags=re.M)
    anchors = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
    toc = re.findall(r"^- \[[^\]]+\]\(#([^)]+)\)$", README, flags=re.M)
    assert toc and set(toc) <= anchors, (set(toc) - anchors)
    assert set(toc) == anchors - {"contents"}, "every section is in the table of contents"


@pytest.mark.parametrize("doc", sorted(set(re.findall(r"\]\((docs/[\w.]+\.md)", README))))
def test_readme_links_resolve(doc: str) -> None:
    assert (REPO / doc).is_file(), doc
