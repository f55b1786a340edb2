"""add-mtp / remove-mtp on the four tiny variants: exact tensors, unchanged backbone, every
layout, quantization, idempotence, --output, symlinked Hub-cache folders."""

from __future__ import annotations

import json
import os
import shutil

import mlx.core as mx
import pytest

from mtpforge.errors import InputError, RefusedError
from mtpforge.inspect import inspect_checkpoint
from mtpforge.pipeline import add_mtp, remove_mtp
from tests.checkers import expected_bf16_head, folder_state, load_all, logits, source_head

VARIANTS = ["qwen3_5", "qwen3_5_moe", "qwen3_6_moe", "qwen3_next"]
#: where plain add-mtp puts the head (a sidecar for every family), and its expert format
DEFAULT = {
    "qwen3_5": ("mtp.safetensors", "mtp.", "none"),
    "qwen3_5_moe": ("mtp.safetensors", "mtp.", "switch_mlp"),
    "qwen3_6_moe": ("mtp.safetensors", "mtp.", "switch_mlp"),
    "qwen3_next": ("mtp.safetensors", "mtp.", "switch_mlp"),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_bf16_default_layout_exact_and_backbone_unchanged(make_hf, make_target, variant):
    hf, tgt = make_hf(variant), make_target(variant)
    before = logits(tgt)
    r = add_mtp(source=str(hf), target=str(tgt), precision="bf16", progress=False)
    file, prefix, fmt = DEFAULT[variant]
    assert r["status"] == "written" and r["expert_format"] == fmt
    written = {k[len(prefix):]: v for k, v in mx.load(str(tgt / file)).items()}
    want = expected_bf16_head(hf, fmt)
    assert set(written) == set(want)
    for k in want:
        assert written[k].dtype == want[k].dtype and mx.array_equal(written[k], want[k]).item(), k
    assert mx.array_equal(logits(tgt), before).item()
    rep = inspect_checkpoint(str(tgt))
    assert [f for f in rep["findings"] if f["severity"] == "error"] == []
    assert rep["mtp_tensors"] == r["mtp_tensors"] and rep["mtp_bytes"] == r["mtp_bytes"]


def test_norms_are_raw_plus_one_not_heuristic(make_hf, make_target):
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    add_mtp(source=str(hf), target=str(tgt), layout="embedded", precision="bf16", progress=False)
    raw = source_head(hf)
    got = mx.load(str(tgt / "model-mtp.safetensors"))
    for k in ("pre_fc_norm_embedding.weight", "layers.0.self_attn.q_norm.weight", "norm.weight"):
        exp = (raw[k].astype(mx.float32) + 1.0).astype(mx.bfloat16)
        assert mx.array_equal(got["language_model.mtp." + k], exp).item()
    assert mx.array_equal(got["language_model.mtp.fc.weight"], raw["fc.weight"]).item()


def test_match_precision_quantizes_with_config_entries(make_hf, make_target):
    hf, tgt = make_hf("qwen3_5_moe"), make_target("qwen3_5_moe")
    r = add_mtp(source=str(hf), target=str(tgt), layout="sidecar", progress=False)
    cfg = json.loads((tgt / "config.json").read_text())
    q = cfg["quantization"]
    assert q["language_model.mtp.layers.0.mlp.gate"] == {"group_size": 64, "bits": 8}
    assert cfg["quantization_config"]["language_model.mtp.layers.0.mlp.gate"] == {"group_size": 64, "bits": 8}
    assert cfg["mlx_lm_extra_tensors"] == {"mtp_file": "mtp.safetensors", "mtp_tensor_count": r["mtp_tensors"]}
    got = mx.load(str(tgt / "mtp.safetensors"))
    src = source_head(hf)
    w = got["mtp.layers.0.self_attn.q_proj.weight"]
    assert w.dtype == mx.uint32
    deq = mx.dequantize(w, got["mtp.layers.0.self_attn.q_proj.scales"], got["mtp.layers.0.self_attn.q_proj.biases"],
                        group_size=64, bits=4)
    ref = src["layers.0.self_attn.q_proj.weight"].astype(mx.float32)
    step = got["mtp.layers.0.self_attn.q_proj.scales"].astype(mx.float32)
    err = mx.abs(deq - ref).reshape(ref.shape[0], -1, 64)
    assert mx.all(err <= mx.abs(step)[..., None] * 1.01 + 1e-3).item()
    assert "mtp.layers.0.pre_fc_norm_hidden.scales" not in got and got["mtp.pre_fc_norm_hidden.weight"].dtype == mx.bfloat16
    assert inspect_checkpoint(str(tgt))["exit_code"] == 0


@pytest.mark.parametrize("variant,layouts", [
    ("qwen3_5", ["embedded", "sidecar", "vllm-mlx", "mlx-vlm-drafter"]),
    ("qwen3_6_moe", ["embedded", "sidecar", "vllm-mlx", "mlx-vlm-drafter"]),
    ("qwen3_next", ["sidecar", "vllm-mlx"]),
])
def test_every_layout_then_remove_restores_bytes(make_hf, make_target, variant, layouts):
    hf = make_hf(variant)
    for layout in layouts:
        tgt = make_target(variant)
        original = folder_state(tgt)
        add_mtp(source=str(hf), target=str(tgt), layout=layout, progress=False)
        folder = tgt.parent / f"{tgt.name}-mtp-drafter" if layout == "mlx-vlm-drafter" else tgt
        rep = inspect_checkpoint(str(folder))
        assert rep["layout"] == layout, (layout, rep["layout"])
        assert [f for f in rep["findings"] if f["severity"] == "error"] == [], (layout, rep["findings"])
        if layout != "mlx-vlm-drafter":
            assert folder_state(tgt) != original
            remove_mtp(str(tgt))
        assert folder_state(tgt) == original, layout


def test_vllm_mlx_qwen3_next_quantizes_as_its_runtime_does(make_hf, make_target):
    hf, tgt = make_hf("qwen3_next"), make_target("qwen3_next")
    add_mtp(source=str(hf), target=str(tgt), layout="vllm-mlx", precision="bf16", progress=False)
    got = load_all(tgt, "model-mtp.safetensors")
    assert got["mtp.fc.weight"].dtype == mx.bfloat16
    assert got["mtp.layers.0.self_attn.q_proj.weight"].dtype == mx.uint32
    assert got["mtp.layers.0.mlp.gate.weight"].shape[-1] * 32 // 8 == got["mtp.pre_fc_norm_hidden.weight"].shape[0]
    cfg = json.loads((tgt / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 1


def test_vllm_mlx_manifest_for_qwen35(make_hf, make_target):
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    add_mtp(source=str(hf), target=str(tgt), layout="vllm-mlx", progress=False)
    m = json.loads((tgt / "mtp" / "manifest.json").read_text())
    assert m["artifact_schema_version"] == 1 and m["rmsnorm_weight_format"] == "mlx_gamma"


def test_idempotent_force_and_refusals(make_hf, make_target):
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    add_mtp(source=str(hf), target=str(tgt), progress=False)
    once = folder_state(tgt)
    r = add_mtp(source=str(hf), target=str(tgt), progress=False)
    assert r["status"] == "already-present" and folder_state(tgt) == once
    with pytest.raises(RefusedError):
        add_mtp(source=str(hf), target=str(tgt), precision="bf16", progress=False)
    assert folder_state(tgt) == once
    add_mtp(source=str(hf), target=str(tgt), precision="bf16", force=True, progress=False)
    assert folder_state(tgt) != once
    add_mtp(source=str(hf), target=str(tgt), force=True, progress=False)
    assert folder_state(tgt) == once


def test_output_leaves_target_untouched(make_hf, make_target, tmp_path):
    hf, tgt = make_hf("qwen3_6_moe"), make_target("qwen3_6_moe")
    before = folder_state(tgt)
    out = tmp_path / "with-head"
    add_mtp(source=str(hf), target=str(tgt), output=str(out), progress=False)
    assert folder_state(tgt) == before
    assert inspect_checkpoint(str(out))["exit_code"] == 0
    with pytest.raises(InputError):
        add_mtp(source=str(hf), target=str(tgt), output=str(out), progress=False)


def test_output_from_a_target_that_has_a_head(make_hf, make_target, tmp_path):
    """--output copies the target, so the target's head counts: the same head is re-created in
    the new folder; another one is refused without --force and replaced with it."""
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    add_mtp(source=str(hf), target=str(tgt), layout="embedded", progress=False)
    before = folder_state(tgt)
    same = add_mtp(source=str(hf), target=str(tgt), layout="embedded", output=str(tmp_path / "same"), progress=False)
    assert same["status"] == "written" and (tmp_path / "same" / "model-mtp.safetensors").is_file()
    with pytest.raises(RefusedError, match="already has"):
        add_mtp(source=str(hf), target=str(tgt), layout="sidecar", output=str(tmp_path / "other"), progress=False)
    assert not (tmp_path / "other").exists()
    add_mtp(source=str(hf), target=str(tgt), layout="sidecar", output=str(tmp_path / "other"), force=True, progress=False)
    rep = inspect_checkpoint(str(tmp_path / "other"))
    assert rep["layout"] == "sidecar" and rep["exit_code"] == 0, rep["findings"]
    assert not (tmp_path / "other" / "model-mtp.safetensors").exists()
    assert folder_state(tgt) == before


def test_dry_run_changes_nothing(make_hf, make_target):
    hf, tgt = make_hf("qwen3_5_moe"), make_target("qwen3_5_moe")
    before = folder_state(tgt)
    r = add_mtp(source=str(hf), target=str(tgt), dry_run=True, progress=False)
    assert r["dry_run"] and r["fetch_bytes"] > 0 and r["peak_memory_estimate"] > 0 and r["files_to_write"]
    assert folder_state(tgt) == before


def test_symlinked_hub_cache_blobs_untouched(make_hf, make_target, tmp_path):
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    cache = tmp_path / "models--org--tiny"
    blobs, snap = cache / "blobs", cache / "snapshots" / ("a" * 40)
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in sorted(tgt.iterdir()):
        blob = blobs / f"blob-{f.name}"
        shutil.copy(f, blob)
        os.symlink(os.path.relpath(blob, snap), snap / f.name)
    blob_state = folder_state(blobs)
    add_mtp(source=str(hf), target=str(snap), progress=False)
    assert folder_state(blobs) == blob_state
    assert (snap / "config.json").is_file() and not (snap / "config.json").is_symlink()
    assert (snap / "model.safetensors.index.json").is_file()
    assert (snap / "tokenizer.json").is_symlink()
    assert inspect_checkpoint(str(snap))["exit_code"] == 0
    remove_mtp(str(snap))
    assert (snap / "config.json").is_symlink() and folder_state(blobs) == blob_state


def test_mismatched_source_refused_before_anything(make_hf, make_target):
    tgt = make_target("qwen3_5")
    before = folder_state(tgt)
    with pytest.raises(RefusedError):
        add_mtp(source=str(make_hf("qwen3_next")), target=str(tgt), progress=False)
    with pytest.raises(RefusedError):
        add_mtp(source=str(make_hf("qwen3_5_moe")), target=str(tgt), progress=False)
    assert folder_state(tgt) == before


def test_layout_family_mismatch_is_bad_input(make_hf, make_target):
    with pytest.raises(InputError):
        add_mtp(source=str(make_hf("qwen3_next")), target=str(make_target("qwen3_next")), layout="embedded", progress=False)


def test_foreign_head_replaced_with_force(make_hf, make_target):
    """A head written by another tool inside a backbone shard: refused, then replaced with --force."""
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    add_mtp(source=str(hf), target=str(tgt), precision="bf16", progress=False)
    (tgt / "mtpforge.json").unlink()
    with pytest.raises(RefusedError):
        add_mtp(source=str(hf), target=str(tgt), progress=False)
    add_mtp(source=str(hf), target=str(tgt), force=True, progress=False)
    assert inspect_checkpoint(str(tgt), source=str(hf))["exit_code"] == 0


def test_default_source_paths_do_not_exist_is_bad_input(make_target, tmp_path):
    with pytest.raises(InputError):
        add_mtp(source=str(tmp_path / "missing"), target=str(make_target("qwen3_5")), progress=False)
    with pytest.raises(InputError):
        add_mtp(source="Qwen/Qwen3.5-27B", target=str(tmp_path / "nope"), progress=False)



def test_findings_after_add_mtp_name_the_users_folder_not_the_staged_copy(make_hf, make_target):
    """add-mtp judges the staged copy before it commits; a finding's fix must name the folder the
    user passed (the staged copy is gone once the run ends)."""
    hf, tgt = make_hf("qwen3_5_moe"), make_target("qwen3_5_moe")
    r = add_mtp(source=str(hf), target=str(tgt), layout="embedded", experts="switch_mlp", precision="4", progress=False)
    fixes = [f["fix"] for f in r["inspect"]["findings"] if f.get("fix")]
    assert fixes and all(f"--target {tgt}" in f and "mtpforge-stage" not in f for f in fixes), fixes
