"""The DSA families' heads for llama.cpp — DeepSeek-V3.2 (``deepseek_v32``, llama.cpp
``deepseek32``) and GLM-5 (``glm_moe_dsa``, ``glm-dsa``) — written by mtpforge and judged by
llama.cpp.

The references are llama.cpp's own converter on each family's tiny checkpoint, in bf16 and as the
releases store it (the NextN layer's projections FP8 e4m3 with 128x128 ``weight_scale_inv``):
``--no-mtp`` for the trunk users have, ``--mtp`` for the MTP-only file, neither for the full file.
add-mtp from the trunk and the source's head bytes writes the same tensors (MLA's ``kv_b_proj``
split, the DSA indexer's tensors llama.cpp requires in the block) and metadata, ``llama-server``
drafts with it exactly as with the converter's file and decodes as without it, only the head's
bytes come over the (loopback) Hub, and inspect tells a head-less trunk from a complete one.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from mtpforge.gguf.names import block_of
from tests import gguf_env
from tests import gguf_judged as judged
from tests.gguf_env import mtpforge, official

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
N = 2  # the tiny models' num_hidden_layers: the NextN layer is blk.2
#: tensors in the converter's NextN block: GLM-4.7-Flash's 24 and the indexer's 5 (measured,
#: docs/families/deepseek_v32.md)
BLOCK = 29
INDEXER = ("indexer.attn_q_b.weight", "indexer.attn_k.weight", "indexer.k_norm.weight", "indexer.k_norm.bias",
           "indexer.proj.weight")
VARIANTS = ("bf16", "fp8")


@dataclass(frozen=True)
class Dsa:
    """What differs between the two families' tiny checkpoints and files."""

    family: str
    arch: str
    pre: str  # the converter's pre-tokenizer for the tiny vocabulary
    stem: str  # the MTP-only file's name after ``mtp-``
    repo: str  # the release a fix names


