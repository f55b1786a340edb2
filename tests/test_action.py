"""The GitHub Action (``action.yml``) run from the example workflow, and the pre-commit hook run
under ``pre-commit try-repo``.

A local runner stands in for GitHub's: it reads ``examples/github-action.yml``, finds the steps
that use mtpforge's action, and runs the action's ``run:`` steps with bash as the runner does —
``${{ inputs.* }}`` from the step's ``with:`` over the action's defaults, ``GITHUB_OUTPUT``,
``GITHUB_STEP_SUMMARY``, ``GITHUB_WORKSPACE`` and ``RUNNER_TEMP`` set — and then reads the
annotations from the step's stdout with the runner's grammar.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtpforge.pipeline import add_mtp
from mtpforge.community import convert_to_mlx

from tests.test_ci_output import parse

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "mtpforge" / "data"
WORKFLOW = REPO / "examples" / "github-action.yml"
ACTION = yaml.safe_load((REPO / "action.yml").read_text())
_EXPR = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")


@dataclass
class StepRun:
    code: int
    stdout: str
    stderr: str
    outputs: dict[str, str]
    summary: str

    def annotations(self) -> list[tuple[str, dict[str, str], str]]:
        return [parse(ln) for ln in self.stdout.splitlines() if ln.startswith("::")]


class LocalRunner:
    """Runs a composite action's ``run:`` steps the way a GitHub runner does."""

    def __init__(self, workspace: Path, temp: Path, path_prefix: Path, extra_env: dict[str, str]) -> None:
        self.workspace, self.temp, self.path_prefix, self.extra_env = workspace, temp, path_prefix, extra_env

    def _subst(self, text: str, ctx: dict[str, str]) -> str:
        def one(m: re.Match[str]) -> str:
            key = m.group(1)
            if key not in ctx:
                raise KeyError(f"expression {key!r} is not known to the local runner")
            return ctx[key]

        return _EXPR.sub(one, text)

    def run_action(self, with_: dict[str, Any]) -> StepRun:
        unknown = set(with_) - set(ACTION["inputs"])
        assert not unknown, f"the workflow passes inputs the action does not declare: {unknown}"
        inputs = {k: str(with_.get(k, spec.get("default", ""))) for k, spec in ACTION["inputs"].items()}
        ctx = {f"inputs.{k}": v for k, v in inputs.items()}
        ctx.update({"github.action_path": str(REPO), "runner.temp": str(self.temp)})
        out_file, summary = self.temp / "github_output", self.temp / "step_summary.md"
        for f in (out_file, summary):
            f.write_text("")
        stdout, stderr, code = "", "", 0
        for step in ACTION["runs"]["steps"]:
            assert step.get("shell") == "bash" and "run" in step, step  # composite run steps name their shell
            env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "HF_", "MTPFORGE_"))}
            env.update(self.extra_env)
            env.update({k: self._subst(str(v), ctx) for k, v in (step.get("env") or {}).items()})
            env.update(GITHUB_OUTPUT=str(out_file), GITHUB_STEP_SUMMARY=str(summary), GITHUB_WORKSPACE=str(self.workspace),
                       RUNNER_TEMP=str(self.temp), GITHUB_ACTION_PATH=str(REPO), NO_COLOR="1", COLUMNS="200",
                       PATH=f"{self.path_prefix}{os.pathsep}{env.get('PATH', '')}")
            script = self.temp / "step.sh"
            script.write_text(self._subst(step["run"], ctx))
            # GitHub's `shell: bash` is `bash --noprofile --norc -eo pipefail {0}`
            p = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=self.workspace,
                               env=env, capture_output=True, text=True, timeout=600)
            stdout, stderr, code = stdout + p.stdout, stderr + p.stderr, p.returncode
            if code != 0:
                break
        outputs = dict(ln.split("=", 1) for ln in out_file.read_text().splitlines() if "=" in ln)
        return StepRun(code, stdout, stderr, outputs, summary.read_text())


def _action_steps() -> dict[str, list[dict[str, Any]]]:
    wf = yaml.safe_load(WORKFLOW.read_text())
    return {job: [s for s in spec["steps"] if re.fullmatch(r"[\w.-]+/mtpforge@[\w.-]+", str(s.get("uses", "")))]
            for job, spec in wf["jobs"].items()}


@pytest.fixture(scope="module")
def installer_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv for the action's install step: it sees the test environment's
    packages (mlx, mlx-lm, ... through a .pth line) but not its mtpforge, so the step's
    `pip install <action path>` really builds and installs mtpforge."""
    venv = tmp_path_factory.mktemp("action-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    site.mkdir(parents=True, exist_ok=True)
    (site / "_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled model as a community conversion (4-bit, no head)."""
    return convert_to_mlx(DATA / "tiny-qwen3_5", tmp_path_factory.mktemp("conv") / "tiny-qwen3_5-4bit")


