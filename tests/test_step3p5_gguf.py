"""Step-3.5 (``step3p5``, llama.cpp ``step35``) heads for llama.cpp, written by mtpforge and judged
by llama.cpp.

The references are llama.cpp's own converter on the tiny Step-3.5 checkpoint (``--no-mtp`` for the
trunk users have, ``--mtp`` for the MTP-only file, neither for the full file; the config read as
stored, docs/families/step3p5.md §2): add-mtp from the trunk and the source's head bytes writes
the same tensors — the appended layer ``model.layers.2`` as ``blk.2``, every norm +1, the
head-wise gate ``attn_gate`` — and the same metadata (``head_count``, ``head_count_kv``,
``sliding_window_pattern`` and both SwiGLU clamp arrays extended by the MTP layer's entry);
``llama-server`` drafts with the result and decodes exactly as without it, only the head's bytes
come over the (loopback) Hub, and inspect tells a head-less trunk from a complete one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpforge.gguf.names import block_of
from tests import gguf_env
from tests import gguf_judged as judged
from tests.gguf_env import mtpforge, official

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP)
PRE = "qwen35"  # the converter's pre-tokenizer for the synthetic byte-level vocabulary
N = 2  # the tiny model's trunk layers: the MTP layer is blk.2
#: tensors in the converter's MTP block (measured, docs/families/step3p5.md)
BLOCK = 17
#: the converter's MTP-only file: the block plus token_embd, output_norm, output
MTP_FILE = 20
EXAMPLE = "stepfun-ai/Step-3.5-Flash"


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.synth.step3p5 import build_step3p5

    return build_step3p5(tmp_path_factory.mktemp("step3p5_gguf") / "tiny-step3p5")


def _trunk(src: Path, dst: Path, qtype: str = "f32") -> Path:
    return gguf_env.trunk_copy(src, dst, qtype, pre=PRE)


def test_the_mtp_file_equals_the_converters_mtp_export_at_f32(src: Path, tmp_path: Path) -> None:
    """Everything ``--mtp`` writes (tensors, values, metadata with its per-layer arrays, the
    file name), from the ``--no-mtp`` trunk and the head's bytes; the trunk is only read."""
    r, ref = judged.equals_mtp_export(src, _trunk(src, tmp_path), PRE)
    assert Path(r["output"]).name == "mtp-Tiny-Step3P5-F32.gguf"
    assert r["family"] == "step3p5" and r["architecture"] == "step35"
    assert len(ref.tensors) == MTP_FILE and r["mtp_tensors"] == BLOCK
    assert ref.get("{arch}.attention.head_count") == [2, 4, 4]
    assert ref.get("{arch}.attention.head_count_kv") == [1, 2, 2]
    assert ref.get("{arch}.attention.sliding_window_pattern") == [False, True, True]
    assert ref.get("{arch}.swiglu_clamp_exp") == [0.0, 7.0, 0.0]
    assert json.loads(Path(r["manifest"]).read_text())["norm_convention"] == "shifted"


@pytest.mark.parametrize("precision", ["f16", "bf16", "q8_0"])
def test_the_mtp_block_equals_the_converters_bit_for_bit(src: Path, precision: str, tmp_path: Path) -> None:
    """At f16 / bf16 / q8_0 the MTP block (+1 norms, the gate, the dense MLP) is the converter's
    byte for byte; token_embd / output_norm / output are the user's trunk's."""
    judged.block_equals_converters(src, _trunk(src, tmp_path), PRE, precision, N, BLOCK)


def test_the_tail_equals_the_converters_full_file(src: Path, tmp_path: Path) -> None:
    judged.tail_equals_full(src, _trunk(src, tmp_path), PRE, tmp_path / "with-tail.gguf")


@pytest.mark.parametrize("qtype", ["f32", "Q8_0", "Q4_K_M"])
def test_llama_server_drafts_with_mtpforges_file_exactly_as_plain_and_as_with_the_official_one(src: Path, qtype: str,
                                                                                              tmp_path: Path) -> None:
    """On the f32, Q8_0 and Q4_K_M trunks: plain output, and the official file's counts."""
    judged.drafts_as_official(src, _trunk(src, tmp_path, qtype), PRE, tmp_path)


def test_only_the_heads_bytes_come_from_the_hub(src: Path, hub, tmp_path: Path) -> None:
    judged.fetches_only_the_head(hub, src, lambda d: _trunk(src, d), tmp_path)


def test_inspect_finds_the_missing_head_then_a_clean_one_with_shifted_norms(src: Path, tmp_path: Path) -> None:
    trunk = _trunk(src, tmp_path)
    code, rep = judged.inspect_json(trunk)
    (f,) = rep["findings"]
    assert rep["family"] == "step3p5" and f["code"] == "MTP_HEAD_MISSING" and str(trunk) in f["fix"]
    assert f["fix"].startswith(f"mtpforge add-mtp --source <original Hugging Face repo, e.g. {EXAMPLE}>")
    judged.add_mtp(trunk, src)
    code, rep = judged.inspect_json(trunk, "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-mtp" and rep["norm_convention"] == "shifted"
    assert rep["mtp_tensors"] == BLOCK
    code, rep = judged.inspect_json(official(src, "full", "f32", pre=PRE), "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-tail"


def test_inspect_finds_raw_norms(src: Path, tmp_path: Path) -> None:
    """All seven head norms are written +1: a head whose norms were copied raw is found."""
    from tests.test_gguf import _rewrite

    full = official(src, "full", "f32", pre=PRE)
    bad = _rewrite(full, tmp_path / "raw.gguf",
                   edit=lambda k, a: a - 1 if block_of(k) == N and k.endswith("norm.weight") else None)
    code, rep = judged.inspect_json(bad, "--source", str(src))
    assert code == 1 and "MTP_NORMS_RAW" in {f["code"] for f in rep["findings"]}, rep["findings"]


def test_a_source_declaring_three_mtp_layers_is_refused(src: Path, tmp_path: Path) -> None:
    """The release declares three appended layers; mtpforge writes one (GLM's appended-layer
    prefix): a source declaring more is refused in one line, nothing written."""
    import shutil

    from tests.support.synth.step3p5 import build_step3p5

    three = build_step3p5(tmp_path / "three", num_nextn_predict_layers=3)
    trunk = _trunk(src, tmp_path / "t")
    r = mtpforge("add-mtp", "--source", str(three), "--target", str(trunk))
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 1 and len(lines) == 1 and "3 MTP layers" in lines[0], r.stderr
    assert sorted(p.name for p in trunk.parent.iterdir()) == [trunk.name]
    shutil.rmtree(three)
