"""Shared pytest fixtures live in their own modules; this file wires them in and ends a run with
one line per separately built program whose tests were skipped (tests/external.py), and with
the runtime conformance matrix when cells ran."""

from __future__ import annotations

import time
from typing import Any

from tests import external

_STARTED = time.time()

pytest_plugins = ["tests.fixtures_checkpoints", "tests.fixtures_hub"]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    reasons = []
    for rep in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(rep, "longrepr", None)
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            reasons.append(str(longrepr[2]).removeprefix("Skipped: "))
    for line in external.summary(reasons):
        terminalreporter.write_line(line)
    from tests.conformance.harness import matrix_summary

    for line in matrix_summary(_STARTED):
        terminalreporter.write_line(line)
