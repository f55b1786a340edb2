"""``--help`` reads well at 80 and 120 columns: every flag whole, choice lists unbroken, no type
placeholders, a usage line a person would write, no line past the width; and ``--version``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from mtpforge.cli import app

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {name: cmd for name, cmd in typer.main.get_command(app).commands.items() if not cmd.hidden}


def _help(args: list[str], width: int) -> str:
    env = {**os.environ, "COLUMNS": str(width), "NO_COLOR": "1", "TERM": "dumb"}
    r = subprocess.run([sys.executable, "-m", "mtpforge", *args, "--help"], capture_output=True, text=True,
                       env=env, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_every_command_is_checked() -> None:
    assert {"inspect", "add-mtp", "convert", "remove-mtp", "repair-norms", "align", "verify", "run", "schema", "demo",
            "env"} <= set(COMMANDS)


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_screen(name: str, width: int) -> None:
    text = _help([name], width)
    lines = text.splitlines()
    assert "…" not in text, "a cut name or choice"
    for bad in ("<bool>", "<str>", "<int", "<float", "<list", "{"):
        assert bad not in text, f"type placeholder {bad!r} in {name}'s help"
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    usage = lines[0]
    assert re.fullmatch(rf"Usage: mtpforge {re.escape(name)} \[OPTIONS\]( [A-Z_]+| \[[A-Z_]+\])*", usage), usage
    for param in COMMANDS[name].params:
        for opt in getattr(param, "opts", []):
            if opt.startswith("-"):
                assert re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text), f"{opt} missing or cut"
        metavar = getattr(param, "metavar", None) or ""
        if "|" in metavar:  # a choice list: whole, on one line
            assert any(metavar in line for line in lines), f"{metavar} split across lines"


def test_top_level_help_and_version() -> None:
    text = _help([], 80)
    assert text.startswith("Usage: mtpforge [OPTIONS] COMMAND [ARGS]...")
    assert all(name in text for name in COMMANDS)
    r = subprocess.run([sys.executable, "-m", "mtpforge", "--version"], capture_output=True, text=True, cwd=REPO)
    from importlib.metadata import version

    assert r.returncode == 0 and r.stdout.strip() == f"mtpforge {version('mtpforge')}"


@pytest.mark.parametrize("width", [80, 120])
def test_top_level_help_says_every_command_whole(width: int) -> None:
    """click cuts a description that does not fit with "..."; each command's short help fits."""
    text = _help([], width)
    commands = text.split("Commands:", 1)[1].splitlines()
    assert [line for line in commands if line.rstrip().endswith("...")] == [], text


def test_every_verify_option_says_what_it_does() -> None:
    for param in COMMANDS["verify"].params:
        if getattr(param, "param_type_name", "") == "option":
            assert getattr(param, "help", None), f"{param.opts} has no help text"
