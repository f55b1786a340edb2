"""Whole-folder findings beyond the head, each on a real conversion with that one defect, and
none on clean ``mlx_lm.convert`` conversions."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest

from mtpforge.inspect import inspect_checkpoint
from tests.support.synth import VARIANTS, convert_to_mlx

from tests.checkers import codes, edit_json, rewrite

DATA = Path(__file__).resolve().parent.parent / "mtpforge" / "data"
BUNDLED = [d for d in (DATA / "tiny-qwen3_5", DATA / "tiny-qwen3_5_moe") if (d / "config.json").is_file()]
FOLDER_CODES = {"TOKENIZER_MISSING", "TOKENIZER_UNREADABLE", "EOS_PAD_INCONSISTENT", "CHAT_TEMPLATE_MISSING",
                "QUANT_CONFIG_MISMATCH"}


def folder_codes(r: dict) -> dict[str, str]:
    return {c: s for c, s in codes(r).items() if c in FOLDER_CODES}


@pytest.mark.parametrize("model", BUNDLED, ids=[d.name for d in BUNDLED])
@pytest.mark.parametrize("q_bits", [4, 8, None], ids=["4bit", "8bit", "bf16"])
def test_clean_conversions_of_the_bundled_models_have_no_finding(tmp_path, model: Path, q_bits) -> None:
    tgt = convert_to_mlx(model, tmp_path / "mlx", q_bits=q_bits)
    assert folder_codes(inspect_checkpoint(str(tgt), behaviour=False)) == {}
    assert folder_codes(inspect_checkpoint(str(model), behaviour=False)) == {}  # the source itself


@pytest.mark.parametrize("variant", VARIANTS)
def test_clean_synthetic_conversions_have_no_finding(synth, variant: str) -> None:
    assert folder_codes(inspect_checkpoint(str(synth.target(variant)), behaviour=False)) == {}
    assert folder_codes(inspect_checkpoint(str(synth.hf(variant)), behaviour=False)) == {}


def test_backbone_module_quantized_at_other_bits_than_config(make_target) -> None:
    tgt = make_target("qwen3_5")  # 4-bit group 64
    path = "language_model.model.layers.0.mlp.down_proj"

    def requantize(t: dict[str, mx.array]) -> dict[str, mx.array]:
        w = mx.dequantize(t[f"{path}.weight"], t[f"{path}.scales"], t[f"{path}.biases"], group_size=64, bits=4)
        q, s, b = mx.quantize(w, group_size=64, bits=8)
        return {**t, f"{path}.weight": q, f"{path}.scales": s, f"{path}.biases": b}

    shard = next(f for f in sorted(tgt.glob("model*.safetensors")) if f"{path}.scales" in mx.load(str(f)))
    rewrite(shard, requantize)
    r = inspect_checkpoint(str(tgt), behaviour=False)
    f = next(f for f in r["findings"] if f["code"] == "QUANT_CONFIG_MISMATCH")
    assert f["severity"] == "error" and path in f["message"] and "8-bit" in f["message"] and r["exit_code"] == 1


def test_module_stored_quantized_where_the_config_says_not(make_target) -> None:
    tgt = make_target("qwen3_5")
    path = "language_model.model.layers.0.mlp.up_proj"
    edit_json(tgt / "config.json", lambda c: [c[k].update({path: False}) for k in ("quantization", "quantization_config") if k in c])
    assert folder_codes(inspect_checkpoint(str(tgt), behaviour=False)) == {"QUANT_CONFIG_MISMATCH": "error"}


def test_missing_tokenizer(make_target) -> None:
    tgt = make_target("qwen3_5")
    (tgt / "tokenizer.json").unlink()
    assert folder_codes(inspect_checkpoint(str(tgt), behaviour=False)) == {"TOKENIZER_MISSING": "error"}


def test_unreadable_tokenizer(make_target) -> None:
    tgt = make_target("qwen3_5")
    p = tgt / "tokenizer.json"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    assert folder_codes(inspect_checkpoint(str(tgt), behaviour=False)) == {"TOKENIZER_UNREADABLE": "error"}


def test_eos_that_is_not_a_token_is_an_error(make_target) -> None:
    tgt = make_target("qwen3_5")
    edit_json(tgt / "generation_config.json", lambda g: g.update(eos_token_id=[2, 999_999]))
    r = inspect_checkpoint(str(tgt), behaviour=False)
    f = next(f for f in r["findings"] if f["code"] == "EOS_PAD_INCONSISTENT")
    assert f["severity"] == "error" and "999999" in f["message"]


def test_tokenizer_eos_not_among_the_stop_ids_is_a_warning(make_target) -> None:
    tgt = make_target("qwen3_5")
    edit_json(tgt / "tokenizer_config.json", lambda t: t.update(eos_token="<|im_start|>"))
    r = inspect_checkpoint(str(tgt), behaviour=False)
    assert folder_codes(r) == {"EOS_PAD_INCONSISTENT": "warning"} 
    assert any("<|im_start|>" in f["message"] for f in r["findings"] if f["code"] == "EOS_PAD_INCONSISTENT")


def test_pad_disagreement_is_a_warning(make_target) -> None:
    tgt = make_target("qwen3_5")
    edit_json(tgt / "generation_config.json", lambda g: g.update(pad_token_id=1))
    assert folder_codes(inspect_checkpoint(str(tgt), behaviour=False)) == {"EOS_PAD_INCONSISTENT": "warning"}


def test_missing_chat_template(make_target) -> None:
    tgt = make_target("qwen3_5")
    for f in ("chat_template.jinja", "chat_template.json"):
        (tgt / f).unlink(missing_ok=True)
    edit_json(tgt / "tokenizer_config.json", lambda t: t.pop("chat_template", None))
    assert folder_codes(inspect_checkpoint(str(tgt), behaviour=False)) == {"CHAT_TEMPLATE_MISSING": "warning"}
