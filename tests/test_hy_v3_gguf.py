"""Hy3 (``hy_v3``, llama.cpp ``hy_v3``) heads for llama.cpp, written by mtpforge and judged by
llama.cpp.

The references are llama.cpp's own converter (``HYV3Model``) on the tiny Hy3 checkpoint
(tests/support/synth/hy_v3.py, the release's own names): ``--no-mtp`` for the trunk users have,
``--mtp`` for the MTP-only file, neither for the full file. add-mtp from the trunk and the source's
head bytes writes the same tensors — the appended layer ``model.layers.2`` as ``blk.2`` with its
per-expert experts stacked, ``final_layernorm`` as ``nextn.shared_head_norm``, the router's
suffix-less ``exp_probs_b``, raw norms — and the same metadata; ``llama-server`` drafts with the
result exactly as with the converter's file and decodes as without it, only the head's bytes come
over the (loopback) Hub, and inspect, verify and remove-mtp speak of the family's head.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpforge.gguf.names import block_of
from tests import gguf_env
from tests import gguf_judged as judged
from tests.gguf_env import mtpforge, official

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
PRE = "qwen35"  # the converter's pre-tokenizer for the synthetic byte-level vocabulary
N = 2  # the tiny model's trunk layers: the MTP layer is blk.2
#: tensors in the converter's MTP block: 4 NextN, 8 attention, 5 router/shared, 3 expert stacks
BLOCK = 20
EXAMPLE = "tencent/Hy3"


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.synth.hy_v3 import build_hy_v3

    return build_hy_v3(tmp_path_factory.mktemp("hy_v3_gguf") / "tiny-hy_v3")


def _trunk(src: Path, dst: Path, qtype: str = "f32") -> Path:
    return gguf_env.trunk_copy(src, dst, qtype, pre=PRE)


def test_the_mtp_file_equals_the_converters_mtp_export_at_f32(src: Path, tmp_path: Path) -> None:
    """Everything ``--mtp`` writes (tensors, values, metadata, the file name), from the
    ``--no-mtp`` trunk and the head's bytes; the trunk is only read."""
    r, ref = judged.equals_mtp_export(src, _trunk(src, tmp_path), PRE)
    assert Path(r["output"]).name == "mtp-Tiny-Hy_V3-F32.gguf"
    assert r["family"] == "hy_v3" and r["architecture"] == "hy_v3" and r["expert_format"] == "per-expert"
    block = {k.split(".", 2)[2] for k in ref.tensors if block_of(k) == N}
    assert len(block) == BLOCK == r["mtp_tensors"] and len(ref.tensors) == 3 + BLOCK
    assert {"exp_probs_b", "nextn.shared_head_norm.weight", "ffn_norm.weight", "ffn_gate_exps.weight"} <= block
    assert not {"nextn.embed_tokens.weight", "nextn.shared_head_head.weight"} & block  # it shares the trunk's
    assert ref.get("{arch}.nextn_predict_layers") == 1 and ref.get("{arch}.block_count") == N + 1
    assert json.loads(Path(r["manifest"]).read_text())["norm_convention"] == "raw"


@pytest.mark.parametrize("precision", ["f16", "bf16", "q8_0"])
def test_the_mtp_block_equals_the_converters_bit_for_bit(src: Path, precision: str, tmp_path: Path) -> None:
    """At f16 / bf16 / q8_0 the MTP block (expert stacks included; router, its bias and the norms
    F32 as the converter keeps them) is the converter's byte for byte; token_embd / output_norm /
    output are the user's trunk's."""
    judged.block_equals_converters(src, _trunk(src, tmp_path), PRE, precision, N, BLOCK)


class TestConverterJudged(judged.ConverterJudged):
    """The tail, llama-server's drafting on f32 / Q8_0 / Q4_K_M trunks, the hub's bytes."""

    pre = PRE


