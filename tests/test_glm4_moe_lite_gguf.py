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

import numpy as np
import pytest

from mtpforge.gguf.gguffile import read_local, tensor_array
from mtpforge.gguf.names import SHARED_TENSORS, block_of
from tests import gguf_env
from tests.gguf_env import mtpforge, official, sha256

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


def _add(trunk: Path, source: Path | str, *extra: str) -> dict:
    r = mtpforge("add-mtp", "--source", str(source), "--target", str(trunk), "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _tensors(g) -> dict[str, tuple[object, tuple[int, ...]]]:
    return {k: (t.type, t.shape) for k, t in g.tensors.items()}


def _kv(g, skip: tuple[str, ...] = ()) -> list[tuple[str, object, int]]:
    return [(k, v.value, int(v.type)) for k, v in g.kv.items() if k not in skip]


def test_the_mtp_file_equals_the_converters_mtp_export_at_f32(src: Path, tmp_path: Path) -> None:
    """Names, ggml types, shapes, values, metadata (keys, order, types) and the file name of
    ``--mtp``, from the ``--no-mtp`` trunk and the head's bytes; the trunk is only read."""
    trunk = _trunk(src, tmp_path)
    before = sha256(trunk)
    r = _add(trunk, src, "--precision", "f32")
    ours, ref = read_local(r["output"]), read_local(official(src, "mtp", "f32", pre=PRE))
    assert Path(r["output"]).name == "mtp-Tiny-Glm4_Moe_Lite-F32.gguf"
    assert r["family"] == "glm4_moe_lite" and r["architecture"] == "deepseek2"
    assert _tensors(ours) == _tensors(ref)
    assert {f"blk.{N}.attn_k_b.weight", f"blk.{N}.attn_v_b.weight"} <= set(ref.tensors)
    assert not any("kv_b" in k for k in ref.tensors)
    for k, t in ref.tensors.items():
        assert np.array_equal(tensor_array(ours, ours.tensors[k]), tensor_array(ref, t)), k
    assert _kv(ours) == _kv(ref)
    assert sha256(trunk) == before
    rec = json.loads(Path(r["manifest"]).read_text())
    assert rec["norm_convention"] == "raw"


@pytest.mark.parametrize("precision", ["f16", "bf16", "q8_0"])
def test_the_mtp_block_equals_the_converters_bit_for_bit(src: Path, precision: str, tmp_path: Path) -> None:
    """At f16 / bf16 / q8_0 the MTP block (the split k_b / v_b included) is the converter's
    byte for byte; token_embd / output_norm / output are the user's trunk's own bytes."""
    trunk = _trunk(src, tmp_path)
    r = _add(trunk, src, "--precision", precision)
    ours, ref = read_local(r["output"]), read_local(official(src, "mtp", precision, pre=PRE))
    block = [k for k in ref.tensors if block_of(k) == N]
    assert len(block) == BLOCK and {k for k in ours.tensors if block_of(k) == N} == set(block)
    with open(r["output"], "rb") as a, open(ref.path, "rb") as b:
        for k in block:
            ta, tb = ours.tensors[k], ref.tensors[k]
            assert (ta.type, ta.shape) == (tb.type, tb.shape), k
            a.seek(ta.offset)
            b.seek(tb.offset)
            assert a.read(ta.nbytes) == b.read(tb.nbytes), k
    tr = read_local(trunk)
    for k in SHARED_TENSORS:
        assert np.array_equal(tensor_array(ours, ours.tensors[k]), tensor_array(tr, tr.tensors[k])), k
    assert _kv(ours) == _kv(ref)


def test_the_tail_equals_the_converters_full_file(src: Path, tmp_path: Path) -> None:
    trunk = _trunk(src, tmp_path)
    out = tmp_path / "with-tail.gguf"
    _add(trunk, src, "--precision", "f32", "--layout", "gguf-tail", "--output", str(out))
    ours, ref = read_local(out), read_local(official(src, "full", "f32", pre=PRE))
    assert _tensors(ours) == _tensors(ref)
    for k, t in ref.tensors.items():
        assert np.array_equal(tensor_array(ours, ours.tensors[k]), tensor_array(ref, t)), k
    assert _kv(ours, ("general.size_label",)) == _kv(ref, ("general.size_label",))


@pytest.mark.parametrize("qtype", ["f32", "Q8_0", "Q4_K_M"])
def test_llama_server_drafts_with_mtpforges_file_exactly_as_plain_and_as_with_the_official_one(src: Path, qtype: str,
                                                                                              tmp_path: Path) -> None:
    """On the f32, Q8_0 and Q4_K_M trunks: greedy output with mtpforge's MTP file is the
    trunk's plain output, and llama.cpp drafts and accepts exactly as many tokens as with the
    converter's own ``--mtp`` file beside the same trunk."""
    gguf_env.need("server")
    trunk = _trunk(src, tmp_path, qtype)
    ours = Path(_add(trunk, src, "--precision", "f32")["output"])
    theirs = gguf_env.graft(official(src, "mtp", "f32", pre=PRE), trunk, tmp_path / "official" / "mtp-official.gguf")
    texts = gguf_env.prompts()[:4]
    plain = gguf_env.measure(trunk, texts=texts)
    with_ours = gguf_env.measure(trunk, draft=ours, texts=texts)
    with_theirs = gguf_env.measure(trunk, draft=theirs, texts=texts)
    assert with_ours["drafted"] > 0 and with_ours["tokens"] == plain["tokens"]
    assert (with_ours["drafted"], with_ours["accepted"]) == (with_theirs["drafted"], with_theirs["accepted"])


def test_only_the_heads_bytes_come_from_the_hub(src: Path, hub, tmp_path: Path) -> None:
    repo, _ = hub.publish(src)
    trunk = _trunk(src, tmp_path)
    dry = hub.run("add-mtp", "--source", repo, "--target", str(trunk), "--dry-run")
    assert dry.code == 0, dry.stderr
    head_bytes = dry.json["fetch_bytes"]
    hub.server.clear_log()
    r = hub.run("add-mtp", "--source", repo, "--target", str(trunk))
    assert r.code == 0, r.stderr
    assert 0 < r.json["fetched_bytes"] <= 1.01 * head_bytes and hub.tensor_bytes(repo) <= 1.01 * head_bytes
    local = _add(_trunk(src, tmp_path / "local"), src)
    assert sha256(Path(r.json["output"])) == sha256(Path(local["output"]))


def _inspect(target: Path, *extra: str) -> tuple[int, dict]:
    r = mtpforge("inspect", str(target), "--json", *extra)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


def test_inspect_finds_the_missing_head_then_a_clean_one_with_raw_norms(src: Path, tmp_path: Path) -> None:
    trunk = _trunk(src, tmp_path)
    code, rep = _inspect(trunk)
    (f,) = rep["findings"]
    assert rep["family"] == "glm4_moe_lite" and f["code"] == "MTP_HEAD_MISSING" and str(trunk) in f["fix"]
    assert f["fix"].startswith("mtpforge add-mtp --source <original Hugging Face repo, e.g. zai-org/GLM-4.7-Flash>")
    _add(trunk, src)
    code, rep = _inspect(trunk, "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-mtp" and rep["norm_convention"] == "raw"
    assert rep["mtp_tensors"] == BLOCK and rep["expert_format"] == "stacked"
    code, rep = _inspect(official(src, "full", "f32", pre=PRE), "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-tail"


def test_a_block_without_its_split_key_matrix_is_found(src: Path, tmp_path: Path) -> None:
    """inspect's expected block knows the split: an MTP file whose ``attn_k_b`` is gone is
    incomplete (``kv_b_proj`` has no tensor of its own in llama.cpp's file)."""
    from tests.test_gguf import _rewrite

    bad = _rewrite(official(src, "full", "f32", pre=PRE), tmp_path / "no-k_b.gguf", drop=(f"blk.{N}.attn_k_b.weight",))
    code, rep = _inspect(bad)
    assert code == 1 and "MTP_MISSING_TENSORS" in {f["code"] for f in rep["findings"]}


def test_inspect_finds_the_norms_shifted_as_if_they_were_qwens(src: Path, tmp_path: Path) -> None:
    """Every head norm is raw, the MLA ones (``attn_q_a_norm``, ``attn_kv_a_norm``) included: a
    head whose norms got Qwen's +1 is found against the source."""
    from tests.test_gguf import _rewrite

    full = official(src, "full", "f32", pre=PRE)
    bad = _rewrite(full, tmp_path / "shifted.gguf",
                   edit=lambda k, a: a + 1 if block_of(k) == N and k.endswith("norm.weight") else None)
    code, rep = _inspect(bad, "--source", str(src))
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
