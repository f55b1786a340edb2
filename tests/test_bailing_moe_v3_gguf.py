"""Ling-3 (``bailing_moe_v3``, llama.cpp ``bailingmoe3``) heads for llama.cpp, written by mtpforge
and judged by llama.cpp.

The references are llama.cpp's own converter (``BailingMoeV3Model``) on the tiny Ling-3 checkpoint
(tests/support/synth/bailing_moe_v3.py: a KDA layer, an MLA layer, the MTP layer; the release's
own names): ``--no-mtp`` for the trunk users have, ``--mtp`` for the MTP-only file, neither for the
full file. add-mtp from the trunk and the source's head bytes writes the same tensors — the
appended MLA + MoE layer ``model.layers.2`` as ``blk.2`` with ``kv_b_proj`` split, the experts
stacked, ``final_layernorm`` as ``layer_output_norm``, ``head_count_kv`` extended by the MLA
layer's 1 — and the same metadata; ``llama-server`` drafts with the result exactly as with the
converter's file and decodes as without it, only the head's bytes come over the (loopback) Hub, and
inspect, verify and remove-mtp speak of the family's head.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpforge.gguf.names import block_of
from tests import gguf_env
from tests import gguf_judged as judged
from tests.gguf_env import mtpforge

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
PRE = "qwen35"  # the converter's pre-tokenizer for the synthetic byte-level vocabulary
N = 2  # the tiny model's trunk layers: the MTP layer is blk.2
#: tensors in the converter's MTP block: 4 NextN, 2 layer norms, 9 MLA (k_b / v_b split, the
#: gate), 2 router, 3 shared expert, 3 expert stacks
BLOCK = 23
EXAMPLE = "inclusionAI/Ling-3.0-flash"


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.synth.bailing_moe_v3 import build_bailing_moe_v3

    return build_bailing_moe_v3(tmp_path_factory.mktemp("bailing_moe_v3_gguf") / "tiny-bailing_moe_v3")


def _trunk(src: Path, dst: Path, qtype: str = "f32") -> Path:
    return gguf_env.trunk_copy(src, dst, qtype, pre=PRE)


def test_the_mtp_file_equals_the_converters_mtp_export_at_f32(src: Path, tmp_path: Path) -> None:
    """Everything ``--mtp`` writes (tensors, values, metadata — ``head_count_kv`` [0, 1, 1] —, the
    file name), from the ``--no-mtp`` trunk and the head's bytes; the trunk is only read."""
    r, ref = judged.equals_mtp_export(src, _trunk(src, tmp_path), PRE)
    assert Path(r["output"]).name == "mtp-Tiny-Bailing_Moe_V3-F32.gguf"
    assert r["family"] == "bailing_moe_v3" and r["architecture"] == "bailingmoe3" and r["expert_format"] == "per-expert"
    block = {k.split(".", 2)[2] for k in ref.tensors if block_of(k) == N}
    assert len(block) == BLOCK == r["mtp_tensors"] and len(ref.tensors) == 3 + BLOCK
    assert {"layer_output_norm.weight", "attn_gate.weight", "attn_k_b.weight", "exp_probs_b.bias"} <= block
    assert ref.get("{arch}.attention.head_count_kv") == [0, 1, 1] and ref.get("{arch}.nextn_predict_layers") == 1
    assert json.loads(Path(r["manifest"]).read_text())["norm_convention"] == "raw"


def test_the_mtp_block_equals_the_converters_bit_for_bit_at_q8_0(src: Path, tmp_path: Path) -> None:
    """At q8_0 the MTP block (expert stacks, the split k_b / v_b; router, its bias and the norms
    F32 as the converter keeps them) is the converter's byte for byte (f16 / bf16 are the same
    casts every family's tests hold)."""
    judged.block_equals_converters(src, _trunk(src, tmp_path), PRE, "q8_0", N, BLOCK)


class TestConverterJudged(judged.ConverterJudged):
    """The tail, llama-server's drafting on f32 / Q8_0 / Q4_K_M trunks, the hub's bytes."""

    pre = PRE


def test_inspect_verify_and_remove_mtp_speak_of_the_ling3_head(src: Path, tmp_path: Path) -> None:
    """inspect finds the head-less trunk and names Ling-3's release; after add-mtp a clean head
    with raw norms (a copy with them +1 is named shifted); verify decodes identically with the head
    through llama-server; remove-mtp leaves the trunk as the converter wrote it."""
    from tests.test_gguf import _rewrite

    trunk = _trunk(src, tmp_path / "t")
    before = gguf_env.sha256(trunk)
    code, rep = judged.inspect_json(trunk)
    (f,) = rep["findings"]
    assert rep["family"] == "bailing_moe_v3" and f["code"] == "MTP_HEAD_MISSING" and str(trunk) in f["fix"]
    assert f["fix"].startswith(f"mtpforge add-mtp --source <original Hugging Face repo, e.g. {EXAMPLE}>")
    ours = Path(judged.add_mtp(trunk, src)["output"])
    code, rep = judged.inspect_json(trunk, "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-mtp" and rep["norm_convention"] == "raw"
    assert rep["mtp_tensors"] == BLOCK and rep["expert_format"] == "stacked"
    (tmp_path / "shifted").mkdir()
    bad = _rewrite(ours, tmp_path / "shifted" / ours.name, edit=lambda k, a: a + 1 if k.endswith("norm.weight") else None)
    code, rep = judged.inspect_json(bad, "--source", str(src))
    assert code == 1 and {f["code"] for f in rep["findings"]} == {"MTP_NORMS_SHIFTED"}
    gguf_env.need("server")
    r = mtpforge("verify", str(trunk), "--json", "--max-tokens", "16", "--prompt", "Count: 3, 4, 5, 6, 7, 8.")
    v = json.loads(r.stdout)
    assert r.returncode == 0 and v["identical"] is True and v["drafted"] > 0, r.stderr
    r = mtpforge("remove-mtp", str(trunk), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "removed", r.stderr
    assert sorted(p.name for p in trunk.parent.iterdir()) == [trunk.name] and gguf_env.sha256(trunk) == before


def test_an_mlx_folder_is_refused_naming_what_drafts_the_head(src: Path) -> None:
    """mtpforge writes Ling-3's head for llama.cpp only: add-mtp into the release itself names the
    GGUF trunk instead of an MLX conversion."""
    r = mtpforge("add-mtp", "--source", str(src), "--target", str(src))
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and f"mtpforge add-mtp --source {src} --target <trunk>.gguf" in line, line


def test_the_drafting_comparison_sees_a_misread_block(src: Path, tmp_path: Path) -> None:
    """The tiny head drafts (``family_common.echo_head_tensors``), so equal accepted counts mean
    something: with ``eh_proj``'s halves read the other way round, llama-server accepts a small
    fraction of what it accepts with mtpforge's block."""
    gguf_env.need("server")
    trunk = _trunk(src, tmp_path)
    ours = Path(judged.add_mtp(trunk, src, "--precision", "f32")["output"])
    good, wrong = judged.drafts_with_eh_proj_halves_swapped(trunk, ours, tmp_path)
    assert good["acceptance"] > 0.1 and wrong["acceptance"] < good["acceptance"] / 4, (good, wrong)
