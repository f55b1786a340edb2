"""inspect finds exactly the defects of docs/SPEC.md §6, each on a checkpoint built with that defect."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import pytest

from mtpforge.inspect import inspect_checkpoint
from mtpforge.pipeline import add_mtp
from mtpforge.errors import RefusedError
from tests.checkers import codes, edit_json, folder_state, rewrite

QWEN35 = ["qwen3_5", "qwen3_5_moe", "qwen3_6_moe"]


def _with_head(make_hf, make_target, variant="qwen3_5", **kw):
    """A head written by add-mtp; the embedded layout unless ``layout`` says otherwise (these
    tests break ``model-mtp.safetensors`` by hand)."""
    hf, tgt = make_hf(variant), make_target(variant)
    kw.setdefault("layout", "embedded" if variant != "qwen3_next" else None)
    add_mtp(source=str(hf), target=str(tgt), progress=False, **kw)
    return hf, tgt


@pytest.mark.parametrize("variant", QWEN35)
def test_converted_target_lost_its_head(make_target, variant):
    r = inspect_checkpoint(str(make_target(variant)))
    assert r["family"] == ("qwen3_5" if variant == "qwen3_5" else "qwen3_5_moe")
    assert r["layout"] == "none" and r["config_mtp_layers"] == 1 and r["mtp_tensors"] == 0
    f = next(f for f in r["findings"] if f["code"] == "MTP_CONFIG_WITHOUT_WEIGHTS")
    assert f["severity"] == "error" and "mtpforge add-mtp --source" in f["fix"]
    assert r["exit_code"] == 1


def test_qwen3_next_without_head_is_a_warning(make_target):
    tgt = make_target("qwen3_next")
    r = inspect_checkpoint(str(tgt))
    assert r["config_mtp_layers"] == 0
    assert codes(r) == {"MTP_HEAD_MISSING": "warning"}
    assert "mtpforge add-mtp --source" in r["findings"][0]["fix"]
    assert r["exit_code"] == 0
    assert inspect_checkpoint(str(tgt), strict=True)["exit_code"] == 1


@pytest.mark.parametrize("variant", ["qwen3_5", "qwen3_5_moe", "qwen3_6_moe", "qwen3_next"])
def test_source_checkpoint_is_clean_and_raw(make_hf, variant):
    r = inspect_checkpoint(str(make_hf(variant)))
    assert r["layout"] == "hf" and r["norm_convention"] == "raw"
    assert [f for f in r["findings"] if f["severity"] == "error"] == []


def test_raw_norms_in_mlx_layout(make_hf, make_target):
    _, tgt = _with_head(make_hf, make_target, precision="bf16")
    (tgt / "mtpforge.json").unlink()  # a third-party head: no manifest to trust
    rewrite(tgt / "model-mtp.safetensors", lambda t: {
        k: (v.astype(mx.float32) - 1).astype(v.dtype) if "norm" in k else v for k, v in t.items()})
    # an untrained (synthetic) head: behaviour is no evidence (tests/test_norm_behaviour.py), so
    # this is the backbone comparison's case
    r = inspect_checkpoint(str(tgt), behaviour=False)
    assert r["norm_convention"] == "raw" and codes(r).get("MTP_NORMS_RAW") == "error"


def test_mixed_norms(make_hf, make_target):
    _, tgt = _with_head(make_hf, make_target, precision="bf16")
    (tgt / "mtpforge.json").unlink()
    rewrite(tgt / "model-mtp.safetensors", lambda t: {
        k: (v.astype(mx.float32) - 1).astype(v.dtype) if k.endswith("input_layernorm.weight") else v
        for k, v in t.items()})
    r = inspect_checkpoint(str(tgt), behaviour=False)
    assert codes(r).get("MTP_NORMS_MIXED") == "error"


def test_double_shift_found_exactly_with_source(make_hf, make_target):
    hf, tgt = _with_head(make_hf, make_target, precision="bf16")
    rewrite(tgt / "model-mtp.safetensors", lambda t: {
        k: (v.astype(mx.float32) + 1).astype(v.dtype) if "norm" in k else v for k, v in t.items()})
    r = inspect_checkpoint(str(tgt), source=str(hf))
    assert r["norm_convention"] == "double-shifted" and r["norm_convention_from"] == "source"
    assert codes(r).get("MTP_NORMS_DOUBLE_SHIFTED") == "error"
    # the manifest no longer matches the tensors: it is not trusted
    r2 = inspect_checkpoint(str(tgt), behaviour=False)
    assert "MANIFEST_STALE" in codes(r2) and r2["norm_convention_from"] != "manifest"


def test_correct_head_is_shifted_by_every_method(make_hf, make_target):
    hf, tgt = _with_head(make_hf, make_target, precision="bf16")
    assert inspect_checkpoint(str(tgt))["norm_convention_from"] == "manifest"
    r = inspect_checkpoint(str(tgt), source=str(hf))
    assert (r["norm_convention"], r["exit_code"]) == ("shifted", 0)
    (tgt / "mtpforge.json").unlink()
    r = inspect_checkpoint(str(tgt), behaviour=False)
    assert (r["norm_convention_from"], r["norm_convention"]) in (("backbone", "shifted"), ("unknown", "unknown"))
    assert r["exit_code"] == 0


def test_stale_shard(make_target):
    tgt = make_target("qwen3_5")
    shard = sorted(tgt.glob("model*.safetensors"))[0]
    shutil.copy(shard, tgt / "model-old.safetensors")
    assert codes(inspect_checkpoint(str(tgt))).get("STALE_SHARD") == "error"


def test_index_names_missing_file_and_absent_key(make_target):
    tgt = make_target("qwen3_5")
    edit_json(tgt / "model.safetensors.index.json", lambda i: i["weight_map"].update(
        {"language_model.model.extra.weight": "model-99999.safetensors", "language_model.model.ghost.weight":
         sorted(set(i["weight_map"].values()))[0]}))
    r = inspect_checkpoint(str(tgt))
    msgs = [f["message"] for f in r["findings"] if f["code"] == "INDEX_INCONSISTENT"]
    assert any("model-99999" in m for m in msgs) and any("absent" in m for m in msgs)
    assert r["exit_code"] == 1


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/passwd"])
def test_index_naming_files_outside_the_folder_is_a_finding(make_hf, make_target, name):
    """A bad index inside a readable folder is a finding (exit 1), and add-mtp refuses it."""
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    edit_json(tgt / "model.safetensors.index.json", lambda i: i["weight_map"].update({"language_model.model.x.weight": name}))
    r = inspect_checkpoint(str(tgt))
    assert codes(r).get("INDEX_INCONSISTENT") == "error" and r["exit_code"] == 1
    assert any(name in f["message"] for f in r["findings"] if f["code"] == "INDEX_INCONSISTENT")
    before = folder_state(tgt)
    with pytest.raises(RefusedError, match="outside the model folder|absolute"):
        add_mtp(source=str(hf), target=str(tgt), progress=False)
    assert folder_state(tgt) == before


def test_corrupt_shard_is_a_finding_not_a_crash(make_target):
    tgt = make_target("qwen3_5")
    shard = sorted(tgt.glob("model*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    r = inspect_checkpoint(str(tgt))
    assert codes(r).get("CORRUPT_FILE") == "error" and r["exit_code"] == 1


def test_shape_mismatch_head_from_another_size(make_hf, make_target):
    _, tgt = _with_head(make_hf, make_target, precision="bf16")
    rewrite(tgt / "model-mtp.safetensors", lambda t: {
        k: (mx.zeros((v.shape[0], v.shape[1] * 2), v.dtype) + 0.01 if k.endswith("fc.weight") else v) for k, v in t.items()})
    assert codes(inspect_checkpoint(str(tgt))).get("MTP_SHAPE_MISMATCH") == "error"


def test_quant_config_mismatch(make_hf, make_target):
    _, tgt = _with_head(make_hf, make_target)  # match: 4-bit head, routers none (dense)
    edit_json(tgt / "config.json", lambda c: c["quantization"].update(
        {"language_model.mtp.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8}}))
    r = inspect_checkpoint(str(tgt))
    assert codes(r).get("QUANT_CONFIG_MISMATCH") == "error"


def test_weights_without_config(make_hf, make_target):
    _, tgt = _with_head(make_hf, make_target)
    edit_json(tgt / "config.json", lambda c: c["text_config"].update({"mtp_num_hidden_layers": 0}))
    assert codes(inspect_checkpoint(str(tgt))).get("MTP_WEIGHTS_WITHOUT_CONFIG") == "error"


def test_missing_and_unexpected_tensors(make_hf, make_target):
    _, tgt = _with_head(make_hf, make_target, precision="bf16")
    idx = tgt / "model.safetensors.index.json"

    def drop_and_add(t):
        t = {k: v for k, v in t.items() if not k.endswith("o_proj.weight")}
        t["language_model.mtp.layers.0.self_attn.bogus.weight"] = mx.ones((4, 4), dtype=mx.bfloat16)
        return t

    rewrite(tgt / "model-mtp.safetensors", drop_and_add)
    edit_json(idx, lambda i: (i["weight_map"].pop("language_model.mtp.layers.0.self_attn.o_proj.weight"),
                              i["weight_map"].update({"language_model.mtp.layers.0.self_attn.bogus.weight": "model-mtp.safetensors"})))
    c = codes(inspect_checkpoint(str(tgt)))
    assert c.get("MTP_MISSING_TENSORS") == "error" and c.get("MTP_UNEXPECTED_TENSORS") == "error"


def test_sidecar_unreferenced(make_hf, make_target):
    _, tgt = _with_head(make_hf, make_target, layout="sidecar")
    edit_json(tgt / "config.json", lambda c: c.pop("mlx_lm_extra_tensors"))
    assert codes(inspect_checkpoint(str(tgt))).get("SIDECAR_UNREFERENCED") == "error"


def test_expert_layout_incompatible(make_hf, make_target):
    _, tgt = _with_head(make_hf, make_target, "qwen3_5_moe", layout="embedded", experts="switch_mlp")
    assert codes(inspect_checkpoint(str(tgt))).get("EXPERT_LAYOUT_INCOMPATIBLE") == "warning"
    r = inspect_checkpoint(str(tgt), runtime="mlx-lm-mtp")
    assert codes(r).get("EXPERT_LAYOUT_INCOMPATIBLE") == "error" and r["exit_code"] == 1
    assert "EXPERT_LAYOUT_INCOMPATIBLE" not in codes(inspect_checkpoint(str(tgt), runtime="exo"))


def test_qwen3_next_head_in_model_files_breaks_released_mlx_lm(make_hf, make_target):
    _, tgt = _with_head(make_hf, make_target, "qwen3_next", layout="vllm-mlx")
    assert codes(inspect_checkpoint(str(tgt))).get("MLX_LM_LOAD_BREAKS") == "warning"
    r = inspect_checkpoint(str(tgt), runtime="mlx-lm")
    assert codes(r).get("MLX_LM_LOAD_BREAKS") == "error" and r["exit_code"] == 1


def test_legacy_loader_warning_depends_on_installed_version(make_hf, make_target):
    _, tgt = _with_head(make_hf, make_target)
    assert "LEGACY_LOADER_DOUBLE_SHIFT" not in codes(inspect_checkpoint(str(tgt)))
    r = inspect_checkpoint(str(tgt), mlx_lm_version="0.31.1")
    assert codes(r).get("LEGACY_LOADER_DOUBLE_SHIFT") == "warning"
    _, side = _with_head(make_hf, make_target, layout="sidecar")
    assert "LEGACY_LOADER_DOUBLE_SHIFT" not in codes(inspect_checkpoint(str(side), mlx_lm_version="0.31.1"))


def test_nonfinite_and_degenerate(make_hf, make_target):
    _, tgt = _with_head(make_hf, make_target, precision="bf16")

    def damage(t):
        t = dict(t)
        k1 = next(k for k in t if k.endswith("q_proj.weight"))
        k2 = next(k for k in t if k.endswith("k_proj.weight"))
        t[k1] = mx.full(t[k1].shape, float("nan"), dtype=t[k1].dtype)
        t[k2] = mx.zeros(t[k2].shape, dtype=t[k2].dtype)
        return t

    rewrite(tgt / "model-mtp.safetensors", damage)
    c = codes(inspect_checkpoint(str(tgt)))
    assert c.get("NONFINITE_WEIGHTS") == "error" and c.get("DEGENERATE_TENSOR") == "error"


@pytest.mark.parametrize("layout", ["embedded", "sidecar", "vllm-mlx", "mlx-vlm-drafter"])
def test_every_layout_recognised_clean(make_hf, make_target, layout):
    hf, tgt = _with_head(make_hf, make_target, "qwen3_5_moe", layout=layout)
    folder = tgt.parent / f"{tgt.name}-mtp-drafter" if layout == "mlx-vlm-drafter" else tgt
    r = inspect_checkpoint(str(folder), source=str(hf))
    assert r["layout"] == layout and r["norm_convention"] == "shifted"
    assert [f for f in r["findings"] if f["severity"] == "error"] == [], r["findings"]


def test_cli_json_and_exit_codes(make_target, tmp_path):
    import subprocess
    import sys

    tgt = make_target("qwen3_5")
    p = subprocess.run([sys.executable, "-m", "mtpforge", "inspect", str(tgt), "--json"], capture_output=True, text=True)
    assert p.returncode == 1
    r = json.loads(p.stdout)
    for key in ("target", "family", "layout", "config_mtp_layers", "mtp_tensors", "mtp_bytes", "norm_convention",
                "expert_format", "quantization", "findings"):
        assert key in r
    p = subprocess.run([sys.executable, "-m", "mtpforge", "inspect", str(tmp_path / "nope")], capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    (tmp_path / "empty").mkdir()
    p = subprocess.run([sys.executable, "-m", "mtpforge", "inspect", str(tmp_path / "empty"), "--json"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and json.loads(p.stdout)["error"]["code"] == "BAD_INPUT"


def test_an_original_hugging_face_checkpoint_is_a_source_not_a_broken_folder() -> None:
    """The folder a user passes as --source: its zero-centred norms are its convention, and the
    one finding says what to run with it, as a command that copies whole at 80 columns."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "mtpforge" / "data" / "tiny-qwen3_5"
    r = inspect_checkpoint(str(src))
    assert r["layout"] == "hf" and r["norm_convention"] == "raw"
    assert [(f["code"], f["severity"]) for f in r["findings"]] == [("HF_SOURCE_CHECKPOINT", "info")]
    assert f"mtpforge add-mtp --source {src} --target" in r["findings"][0]["fix"]
    out = subprocess.run([sys.executable, "-m", "mtpforge", "inspect", str(src)], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "80", "NO_COLOR": "1"})
    assert out.returncode == 0, out.stderr
    fix = [line for line in out.stdout.splitlines() if line.startswith("fix (HF_SOURCE_CHECKPOINT):")]
    assert len(fix) == 1 and f"mtpforge add-mtp --source {src} --target <your MLX folder>" in fix[0], out.stdout


def test_a_fix_never_names_a_local_source_by_its_bare_folder_name(make_hf, make_target):
    """The manifest records a local source by its folder name only; a fix that passed that name as
    --source would look for it in the working folder (or on the Hub), so it asks for the path."""
    hf, tgt = _with_head(make_hf, make_target, layout="sidecar")
    r = inspect_checkpoint(str(tgt), runtime="vllm-mlx")
    fix = next(f["fix"] for f in r["findings"] if f["code"] == "LAYOUT_NOT_READ_BY_RUNTIME")
    assert f"--source <path to {hf.name}> --target {tgt}" in fix
