"""MiMo-V2.5 (``mimo_v2``, ``MiMoV2ForCausalLM``; llama.cpp ``mimo2``) heads for llama.cpp, written
by mtpforge and judged by llama.cpp.

MiMo-V2-Flash's text model with each attention's projections stored as one ``qkv_proj`` — so the
converter's ``--mtp`` export has the fused ``attn_qkv`` that ``mimo2.cpp``'s MTP graph requires,
and mtpforge's MTP file must be that export, tensor for tensor. The FP8 release stores
``qkv_proj`` rank by rank over its tensor-parallel ranks, each rank quantized in 128-row blocks of
its own (``tests/support/synth/mimo_v2.py``: ``build_mimo_v2_fp8``, 4 ranks); the converter
unshards it (``_tp_aware_qkv_dequant``) and so must mtpforge: read the standard way, the scales
land on the wrong rows and the rows in the wrong order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpforge.gguf.gguffile import read_local
from mtpforge.gguf.names import block_of
from tests import gguf_env
from tests import gguf_judged as judged
from tests.gguf_env import official

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
PRE = "qwen35"  # the converter's pre-tokenizer for the synthetic byte-level vocabulary
N, K = 2, 3  # the tiny trunk's layers; the MTP layers, blk.2 ... blk.4
#: tensors in each MTP block, attn_qkv one of them as the release stores it
BLOCK = 12


@pytest.fixture(scope="module")
def srcs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny V2.5 (bf16) and its FP8 release (``qkv_proj`` sharded over 4 ranks)."""
    from tests.support.synth.mimo_v2 import build_mimo_v2_fp8

    fp8 = build_mimo_v2_fp8(tmp_path_factory.mktemp("mimo_v2_gguf") / "tiny-mimo_v2-fp8")
    return {"bf16": fp8.with_name(fp8.name + "-bf16"), "fp8": fp8}


def _trunk(srcs: dict[str, Path], dst: Path, qtype: str = "f32") -> Path:
    """The converter's --no-mtp trunk of the bf16 release (the FP8 one's trunk is the same model)."""
    return gguf_env.trunk_copy(srcs["bf16"], dst, qtype, pre=PRE)


def _as_converters(ours: Path, ref: Path) -> None:
    """Every MTP-block tensor the converter's, type, shape and bytes; the same metadata but the
    file's name (the trunk's, for ours)."""
    o, r = read_local(ours), read_local(ref)
    assert judged.kv_list(o, ("general.name",)) == judged.kv_list(r, ("general.name",))
    mtp = {k: t for k, t in r.tensors.items() if block_of(k) is not None}
    assert set(mtp) == {k for k in o.tensors if block_of(k) is not None} and len(mtp) == BLOCK * K
    assert {f"blk.{b}.attn_qkv.weight" for b in range(N, N + K)} <= set(mtp)
    with open(ours, "rb") as a, open(ref, "rb") as b:
        for k, t in mtp.items():
            mine = o.tensors[k]
            a.seek(mine.offset)
            b.seek(t.offset)
            assert (mine.type, mine.shape) == (t.type, t.shape) and a.read(mine.nbytes) == b.read(t.nbytes), k


@pytest.mark.parametrize("release,precision", [("bf16", "f32"), ("fp8", "f32"), ("fp8", "q8_0")])
def test_the_mtp_file_is_the_converters_export(srcs: dict[str, Path], release: str, precision: str,
                                               tmp_path: Path) -> None:
    """From either release: the converter's ``--mtp`` export, tensor for tensor — for the FP8
    release only when ``qkv_proj`` is unsharded as the converter unshards it (bf16 from both
    releases measured the same way: docs/families/mimo_v2_flash.md §6)."""
    trunk = _trunk(srcs, tmp_path)
    before = gguf_env.sha256(trunk)
    r = judged.add_mtp(trunk, srcs[release], "--precision", precision)
    assert r["family"] == "mimo_v2" and r["architecture"] == "mimo2" and r["mtp_tensors"] == BLOCK * K
    _as_converters(Path(r["output"]), official(srcs[release], "mtp", precision, pre=PRE))
    assert gguf_env.sha256(trunk) == before


