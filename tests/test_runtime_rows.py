"""The runtime rows as add-mtp writes by them (planned from data, no file opened) and as
``inspect --runtime`` predicts from them (tiny real folders). The real runtimes are held to the
same rows by tests/conformance; these tests keep the rows' consequences fast to check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mtpforge.checkpoint.safetensors_header import DTYPE_SIZES, TensorInfo
from mtpforge.errors import InputError
from mtpforge.families.detect import detect_family
from mtpforge.inspect import inspect_checkpoint
from mtpforge.layouts.detect import HeadLocation
from mtpforge.options import AddOptions
from mtpforge.pipeline import SourceHead, add_mtp, make_plan
from mtpforge.runtimes import RUNTIMES
from mtpforge.runtimes.norms import below_half, mtplx_two_signal
from tests.support.synth import hf_tensor_specs, tiny_config

Q4 = {"group_size": 64, "bits": 4, "mode": "affine"}


def _source(variant: str) -> tuple[dict[str, Any], SourceHead]:
    config = tiny_config(variant)
    entries, offset = {}, 0
    for name, (shape, *_rest) in sorted(hf_tensor_specs(config).items()):
        if name.startswith("mtp."):
            n = DTYPE_SIZES["BF16"]
            for d in shape:
                n *= d
            entries[name[4:]] = TensorInfo(name, "model-00003-of-00003.safetensors", "BF16", tuple(shape), offset, offset + n)
            offset += n
    head = HeadLocation("hf", entries, {k: i.name for k, i in entries.items()})
    return config, SourceHead(variant, config, detect_family(config), head, None, True,
                              {"model-00003-of-00003.safetensors": offset})


def plan(variant: str, **kw: Any) -> Any:
    config, src = _source(variant)
    target_config = {**config, "quantization": dict(Q4), "quantization_config": dict(Q4)}
    return make_plan(AddOptions(source="/nowhere/s", target="/nowhere/t", **kw), target=Path("/nowhere/t"),
                     target_config=target_config, family=src.family, source=src)


def precisions(p: Any) -> dict[str, Any]:
    return {m.bare: (m.q.bits if m.q else m.float_dtype) for m in p.head.modules}


@pytest.mark.parametrize("variant", ["qwen3_5", "qwen3_5_moe", "qwen3_6_moe", "qwen3_next"])
def test_plain_add_mtp_writes_the_portable_sidecar(variant):
    """No --runtime, no --layout: a sidecar for every family, experts stacked, MoE heads bf16."""
    p = plan(variant)
    assert p.head.layout == "sidecar" and p.placement.file == "mtp.safetensors" and not p.placement.in_index
    moe = variant != "qwen3_5"
    assert p.head.expert_format == ("switch_mlp" if moe else "none")
    prec = set(precisions(p).values())
    assert prec == {"bfloat16"} if moe else 4 in prec
    assert p.recorded_options["precision"] == ("bf16" if moe else "match") and "runtime" not in p.recorded_options
    # loads in MTPLX and exo, leaves released mlx-lm alone; a dense head matching a 4-bit target
    # is below the dense knee, which the one note says (docs/PRECISION.md)
    assert [n.split(";")[0] for n in p.notes] == ([] if moe else ["the head matches the target's 4 bits"])


@pytest.mark.parametrize("variant", ["qwen3_5_moe", "qwen3_next"])
def test_mtplx_moe_template(variant):
    """MTPLX keeps a quantized MoE head only as its template: fc and the router float, the rest
    quantized, shared_expert_gate 8-bit with its per-path entry."""
    p = plan(variant, runtime="mtplx")
    got = precisions(p)
    assert p.head.layout == "sidecar" and p.head.expert_format == "switch_mlp"
    assert got["fc"] == "bfloat16" and got["layers.0.mlp.gate"] == "bfloat16"
    assert got["layers.0.mlp.shared_expert_gate"] == 8
    assert got["layers.0.mlp.switch_mlp.up_proj"] == 4 and got["layers.0.self_attn.q_proj"] == 4
    assert any(k.endswith("layers.0.mlp.shared_expert_gate") for k in p.head.quant_entries())
    assert p.notes == () and p.recorded_options["runtime"] == "mtplx"


def test_vllm_mlx_rules():
    """Qwen3.5 MoE: fused kept, per-expert stacked (vllm-mlx refuses per-expert), routers float;
    Qwen3-Next: expert stacks float (vllm-mlx quantizes only nn.Linear), the rest at the
    model's bits, routers 8-bit, and a note that it never drafts Qwen3-Next."""
    assert plan("qwen3_6_moe", runtime="vllm-mlx").head.expert_format == "fused"
    pe = plan("qwen3_5_moe", runtime="vllm-mlx")
    assert pe.head.expert_format == "switch_mlp" and precisions(pe)["layers.0.mlp.gate"] == "bfloat16"
    nx = plan("qwen3_next", runtime="vllm-mlx", precision="bf16")
    got = precisions(nx)
    assert got["layers.0.mlp.switch_mlp.down_proj"] == "bfloat16" and got["fc"] == "bfloat16"
    assert got["layers.0.self_attn.o_proj"] == 4 and got["layers.0.mlp.gate"] == 8
    assert any("never drafts Qwen3-Next" in n for n in nx.notes)


def test_exo_one_precision():
    got = precisions(plan("qwen3_5_moe", runtime="exo", precision="8"))
    assert set(got[m] for m in got if "norm" not in m) == {4}  # the model's default bits, routers included


