"""Every command's human output read as one interface, at 80 and 120 columns and into a pipe (a
CI log): no path or word split inside a table cell, no line that repeats another, no raw Python
repr, no title that repeats the command, one success line per command.

The results are the real API's on a real folder whose paths are longer than a table cell at 80
columns; they are rendered by the real renderers on consoles of each width (a console that is
not a terminal is what a pipe gets), and a few commands run end to end in a pipe."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from rich.console import Console

from mtpforge import render
from mtpforge.convert_with_head import convert
from mtpforge.recipe import run_recipe
from mtpforge.inspect import inspect_checkpoint
from mtpforge.pipeline import add_mtp, remove_mtp

REPO = Path(__file__).resolve().parents[1]
WIDTHS = (80, 120)
REPR = re.compile(r"\['|\[\"|\{'|\(\'|': |<[A-Za-z_.]+ object at 0x")
BORDER = re.compile(r"^[\s│┃┌┐└┘├┤┬┴┼─━┏┓┗┛┡┩╇┳┻╋]*$")


def rendered(fn: Callable[[dict[str, Any], Console], None], result: dict[str, Any], width: int) -> str:
    buf = io.StringIO()
    fn(result, Console(file=buf, width=width, force_terminal=False, no_color=True, highlight=False))
    return buf.getvalue()


def judge(text: str, paths: list[str], width: int) -> None:
    lines = text.splitlines()
    for p in paths:  # a path is printed whole: in one cell, or on a line of its own
        assert p in text, f"{p} split at {width} columns:\n{text}"
    said = [ln.strip(" │┃") for ln in lines if not BORDER.match(ln)]
    dup = sorted({s for s in said if s and said.count(s) > 1})
    assert not dup, f"repeated lines {dup}:\n{text}"
    assert not REPR.search(text), f"a raw Python value:\n{text}"
    assert not any(ln.lstrip().startswith("mtpforge ") for ln in lines[:1]), f"a title repeating the command:\n{text}"
    boxed = [ln for ln in lines if ln.startswith(("│", "┃"))]
    assert all(len(ln) <= width for ln in boxed), f"a table wider than {width}:\n{text}"


@pytest.fixture
def deep(tmp_path: Path, make_hf, make_target) -> tuple[Path, Path]:
    """A source and a target whose paths do not fit a table cell at 80 columns."""
    d = tmp_path / "a-rather-long-folder-name-for-models" / "community-conversions-of-this-month"
    d.mkdir(parents=True)
    tgt = make_target("qwen3_5").rename(d / "tiny-qwen3_5-4bit-community-conversion-v2")
    return make_hf("qwen3_5"), tgt


def recipe(folder: Path, src: Path, tgt: Path) -> Path:
    p = folder / "a-recipe-for-this-long-named-community-conversion.yaml"
    p.write_text(f"source: {src}\ntarget: ./{tgt.name}\nchecks:\n  inspect: {{strict: true}}\n")
    return p


def test_every_result_renders_whole_at_each_width(deep: tuple[Path, Path]) -> None:
    src, tgt = deep
    results: list[tuple[str, Callable[[dict[str, Any], Console], None], dict[str, Any]]] = [
        ("inspect, no head", render.render_inspect, inspect_checkpoint(str(tgt))),
        ("inspect, source", render.render_inspect, inspect_checkpoint(str(src))),
        ("add-mtp --dry-run", render.render_add, add_mtp(source=str(src), target=str(tgt), dry_run=True, progress=False)),
        ("add-mtp", render.render_add, add_mtp(source=str(src), target=str(tgt), progress=False)),
        ("add-mtp again", render.render_add, add_mtp(source=str(src), target=str(tgt), progress=False)),
        ("inspect, head, wrong runtime", render.render_inspect, inspect_checkpoint(str(tgt), runtime="mlx-lm-mtp")),
        ("remove-mtp", render.render_remove, remove_mtp(str(tgt), progress=False)),
        ("convert", render.render_convert, convert(str(src), str(tgt.parent / "converted-with-its-head-by-mtpforge"),
                                                   quantize=True, progress=False)),
        ("run --validate", render.render_run, run_recipe(str(recipe(tgt.parent, src, tgt)), validate=True, progress=False)),
    ]
    for name, fn, r in results:
        paths = [str(p) for p in (*(r.get("files_written") or []), *(r.get("files_to_write") or []))]
        paths = [r["mlx_path"], r["source"]] if fn is render.render_convert else paths
        paths += [str(r["manifest"])] if fn is render.render_add and r.get("status") != "planned" else []
        for width in WIDTHS:
            judge(rendered(fn, r, width), paths, width)
    again = results[4][2]
    text = rendered(render.render_add, again, 80)
    assert again["status"] == "already-present" and "written" not in text and "downloaded" not in text, text
    assert "(from none)" not in rendered(render.render_inspect, results[0][2], 120)


def cli(*args: str, cwd: Path, columns: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.update(PYTHONPATH=str(REPO), NO_COLOR="1", TERM="dumb", HF_HUB_OFFLINE="1", HF_HOME=str(cwd / "hf-home"))
    if columns:
        env["COLUMNS"] = columns
    return subprocess.run([sys.executable, "-m", "mtpforge", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("columns", [None, "80", "120"])
def test_commands_in_a_pipe_say_each_thing_once(deep: tuple[Path, Path], tmp_path: Path, columns: str | None) -> None:
    src, tgt = deep
    add = cli("add-mtp", "--source", str(src), "--target", str(tgt), cwd=tmp_path, columns=columns)
    assert add.returncode == 0, add.stderr
    judge(add.stdout, [str(tgt / "mtp.safetensors"), str(tgt / "mtpforge.json")], int(columns or 80))
    assert "reading 15 MTP tensors" in add.stderr and "fetching" not in add.stderr, add.stderr  # a local source
    rm = cli("remove-mtp", str(tgt), cwd=tmp_path, columns=columns)
    assert rm.returncode == 0, rm.stderr
    both = (rm.stdout + rm.stderr).lower()
    assert both.count("removed the mtp head") == 1, rm.stdout + rm.stderr
    bad = cli("add-mtp", "--source", str(src), "--target", str(tgt / "nope"), "--runtime", "mtplxx", cwd=tmp_path,
              columns=columns)
    lines = [ln for ln in bad.stderr.splitlines() if ln.strip()]
    assert bad.returncode == 2 and len(lines) == 1, bad.stderr
    assert "did you mean mtplx?" in lines[0] and lines[0].count("mlx-vlm") == 1, lines[0]


@pytest.mark.parametrize("value", ["gguf-tail", "gguf-mtp"])
def test_a_gguf_layout_on_a_folder_says_why_not_unknown(deep: tuple[Path, Path], tmp_path: Path, value: str) -> None:
    src, tgt = deep
    r = cli("add-mtp", "--source", str(src), "--target", str(tgt), "--layout", value, "--dry-run", cwd=tmp_path,
            columns="120")
    assert r.returncode == 2 and "unknown layout" not in r.stderr and ".gguf" in r.stderr, r.stderr


def test_min_acceptance_as_a_percentage_fails_after_saying_the_figure_without_a_tick(deep: tuple[Path, Path],
                                                                                      tmp_path: Path) -> None:
    """``--min-acceptance 60`` means 60% (as the failure prints it), and the progress line of a
    failed floor carries no ✓; the synthetic head is untrained, so it drafts below 60%."""
    src, tgt = deep
    assert cli("add-mtp", "--source", str(src), "--target", str(tgt), cwd=tmp_path, columns="120").returncode == 0
    r = cli("verify", str(tgt), "--generate", "--prompt", "hello", "--max-tokens", "8", "--min-acceptance", "60",
            cwd=tmp_path, columns="120")
    assert r.returncode == 1, r.stderr
    assert "below --min-acceptance 60.0%" in r.stdout and "✓" not in r.stderr, (r.stdout, r.stderr)
    assert "tokens" in r.stdout and "(1 prompt, up to 8 each)" in r.stdout, r.stdout
    r = cli("verify", str(tgt), "--min-acceptance", "101", cwd=tmp_path, columns="120")
    assert r.returncode == 2 and "Traceback" not in r.stderr
