"""DeepSeek-V3.2 (``deepseek_v32``, llama.cpp ``deepseek32``) heads for llama.cpp, written by
mtpforge and judged by llama.cpp.

The references are llama.cpp's own converter on the tiny DeepSeek-V3.2 checkpoint, in bf16 and
as DeepSeek releases it (the NextN layer's projections FP8 e4m3 with 128x128
``weight_scale_inv``): ``--no-mtp`` for the trunk users have, ``--mtp`` for the MTP-only file,
neither for the full file. add-mtp from the trunk and the source's head bytes writes the same
tensors (MLA's ``kv_b_proj`` split, the DSA indexer's tensors llama.cpp requires in the block)
and metadata, ``llama-server`` drafts with it exactly as with the converter's file and decodes as
without it, only the head's bytes come over the (loopback) Hub, and inspect tells a head-less
trunk from a complete one.
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
PRE = "deepseek-v3"  # the converter's pre-tokenizer for DeepSeek-V3's vocabulary, declared
N = 2  # the tiny model's num_hidden_layers: the NextN layer is blk.2
#: tensors in the converter's NextN block: GLM-4.7-Flash's 24 and the indexer's 5 (measured,
#: docs/families/deepseek_v32.md)
BLOCK = 29
INDEXER = ("indexer.attn_q_b.weight", "indexer.attn_k.weight", "indexer.k_norm.weight", "indexer.k_norm.bias",
           "indexer.proj.weight")
VARIANTS = ("bf16", "fp8")


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.support.synth.deepseek_v32 import build_deepseek_v32, build_deepseek_v32_fp8

    base = tmp_path_factory.mktemp("deepseek_v32_gguf")
    return {"bf16": build_deepseek_v32(base / "tiny-deepseek_v32"),
            "fp8": build_deepseek_v32_fp8(base / "tiny-deepseek_v32-fp8")}


@pytest.fixture
def src(sources: dict[str, Path], variant: str) -> Path:
    return sources[variant]


def _trunk(src: Path, dst: Path, qtype: str = "f32") -> Path:
    return gguf_env.trunk_copy(src, dst, qtype, pre=PRE)


def test_the_mtp_file_equals_the_converters_mtp_export_at_f32(src: Path, variant: str, tmp_path: Path) -> None:
    """Everything ``--mtp`` writes (tensors, values, metadata, the file name), from the
    ``--no-mtp`` trunk and the head's bytes (FP8 dequantized as the converter does); the trunk
    is only read."""
    r, ref = judged.equals_mtp_export(src, _trunk(src, tmp_path), PRE)
    assert Path(r["output"]).name.startswith("mtp-Tiny-Deepseek_V32") and r["output"].endswith("-F32.gguf")
    assert r["family"] == "deepseek_v32" and r["architecture"] == "deepseek32"
    assert {f"blk.{N}.{t}" for t in INDEXER} <= set(ref.tensors) and r["mtp_tensors"] == BLOCK
    assert not any("kv_b" in k for k in ref.tensors)
    assert ref.get("{arch}.nextn_predict_layers") == 1 and ref.get("{arch}.attention.indexer.key_length") == 64
    assert json.loads(Path(r["manifest"]).read_text())["norm_convention"] == "raw"


@pytest.mark.parametrize("precision", ["f16", "bf16", "q8_0"])
def test_the_mtp_block_equals_the_converters_bit_for_bit(src: Path, precision: str, tmp_path: Path) -> None:
    """At f16 / bf16 / q8_0 the MTP block (the split k_b / v_b and the indexer included; the
    indexer's head weights F32 as the converter keeps them) is the converter's byte for byte;
    token_embd / output_norm / output are the user's trunk's own bytes."""
    judged.block_equals_converters(src, _trunk(src, tmp_path), PRE, precision, N, BLOCK)


class TestConverterJudged(judged.ConverterJudged):
    """The tail, llama-server's drafting on f32 / Q8_0 / Q4_K_M trunks, the hub's bytes."""

    pre = PRE


def test_inspect_finds_the_missing_head_then_a_clean_one_with_raw_norms(src: Path, tmp_path: Path) -> None:
    trunk = _trunk(src, tmp_path)
    code, rep = judged.inspect_json(trunk)
    (f,) = rep["findings"]
    assert rep["family"] == "deepseek_v32" and f["code"] == "MTP_HEAD_MISSING" and str(trunk) in f["fix"]
    assert f["fix"].startswith("mtpforge add-mtp --source <original Hugging Face repo, e.g. deepseek-ai/DeepSeek-V3.2>")
    judged.add_mtp(trunk, src)
    code, rep = judged.inspect_json(trunk, "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-mtp" and rep["norm_convention"] == "raw"
    assert rep["mtp_tensors"] == BLOCK and rep["expert_format"] == "stacked"
    code, rep = judged.inspect_json(official(src, "full", "f32", pre=PRE), "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-tail"


def test_a_block_without_its_indexer_is_found(src: Path, tmp_path: Path) -> None:
    """inspect's expected block holds the indexer: an MTP block without ``indexer.attn_k``
    (which llama.cpp needs to load it) is incomplete."""
    from tests.test_gguf import _rewrite

    bad = _rewrite(official(src, "full", "f32", pre=PRE), tmp_path / "no-indexer.gguf",
                   drop=(f"blk.{N}.indexer.attn_k.weight",))
    code, rep = judged.inspect_json(bad)
    assert code == 1 and "MTP_MISSING_TENSORS" in {f["code"] for f in rep["findings"]}


def test_inspect_finds_the_norms_shifted_as_if_they_were_qwens(src: Path, tmp_path: Path) -> None:
    """Every head norm is raw, the indexer's key LayerNorm included: a head whose norms got
    Qwen's +1 is found against the source."""
    from tests.test_gguf import _rewrite

    full = official(src, "full", "f32", pre=PRE)
    bad = _rewrite(full, tmp_path / "shifted.gguf",
                   edit=lambda k, a: a + 1 if block_of(k) == N and k.endswith("norm.weight") else None)
    code, rep = judged.inspect_json(bad, "--source", str(src))
    assert code == 1 and {f["code"] for f in rep["findings"]} == {"MTP_NORMS_SHIFTED"}


def test_a_trunk_of_another_indexer_width_is_refused_before_anything_is_fetched(src: Path, tmp_path: Path) -> None:
    """The indexer's head width is part of the compatibility check: a trunk whose
    ``indexer.key_length`` differs is refused in one line, nothing written."""
    from tests.test_gguf import _rewrite

    (tmp_path / "other").mkdir()
    trunk = _rewrite(_trunk(src, tmp_path / "t"), tmp_path / "other" / "trunk.gguf",
                     kv={"deepseek32.attention.indexer.key_length": 128})
    r = mtpforge("add-mtp", "--source", str(src), "--target", str(trunk))
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 1 and len(lines) == 1 and "128 vs 64" in lines[0], r.stderr
    assert sorted(p.name for p in trunk.parent.iterdir()) == [trunk.name]
