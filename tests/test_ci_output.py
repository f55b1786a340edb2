"""CI output: ``--format github`` against the workflow-command syntax, the step summary, the
versioned JSON schemas, and ``--json`` keeping progress off for every command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mtpforge.github import escape_data, escape_property, workflow_command
from mtpforge.output_schema import OUTPUTS, SCHEMA_VERSION, output_schema
from mtpforge.recipe import recipe_schema

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "mtpforge" / "data"
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "GITHUB_"))},
       "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9", "NO_COLOR": "1", "COLUMNS": "200"}

#: The runner's grammar (actions/runner ActionCommand.TryParseV2): ``::name[ k=v[,k=v]*]::data``;
#: a property value may not hold a raw ``,`` or ``:`` and no line may hold a raw CR or LF.
_PROP = r"(?:file|line|endLine|col|endColumn|title)=[^,:\r\n]*"
WORKFLOW_COMMAND = re.compile(rf"^::(?:error|warning|notice)(?: {_PROP}(?:,{_PROP})*)?::[^\r\n]*$")


def unescape(s: str) -> str:
    """The runner's unescaping (ActionCommand.UnescapeValue), % last."""
    return s.replace("%0D", "\r").replace("%0A", "\n").replace("%3A", ":").replace("%2C", ",").replace("%25", "%")


def parse(line: str) -> tuple[str, dict[str, str], str]:
    m = WORKFLOW_COMMAND.match(line)
    assert m, f"not a workflow command: {line!r}"
    head, data = line[2:].split("::", 1)
    name, _, props = head.partition(" ")
    kv = dict(p.split("=", 1) for p in props.split(",")) if props else {}
    return name, {k: unescape(v) for k, v in kv.items()}, unescape(data)


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mtpforge", *args], capture_output=True, text=True, cwd=cwd,
                          env={**ENV, **(env or {})}, timeout=600)


# ----------------------------------------------------------------------------- escaping

@pytest.mark.parametrize("text", ["plain", "a: b, c", "100% sure\nsecond line\r\n", "%0A is not a newline", "::error::x"])
def test_escaping_round_trips_through_the_runner_grammar(text: str) -> None:
    line = workflow_command("error", text, file=f"models/{text}.json", line=3, title=f"t: {text}")
    name, props, data = parse(line)
    assert (name, data, props["title"], props["file"], props["line"]) == ("error", text, f"t: {text}", f"models/{text}.json", "3")
    assert escape_property("a,b:c%") == "a%2Cb%3Ac%25" and escape_data("a,b:c%\n") == "a,b:c%25%0A"


# ----------------------------------------------------------------------------- --format github

def test_inspect_format_github_annotates_each_finding(make_target: Any, tmp_path: Path) -> None:
    target = make_target("qwen3_5")  # what mlx_lm.convert leaves: the config declares a head it lacks
    as_json = cli("inspect", str(target), "--json")
    findings = json.loads(as_json.stdout)["findings"]
    assert as_json.returncode == 1 and findings
    gh = cli("inspect", str(target), "--format", "github", cwd=tmp_path)
    assert gh.returncode == 1
    lines = [ln for ln in gh.stdout.splitlines() if ln]
    parsed = [parse(ln) for ln in lines]
    level = {"error": "error", "warning": "warning", "info": "notice"}
    assert [(p[0], p[1]["title"], p[2]) for p in parsed] == [
        (level[f["severity"]], f"mtpforge {f['code']}", f"{f['message']}\nfix: {f['fix']}") for f in findings]
    # relative to the workspace (here the working directory), on the folder's config.json
    assert all(p[1]["file"] == os.path.relpath(target / "config.json", tmp_path) for p in parsed)
    assert "MTP_CONFIG_WITHOUT_WEIGHTS" in gh.stderr  # the human report goes to stderr


def test_format_github_error_names_the_recipe_line(tmp_path: Path) -> None:
    p = tmp_path / "broken.yaml"
    p.write_text("source: Qwen/Qwen3.5-27B\ntarget: ./t\nchecks:\n  verify:\n    depth: 0\n")
    r = cli("run", str(p), "--validate", "--format", "github", cwd=tmp_path)
    assert r.returncode == 2
    (line,) = r.stdout.splitlines()
    name, props, data = parse(line)
    assert name == "error" and props["file"] == "broken.yaml" and props["line"] == "5"
    assert "checks.verify.depth" in data and "\nfix: " in data and props["title"].startswith("mtpforge run: ")


