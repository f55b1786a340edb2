"""Hy3 (``hy_v3``) and MLX folders, as the tools themselves answer (docs/families/hy_v3.md §6).

mtpforge writes no MLX form of Hy3 because no released tool makes an MLX Hy3 folder to put one
into: mlx-lm (mtpforge's 0.32.2 and MTPLX's pinned 0.31.3, the command MTPLX's own ``forge build``
runs) and mlx-vlm 0.7.10 stop at "Model type hy_v3 not supported". These tests hold those facts,
so a release that adds the model fails them and the family gets its MLX form. What a user does
instead is what MTPLX 2.12.2 measurably runs: the Hugging Face release folder itself (its vendored
``hy_v3`` model keeps the appended layer, and its ``hy_v3_mtp`` patch binds it), while a folder
that declares the layer but lacks its tensors fails MTPLX's load. add-mtp on an MLX folder says so
in one line, before it reads anything.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import mlx_judged as judged
from tests.support.family_probe import run_in_runtime
from tests.support.synth.hy_v3 import build_hy_v3

#: the trunk's layers in the tiny checkpoint: the MTP layer is model.layers.2
N = 2
DRIVER = Path(__file__).resolve().parent / "support" / "family_mtplx_driver.py"
NOT_SUPPORTED = "Model type hy_v3 not supported"


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hy_v3(tmp_path_factory.mktemp("hy_v3_mlx") / "tiny-hy_v3")


def _without_the_layer(src: Path, dst: Path, declared: int) -> Path:
    """The release with the appended layer's keys deleted and ``num_nextn_predict_layers`` =
    ``declared``: what the community's layer-less conversions hold, in the release's own bf16
    (no released tool makes their quantized trunk, so this is a stand-in for the runtime to
    judge, not a conversion)."""
    import mlx.core as mx

    shutil.copytree(src, dst)
    gone = f"model.layers.{N}."
    for f in sorted(dst.glob("model-*.safetensors")):
        kept = {k: v for k, v in mx.load(str(f)).items() if not k.startswith(gone)}
        mx.save_safetensors(str(f), kept, metadata={"format": "pt"})
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith(gone)}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": declared}))
    return dst


def test_no_released_converter_has_the_model(src: Path, tmp_path: Path) -> None:
    """mlx-lm 0.32.2 here, MTPLX's mlx-lm 0.31.3 run as MTPLX's ``forge build`` runs it
    (``python -P -m mlx_lm convert``, no vendored model registered) and mlx-vlm 0.7.10 (where it
    is set up) all refuse the model."""
    judged.require_mtplx()
    rt = judged.setup_runtimes
    runs = {"mlx-lm": [sys.executable, "-m", "mlx_lm", "convert"],
            "mtplx": [str(rt.venv_python("mtplx")), "-P", "-m", "mlx_lm", "convert"]}
    if rt.is_ready("mlx-vlm"):
        runs["mlx-vlm"] = [str(rt.venv_python("mlx-vlm")), "-m", "mlx_vlm", "convert"]
    for name, cmd in runs.items():
        r = subprocess.run([*cmd, "--hf-path", str(src), "--mlx-path", str(tmp_path / name), "-q"],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert r.returncode != 0 and NOT_SUPPORTED in r.stderr, (name, r.stderr[-2000:])
        assert not (tmp_path / name / "config.json").exists()


def test_add_mtp_into_an_mlx_folder_refuses_in_one_line(src: Path, tmp_path: Path) -> None:
    """Plain and ``--runtime mtplx`` alike: one error line that names the GGUF route and the
    release folder MTPLX runs; the folder is left as it was (only its config is there: the
    refusal comes before any tensor is read)."""
    target = tmp_path / "hy3-mlx-4bit"
    target.mkdir()
    cfg = {**json.loads((src / "config.json").read_text()), "quantization": {"group_size": 64, "bits": 4}}
    (target / "config.json").write_text(json.dumps(cfg))
    before = (target / "config.json").read_bytes()
    for extra in ([], ["--runtime", "mtplx"]):
        r = subprocess.run([sys.executable, "-m", "mtpforge", "add-mtp", "--source", str(src), "--target", str(target),
                            *extra], capture_output=True, text=True, timeout=120, env=judged.ENV)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1, (extra, r.stderr)
        assert "llama.cpp only" in lines[0] and "MTPLX 2.12.2 runs the HF release folder itself" in lines[0], lines[0]
    assert sorted(p.name for p in target.iterdir()) == ["config.json"]
    assert (target / "config.json").read_bytes() == before


def test_mtplx_runs_the_release_folder_and_refuses_a_declared_head_without_tensors(src: Path, tmp_path: Path) -> None:
    """One MTPLX driver run (its loader and ``generate_mtpk``, greedy, depth 1): the release
    folder loads with the head bound, drafts, and decodes exactly as its plain decode; the same
    folder without the layer's tensors fails the load (mlx-lm's strict load of the vendored
    model's ``mtp.*``); declaring no layer, it serves without a head."""
    judged.require_mtplx()
    cells = {"release": src, "declared": _without_the_layer(src, tmp_path / "declared", 1),
             "undeclared": _without_the_layer(src, tmp_path / "undeclared", 0)}
    spec = {"max_tokens": 24, "prompts": [[1, 5, 9, 13, 17, 21], [1, 40, 41, 42]],
            "cells": [{"id": k, "folder": str(v)} for k, v in cells.items()]}
    got = run_in_runtime(judged.setup_runtimes.venv_dir("mtplx").name, DRIVER, spec, tmp_path, timeout=300)
    assert got["ok"], got
    release, declared, undeclared = got["release"], got["declared"], got["undeclared"]
    assert release.get("mtp_enabled") and "error" not in release, release
    assert release["drafted"] > 0 and release["identical_to_plain"], release
    assert any(k.startswith("layer.mlp.switch_mlp.") for k in release["head_params"]), release["head_params"]
    assert declared.get("stage") == "load" and "Missing" in declared["error"], declared
    assert "mtp.eh_proj.weight" in declared["error"] and "mtp.layer.mlp.switch_mlp" in declared["error"]
    assert undeclared.get("mtp_enabled") is False and len(undeclared["plain"]) == 2, undeclared


def test_inspect_of_a_layerless_mlx_folder_does_not_blame_mlx_lm(src: Path, tmp_path: Path) -> None:
    """A folder that declares the layer without its tensors was made by some other converter
    (mlx-lm has no Hy3): inspect says so, and its fix is the refusal's advice."""
    import mlx.core as mx

    target = tmp_path / "hy3-layerless"
    shutil.copytree(src, target)
    n = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    keep_out = f"model.layers.{n}."
    for f in target.glob("*.safetensors"):
        t = {k: v for k, v in mx.load(str(f)).items() if not k.startswith(keep_out)}
        f.unlink()
        mx.save_safetensors(str(f), t, metadata={"format": "mlx"})
    idx = target / "model.safetensors.index.json"
    if idx.is_file():
        d = json.loads(idx.read_text())
        d["weight_map"] = {k: v for k, v in d["weight_map"].items() if not k.startswith(keep_out)}
        idx.write_text(json.dumps(d))
    r = subprocess.run([sys.executable, "-m", "mtpforge", "inspect", str(target), "--json"], capture_output=True,
                       text=True, timeout=120, env=judged.ENV)
    found = {f["code"]: f for f in json.loads(r.stdout)["findings"]}
    assert "MTP_CONFIG_WITHOUT_WEIGHTS" in found, found
    assert "mlx_lm.convert" not in found["MTP_CONFIG_WITHOUT_WEIGHTS"]["message"], found