def test_inspect_verify_and_remove_mtp_speak_of_the_hy3_head(src: Path, tmp_path: Path) -> None:
    """inspect finds the head-less trunk and names Hy3's release; after add-mtp it finds a clean
    head with raw norms, as it does the converter's full file; verify decodes identically with
    the head through llama-server; remove-mtp leaves the trunk as the converter wrote it."""
    trunk = _trunk(src, tmp_path)
    before = gguf_env.sha256(trunk)
    code, rep = judged.inspect_json(trunk)
    (f,) = rep["findings"]
    assert rep["family"] == "hy_v3" and f["code"] == "MTP_HEAD_MISSING" and str(trunk) in f["fix"]
    assert f["fix"].startswith(f"mtpforge add-mtp --source <original Hugging Face repo, e.g. {EXAMPLE}>")
    judged.add_mtp(trunk, src)
    code, rep = judged.inspect_json(trunk, "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-mtp" and rep["norm_convention"] == "raw"
    assert rep["mtp_tensors"] == BLOCK and rep["expert_format"] == "stacked"
    code, rep = judged.inspect_json(official(src, "full", "f32", pre=PRE), "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-tail"
    if (gguf_env.BIN / "llama-server").is_file():
        r = mtpforge("verify", str(trunk), "--json", "--max-tokens", "16", "--prompt", "Count: 3, 4, 5, 6, 7, 8.")
        v = json.loads(r.stdout)
        assert r.returncode == 0 and v["identical"] is True and v["drafted"] > 0, r.stderr
    r = mtpforge("remove-mtp", str(trunk), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "removed", r.stderr
    assert sorted(p.name for p in trunk.parent.iterdir()) == [trunk.name] and gguf_env.sha256(trunk) == before


def test_inspect_finds_the_norms_shifted_as_if_they_were_qwens(src: Path, tmp_path: Path) -> None:
    """Every head norm is raw: a head whose norms got Qwen's +1 is found against the source."""
    from tests.test_gguf import _rewrite

    bad = _rewrite(official(src, "full", "f32", pre=PRE), tmp_path / "shifted.gguf",
                   edit=lambda k, a: a + 1 if block_of(k) == N and k.endswith("norm.weight") else None)
    code, rep = judged.inspect_json(bad, "--source", str(src))
    assert code == 1 and {f["code"] for f in rep["findings"]} == {"MTP_NORMS_SHIFTED"}


def test_a_block_without_its_router_bias_is_found(src: Path, tmp_path: Path) -> None:
    """inspect's expected block holds the suffix-less ``exp_probs_b`` llama.cpp's hy_v3 loader
    reads: a block without it (the sigmoid router then picks experts unbiased) is incomplete."""
    from tests.test_gguf import _rewrite

    bad = _rewrite(official(src, "full", "f32", pre=PRE), tmp_path / "no-bias.gguf", drop=(f"blk.{N}.exp_probs_b",))
    code, rep = judged.inspect_json(bad)
    assert code == 1 and "MTP_MISSING_TENSORS" in {f["code"] for f in rep["findings"]}, rep["findings"]


def test_a_trunk_of_another_expert_count_is_refused_before_anything_is_fetched(src: Path, tmp_path: Path) -> None:
    """The expert count is part of the compatibility check: a trunk whose ``expert_count``
    differs from the source's is refused in one line, nothing written."""
    from tests.test_gguf import _rewrite

    (tmp_path / "other").mkdir()
    trunk = _rewrite(_trunk(src, tmp_path / "t"), tmp_path / "other" / "trunk.gguf", kv={"hy_v3.expert_count": 8})
    r = mtpforge("add-mtp", "--source", str(src), "--target", str(trunk))
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 1 and len(lines) == 1 and "8 vs 4" in lines[0], r.stderr
    assert sorted(p.name for p in trunk.parent.iterdir()) == [trunk.name]


def test_add_mtp_into_the_release_itself_suggests_the_gguf_as_inspect_does(src: Path) -> None:
    """No released mlx-lm converts Hy3, so neither add-mtp nor inspect sends the user to an MLX
    conversion of the original checkpoint: both name the GGUF trunk."""
    r = mtpforge("add-mtp", "--source", str(src), "--target", str(src))
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    code, rep = judged.inspect_json(src)
    (f,) = rep["findings"]
    want = f"mtpforge add-mtp --source {src} --target <trunk>.gguf"
    assert r.returncode == 2 and want in line and "convert" not in line, line
    assert code == 0 and f["code"] == "HF_SOURCE_CHECKPOINT" and want in f["fix"], f


def test_the_drafting_comparison_sees_a_misread_block(src: Path, tmp_path: Path) -> None:
    """The tiny head drafts (tests/support/synth/hy_v3.py ``drafting_tensors``), so equal
    accepted counts mean something: with ``eh_proj``'s embedding and hidden halves read the other
    way round, llama-server accepts a small fraction of what it accepts with mtpforge's block."""
    gguf_env.need("server")
    trunk = _trunk(src, tmp_path)
    ours = Path(judged.add_mtp(trunk, src, "--precision", "f32")["output"])
    good, wrong = judged.drafts_with_eh_proj_halves_swapped(trunk, ours, tmp_path)
    assert good["acceptance"] > 0.1 and wrong["acceptance"] < good["acceptance"] / 4, (good, wrong)
