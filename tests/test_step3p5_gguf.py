"""Step-3.5 (``step3p5``, llama.cpp ``step35``) heads for llama.cpp, written by mtpforge and judged
by llama.cpp.

The references are llama.cpp's own converter on the tiny Step-3.5 checkpoint (``--no-mtp`` for the
trunk users have, ``--mtp`` for the MTP-only file, neither for the full file; the config read as
stored, docs/families/step3p5.md §2): add-mtp from the trunk and the source's head bytes writes
the same tensors — each appended layer ``model.layers.{2+j}`` as ``blk.{2+j}`` (one layer, and
three as the release declares), every norm +1, the head-wise gate ``attn_gate`` — and the same
metadata (``head_count``, ``head_count_kv``,
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
from tests.gguf_env import official

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
PRE = "qwen35"  # the converter's pre-tokenizer for the synthetic byte-level vocabulary
N = 2  # the tiny model's trunk layers: MTP step j is blk.{2 + j}
#: tensors in each of the converter's MTP blocks (measured, docs/families/step3p5.md)
BLOCK = 17
#: MTP steps: one (the tiny default), three (as the release declares)
VARIANTS = {"k1": 1, "k3": 3}
EXAMPLE = "stepfun-ai/Step-3.5-Flash"


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.support.synth.step3p5 import build_step3p5

    base = tmp_path_factory.mktemp("step3p5_gguf")
    return {v: build_step3p5(base / f"tiny-step3p5-{v}", num_nextn_predict_layers=k) for v, k in VARIANTS.items()}


@pytest.fixture
def src(sources: dict[str, Path], variant: str) -> Path:
    return sources[variant]


def _trunk(src: Path, dst: Path, qtype: str = "f32") -> Path:
    return gguf_env.trunk_copy(src, dst, qtype, pre=PRE)


def test_the_mtp_file_equals_the_converters_mtp_export_at_f32(src: Path, variant: str, tmp_path: Path) -> None:
    """Everything ``--mtp`` writes (tensors, values, metadata with its per-layer arrays, the
    file name), from the ``--no-mtp`` trunk and the head's bytes; the trunk is only read."""
    k = VARIANTS[variant]
    r, ref = judged.equals_mtp_export(src, _trunk(src, tmp_path), PRE)
    assert Path(r["output"]).name == f"mtp-Tiny-Step3P5-{variant.upper()}-F32.gguf"
    assert r["family"] == "step3p5" and r["architecture"] == "step35"
    assert len(ref.tensors) == 3 + BLOCK * k and r["mtp_tensors"] == BLOCK * k
    assert ref.get("{arch}.nextn_predict_layers") == k and ref.get("{arch}.block_count") == N + k
    assert ref.get("{arch}.attention.head_count") == [2, 4] + [4] * k
    assert ref.get("{arch}.attention.head_count_kv") == [1, 2] + [2] * k
    assert ref.get("{arch}.attention.sliding_window_pattern") == [False, True] + [True] * k
    assert ref.get("{arch}.swiglu_clamp_exp") == [0.0, 7.0] + [0.0] * k
    assert json.loads(Path(r["manifest"]).read_text())["norm_convention"] == "shifted"


@pytest.mark.parametrize("precision", ["f16", "bf16", "q8_0"])
def test_the_mtp_blocks_equal_the_converters_bit_for_bit(src: Path, variant: str, precision: str, tmp_path: Path) -> None:
    """At f16 / bf16 / q8_0 every MTP block (+1 norms, the gate, the dense MLP) is the
    converter's byte for byte; token_embd / output_norm / output are the user's trunk's."""
    trunk = _trunk(src, tmp_path)
    for j in range(VARIANTS[variant]):
        judged.block_equals_converters(src, trunk, PRE, precision, N + j, BLOCK)


class TestConverterJudged(judged.ConverterJudged):
    """The tail, llama-server's drafting on f32 / Q8_0 / Q4_K_M trunks, the hub's bytes."""

    pre = PRE


def test_inspect_finds_the_missing_head_then_a_clean_one_with_shifted_norms(src: Path, variant: str,
                                                                          tmp_path: Path) -> None:
    trunk = _trunk(src, tmp_path)
    code, rep = judged.inspect_json(trunk)
    (f,) = rep["findings"]
    assert rep["family"] == "step3p5" and f["code"] == "MTP_HEAD_MISSING" and str(trunk) in f["fix"]
    assert f["fix"].startswith(f"mtpforge add-mtp --source <original Hugging Face repo, e.g. {EXAMPLE}>")
    judged.add_mtp(trunk, src)
    code, rep = judged.inspect_json(trunk, "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-mtp" and rep["norm_convention"] == "shifted"
    # inspect checks every MTP block (blk.2 ... blk.{1 + k}) and counts all their tensors, as add-mtp does
    assert rep["mtp_tensors"] == BLOCK * VARIANTS[variant]
    code, rep = judged.inspect_json(official(src, "full", "f32", pre=PRE), "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-tail"


def test_inspect_finds_raw_norms(src: Path, tmp_path: Path) -> None:
    """All seven norms of every MTP block are written +1: a head whose norms were copied raw is found."""
    from tests.test_gguf import _rewrite

    full = official(src, "full", "f32", pre=PRE)
    bad = _rewrite(full, tmp_path / "raw.gguf",
                   edit=lambda k, a: a - 1 if (block_of(k) or 0) >= N and k.endswith("norm.weight") else None)
    code, rep = judged.inspect_json(bad, "--source", str(src))
    assert code == 1 and "MTP_NORMS_RAW" in {f["code"] for f in rep["findings"]}, rep["findings"]


def test_inspect_checks_every_mtp_block_not_only_the_first(sources: dict[str, Path], tmp_path: Path) -> None:
    """Three MTP steps: a tensor missing from the last block, or the last block's norms copied
    raw while the first block's are right, is found (each step drafts through its own block)."""
    from tests.test_gguf import _rewrite

    src = sources["k3"]
    full = official(src, "full", "f32", pre=PRE)
    last = N + VARIANTS["k3"] - 1
    gone = _rewrite(full, tmp_path / "gone.gguf", drop=(f"blk.{last}.attn_gate.weight",))
    code, rep = judged.inspect_json(gone)
    missing = [f for f in rep["findings"] if f["code"] == "MTP_MISSING_TENSORS"]
    assert code == 1 and len(missing) == 1 and f"blk.{last} lacks attn_gate.weight" in missing[0]["message"], rep
    raw = _rewrite(full, tmp_path / "raw-last.gguf",
                   edit=lambda k, a: a - 1 if block_of(k) == last and k.endswith("norm.weight") else None)
    code, rep = judged.inspect_json(raw, "--source", str(src))
    assert code == 1 and rep["norm_convention"] == "mixed", rep
    (f,) = [f for f in rep["findings"] if f["code"] == "MTP_NORMS_MIXED"]
    assert f"blk.{last}." in f["message"] and f"blk.{N}." not in f["message"], f
