"""Nemotron-H (``nemotron_h``, llama.cpp ``nemotron_h_moe``) heads for llama.cpp, written by mtpforge
and judged by llama.cpp.

The references are llama.cpp's own converter on the tiny Nemotron-H checkpoint, plain and with
Nemotron 3 Super's latent MoE (``--no-mtp`` for the trunk users have, ``--mtp`` for the MTP-only
file, neither for the full file): add-mtp from the trunk and the source's head bytes writes the
same tensors — the two source blocks ``mtp.layers.0`` / ``.1`` folded into one ``blk.4``, the
query/key rows permuted as the converter permutes them — and the same metadata (the per-layer
``feed_forward_length`` and ``attention.head_count_kv`` extended by the block's entry);
``llama-server`` drafts with the result and decodes exactly as without it, only the head's bytes
come over the (loopback) Hub, and inspect tells a head-less trunk from a complete one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpforge.gguf.gguffile import read_local
from mtpforge.gguf.names import block_of
from tests import gguf_env
from tests import gguf_judged as judged
from tests.gguf_env import mtpforge, official

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP)
PRE = "qwen35"  # the converter's pre-tokenizer for the synthetic byte-level vocabulary
N = 4  # the tiny model's trunk layers (ME*E): the folded MTP block is blk.4
#: tensors in the converter's MTP block (measured, docs/families/nemotron_h.md): 16, and the two
#: latent projections with a latent MoE
BLOCK = {"plain": 16, "latent": 18}
#: the converter's MTP-only file: the block plus token_embd, output_norm, output
MTP_FILE = {"plain": 19, "latent": 21}
VARIANTS = {"plain": {}, "latent": {"moe_latent_size": 64}}
EXAMPLE = "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16"


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.support.synth.nemotron_h import build_nemotron_h

    base = tmp_path_factory.mktemp("nemotron_h_gguf")
    return {v: build_nemotron_h(base / ("tiny-nemotron_h" + ("" if v == "plain" else f"-{v}")), **kw)
            for v, kw in VARIANTS.items()}


@pytest.fixture
def src(sources: dict[str, Path], variant: str) -> Path:
    return sources[variant]


def _trunk(src: Path, dst: Path, qtype: str = "f32") -> Path:
    return gguf_env.trunk_copy(src, dst, qtype, pre=PRE)


def test_the_mtp_file_equals_the_converters_mtp_export_at_f32(src: Path, variant: str, tmp_path: Path) -> None:
    """Everything ``--mtp`` writes (tensors, values, metadata with its per-layer arrays, the
    file name), from the ``--no-mtp`` trunk and the head's bytes; the trunk is only read."""
    r, ref = judged.equals_mtp_export(src, _trunk(src, tmp_path), PRE)
    stem = "Tiny-Nemotron_H" + ("-Latent" if variant == "latent" else "")
    assert Path(r["output"]).name == f"mtp-{stem}-F32.gguf"
    assert r["family"] == "nemotron_h" and r["architecture"] == "nemotron_h_moe"
    assert len(ref.tensors) == MTP_FILE[variant] and r["mtp_tensors"] == BLOCK[variant]
    assert ref.get("{arch}.feed_forward_length") == [0, 64, 0, 64, 64]
    assert ref.get("{arch}.attention.head_count_kv") == [0, 0, 1, 0, 1]
    assert ({f"blk.{N}.ffn_latent_down.weight", f"blk.{N}.ffn_latent_up.weight"} <= set(ref.tensors)) == (variant == "latent")
    assert json.loads(Path(r["manifest"]).read_text())["norm_convention"] == "raw"


@pytest.mark.parametrize("precision", ["f16", "bf16", "q8_0"])
def test_the_mtp_block_equals_the_converters_bit_for_bit(src: Path, variant: str, precision: str, tmp_path: Path) -> None:
    """At f16 / bf16 / q8_0 the MTP block (permuted q/k, stacked experts, latent projections)
    is the converter's byte for byte; token_embd / output_norm / output are the user's trunk's."""
    judged.block_equals_converters(src, _trunk(src, tmp_path), PRE, precision, N, BLOCK[variant])


class TestConverterJudged(judged.ConverterJudged):
    """The tail, llama-server's drafting on f32 / Q8_0 / Q4_K_M trunks, the hub's bytes."""

    pre = PRE


