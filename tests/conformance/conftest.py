"""Session fixtures of the runtime conformance suite and its matrix report."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest

from tests import external
from tests.conformance import harness as H


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
    """``runtime_ready(name)``: skip (fail under MTPFORGE_CI) unless the runtime's virtualenv is
    built; the suite never builds one itself (``python scripts/setup_runtimes.py`` does)."""

    def ready(name: str) -> None:
        external.require(name, H.setup_runtimes.is_ready(name), f"no virtualenv at {H.setup_runtimes.venv_dir(name)}")

    return ready