def test_clean_folder_has_no_error_annotations_and_a_summary(tmp_path: Path) -> None:
    """The bundled source, inspected: nothing to annotate as error; the summary is a table."""
    summary = tmp_path / "summary.md"
    r = cli("inspect", str(DATA / "tiny-qwen3_5"), "--format", "github", env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.returncode == 0, r.stderr
    assert not [ln for ln in r.stdout.splitlines() if ln.startswith("::error")]
    md = summary.read_text()
    assert md.startswith("### ✅ mtpforge inspect ") and "| family | qwen3_5 |" in md


def test_step_summary_tables_the_findings(make_target: Any, tmp_path: Path) -> None:
    target = make_target("qwen3_5")
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    r = cli("inspect", str(target), "--json", env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.returncode == 1
    md = summary.read_text()
    assert md.startswith("earlier step\n### ❌ mtpforge inspect ")  # appended, never overwritten
    assert "| severity | code | what is wrong | fix |" in md and "| error | `MTP_CONFIG_WITHOUT_WEIGHTS` |" in md


# ----------------------------------------------------------------------------- schemas

def test_schema_command_publishes_each_output_and_keeps_the_recipe_default() -> None:
    assert json.loads(cli("schema").stdout) == recipe_schema()
    assert json.loads(cli("schema", "--output", "recipe").stdout) == recipe_schema()
    for name in ("inspect", "add-mtp", "verify", "run", "convert", "align", "error"):
        s = json.loads(cli("schema", "--output", name).stdout)
        assert s == output_schema(name) and s["properties"]["schema_version"]["const"] == SCHEMA_VERSION
    bad = cli("schema", "--output", "nope")
    assert bad.returncode == 2 and "nope" in bad.stderr


def test_json_outputs_carry_the_version_and_fit_their_schema(make_hf: Any, make_target: Any, tmp_path: Path) -> None:
    target, src = make_target("qwen3_5"), make_hf("qwen3_5")
    outs: dict[str, dict[str, Any]] = {}
    outs["inspect"] = json.loads(cli("inspect", str(target), "--json").stdout)
    r = cli("add-mtp", "--source", str(src), "--target", str(target), "--json")
    assert r.returncode == 0, r.stderr
    outs["add-mtp"] = json.loads(r.stdout)
    outs["verify"] = json.loads(cli("verify", str(target), "--json").stdout)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"source: {src}\ntarget: {target}\n")
    outs["run"] = json.loads(cli("run", str(recipe), "--validate", "--json").stdout)
    outs["error"] = json.loads(cli("inspect", str(tmp_path / "nowhere"), "--json").stdout)
    for name, obj in outs.items():
        assert obj["schema_version"] == SCHEMA_VERSION, name
        OUTPUTS[name].model_validate(obj)
    with pytest.raises(Exception):
        OUTPUTS["inspect"].model_validate({**outs["inspect"], "mtp_tensors": "many"})


# ----------------------------------------------------------------------------- --json is quiet

_PROGRESS = ("•", "✓", "━", "%|")


def test_json_keeps_progress_off_for_every_command(make_hf: Any, make_target: Any, tmp_path: Path) -> None:
    """stderr stays empty on success: no step lines, no bars (rich's or huggingface_hub's tqdm)."""
    target, src = make_target("qwen3_5"), str(make_hf("qwen3_5"))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"source: {src}\ntarget: {target}\nforce: true\nchecks:\n  inspect: {{}}\n")
    runs = {
        "convert": ("convert", "--hf-path", src, "--mlx-path", str(tmp_path / "conv"), "-q"),
        "inspect": ("inspect", src),
        "add-mtp": ("add-mtp", "--source", src, "--target", str(target)),
        "verify": ("verify", str(target), "--generate", "--max-tokens", "4", "--prompt", "Count: 1, 2,"),
        "run": ("run", str(recipe)),
        "remove-mtp": ("remove-mtp", str(target)),
        "env": ("env",),
    }
    for name, args in runs.items():
        r = cli(*args, "--json")
        assert r.returncode == 0, (name, r.stderr)
        json.loads(r.stdout)
        assert not any(mark in r.stderr for mark in _PROGRESS), (name, r.stderr)
    # and the same commands do show progress without --json (the test can fail)
    r = cli("add-mtp", "--source", src, "--target", str(target), "--force")
    assert "•" in r.stderr + r.stdout


def test_help_lists_the_real_choices() -> None:
    from mtpforge.convert_with_head import DTYPES, FOLDER_LAYOUTS, MLX_PRECISIONS, Q_MODES, QUANT_RECIPES
    from mtpforge.options import choices
    from mtpforge.output_schema import OUTPUT_NAMES
    from mtpforge.runtimes import RUNTIME_NAMES

    def help_of(*cmd: str) -> str:
        return re.sub(r"[\s│]+", " ", cli(*cmd, "--help", env={"COLUMNS": "400"}).stdout)

    add = help_of("add-mtp")
    for field in ("layout", "precision", "experts", "fetch"):
        assert "|".join(choices(field)) in add, field
    assert "|".join(RUNTIME_NAMES) in help_of("inspect")
    conv = help_of("convert")
    for vals in (Q_MODES, DTYPES, QUANT_RECIPES, FOLDER_LAYOUTS, MLX_PRECISIONS, choices("experts")):
        assert "|".join(vals) in conv, vals
    assert "gguf" not in conv and "fetch" not in conv  # what convert cannot write or use is not offered
    for cmd in ("inspect", "add-mtp", "convert", "remove-mtp", "repair-norms", "align", "verify", "run", "demo"):
        assert "text|json|github" in help_of(cmd).replace(" ", ""), cmd
    assert "|".join(("recipe", *OUTPUT_NAMES)) in help_of("schema")
