"""Recipes: every shipped recipe validates offline; broken recipes fail in one line that names
the line; `mtpforge schema` is the schema; `run` is add-mtp plus checks, with the contract's
exit codes."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mtpforge.errors import InputError
from mtpforge.findings import CODES
from mtpforge.layouts.table import LAYOUT_NAMES
from mtpforge.runtimes import RUNTIME_NAMES
from mtpforge.passes.quantize import AFFINE_BITS
from mtpforge.recipe import Recipe, load_recipe, run_recipe
from tests.checkers import folder_state

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
TINY_MODEL = ROOT / "mtpforge" / "data" / "tiny-qwen3_5"

#: the Hub can never be reached from these subprocesses: validation must not need it
OFFLINE_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mtpforge", *args], capture_output=True, text=True,
                          cwd=cwd, env=OFFLINE_ENV, timeout=600)


def write(folder: Path, text: str, name: str = "recipe.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text(text, encoding="utf-8")
    return p


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# ----------------------------------------------------------------------------- shipped recipes

@pytest.mark.parametrize("recipe", RECIPES, ids=[p.name for p in RECIPES])
def test_every_shipped_recipe_validates_offline(recipe: Path, tmp_path: Path) -> None:
    proc = cli("run", str(recipe), "--validate", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["valid"] is True and report["mode"] == "validate"
    assert Path(report["target"]).is_absolute() and recipe.parent.resolve() in Path(report["target"]).parents \
        or recipe.name in ("tiny.yaml", "tiny-gguf.yaml")


def test_recipes_cover_the_seed_models_and_every_layout() -> None:
    loaded = {p.name: load_recipe(p) for p in RECIPES}
    sources = {lr.source for lr in loaded.values() if not lr.source_is_local}
    assert sources == {"Qwen/Qwen3.5-27B", "Qwen/Qwen3.5-35B-A3B", "Qwen/Qwen3.5-122B-A10B", "Qwen/Qwen3.6-27B",
                       "Qwen/Qwen3.6-35B-A3B", "Qwen/Qwen3-Next-80B-A3B-Instruct",
                       # the giants: a GGUF in parts, the head no GGUF has, an mlx-vlm drafter
                       "deepseek-ai/DeepSeek-V3.2", "deepseek-ai/DeepSeek-R1", "zai-org/GLM-5"}
    assert {lr.recipe.layout for lr in loaded.values()} == set(LAYOUT_NAMES) | {"gguf-mtp"}
    for name, lr in loaded.items():
        if name == "tiny-gguf.yaml":  # the bundled model for llama.cpp: a GGUF trunk made by its converter
            assert lr.source_is_local and lr.source == str(TINY_MODEL) and lr.target.suffix == ".gguf"
            assert lr.recipe.checks.verify is not None and lr.recipe.checks.inspect.strict
            continue
        if name == "tiny.yaml":
            assert lr.source_is_local and lr.source == str(TINY_MODEL)
            assert lr.recipe.checks.verify is not None and lr.recipe.checks.inspect.strict
            continue
        # a realistic community conversion next to the recipe, and checks that can fail
        if lr.target.suffix == ".gguf":  # a giant's GGUF: its first part, in its download folder
            assert ROOT / "recipes" in lr.target.parents and "-00001-of-" in lr.target.name, name
            assert lr.recipe.checks.verify is not None and lr.recipe.checks.verify.min_acceptance > 0, name
            continue
        assert lr.target.parent == (ROOT / "recipes") and lr.target.name.split("-")[-1] in ("4bit", "6bit"), name
        assert lr.recipe.checks.inspect is not None and lr.recipe.checks.inspect.strict, name
        if lr.recipe.layout != "mlx-vlm-drafter":
            assert lr.recipe.checks.verify is not None and lr.recipe.checks.verify.min_acceptance > 0, name
        if "Next" in lr.source:  # Qwen3-Next has no embedded layout (docs/SPEC.md §5)
            assert lr.recipe.layout in ("sidecar", "vllm-mlx"), name


def test_recipe_literals_match_the_tables() -> None:
    from mtpforge.layouts.table import GGUF_LAYOUT_NAMES

    """The schema's enums are written out for readers; they must not drift from the code."""
    props = Recipe.model_json_schema()
    assert tuple(props["properties"]["layout"]["anyOf"][0]["enum"]) == LAYOUT_NAMES + GGUF_LAYOUT_NAMES
    runtime = props["$defs"]["InspectCheck"]["properties"]["runtime"]["anyOf"][0]["enum"]
    assert tuple(runtime) == RUNTIME_NAMES
    enums = [a.get("enum") for a in props["properties"]["precision"]["anyOf"]]
    assert list(AFFINE_BITS) in enums


