"""Tests that drive a separately built program: llama.cpp, the runtimes' own virtualenvs, Chromium.

The README's test command runs on a machine where none of them exists; there these tests skip,
and the run ends with one line per missing program naming the command that sets it up. Under
``MTPFORGE_CI=1`` (what ``.ci/run`` sets after building them all) a missing program fails the
test instead, so CI cannot go green by skipping. Nothing here builds anything: a suite that
quietly built gigabytes of virtualenvs on a newcomer's first ``pytest`` was the bug this replaces.
"""

from __future__ import annotations

import os

import pytest

#: what sets each program up, in the words the skip line and the README use
SETUP: dict[str, str] = {
    "llama.cpp": "bash scripts/setup_llama_cpp.sh",
    "mtplx": "python scripts/setup_runtimes.py mtplx",
    "vllm-mlx": "python scripts/setup_runtimes.py vllm-mlx",
    "mlx-vlm": "python scripts/setup_runtimes.py mlx-vlm",
    "chromium": "apt-get install -y chromium",
    # not a program: the suites whose minutes the README's ten-minute command cannot hold
    # (tests/conftest.py's LONG); CI runs them, and anyone can
    "the full run": "MTPFORGE_FULL=1 python -m pytest",
}
#: skip reasons start with this, so the summary can count them per program
PREFIX = "needs "


def in_ci() -> bool:
    return os.environ.get("MTPFORGE_CI", "").strip().lower() not in ("", "0", "false", "no")


def full_run() -> bool:
    """The long suites run: under CI, or when asked for — and not where ``MTPFORGE_FULL`` says
    no in so many words (CI's lowest-versions step: the README's set, with CI's failing skips)."""
    full = os.environ.get("MTPFORGE_FULL", "").strip().lower()
    if full in ("0", "false", "no"):
        return False
    return in_ci() or full != ""


def require(program: str, present: bool, detail: str = "") -> None:
    """Skip (or, under MTPFORGE_CI, fail) the calling test unless ``program`` is set up."""
    if present:
        return
    why = f"{PREFIX}{program}: `{SETUP[program]}` sets it up" + (f" ({detail})" if detail else "")
    if in_ci():
        pytest.fail(f"{why}; MTPFORGE_CI requires it")
    pytest.skip(why)


def summary(reasons: list[str]) -> list[str]:
    """One line per missing program, from the skip reasons of a run."""
    counts: dict[str, int] = {}
    for r in reasons:
        for program in SETUP:
            if r.startswith(f"{PREFIX}{program}:"):
                counts[program] = counts.get(program, 0) + 1
    return [f"skipped {n} test{'s that need' if n > 1 else ' that needs'} {p}: `{SETUP[p]}` enables "
            f"{'them' if n > 1 else 'it'}"
            for p, n in counts.items()]
