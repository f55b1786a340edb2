"""Session fixtures of the runtime conformance suite and its matrix report."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.conformance import harness as H

_T0 = time.monotonic()


@pytest.fixture(scope="session")
def work_root() -> Any:
    """This session's own scratch folder (not pytest's numbered basetemp, which a concurrent
    pytest run of the same user may rotate away under a long suite)."""
    root = Path(tempfile.mkdtemp(prefix="mtpforge-conformance-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def models(work_root: Path) -> H.Models:
    """The trained sources and one real mlx_lm conversion (4-bit) of each, shared by every cell."""
    return H.Models(work_root / "models")


@pytest.fixture(scope="session")
def bare_cache() -> dict:
    """(runtime, family) -> that runtime's greedy output on the folder without a head."""
    return {}


@pytest.fixture(scope="session")
def runtime_ready() -> Callable[[str], None]:
    """``runtime_ready(name)``: the runtime's venv, built when absent (once; cached outside the
    repo); skips with the build's own error only when it cannot be built here."""
    failed: dict[str, str] = {}

    def ready(name: str) -> None:
        if H.setup_runtimes.is_ready(name):
            return
        if name not in failed:
            try:
                H.setup_runtimes.build(name, log=lambda m: None)
            except Exception as e:  # the build's failure is the skip reason
                failed[name] = f"{type(e).__name__}: {e}"
        if name in failed:
            pytest.skip(f"runtime venv {H.setup_runtimes.venv_dir(name)} is absent and cannot be built: {failed[name]}")

    return ready


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not H.RESULTS:
        return
    seconds = time.monotonic() - _T0
    for line in H.matrix_lines(H.RESULTS, seconds):
        terminalreporter.write_line(line)
    out = Path(os.environ.get("MTPFORGE_CONFORMANCE_JSON") or H.REPO / "build" / "conformance-matrix.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seconds": round(seconds, 1), "cells": H.RESULTS,
                               "not_installable": H.NOT_INSTALLABLE}, indent=1, default=str))
    terminalreporter.write_line(f"matrix written to {out}")