def test_example_workflow_runs_the_action(installer_venv: Path, converted: Path, hub, tmp_path: Path) -> None:
    steps = _action_steps()
    assert [len(v) for v in steps.values()] == [2, 1], steps
    (folder_step, hub_step), (recipe_step,) = steps["inspect"], steps["recipe"]

    ws = tmp_path / "ws"
    model = ws / folder_step["with"]["path"]
    shutil.copytree(converted, model)
    shutil.copytree(REPO / "recipes", ws / "recipes")
    hub.publish(converted, hub_step["with"]["path"])
    env = hub.env(tmp_path / "hf-home")
    env = {k: v for k, v in env.items() if k.startswith(("HF_", "MTPFORGE_"))}
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    runner = LocalRunner(ws, temp, installer_venv, env)

    # 1. the folder lacks its head (what mlx_lm.convert leaves): the step fails with annotations
    r = runner.run_action(folder_step["with"])
    assert r.code == 1, (r.stdout, r.stderr)
    assert re.search(r"^mtpforge: 0\.\d", r.stdout, re.M)  # the install step's `mtpforge env`
    ann = r.annotations()
    assert ann and all(a[1]["file"] == f"{folder_step['with']['path']}/config.json" for a in ann)
    assert ("error", "mtpforge MTP_CONFIG_WITHOUT_WEIGHTS") in {(a[0], a[1]["title"]) for a in ann}
    report = json.loads(Path(r.outputs["report"]).read_text())
    assert r.outputs["exit-code"] == "1" and report["schema_version"] == 1
    assert {f["code"] for f in report["findings"]} == {a[1]["title"].split()[-1] for a in ann}
    assert "### ❌ mtpforge inspect" in r.summary and "`MTP_CONFIG_WITHOUT_WEIGHTS`" in r.summary

    # 2. after add-mtp the same step passes, with no error annotation
    add_mtp(source=str(DATA / "tiny-qwen3_5"), target=str(model), progress=False)
    r = runner.run_action({**folder_step["with"], "install": "false"})
    assert r.code == 0, (r.stdout, r.stderr)
    assert not [a for a in r.annotations() if a[0] == "error"] and "### ✅ mtpforge inspect" in r.summary

    # 3. the Hub repo (the loopback hub): headers only
    r = runner.run_action(hub_step["with"])
    assert r.code == 1 and hub.tensor_bytes(hub_step["with"]["path"]) == 0
    assert all("file" not in a[1] for a in r.annotations())  # nothing in the workspace to point at

    # 4. the recipe, validated offline
    r = runner.run_action({**recipe_step["with"], "install": "false"})
    assert r.code == 0, (r.stdout, r.stderr)
    assert "### ✅ mtpforge run" in r.summary

    # 5. a broken recipe: the annotation names its file and line
    (ws / "recipes" / "tiny.yaml").write_text((ws / "recipes" / "tiny.yaml").read_text().replace("depth: 1", "depth: 0"))
    r = runner.run_action({**recipe_step["with"], "install": "false"})
    (a,) = r.annotations()
    assert r.code == 2 and a[0] == "error" and a[1]["file"] == "recipes/tiny.yaml" and a[1]["line"].isdigit()


# ----------------------------------------------------------------------------- pre-commit

def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.mark.parametrize("hook", ["mtpforge-inspect", "mtpforge-inspect-system"])
def test_pre_commit_hook_under_try_repo(hook: str, converted: Path, tmp_path: Path) -> None:
    """A repository that keeps a model folder: the hook refuses it without its head and passes it
    with the head. ``mtpforge-inspect`` (``language: python``) makes pre-commit build its own
    virtualenv with mtpforge and its dependencies (minutes), so it runs the refusing case only;
    ``mtpforge-inspect-system`` runs both."""
    pre_commit = shutil.which("pre-commit") or str(Path(sys.executable).parent / "pre-commit")
    repo = tmp_path / "models-repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    shutil.copytree(converted, repo / "models" / "tiny")
    (repo / "notes.txt").write_text("not a model\n")
    _git(repo, "add", "-A")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "PRE_COMMIT"))}
    env.update(PRE_COMMIT_HOME=str(Path.home() / ".cache" / "mtpforge" / "pre-commit"), HF_HUB_OFFLINE="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", NO_COLOR="1")

    def try_repo() -> subprocess.CompletedProcess[str]:
        return subprocess.run([pre_commit, "try-repo", str(REPO), hook, "--all-files", "--color", "never"], cwd=repo,
                              env=env, capture_output=True, text=True, timeout=900)

    p = try_repo()
    assert p.returncode == 1, p.stdout + p.stderr
    assert "models/tiny: error MTP_CONFIG_WITHOUT_WEIGHTS" in p.stdout and "Failed" in p.stdout
    assert p.stdout.count("models/tiny:") == p.stdout.count("models/tiny: ")  # one folder, inspected once per line

    if hook == "mtpforge-inspect":
        return
    add_mtp(source=str(DATA / "tiny-qwen3_5"), target=str(repo / "models" / "tiny"), progress=False)
    _git(repo, "add", "-A")
    p = try_repo()
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Passed" in p.stdout


def test_action_inputs_list_the_real_runtimes() -> None:
    """The action's ``runtime`` input documents inspect's choices: the runtime table's rows."""
    from mtpforge.runtimes import RUNTIME_NAMES

    desc = ACTION["inputs"]["runtime"]["description"]
    assert [n.strip(" .") for n in desc.split(":", 1)[1].split("|")] == list(RUNTIME_NAMES)