def test_llama_server_drafts_with_mtpforges_file_as_with_the_converters(srcs: dict[str, Path], tmp_path: Path) -> None:
    """From the FP8 release, beside the Q8_0 trunk: output identical to plain, and the converter's
    own export (which drafts here: its attn_qkv is the release's) drafts and accepts exactly as
    many tokens (random weights)."""
    gguf_env.need("server")
    trunk = _trunk(srcs, tmp_path, "Q8_0")
    ours = Path(judged.add_mtp(trunk, srcs["fp8"], "--precision", "f16")["output"])
    theirs = gguf_env.graft(official(srcs["fp8"], "mtp", "f16", pre=PRE), trunk, tmp_path / "official" / "mtp-official.gguf")
    texts = gguf_env.prompts()[:4]
    plain = gguf_env.measure(trunk, texts=texts)
    mine, conv = gguf_env.measure(trunk, draft=ours, texts=texts), gguf_env.measure(trunk, draft=theirs, texts=texts)
    print(f"mimo_v2 Q8_0: ours {mine['accepted']}/{mine['drafted']}, the converter's {conv['accepted']}/{conv['drafted']}")
    assert mine["drafted"] > 200 and mine["tokens"] == plain["tokens"] == conv["tokens"]
    assert (mine["drafted"], mine["accepted"]) == (conv["drafted"], conv["accepted"])


def test_only_the_heads_bytes_come_from_the_hub(srcs: dict[str, Path], hub, tmp_path: Path) -> None:
    judged.fetches_only_the_head(hub, srcs["fp8"], lambda d: _trunk(srcs, d), tmp_path)


def test_inspect_reads_the_head_as_mimo2s_and_its_norms_against_the_release(srcs: dict[str, Path],
                                                                            tmp_path: Path) -> None:
    """A mimo2 file does not say which release it came from (MiMo-V2-Flash's and V2.5's are the
    same tensors): inspect names the architecture's family and, with ``--source`` of the V2.5
    release, compares the norms without calling it another model's."""
    trunk = _trunk(srcs, tmp_path)
    judged.add_mtp(trunk, srcs["fp8"])
    code, rep = judged.inspect_json(trunk, "--source", str(srcs["fp8"]))
    assert (code, rep["findings"], rep["layout"]) == (0, [], "gguf-mtp"), rep["findings"]
    assert rep["family"] == "mimo_v2_flash" and rep["norm_convention"] == "raw" and rep["norm_convention_from"] == "source"


def test_a_scale_that_fits_no_rank_layout_is_refused_in_one_line(srcs: dict[str, Path], tmp_path: Path) -> None:
    """``qkv_proj``'s scale with rows that no count of 4 or 8 ranks gives: refused before anything
    is written, naming the tensor; the trunk folder unchanged."""
    import shutil

    from mtpforge.checkpoint.safetensors_header import read_local_header
    from tests.support.synth.fp8 import write_safetensors

    bad = tmp_path / "bad"
    shutil.copytree(srcs["fp8"], bad)
    key = "model.mtp.layers.0.self_attn.qkv_proj.weight_scale_inv"
    shard = bad / json.loads((bad / "model.safetensors.index.json").read_text())["weight_map"][key]
    h = read_local_header(shard, shard.name)
    raw = shard.read_bytes()
    tensors = {n: (i.dtype, list(i.shape), raw[i.begin:i.end]) for n, i in sorted(h.tensors.items(), key=lambda kv: kv[1].begin)}
    dtype, shape, data = tensors[key]
    tensors[key] = (dtype, [3, shape[1]], data[: 3 * shape[1] * 4])
    write_safetensors(shard, tensors, h.metadata or {"format": "pt"})
    trunk = _trunk(srcs, tmp_path / "t")
    listing = sorted(p.name for p in trunk.parent.iterdir())
    r = gguf_env.mtpforge("add-mtp", "--source", str(bad), "--target", str(trunk))
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "qkv_proj.weight_scale_inv" in r.stderr and len(r.stderr.strip().splitlines()) <= 2, r.stderr
    assert sorted(p.name for p in trunk.parent.iterdir()) == listing