# ----------------------------------------------------------------------------- broken recipes (CLI)

GOOD = "source: Qwen/Qwen3.5-27B\ntarget: ./Qwen3.5-27B-4bit\n"

CLI_CASES = {
    "unknown-nested-key": (GOOD + "checks:\n  verify:\n    depth: 1\n    dept: 2\n", 6,
                           ["checks.verify.dept", "unknown key", "did you mean 'depth'"]),
    "unknown-top-key": (GOOD + "layuot: sidecar\n", 3, ["layuot", "did you mean 'layout'"]),
    "wrong-type": (GOOD + "checks:\n  verify:\n    max_tokens: many\n", 5,
                   ["checks.verify.max_tokens", "valid integer", "'many'"]),
    "out-of-range": (GOOD + "checks:\n  verify:\n    depth: 0\n", 5, ["checks.verify.depth", "greater than or equal to 1"]),
    "python-tag": ("source: Qwen/Qwen3.5-27B\ntarget: !!python/object/apply:os.system ['touch {marker}']\n", 2,
                   ["!!python/object/apply:os.system", "not allowed"]),
    "python-name-tag": (GOOD + "force: !!python/name:os.system\n", 3, ["!!python/name:os.system", "not allowed"]),
    "bad-yaml": (GOOD + "checks:\n  verify: {depth: 1\n", 4, ["not valid YAML"]),
    # nested aliases would expand exponentially: refused before anything is constructed
    "alias-bomb": (GOOD + "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"l{i}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)), 3, ["anchors and aliases"]),
    "bad-indent": (GOOD + "checks:\n  inspect:\n    strict: true\n   runtime: mlx-lm\n", 6, ["not valid YAML"]),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_broken_recipe_is_one_line_naming_the_line(case: str, tmp_path: Path) -> None:
    text, line, fragments = CLI_CASES[case]
    marker = tmp_path / "marker"
    p = write(tmp_path, text.replace("{marker}", str(marker)), "broken.yaml")
    for mode in ("--validate", "--dry-run"):
        msg = one_line_error(cli("run", str(p), mode))
        assert f"broken.yaml:{line}: " in msg, msg
        for frag in fragments:
            assert frag in msg, (frag, msg)
    assert not marker.exists()  # the tag was refused, never executed


def test_broken_recipe_json_error_object(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD + "precision: 7\n")
    proc = cli("run", str(p), "--validate", "--json")
    one_line_error(proc)
    err = json.loads(proc.stdout)["error"]
    assert err["code"] == "BAD_INPUT" and err["message"].startswith(f"{p}:3: precision: ") and "7" in err["message"]
    assert "mtpforge schema" in err["fix"]


# ----------------------------------------------------------------------------- static checks (in process)

