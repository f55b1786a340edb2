"""Advice that agrees with itself: what one command says to do, the next command accepts, and
two commands never give different advice for the same folder."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_HOME": str(cwd / "hf-home"),
           "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "mtpforge", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_inspect_finds_the_mlx_vlm_drafter_as_verify_does_and_remove_mtp_leaves_no_folder(tmp_path: Path, make_hf,
                                                                                           make_target) -> None:
    src, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    drafter = tgt.parent / f"{tgt.name}-mtp-drafter"
    add = cli("add-mtp", "--source", str(src), "--target", str(tgt), "--runtime", "mlx-vlm", "--json", cwd=tmp_path)
    assert add.returncode == 0, add.stderr
    for extra in ((), ("--runtime", "mlx-vlm")):
        r = cli("inspect", str(tgt), "--json", *extra, cwd=tmp_path)
        rep = json.loads(r.stdout)
        codes = [f["code"] for f in rep["findings"]]
        assert r.returncode == 0 and "MTP_CONFIG_WITHOUT_WEIGHTS" not in codes, (extra, rep["findings"])
        assert rep["layout"] == "mlx-vlm-drafter" and rep["head_folder"] == str(drafter) and rep["target"] == str(tgt)
    # remove-mtp on the model folder undoes the drafter beside it; no empty folder stays behind
    rm = cli("remove-mtp", str(tgt), "--json", cwd=tmp_path)
    assert rm.returncode == 0 and json.loads(rm.stdout)["folder_removed"] is True, rm.stderr
    assert not drafter.exists()
    # and on the drafter folder itself
    assert cli("add-mtp", "--source", str(src), "--target", str(tgt), "--runtime", "mlx-vlm", cwd=tmp_path).returncode == 0
    rm = cli("remove-mtp", str(drafter), cwd=tmp_path)
    assert rm.returncode == 0 and not drafter.exists(), rm.stderr
    assert rm.stdout.count("removed the MTP head") == 1


def test_add_mtp_on_an_original_checkpoint_suggests_what_inspect_suggests(tmp_path: Path, make_hf) -> None:
    src, hf = make_hf("qwen3_5"), make_hf("qwen3_5")
    add = cli("add-mtp", "--source", str(src), "--target", str(hf), cwd=tmp_path)
    (line,) = [ln for ln in add.stderr.splitlines() if ln.startswith("error:")]
    fix = json.loads(cli("inspect", str(hf), "--json", cwd=tmp_path).stdout)["findings"][0]["fix"]
    assert add.returncode == 2 and "mlx_lm.convert" not in line
    assert f"mtpforge convert --hf-path {hf}" in line and f"mtpforge convert --hf-path {hf}" in fix, (line, fix)


def test_the_mlx_fix_of_a_gguf_only_family_is_short_and_runnable() -> None:
    from mtpforge.families import FAMILIES

    for spec in FAMILIES.values():
        if spec.gguf_only:
            fix = spec.mlx_fix("stepfun-ai/Step-3.5-Flash", "./Step-3.5-Flash-4bit")
            assert len(fix) <= 240, (len(fix), fix)
            cmd = re.search(r"mtpforge add-mtp [^;]*", fix)
            assert cmd and "--source stepfun-ai/Step-3.5-Flash" in cmd.group(0) and "--target" in cmd.group(0), fix


def test_the_readme_real_model_sequence_runs_as_written(tmp_path: Path) -> None:
    """Its recipe line is run from a folder where the recipe's relative target means the folder
    the lines above made; convert writes a new folder, not the one add-mtp changed."""
    text = (REPO / "README.md").read_text()
    section = text.split("## On a real model", 1)[1].split("\n## ", 1)[0]
    lines = [ln.split("#")[0].strip() for ln in re.findall(r"```bash\n(.*?)```", section, re.S) for ln in ln.splitlines()]
    add_target = next(re.search(r"--target (\S+)", ln).group(1) for ln in lines if ln.startswith("mtpforge add-mtp"))
    convert_path = next(re.search(r"--mlx-path (\S+)", ln).group(1) for ln in lines if ln.startswith("mtpforge convert"))
    assert convert_path != add_target, "convert refuses a folder that exists"
    (run_line,) = [ln for ln in lines if "mtpforge run" in ln]
    recipe = re.search(r"mtpforge run (\S+)", run_line).group(1)
    if run_line.startswith("cp "):
        (tmp_path / Path(recipe).name).write_bytes((REPO / run_line.split()[1]).read_bytes())
    else:
        (tmp_path / "recipes").symlink_to(REPO / "recipes")
    r = cli("run", recipe, "--validate", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert Path(json.loads(r.stdout)["target"]) == (tmp_path / add_target).resolve(), "the recipe's target is another folder"
