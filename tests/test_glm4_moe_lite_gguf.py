"""GLM-4.7-Flash (``glm4_moe_lite``) heads for llama.cpp, written by mtpforge and judged by llama.cpp.

The references are llama.cpp's own converter on the tiny GLM-4.7-Flash checkpoint
(``--no-mtp`` for the trunk users have, ``--mtp`` for the MTP-only file, neither for the full
file): add-mtp from the trunk and the source's head bytes writes the same tensors (MLA's
``kv_b_proj`` split into ``attn_k_b`` / ``attn_v_b`` as the converter splits it) and metadata,
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
PRE = "glm4"  # the converter's pre-tokenizer for the synthetic GLM vocabulary
N = 2  # the tiny model's num_hidden_layers: the NextN layer is blk.2
BLOCK = 24  # tensors in the converter's NextN block (measured, docs/families/glm4_moe_lite.md)


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The release's shape: ``q_lora_rank`` set (llama.cpp refuses a trunk without it)."""
    from tests.support.synth.glm4_moe_lite import build_glm4_moe_lite

    return build_glm4_moe_lite(tmp_path_factory.mktemp("glm4_moe_lite_gguf") / "tiny-glm4_moe_lite")


def _trunk(src: Path, dst: Path, qtype: str = "f32") -> Path:
    return gguf_env.trunk_copy(src, dst, qtype, pre=PRE)





def test_the_mtp_file_equals_the_converters_mtp_export_at_f32(src: Path, tmp_path: Path) -> None:
    """Everything ``--mtp`` writes (tensors, values, metadata, the file name), from the
    ``--no-mtp`` trunk and the head's bytes; the trunk is only read."""
    r, ref = judged.equals_mtp_export(src, _trunk(src, tmp_path), PRE)
    assert Path(r["output"]).name == "mtp-Tiny-Glm4_Moe_Lite-F32.gguf"
    assert r["family"] == "glm4_moe_lite" and r["architecture"] == "deepseek2"
    assert {f"blk.{N}.attn_k_b.weight", f"blk.{N}.attn_v_b.weight"} <= set(ref.tensors)
    assert not any("kv_b" in k for k in ref.tensors)
    assert json.loads(Path(r["manifest"]).read_text())["norm_convention"] == "raw"


@pytest.mark.parametrize("precision", ["f16", "bf16", "q8_0"])
def test_the_mtp_block_equals_the_converters_bit_for_bit(src: Path, precision: str, tmp_path: Path) -> None:
    """At f16 / bf16 / q8_0 the MTP block (the split k_b / v_b included) is the converter's
    byte for byte; token_embd / output_norm / output are the user's trunk's own bytes."""
    judged.block_equals_converters(src, _trunk(src, tmp_path), PRE, precision, N, BLOCK)


class TestConverterJudged(judged.ConverterJudged):
    """The tail, llama-server's drafting on f32 / Q8_0 / Q4_K_M trunks, the hub's bytes."""

    pre = PRE


def test_inspect_finds_the_missing_head_then_a_clean_one_with_raw_norms(src: Path, tmp_path: Path) -> None:
    trunk = _trunk(src, tmp_path)
    code, rep = judged.inspect_json(trunk)
    (f,) = rep["findings"]
    assert rep["family"] == "glm4_moe_lite" and f["code"] == "MTP_HEAD_MISSING" and str(trunk) in f["fix"]
    assert f["fix"].startswith("mtpforge add-mtp --source <original Hugging Face repo, e.g. zai-org/GLM-4.7-Flash>")
    judged.add_mtp(trunk, src)
    code, rep = judged.inspect_json(trunk, "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-mtp" and rep["norm_convention"] == "raw"
    assert rep["mtp_tensors"] == BLOCK and rep["expert_format"] == "stacked"
    code, rep = judged.inspect_json(official(src, "full", "f32", pre=PRE), "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-tail"


def test_a_block_without_its_split_key_matrix_is_found(src: Path, tmp_path: Path) -> None:
    """inspect's expected block knows the split: an MTP file whose ``attn_k_b`` is gone is
    incomplete (``kv_b_proj`` has no tensor of its own in llama.cpp's file)."""
    from tests.test_gguf import _rewrite

    bad = _rewrite(official(src, "full", "f32", pre=PRE), tmp_path / "no-k_b.gguf", drop=(f"blk.{N}.attn_k_b.weight",))
    code, rep = judged.inspect_json(bad)
    assert code == 1 and "MTP_MISSING_TENSORS" in {f["code"] for f in rep["findings"]}


def test_inspect_finds_the_norms_shifted_as_if_they_were_qwens(src: Path, tmp_path: Path) -> None:
    """Every head norm is raw, the MLA ones (``attn_q_a_norm``, ``attn_kv_a_norm``) included: a
    head whose norms got Qwen's +1 is found against the source."""
    from tests.test_gguf import _rewrite

    full = official(src, "full", "f32", pre=PRE)
    bad = _rewrite(full, tmp_path / "shifted.gguf",
                   edit=lambda k, a: a + 1 if block_of(k) == N and k.endswith("norm.weight") else None)
    code, rep = judged.inspect_json(bad, "--source", str(src))
    assert code == 1 and {f["code"] for f in rep["findings"]} == {"MTP_NORMS_SHIFTED"}


def test_a_trunk_of_another_latent_rank_is_refused_before_anything_is_fetched(src: Path, tmp_path: Path) -> None:
    """llama.cpp states MLA as MQA (``head_count_kv`` 1): the check compares the MLA keys instead,
    and a trunk whose ``kv_lora_rank`` differs is refused in one line, nothing written."""
    from tests.test_gguf import _rewrite

    (tmp_path / "other").mkdir()
    trunk = _rewrite(_trunk(src, tmp_path / "t"), tmp_path / "other" / "trunk.gguf",
                     kv={"deepseek2.attention.kv_lora_rank": 32})
    r = mtpforge("add-mtp", "--source", str(src), "--target", str(trunk))
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 1 and len(lines) == 1 and "key/value rank (32 vs 64)" in lines[0], r.stderr
    assert sorted(p.name for p in trunk.parent.iterdir()) == [trunk.name]