def test_explicit_overrides_win_with_a_note():
    p = plan("qwen3_5_moe", runtime="mtplx", layout="embedded")
    assert p.head.layout == "embedded"
    assert any("will not work in mtplx" in n and "backbone" in n for n in p.notes)
    p = plan("qwen3_5_moe", runtime="exo", keep_fc_full_precision=True)
    assert any("will not work in exo" in n and "fc is float" in n for n in p.notes)
    p = plan("qwen3_5_moe", layout="sidecar")  # the layout's own rule, named by the runtime that loads it
    assert any("pass --runtime mtplx" in n for n in p.notes)
    p = plan("qwen3_5", layout="embedded")  # loads in #990, and corrupts MTPLX's and exo's backbone
    assert [n.split(":")[0] for n in p.notes] == ["breaks mtplx", "breaks exo"]
    p = plan("qwen3_next", runtime="vllm-mlx")
    assert {n.split(":")[0] for n in p.notes} == {"breaks mlx-lm", "breaks mtplx", "will not work in vllm-mlx"}


def test_runtimes_without_a_path_refuse_with_their_words():
    with pytest.raises(InputError, match="no Qwen3-Next MTP drafter"):
        plan("qwen3_next", runtime="mlx-vlm")
    with pytest.raises(InputError, match="GGUF"):
        plan("qwen3_5", runtime="llama.cpp")


def test_every_runtime_row_cites_what_it_was_checked_against():
    for row in RUNTIMES.values():
        if row.name == "omlx":
            assert row.version_checked is None and "not checked" in row.summary
            continue
        assert row.version_checked and ("measured" in row.version_checked or "docs/SPEC.md §5.1" in row.version_checked)
        assert row.output_format.value != "mlx-folder" or row.mlx_lm, row.name


def test_norm_rules_fire_on_values_alone():
    shifted_low = {"pre_fc_norm_embedding.weight": 0.4, "layers.0.self_attn.q_norm.weight": 1.1,
                   "layers.0.input_layernorm.weight": 1.0, "norm.weight": 1.2}
    assert below_half(shifted_low) == ["pre_fc_norm_embedding.weight"]
    assert mtplx_two_signal(shifted_low) == sorted(shifted_low)  # q/k below 1.25 and a low one below 0.5
    assert mtplx_two_signal({**shifted_low, "layers.0.self_attn.q_norm.weight": 1.7}) == []


def _codes(report: dict[str, Any]) -> dict[str, str]:
    return {f["code"]: f["severity"] for f in report["findings"]}


def test_inspect_runtime_predictions(make_hf, make_target):
    """The hand-broken folders of the conformance suite, as inspect --runtime sees them."""
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    add_mtp(source=str(hf), target=str(tgt), layout="embedded", progress=False)
    assert _codes(inspect_checkpoint(str(tgt), runtime="mtplx")).get("LEGACY_LOADER_DOUBLE_SHIFT") == "error"
    assert "LEGACY_LOADER_DOUBLE_SHIFT" not in _codes(inspect_checkpoint(str(tgt), runtime="vllm-mlx"))  # VL route
    assert _codes(inspect_checkpoint(str(tgt), runtime="mlx-lm")).get("LEGACY_LOADER_DOUBLE_SHIFT") is None
    hf, tgt = make_hf("qwen3_5_moe"), make_target("qwen3_5_moe")
    add_mtp(source=str(hf), target=str(tgt), layout="vllm-mlx", progress=False)  # per-expert experts
    assert _codes(inspect_checkpoint(str(tgt), runtime="vllm-mlx")).get("EXPERT_LAYOUT_INCOMPATIBLE") == "error"
    assert _codes(inspect_checkpoint(str(tgt), runtime="exo")).get("LAYOUT_NOT_READ_BY_RUNTIME") == "error"


def test_inspect_no_false_errors(make_hf, make_target):
    hf = make_hf("qwen3_6_moe")
    fused = make_target("qwen3_6_moe")
    add_mtp(source=str(hf), target=str(fused), runtime="mtplx", experts="source", progress=False)
    r = inspect_checkpoint(str(fused), runtime="mtplx")
    assert r["expert_format"] == "fused" and r["exit_code"] == 0, r["findings"]
    drafter_tgt = make_target("qwen3_6_moe")
    add_mtp(source=str(hf), target=str(drafter_tgt), runtime="mlx-vlm", experts="source", progress=False)
    r = inspect_checkpoint(str(drafter_tgt.parent / f"{drafter_tgt.name}-mtp-drafter"), runtime="mlx-vlm")
    assert r["expert_format"] == "fused" and r["exit_code"] == 0, r["findings"]
    plain = make_target("qwen3_6_moe")
    add_mtp(source=str(hf), target=str(plain), progress=False)
    for rt in ("mtplx", "exo", "mlx-lm"):
        assert not [f for f in inspect_checkpoint(str(plain), runtime=rt)["findings"] if f["severity"] == "error"], rt


def test_vllm_mlx_without_its_marker_reshifts_low_norms(make_hf, make_target):
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    add_mtp(source=str(hf), target=str(tgt), runtime="vllm-mlx", progress=False)
    assert "RUNTIME_RESHIFTS_NORMS" not in _codes(inspect_checkpoint(str(tgt), runtime="vllm-mlx"))
    marker = json.loads((tgt / "mtp" / "manifest.json").read_text())
    (tgt / "mtp" / "manifest.json").unlink()
    head = mx.load(str(tgt / "mtp" / "weights.safetensors"))
    low = [k for k, v in head.items() if "norm" in k and v.ndim == 1 and mx.mean(v.astype(mx.float32)).item() < 0.5]
    got = _codes(inspect_checkpoint(str(tgt), runtime="vllm-mlx")).get("RUNTIME_RESHIFTS_NORMS")
    assert got == ("warning" if low else None)
    assert marker["rmsnorm_weight_format"] == "mlx_gamma"
