"""MiMo-V2-Flash (``mimo_v2_flash``, llama.cpp ``mimo2``) heads for llama.cpp, written by mtpforge
and judged by llama.cpp.

llama.cpp's ``mimo2`` MTP graph requires the attention's projections fused
(``GGML_ASSERT(layer.wqkv && "MIMO2 MTP requires fused attn_qkv")``), while its converter's
``--mtp`` export keeps ``attn_q`` / ``attn_k`` / ``attn_v`` apart, as the release stores them: so the
converter's own file does not draft (measured here: llama-server aborts loading it). mtpforge
writes the three MTP layers ``model.mtp.layers.{0,1,2}`` as ``blk.{2,3,4}`` with one ``attn_qkv``
(query rows, then key, then value: the offsets ``mimo2.cpp`` views) and every other tensor and
metadata key exactly as the converter's export — and llama-server drafts with it, its output
identical to plain decoding, only the head's bytes coming over the (loopback) Hub.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mtpforge.gguf.gguffile import read_local, tensor_array
from mtpforge.gguf.names import block_of
from tests import gguf_env
from tests import gguf_judged as judged
from tests.gguf_env import official

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
PRE = "qwen35"  # the converter's pre-tokenizer for the synthetic byte-level vocabulary
N, K = 2, 3  # the tiny trunk's layers; the MTP layers, blk.2 ... blk.4
#: tensors in each MTP block: the converter's 14, with attn_q / attn_k / attn_v as one attn_qkv
BLOCK = 12
EXAMPLE = "XiaomiMiMo/MiMo-V2-Flash"
QKV = ("attn_q", "attn_k", "attn_v")


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.synth.mimo_v2_flash import build_mimo_v2_flash

    return build_mimo_v2_flash(tmp_path_factory.mktemp("mimo_gguf") / "tiny-mimo_v2_flash")


def _trunk(src: Path, dst: Path, qtype: str = "f32") -> Path:
    return gguf_env.trunk_copy(src, dst, qtype, pre=PRE)


def _fused_as_converters(ours: Path, ref: Path, skip: tuple[str, ...] = ()) -> None:
    """Same metadata (keys, order, types; but ``skip``); every MTP-block tensor the converter's
    byte for byte, but its attn_q / attn_k / attn_v, which are attn_qkv's rows in that order,
    byte for byte."""
    o, r = read_local(ours), read_local(ref)
    assert judged.kv_list(o, skip) == judged.kv_list(r, skip)
    fused = {f"blk.{b}.{t}.weight" for b in range(N, N + K) for t in QKV}
    assert set(o.tensors) == (set(r.tensors) - fused) | {f"blk.{b}.attn_qkv.weight" for b in range(N, N + K)}
    with open(ours, "rb") as a, open(ref, "rb") as b:
        def raw(f, t):
            f.seek(t.offset)
            return f.read(t.nbytes)

        for k, t in r.tensors.items():
            if block_of(k) is not None and k not in fused:
                assert (o.tensors[k].type, o.tensors[k].shape) == (t.type, t.shape) and raw(a, o.tensors[k]) == raw(b, t), k
        for blk in range(N, N + K):
            parts = [r.tensors[f"blk.{blk}.{x}.weight"] for x in QKV]
            qkv = o.tensors[f"blk.{blk}.attn_qkv.weight"]
            assert qkv.type == parts[0].type and qkv.shape == (sum(p.shape[0] for p in parts), parts[0].shape[1])
            assert raw(a, qkv) == b"".join(raw(b, p) for p in parts), blk


def test_the_mtp_file_is_the_converters_export_with_qkv_fused_at_f32(src: Path, tmp_path: Path) -> None:
    trunk = _trunk(src, tmp_path)
    before = gguf_env.sha256(trunk)
    r = judged.add_mtp(trunk, src, "--precision", "f32")
    assert r["family"] == "mimo_v2_flash" and r["architecture"] == "mimo2" and r["mtp_tensors"] == BLOCK * K
    ref = official(src, "mtp", "f32", pre=PRE)
    _fused_as_converters(Path(r["output"]), ref)
    g = read_local(ref)
    assert g.get("{arch}.nextn_predict_layers") == K and g.get("{arch}.block_count") == N + K
    assert g.get("{arch}.attention.head_count_kv") == [1, 2] + [2] * K
    assert g.get("{arch}.attention.sliding_window_pattern") == [0, 1] + [1] * K
    # the shared tensors are the trunk's own (at f32 the converter's too)
    ours, tr = read_local(r["output"]), read_local(trunk)
    for k in ("token_embd.weight", "output.weight", "output_norm.weight"):
        assert np.array_equal(tensor_array(ours, ours.tensors[k]), tensor_array(tr, tr.tensors[k])), k
    assert gguf_env.sha256(trunk) == before


def test_every_mtp_tensor_is_the_converters_bytes_at_q8_0(src: Path, tmp_path: Path) -> None:
    """q8_0 quantizes rows in blocks: the fused tensor is still the three parts' bytes (f16 is
    measured the same way, docs/families/mimo_v2_flash.md)."""
    r = judged.add_mtp(_trunk(src, tmp_path), src, "--precision", "q8_0")
    _fused_as_converters(Path(r["output"]), official(src, "mtp", "q8_0", pre=PRE))


def test_the_converters_own_export_does_not_draft(src: Path, tmp_path: Path) -> None:
    """Why mtpforge fuses: llama-server aborts on the converter's MTP file (q/k/v apart)."""
    gguf_env.need("server")
    trunk = _trunk(src, tmp_path)
    theirs = gguf_env.graft(official(src, "mtp", "f32", pre=PRE), trunk, tmp_path / "official" / "mtp-official.gguf")
    p = subprocess.run([str(gguf_env.BIN / "llama-server"), "-m", str(trunk), "-md", str(theirs), "--spec-type", "draft-mtp",
                        "--port", "0", "-t", "1", "-c", "512"], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "MIMO2 MTP requires fused attn_qkv" in p.stdout + p.stderr


def test_llama_server_drafts_with_mtpforges_file_exactly_as_plain(src: Path, tmp_path: Path) -> None:
    """Random weights (the quantized trunks and the acceptance: tests/test_mimo_v2_flash_trained.py)."""
    gguf_env.need("server")
    trunk = _trunk(src, tmp_path)
    ours = Path(judged.add_mtp(trunk, src, "--precision", "f32")["output"])
    texts = gguf_env.prompts()[:4]
    plain, with_ours = gguf_env.measure(trunk, texts=texts), gguf_env.measure(trunk, draft=ours, texts=texts)
    assert with_ours["drafted"] > 200 and with_ours["tokens"] == plain["tokens"]


def test_only_the_heads_bytes_come_from_the_hub(src: Path, hub, tmp_path: Path) -> None:
    judged.fetches_only_the_head(hub, src, lambda d: _trunk(src, d), tmp_path)


def test_inspect_finds_the_missing_head_then_a_clean_one_and_the_converters_unfused_block(src: Path,
                                                                                           tmp_path: Path) -> None:
    trunk = _trunk(src, tmp_path)
    code, rep = judged.inspect_json(trunk)
    (f,) = rep["findings"]
    assert rep["family"] == "mimo_v2_flash" and f["code"] == "MTP_HEAD_MISSING"
    assert f["fix"].startswith(f"mtpforge add-mtp --source <original Hugging Face repo, e.g. {EXAMPLE}>")
    judged.add_mtp(trunk, src)
    code, rep = judged.inspect_json(trunk, "--source", str(src))
    assert (code, rep["findings"], rep["layout"], rep["norm_convention"]) == (0, [], "gguf-mtp", "raw")
    assert rep["mtp_tensors"] == BLOCK * K
    # the converter's full file keeps q/k/v apart in every MTP block: llama.cpp would not draft it
    code, rep = judged.inspect_json(official(src, "full", "f32", pre=PRE))
    missing = [x["message"] for x in rep["findings"] if x["code"] == "MTP_MISSING_TENSORS"]
    assert code == 1 and len(missing) == K and all("lacks attn_qkv.weight" in m for m in missing), rep["findings"]


def test_the_tail_drafts_as_plain_and_remove_mtp_undoes_it(src: Path, tmp_path: Path) -> None:
    """``--layout gguf-tail``: the converter's full file with q/k/v fused; llama-server drafts
    from it alone; remove-mtp deletes what add-mtp wrote."""
    trunk = _trunk(src, tmp_path)
    out = tmp_path / "with-tail.gguf"
    judged.add_mtp(trunk, src, "--precision", "f32", "--layout", "gguf-tail", "--output", str(out))
    _fused_as_converters(out, official(src, "full", "f32", pre=PRE), ("general.size_label",))
    code, rep = judged.inspect_json(out, "--source", str(src))
    assert (code, rep["findings"], rep["layout"]) == (0, [], "gguf-tail")
    texts = gguf_env.prompts()[:2]
    plain, tail = gguf_env.measure(trunk, texts=texts), gguf_env.measure(out, mtp=True, texts=texts)
    assert tail["drafted"] > 0 and tail["tokens"] == plain["tokens"]
    r = gguf_env.mtpforge("remove-mtp", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert not out.exists() and json.loads(r.stdout)["removed"]