def test_inspect_finds_the_missing_head_then_a_clean_one_with_raw_norms(src: Path, variant: str, tmp_path: Path) -> None:
    trunk = _trunk(src, tmp_path)
    code, rep = judged.inspect_json(trunk)
    (f,) = rep["findings"]
    assert rep["family"] == "nemotron_h" and f["code"] == "MTP_HEAD_MISSING" and str(trunk) in f["fix"]
    assert f["fix"].startswith(f"mtpforge add-mtp --source <original Hugging Face repo, e.g. {EXAMPLE}>")
    judged.add_mtp(trunk, src)
    code, rep = judged.inspect_json(trunk, "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-mtp" and rep["norm_convention"] == "raw"
    assert rep["mtp_tensors"] == BLOCK[variant] and rep["expert_format"] == "stacked"
    code, rep = judged.inspect_json(official(src, "full", "f32", pre=PRE), "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-tail"


def test_inspect_finds_the_norms_shifted_as_if_they_were_qwens(src: Path, tmp_path: Path) -> None:
    """All five head norms are raw (the folded block's attn_norm and post_attention_norm, the
    NextN ones and the final LayerNorm): a head whose norms got Qwen's +1 is found."""
    from tests.test_gguf import _rewrite

    full = official(src, "full", "f32", pre=PRE)
    bad = _rewrite(full, tmp_path / "shifted.gguf",
                   edit=lambda k, a: a + 1 if block_of(k) == N and k.endswith("norm.weight") else None)
    code, rep = judged.inspect_json(bad, "--source", str(src))
    assert code == 1 and {f["code"] for f in rep["findings"]} == {"MTP_NORMS_SHIFTED"}


def test_a_block_without_its_latent_projection_is_found(sources: dict[str, Path], tmp_path: Path) -> None:
    """inspect's expected block knows the latent MoE from the GGUF's ``moe_latent_size``: a
    latent block without ``ffn_latent_down`` is incomplete."""
    from tests.test_gguf import _rewrite

    full = official(sources["latent"], "full", "f32", pre=PRE)
    bad = _rewrite(full, tmp_path / "no-latent.gguf", drop=(f"blk.{N}.ffn_latent_down.weight",))
    code, rep = judged.inspect_json(bad)
    assert code == 1 and "MTP_MISSING_TENSORS" in {f["code"] for f in rep["findings"]}


def test_a_trunk_of_another_latent_size_is_refused_before_anything_is_fetched(sources: dict[str, Path],
                                                                             tmp_path: Path) -> None:
    """The hybrid trunk states its KV heads per layer (0 on Mamba and MoE layers): the check
    reads the attention layers' value, and a trunk whose ``moe_latent_size`` differs is refused
    in one line, nothing written."""
    from tests.test_gguf import _rewrite

    src = sources["latent"]
    (tmp_path / "other").mkdir()
    trunk = _rewrite(_trunk(src, tmp_path / "t"), tmp_path / "other" / "trunk.gguf",
                     kv={"nemotron_h_moe.moe_latent_size": 32})
    r = mtpforge("add-mtp", "--source", str(src), "--target", str(trunk))
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 1 and len(lines) == 1 and "latent size (32 vs 64)" in lines[0], r.stderr
    assert sorted(p.name for p in trunk.parent.iterdir()) == [trunk.name]
    assert read_local(_trunk(src, tmp_path / "t2")).get("{arch}.attention.head_count_kv") == [0, 0, 1, 0]


def test_a_source_declaring_two_mtp_steps_is_refused(sources: dict[str, Path], tmp_path: Path) -> None:
    """The two source layers are one MTP step (llama.cpp's converter asserts
    ``num_nextn_predict_layers == 1``): a config declaring two steps is refused in one line,
    not written as two blocks of the same tensors."""
    import shutil

    src = shutil.copytree(sources["plain"], tmp_path / "two-steps")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": 2}))
    trunk = _trunk(sources["plain"], tmp_path / "t")
    r = mtpforge("add-mtp", "--source", str(src), "--target", str(trunk))
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 1 and len(lines) == 1 and "one MTP step" in lines[0], r.stderr
    assert sorted(p.name for p in trunk.parent.iterdir()) == [trunk.name]