FAMILIES = {
    "deepseek_v32": Dsa("deepseek_v32", "deepseek32", "deepseek-v3", "Tiny-Deepseek_V32", "deepseek-ai/DeepSeek-V3.2"),
    "glm_moe_dsa": Dsa("glm_moe_dsa", "glm-dsa", "glm4", "Tiny-Glm_Moe_Dsa", "zai-org/GLM-5"),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def fam(request: pytest.FixtureRequest) -> Dsa:
    return FAMILIES[request.param]


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def sources(fam: Dsa, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    synth = importlib.import_module(f"tests.support.synth.{fam.family}")
    base = tmp_path_factory.mktemp(f"{fam.family}_gguf")
    build, build_fp8 = getattr(synth, f"build_{fam.family}"), getattr(synth, f"build_{fam.family}_fp8")
    return {"bf16": build(base / f"tiny-{fam.family}"), "fp8": build_fp8(base / f"tiny-{fam.family}-fp8")}


@pytest.fixture
def src(sources: dict[str, Path], variant: str) -> Path:
    return sources[variant]


def _trunk(fam: Dsa, src: Path, dst: Path, qtype: str = "f32") -> Path:
    return gguf_env.trunk_copy(src, dst, qtype, pre=fam.pre)


def test_the_mtp_file_equals_the_converters_mtp_export_at_f32(fam: Dsa, src: Path, variant: str, tmp_path: Path) -> None:
    """Everything ``--mtp`` writes (tensors, values, metadata, the file name), from the
    ``--no-mtp`` trunk and the head's bytes (FP8 dequantized as the converter does); the trunk
    is only read."""
    r, ref = judged.equals_mtp_export(src, _trunk(fam, src, tmp_path), fam.pre)
    assert Path(r["output"]).name.startswith(f"mtp-{fam.stem}") and r["output"].endswith("-F32.gguf")
    assert r["family"] == fam.family and r["architecture"] == fam.arch
    assert {f"blk.{N}.{t}" for t in INDEXER} <= set(ref.tensors) and r["mtp_tensors"] == BLOCK
    assert not any("kv_b" in k for k in ref.tensors)
    assert ref.get("{arch}.nextn_predict_layers") == 1 and ref.get("{arch}.attention.indexer.key_length") == 64
    assert json.loads(Path(r["manifest"]).read_text())["norm_convention"] == "raw"


@pytest.mark.parametrize("precision", ["f16", "bf16", "q8_0"])
def test_the_mtp_block_equals_the_converters_bit_for_bit(fam: Dsa, src: Path, precision: str, tmp_path: Path) -> None:
    """At f16 / bf16 / q8_0 the MTP block (the split k_b / v_b and the indexer included; the
    indexer's head weights F32 as the converter keeps them) is the converter's byte for byte;
    token_embd / output_norm / output are the user's trunk's own bytes."""
    judged.block_equals_converters(src, _trunk(fam, src, tmp_path), fam.pre, precision, N, BLOCK)


class TestConverterJudged(judged.ConverterJudged):
    """The tail, llama-server's drafting on f32 / Q8_0 / Q4_K_M trunks, the hub's bytes."""

    @pytest.fixture(autouse=True)
    def _pre(self, fam: Dsa) -> None:
        self.pre = fam.pre


def test_inspect_finds_the_missing_head_then_a_clean_one_with_raw_norms(fam: Dsa, src: Path, tmp_path: Path) -> None:
    trunk = _trunk(fam, src, tmp_path)
    code, rep = judged.inspect_json(trunk)
    (f,) = rep["findings"]
    assert rep["family"] == fam.family and f["code"] == "MTP_HEAD_MISSING" and str(trunk) in f["fix"]
    assert f["fix"].startswith(f"mtpforge add-mtp --source <original Hugging Face repo, e.g. {fam.repo}>")
    judged.add_mtp(trunk, src)
    code, rep = judged.inspect_json(trunk, "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-mtp" and rep["norm_convention"] == "raw"
    assert rep["mtp_tensors"] == BLOCK and rep["expert_format"] == "stacked"
    code, rep = judged.inspect_json(official(src, "full", "f32", pre=fam.pre), "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-tail"


def test_a_block_without_its_indexer_is_found(fam: Dsa, src: Path, tmp_path: Path) -> None:
    """inspect's expected block holds the indexer: an MTP block without ``indexer.attn_k``
    (which llama.cpp needs to load it) is incomplete."""
    from tests.test_gguf import _rewrite

    bad = _rewrite(official(src, "full", "f32", pre=fam.pre), tmp_path / "no-indexer.gguf",
                   drop=(f"blk.{N}.indexer.attn_k.weight",))
    code, rep = judged.inspect_json(bad)
    assert code == 1 and "MTP_MISSING_TENSORS" in {f["code"] for f in rep["findings"]}


def test_inspect_finds_the_norms_shifted_as_if_they_were_qwens(fam: Dsa, src: Path, tmp_path: Path) -> None:
    """Every head norm is raw, the indexer's key LayerNorm included: a head whose norms got
    Qwen's +1 is found against the source."""
    from tests.test_gguf import _rewrite

    full = official(src, "full", "f32", pre=fam.pre)
    bad = _rewrite(full, tmp_path / "shifted.gguf",
                   edit=lambda k, a: a + 1 if block_of(k) == N and k.endswith("norm.weight") else None)
    code, rep = judged.inspect_json(bad, "--source", str(src))
    assert code == 1 and {f["code"] for f in rep["findings"]} == {"MTP_NORMS_SHIFTED"}


def test_a_trunk_of_another_indexer_width_is_refused_before_anything_is_fetched(fam: Dsa, src: Path, tmp_path: Path) -> None:
    """The indexer's head width is part of the compatibility check: a trunk whose
    ``indexer.key_length`` differs is refused in one line, nothing written."""
    from tests.test_gguf import _rewrite

    (tmp_path / "other").mkdir()
    trunk = _rewrite(_trunk(fam, src, tmp_path / "t"), tmp_path / "other" / "trunk.gguf",
                     kv={f"{fam.arch}.attention.indexer.key_length": 128})
    r = mtpforge("add-mtp", "--source", str(src), "--target", str(trunk))
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 1 and len(lines) == 1 and "128 vs 64" in lines[0], r.stderr
    assert sorted(p.name for p in trunk.parent.iterdir()) == [trunk.name]