STATIC_CASES = {
    "missing-target": ("source: Qwen/Qwen3.5-27B\n", 1, "target: required key missing"),
    "empty": ("", 1, "the recipe is empty"),
    "a-list": ("- source: x\n", 1, "a recipe is a mapping"),
    "duplicate-key": (GOOD + "layout: embedded\nlayout: sidecar\n", 4, "duplicate key 'layout' (first at line 3)"),
    "float-revision": (GOOD + "revision: 1.0\n", 3, "revision: Input should be a valid string, got float 1.0 (quote it"),
    "string-bool": (GOOD + "force: 'yes'\n", 3, "force: Input should be a valid boolean"),
    "precision-7": (GOOD + "precision: 7\n", 3, "precision: must be match, bf16, float16 or bits"),
    "bad-layout": (GOOD + "layout: inline\n", 3, "layout: Input should be 'embedded', 'sidecar', 'vllm-mlx', 'mlx-vlm-drafter', 'gguf-mtp' or 'gguf-tail'"),
    "runtime-vs-layout": (GOOD + "layout: sidecar\nchecks:\n  inspect:\n    runtime: vllm-mlx\n", 6,
                          "checks.inspect.runtime: vllm-mlx reads its head from the vllm-mlx"),
    "experts-vs-runtime": (GOOD + "experts: switch_mlp\nchecks:\n  inspect:\n    runtime: mlx-lm-mtp\n", 3,
                           "experts: mlx-lm-mtp loads MoE experts only as per-expert / fused"),
    "drafter-source-experts": (GOOD + "layout: mlx-vlm-drafter\nexperts: source\n", 4, "experts: the mlx-vlm drafter loads stacked"),
    "drafter-verify": (GOOD + "layout: mlx-vlm-drafter\nchecks:\n  verify:\n    depth: 1\n", 5,
                       "checks.verify: the mlx-vlm drafter is a separate folder without a backbone"),
    "allow-without-strict": (GOOD + "checks:\n  inspect:\n    allow_warnings: [MLX_LM_LOAD_BREAKS]\n", 5,
                             "checks.inspect.allow_warnings: allow_warnings only matters with strict: true"),
    "allow-an-error": (GOOD + "checks:\n  inspect:\n    strict: true\n    allow_warnings:\n      - MTP_NORMS_RAW\n", 7,
                       "checks.inspect.allow_warnings.0: MTP_NORMS_RAW is an error"),
    "allow-unknown": (GOOD + "checks:\n  inspect:\n    strict: true\n    allow_warnings: [NOPE]\n", 6,
                      "unknown finding code 'NOPE'"),
    "acceptance-without-generate": (GOOD + "checks:\n  verify:\n    generate: false\n    min_acceptance: 0.5\n", 6,
                                    "checks.verify.min_acceptance: min_acceptance is measured by decoding"),
    "acceptance-above-one": (GOOD + "checks:\n  verify:\n    min_acceptance: 80\n", 5,
                             "checks.verify.min_acceptance: Input should be less than or equal to 1"),
    "empty-prompt": (GOOD + "checks:\n  verify:\n    prompts:\n      - hello\n      - '  '\n", 7,
                     "checks.verify.prompts.1: a prompt is empty"),
    "output-is-target": (GOOD + "output: ./Qwen3.5-27B-4bit/\n", 3, "output: output is the target folder"),
    "output-inside-target": (GOOD + "output: ./Qwen3.5-27B-4bit/mtp\n", 3, "output: output and target are nested"),
    "not-a-source": ("source: Qwen3.5-27B\ntarget: ./t\n", 1, "source: 'Qwen3.5-27B' is neither a folder next to the recipe"),
    "revision-on-folder": ("source: ./hf\nrevision: main\ntarget: ./t\n", 2, "revision: a local source folder has no revisions"),
    "wrong-version": (GOOD + "version: 2\n", 3, "version: Input should be 1"),
}


@pytest.mark.parametrize("case", list(STATIC_CASES))
def test_static_problems_name_the_line_and_what_to_change(case: str, tmp_path: Path) -> None:
    text, line, fragment = STATIC_CASES[case]
    p = write(tmp_path, text)
    with pytest.raises(InputError) as e:
        load_recipe(p)
    msg = e.value.message
    assert msg.startswith(f"{p}:{line}: ") and "\n" not in msg, msg
    assert fragment in msg, msg


def test_several_problems_report_the_first_and_count_the_rest(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD + "checks:\n  verify:\n    depth: 0\n    temp: -1\n    hiden: pre\n")
    with pytest.raises(InputError) as e:
        load_recipe(p)
    assert e.value.message.startswith(f"{p}:5: checks.verify.depth: ")
    assert e.value.message.endswith("(and 2 more: line 6, 7)")


def test_layout_checked_against_a_local_source_family(make_hf, tmp_path: Path) -> None:
    hf = make_hf("qwen3_next")
    p = write(tmp_path, f"source: {hf}\ntarget: ./t\nlayout: embedded\n")
    with pytest.raises(InputError) as e:
        load_recipe(p)
    assert e.value.message.startswith(f"{p}:3: layout: the embedded layout does not apply to qwen3_next")
    assert "sidecar, vllm-mlx" in e.value.fix
    p.write_text(f"source: {hf}\ntarget: ./t\nlayout: sidecar\n")
    assert load_recipe(p).family == "qwen3_next"


