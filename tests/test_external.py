"""The rule for suites that drive a separately built program: skip with the command that sets it
up, fail under MTPFORGE_CI, and end the run with one line per missing program."""

from __future__ import annotations

import pytest

from tests import external


def test_missing_program_skips_naming_its_setup_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MTPFORGE_CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"needs llama\.cpp: `bash scripts/setup_llama_cpp\.sh`"):
        external.require("llama.cpp", False)
    external.require("llama.cpp", True)  # present: nothing happens


@pytest.mark.parametrize("value", ["1", "true"])
def test_missing_program_fails_under_ci(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("MTPFORGE_CI", value)
    with pytest.raises(pytest.fail.Exception, match="MTPFORGE_CI requires it"):
        external.require("mtplx", False)


def test_ci_switch_off_values_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTPFORGE_CI", "0")
    with pytest.raises(pytest.skip.Exception):
        external.require("chromium", False)


def test_summary_is_one_line_per_program() -> None:
    reasons = ["needs mtplx: x", "needs mtplx: y", "needs chromium: z", "no bundled model"]
    assert external.summary(reasons) == [
        "skipped 2 tests that need mtplx: `python scripts/setup_runtimes.py mtplx` enables them",
        "skipped 1 test that needs chromium: `apt-get install -y chromium` enables it",
    ]


@pytest.mark.parametrize("ci,full,runs", [("", "", False), ("1", "", True), ("", "1", True), ("0", "0", False),
                                         ("1", "0", False)])
def test_the_long_suites_run_under_ci_or_when_asked(monkeypatch: pytest.MonkeyPatch, ci: str, full: str, runs: bool) -> None:
    monkeypatch.setenv("MTPFORGE_CI", ci)
    monkeypatch.setenv("MTPFORGE_FULL", full)
    assert external.full_run() is runs
    assert external.summary(["needs the full run: x"]) == [
        "skipped 1 test that needs the full run: `MTPFORGE_FULL=1 python -m pytest` enables it"]