def test_relative_paths_resolve_against_the_recipe_folder(tmp_path: Path) -> None:
    (tmp_path / "proj" / "hf").mkdir(parents=True)
    p = write(tmp_path / "proj" / "recipes", "source: ../hf\ntarget: ./model-4bit\noutput: ../out\n")
    proc = cli("run", "proj/recipes/recipe.yaml", "--validate", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["source"] == str(tmp_path / "proj" / "hf")
    assert r["target"] == str(tmp_path / "proj" / "recipes" / "model-4bit")
    assert r["output"] == str(tmp_path / "proj" / "out")
    assert r["recipe"] == "proj/recipes/recipe.yaml"


def test_validate_and_dry_run_are_exclusive(tmp_path: Path) -> None:
    msg = one_line_error(cli("run", str(write(tmp_path, GOOD)), "--validate", "--dry-run"))
    assert "exclusive" in msg


def test_missing_recipe_file(tmp_path: Path) -> None:
    assert "does not exist" in one_line_error(cli("run", str(tmp_path / "nope.yaml"), "--validate"))


# ----------------------------------------------------------------------------- schema

def test_schema_is_json_schema_of_the_recipe() -> None:
    proc = cli("schema")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema" and s["type"] == "object"
    assert set(s["properties"]) == set(Recipe.model_fields)
    assert sorted(s["required"]) == ["source", "target"]
    for obj in [s, *s["$defs"].values()]:
        assert obj["additionalProperties"] is False
    allow = s["$defs"]["InspectCheck"]["properties"]["allow_warnings"]["items"]["enum"]
    assert allow == sorted(c for c, sev in CODES.items() if sev == "warning")
    # every key the shipped recipes use is in the schema, at its place
    for recipe in RECIPES:
        data = yaml.safe_load(recipe.read_text())
        assert set(data) <= set(s["properties"]), recipe.name
        for check, block in (data.get("checks") or {}).items():
            ref = {"inspect": "InspectCheck", "verify": "VerifyCheck"}[check]
            assert set(block or {}) <= set(s["$defs"][ref]["properties"]), (recipe.name, check)


# ----------------------------------------------------------------------------- running

def _recipe_for(folder: Path, hf: Path, tgt: Path, extra: str = "", checks: str = "") -> Path:
    return write(folder, f"source: {hf}\ntarget: {tgt}\n{extra}checks:\n  inspect:\n    runtime: mlx-lm\n    strict: true\n{checks}")


def test_run_is_add_mtp_plus_checks(make_hf, make_target, tmp_path: Path) -> None:
    hf, t_recipe, t_cli = make_hf("qwen3_5_moe"), make_target("qwen3_5_moe"), make_target("qwen3_5_moe")
    p = _recipe_for(tmp_path / "r", hf, t_recipe, extra="precision: bf16\nlayout: embedded\n")
    proc = cli("run", str(p), "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["status"] == "written" and rep["ok"] is True and rep["check_results"] == {"inspect": "passed"}
    assert rep["steps"]["add_mtp"]["layout"] == "embedded" and rep["steps"]["inspect"]["norm_convention"] == "shifted"
    assert rep["steps"]["inspect"]["norm_convention_from"] == "source"  # compare_source defaults on
    # the same options through add-mtp give a byte-identical folder: one code path
    proc = cli("add-mtp", "--source", str(hf), "--target", str(t_cli), "--precision", "bf16", "--layout", "embedded", "--json")
    assert proc.returncode == 0, proc.stderr
    assert folder_state(t_recipe) == folder_state(t_cli)
    # and running the recipe again changes nothing and still checks
    before = folder_state(t_recipe)
    again = run_recipe(str(p), progress=False)
    assert again["status"] == "already-present" and again["exit_code"] == 0 and again["steps"]["inspect"]["passed"]
    assert folder_state(t_recipe) == before


def test_recipe_runtime_writes_what_the_cli_writes_and_inspects_against_it(make_hf, make_target, tmp_path: Path) -> None:
    """``runtime:`` is add-mtp's --runtime (one HeadOptions field); with no runtime named under
    checks.inspect, inspect predicts the recipe's runtime."""
    hf, t_recipe, t_cli = make_hf("qwen3_5_moe"), make_target("qwen3_5_moe"), make_target("qwen3_5_moe")
    p = write(tmp_path / "r", f"source: {hf}\ntarget: {t_recipe}\nruntime: mtplx\nchecks:\n  inspect:\n    strict: true\n")
    rep = run_recipe(str(p), progress=False)
    assert rep["exit_code"] == 0 and rep["steps"]["add_mtp"]["layout"] == "sidecar", rep
    assert json.loads((t_recipe / "mtpforge.json").read_text())["options"]["runtime"] == "mtplx"
    proc = cli("add-mtp", "--source", str(hf), "--target", str(t_cli), "--runtime", "mtplx", "--json")
    assert proc.returncode == 0, proc.stderr
    assert folder_state(t_recipe) == folder_state(t_cli)
    side = write(tmp_path / "s", f"source: {hf}\ntarget: {make_target('qwen3_5_moe')}\nruntime: mtplx\nlayout: embedded\n"
                 "checks:\n  inspect:\n    strict: true\n")
    bad = run_recipe(str(side), progress=False)  # MTPLX's pinned mlx-lm corrupts an embedded backbone
    assert bad["exit_code"] == 1 and any(f.startswith("LEGACY_LOADER_DOUBLE_SHIFT") for f in bad["steps"]["inspect"]["failing"])


def test_dry_run_plans_and_changes_nothing(make_hf, make_target, tmp_path: Path) -> None:
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    before = folder_state(tgt)
    rep = run_recipe(str(_recipe_for(tmp_path, hf, tgt)), dry_run=True, progress=False)
    assert rep["status"] == "planned" and rep["exit_code"] == 0 and rep["mode"] == "dry-run"
    assert str(tgt / "mtp.safetensors") in rep["files_to_write"] and rep["fetch_bytes"] > 0
    assert "inspect" not in rep["steps"]
    assert folder_state(tgt) == before


def test_failed_check_exits_1_and_says_what_was_written(make_hf, make_target, tmp_path: Path) -> None:
    """Qwen3-Next in the vllm-mlx layout: released mlx-lm cannot load the output (a warning
    when no runtime is named), so a strict inspect fails unless the recipe allows it."""
    hf, tgt = make_hf("qwen3_next"), make_target("qwen3_next")
    out = tmp_path / "out"
    strict = "checks:\n  inspect:\n    strict: true\n"
    p = write(tmp_path / "r", f"source: {hf}\ntarget: {tgt}\nlayout: vllm-mlx\noutput: {out}\n" + strict)
    target_before = folder_state(tgt)
    proc = cli("run", str(p), "--json")
    assert proc.returncode == 1, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["ok"] is False and rep["check_results"] == {"inspect": "FAILED"}
    assert rep["status"] == "written" and rep["written_to"] == str(out)
    assert str(out / "model-mtp.safetensors") in rep["files_written"]
    assert [f.split(":")[0] for f in rep["steps"]["inspect"]["failing"]] == ["MLX_LM_LOAD_BREAKS"]
    assert folder_state(tgt) == target_before  # output mode left the target alone
    p.write_text(p.read_text().replace("/out\n", "/out2\n") + "    allow_warnings: [MLX_LM_LOAD_BREAKS]\n")
    rep = run_recipe(str(p), progress=False)
    assert rep["exit_code"] == 0 and rep["status"] == "written" and rep["check_results"] == {"inspect": "passed"}


def test_refused_or_unusable_input_is_one_line(make_hf, make_target, tmp_path: Path) -> None:
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    missing = write(tmp_path / "a", f"target: {tgt}\nsource: ./no-such-folder\n")
    msg = one_line_error(cli("run", str(missing)))
    assert msg.startswith(f"error: {missing}:2: source: the folder ") and "no-such-folder does not exist" in msg
    no_target = write(tmp_path / "c", f"source: {hf}\ntarget: ./not-downloaded\n")
    msg = one_line_error(cli("run", str(no_target), "--dry-run"))
    assert msg.startswith(f"error: {no_target}:2: target: the folder ") and "hf download" in msg
    wrong_family = write(tmp_path / "b", f"source: {make_hf('qwen3_next')}\ntarget: {tgt}\n")
    proc = cli("run", str(wrong_family), "--json")
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and json.loads(proc.stdout)["error"]["message"]
    assert folder_state(tgt) == folder_state(make_target("qwen3_5"))  # nothing changed


# ----------------------------------------------------------------------------- the tiny recipe, for real

def _tiny_skip_reason() -> str | None:
    if not (TINY_MODEL / "config.json").is_file():
        return "the bundled model mtpforge/data/tiny-qwen3_5 is not in the tree yet"
    if importlib.util.find_spec("mtpforge.verify") is None:
        return "mtpforge.verify is not in the tree yet"
    return None


@pytest.mark.skipif(_tiny_skip_reason() is not None, reason=str(_tiny_skip_reason()))
def test_tiny_recipe_end_to_end(tmp_path: Path) -> None:
    """recipes/tiny.yaml, unmodified, in a copy of the repository layout it expects (its paths
    are relative to recipes/): the target is made first, as the recipe's header says."""
    from mtpforge.demo import make_community_target

    (tmp_path / "recipes").mkdir()
    shutil.copy(ROOT / "recipes" / "tiny.yaml", tmp_path / "recipes" / "tiny.yaml")
    (tmp_path / "mtpforge").symlink_to(ROOT / "mtpforge", target_is_directory=True)
    make_community_target(TINY_MODEL, tmp_path / "build" / "tiny-qwen3_5-4bit")
    proc = cli("run", "recipes/tiny.yaml", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["status"] == "written" and rep["check_results"] == {"inspect": "passed", "verify": "passed"}
    v = rep["steps"]["verify"]
    assert v["identical"] is True and v["acceptance"] >= 0.6
