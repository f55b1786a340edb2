"""DeepSeek-V4 (``deepseek_v4``, llama.cpp ``deepseek4``): what llama.cpp's own programs do with the
head, and mtpforge's reading of the release's formats held to them.

The references are llama.cpp's converter (``DeepseekV4Model``) on the tiny DeepSeek-V4 checkpoint
(tests/support/synth/deepseek_v4.py: the release's ``mtp.0.*`` names, dense FP8 e4m3 with E8M0
128x128 scales, FP4 experts with an E8M0 exponent per 32 values): ``--no-mtp`` for the trunk users
have, ``--mtp`` for the MTP-only file (the converter never writes a trunk with its head). The
converter keeps its own types whatever ``--outtype`` says: a block-FP8 matrix dequantized to Q8_0,
the routed experts repacked to MXFP4 bit for bit, ``e_proj``/``h_proj`` side by side as a Q8_0
``nextn.eh_proj``. mtpforge's E8M0 dequantization and MXFP4 repacking (passes/fp8.py, through
headplan's ``read_scale`` / ``decode`` / row blocks) give the converter's bytes from the same
source bytes; llama-server drafts with the converter's MTP file on f32 / Q8_0 / Q4_K_M trunks
with output identical to plain. add-mtp from the ``--no-mtp`` trunk and the head's bytes writes
the converter's ``--mtp`` file — every tensor byte for byte (the ``mtp.0.*`` layer as ``blk.2``,
``hc_head_*`` as ``output_hc_*``, the experts MXFP4) and the same metadata — at every precision,
since the converter's types follow the source's; llama-server drafts with it as with the
converter's file and decodes as without it, and only the head's bytes come over the (loopback)
Hub (docs/families/deepseek_v4.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import pytest

from mtpforge.checkpoint.safetensors_header import TensorInfo, read_local_header
from mtpforge.gguf.gguffile import GgufFile, read_local
from mtpforge.headplan import block_scale, decode, fetch_list, is_scale, read_scale, scale_of, SliceRef
from mtpforge.passes.fp8 import e8m0_to_float, repack_mxfp4
from mtpforge.gguf.names import block_of
from tests import gguf_env
from tests import gguf_judged as judged
from tests.gguf_env import mtpforge, official

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
PRE = "qwen35"  # the converter's pre-tokenizer for the synthetic byte-level vocabulary
N = 2  # the tiny model's trunk layers: the MTP layer is blk.2
Q = gguf.GGMLQuantizationType
#: tensors in the converter's MTP block: 4 NextN (eh_proj, enorm, hnorm, shared_head_norm), 11
#: attention (two norms, sinks, q_a, q_a_norm, q_b, kv, kv norm, output a and b... and ffn_norm),
#: 6 hyper-connection, router and its bias, 3 shared-expert and 3 expert stacks
BLOCK = 28
#: the head's output hyper-connection, written outside the block
ROOT = ("output_hc_base.weight", "output_hc_fn.weight", "output_hc_scale.weight")

#: the head's block-FP8 matrices (release name under ``mtp.0.``) -> the converter's name in blk.N
FP8_NAMES = {
    "attn.wq_a.weight": "attn_q_a.weight", "attn.wq_b.weight": "attn_q_b.weight", "attn.wkv.weight": "attn_kv.weight",
    "attn.wo_a.weight": "attn_output_a.weight", "attn.wo_b.weight": "attn_output_b.weight",
    "ffn.shared_experts.w1.weight": "ffn_gate_shexp.weight", "ffn.shared_experts.w2.weight": "ffn_down_shexp.weight",
    "ffn.shared_experts.w3.weight": "ffn_up_shexp.weight",
}
#: the routed experts' projections -> the converter's stacked MXFP4 tensor
EXPERT_NAMES = {"w1": "ffn_gate_exps.weight", "w2": "ffn_down_exps.weight", "w3": "ffn_up_exps.weight"}


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.synth.deepseek_v4 import build_deepseek_v4

    return build_deepseek_v4(tmp_path_factory.mktemp("deepseek_v4_gguf") / "tiny-deepseek_v4")


@pytest.fixture(scope="module")
def ref(src: Path) -> GgufFile:
    return read_local(official(src, "mtp", "f32", pre=PRE))


def _entries(src: Path) -> tuple[dict[str, TensorInfo], Callable[[TensorInfo, int, int], bytes]]:
    """The source's tensors by name, and a reader of byte ranges within one tensor."""
    entries: dict[str, TensorInfo] = {}
    for shard in sorted(src.glob("*.safetensors")):
        entries.update(read_local_header(shard, shard.name).tensors)

    def read(info: TensorInfo, start: int, end: int) -> bytes:
        with open(src / info.file, "rb") as f:
            f.seek(info.begin + start)
            return f.read(end - start)

    return entries, read


def _trunk(src: Path, dst: Path, qtype: str) -> Path:
    """The converter's ``--no-mtp`` trunk, quantized as a user would: its routed experts are MXFP4
    already, which llama-quantize requantizes only when told (``--allow-requantize``)."""
    import subprocess

    f32 = official(src, "trunk", "f32", pre=PRE)
    dst.mkdir(parents=True, exist_ok=True)
    out = dst / f"{src.name}-{qtype}.gguf"
    if qtype == "f32":
        out.write_bytes(f32.read_bytes())
        return out
    r = subprocess.run([str(gguf_env.BIN / "llama-quantize"), "--allow-requantize", str(f32), str(out), qtype],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    return out


def _raw(g: GgufFile, name: str) -> bytes:
    t = g.tensors[name]
    assert g.path is not None
    with open(g.path, "rb") as f:
        f.seek(t.offset)
        return f.read(t.nbytes)


def _q8(w: np.ndarray) -> bytes:
    return np.ascontiguousarray(gguf.quants.quantize(np.asarray(w, np.float32), Q.Q8_0)).tobytes()


def _dequantized(key: str, entries: dict[str, TensorInfo], read: Callable[[TensorInfo, int, int], bytes],
                 k: int = 1) -> list[np.ndarray]:
    """``key`` through headplan's decode, in ``k`` row blocks (each with its rows of the scale)."""
    info = entries[key]
    scale = read_scale(key, entries, read)
    s = SliceRef(key, 0, info.nbytes, tuple(info.shape))
    step, rows = info.nbytes // k, info.shape[0] // k
    return [np.array(decode(info, read(info, j * step, (j + 1) * step), (rows, *info.shape[1:]),
                            block_scale(scale, j, k, s.shape))) for j in range(k)]


def test_the_head_is_stored_as_the_release_stores_it(src: Path) -> None:
    """The tiny source holds the release's formats: E8M0 ``.scale`` beside every FP8 matrix and
    every FP4 expert, which the plan reads with its weight and never as a tensor of its own."""
    entries, _ = _entries(src)
    head = {k: v for k, v in entries.items() if k.startswith("mtp.0.")}
    assert {v.dtype for v in head.values()} == {"F8_E4M3", "F8_E8M0", "I8", "BF16", "F32"}
    for k, v in head.items():
        if v.dtype in ("F8_E4M3", "I8"):
            assert scale_of(k, entries) == k.removesuffix(".weight") + ".scale", k
        assert is_scale(k, entries) == (v.dtype == "F8_E8M0"), k
    fetched = fetch_list([SliceRef("mtp.0.attn.wq_a.weight", 0, 1, (1,))], entries)
    assert [t.name for t in fetched] == ["mtp.0.attn.wq_a.scale", "mtp.0.attn.wq_a.weight"]


def test_e8m0_exponents_are_exact_powers_of_two() -> None:
    """127 is 1.0; every exponent a release uses maps to the exact float32 power of two (what the
    converter's ``torch.float8_e8m0fnu`` cast gives); 255 (E8M0's NaN) is not finite."""
    import mlx.core as mx

    e = np.arange(1, 255, dtype=np.uint8)
    got = np.array(e8m0_to_float(mx.array(e)))
    assert got.dtype == np.float32 and np.array_equal(got, np.float32(2.0) ** (e.astype(np.float32) - 127))
    assert not np.isfinite(np.array(e8m0_to_float(mx.array(np.array([255], np.uint8))))).any()


def test_the_fp8_matrices_dequantize_to_the_converters_q8_0_bytes(src: Path, ref: GgufFile) -> None:
    """Each block-FP8 matrix of the head, dequantized from its E8M0 scales and quantized Q8_0, is
    the converter's tensor byte for byte — whole, and in two row blocks of 128 where it has 256
    rows (the streaming path: each block with its own rows of the scale)."""
    entries, read = _entries(src)
    split = 0
    for bare, name in FP8_NAMES.items():
        key = "mtp.0." + bare
        want = _raw(ref, f"blk.{N}.{name}")
        assert ref.tensors[f"blk.{N}.{name}"].type == Q.Q8_0, name
        assert _q8(_dequantized(key, entries, read)[0]) == want, name
        if entries[key].shape[0] % 256 == 0:
            assert b"".join(_q8(b) for b in _dequantized(key, entries, read, 2)) == want, name
            split += 1
    assert split >= 1


def test_eh_proj_is_e_proj_beside_h_proj_in_q8_0(src: Path, ref: GgufFile) -> None:
    """The converter's ``nextn.eh_proj`` [H, 2H] is ``e_proj`` then ``h_proj`` along the input
    axis (the embedding half first, as every other NextN head), Q8_0 whatever the outtype."""
    entries, read = _entries(src)
    e, h = (_dequantized(f"mtp.0.{p}_proj.weight", entries, read)[0] for p in "eh")
    name = f"blk.{N}.nextn.eh_proj.weight"
    assert ref.tensors[name].type == Q.Q8_0
    assert _q8(np.concatenate([e, h], axis=1)) == _raw(ref, name)


def test_the_fp4_experts_repack_to_the_converters_mxfp4_bytes(src: Path, ref: GgufFile) -> None:
    """The routed experts stacked as the converter stacks them (expert by expert on the slowest
    axis): each expert's FP4 bytes and E8M0 exponents repacked to ggml's MXFP4 are its bytes —
    also one row block at a time (rows are independent)."""
    entries, read = _entries(src)
    E = json.loads((src / "config.json").read_text())["n_routed_experts"]
    for w, name in EXPERT_NAMES.items():
        t = ref.tensors[f"blk.{N}.{name}"]
        assert t.type == Q.MXFP4, name
        whole, blocks = [], []
        for x in range(E):
            wi, si = entries[f"mtp.0.ffn.experts.{x}.{w}.weight"], entries[f"mtp.0.ffn.experts.{x}.{w}.scale"]
            p = np.frombuffer(read(wi, 0, wi.nbytes), np.uint8).reshape(wi.shape)
            s = np.frombuffer(read(si, 0, si.nbytes), np.uint8).reshape(si.shape)
            whole.append(repack_mxfp4(p, s).tobytes())
            half = p.shape[0] // 2
            blocks += [repack_mxfp4(p[:half], s[:half]).tobytes(), repack_mxfp4(p[half:], s[half:]).tobytes()]
        assert b"".join(whole) == b"".join(blocks) == _raw(ref, f"blk.{N}.{name}"), name


@pytest.mark.parametrize("qtype", ["f32", "Q8_0", "Q4_K_M"])
def test_llama_server_drafts_with_the_converters_mtp_file(src: Path, qtype: str, tmp_path: Path) -> None:
    """llama.cpp's ``deepseek4`` MTP graph runs: with the converter's MTP-only file beside a
    ``--no-mtp`` trunk llama-server drafts, and the output is the plain decoding's, token for token
    (the reference mtpforge's sibling will be held to)."""
    gguf_env.need("server")
    trunk = _trunk(src, tmp_path, qtype)
    mtp = official(src, "mtp", "f32", pre=PRE)
    texts = gguf_env.prompts()[:2]
    plain, spec = gguf_env.measure(trunk, texts=texts), gguf_env.measure(trunk, draft=mtp, texts=texts)
    assert spec["tokens"] == plain["tokens"] and spec["drafted"] > 0, (plain, spec)


def test_the_mtp_file_equals_the_converters_mtp_export(src: Path, tmp_path: Path) -> None:
    """Everything ``--mtp`` writes (tensors, values, metadata: ``general.file_type`` 38, the
    SwiGLU clamps extended by the MTP block), from the ``--no-mtp`` trunk and the head's bytes;
    the trunk is only read."""
    r, ref = judged.equals_mtp_export(src, _trunk(src, tmp_path, "f32"), PRE)
    assert r["family"] == "deepseek_v4" and r["architecture"] == "deepseek4" and r["expert_format"] == "per-expert"
    block = {k.split(".", 2)[2] for k in ref.tensors if block_of(k) == N}
    assert len(block) == BLOCK and r["mtp_tensors"] == BLOCK + len(ROOT) and set(ROOT) <= set(ref.tensors)
    assert len(ref.tensors) == 3 + BLOCK + len(ROOT)
    assert {"nextn.eh_proj.weight", "attn_output_a.weight", "hc_attn_fn.weight", "ffn_gate_exps.weight"} <= block
    assert ref.get("{arch}.nextn_predict_layers") == 1 and ref.get("{arch}.block_count") == N + 1
    assert ref.get("general.file_type") == 38 and ref.get("{arch}.swiglu_clamp_exp") == [10.0] * (N + 1)


@pytest.mark.parametrize("precision", ["f16", "bf16", "q8_0"])
def test_the_mtp_block_equals_the_converters_at_every_precision(src: Path, precision: str, tmp_path: Path) -> None:
    """The converter writes DeepSeek-V4's types from the source's whatever ``--outtype`` says
    (Q8_0 from FP8, MXFP4 from FP4, BF16 / F32 as stored), and so does add-mtp whatever
    ``--precision`` says: the block and the output hyper-connection are byte for byte its."""
    judged.block_equals_converters(src, _trunk(src, tmp_path, "f32"), PRE, precision, N, BLOCK)
    ours = read_local(next(tmp_path.glob(f"mtp-*-{precision.upper()}.gguf")))
    ref = read_local(official(src, "mtp", precision, pre=PRE))
    for k in ROOT:
        assert (ours.tensors[k].type, _raw(ours, k)) == (ref.tensors[k].type, _raw(ref, k)), k


class TestConverterJudged(judged.ConverterJudged):
    """llama-server's drafting on f32 / Q8_0 / Q4_K_M trunks, the hub's bytes. The converter never
    appends the head to a trunk (``gguf-tail``), and add-mtp refuses to: llama.cpp holds one
    ``output_hc_*`` per file, and the trunk's and the head's differ."""

    pre = PRE

    def trunk(self, src: Path, dst: Path, qtype: str = "f32") -> Path:
        return _trunk(src, dst, qtype)

    def test_the_tail_equals_the_converters_full_file(self, src: Path, tmp_path: Path) -> None:
        trunk = self.trunk(src, tmp_path)
        r = mtpforge("add-mtp", "--source", str(src), "--target", str(trunk), "--layout", "gguf-tail",
                     "--output", str(tmp_path / "with-tail.gguf"))
        (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert r.returncode == 1 and "output_hc_fn.weight" in line and "--layout" in line, r.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == [trunk.name]


def test_the_drafting_comparison_sees_a_misread_block(src: Path, tmp_path: Path) -> None:
    """The tiny head drafts (tests/support/synth/deepseek_v4.py ``_drafting``), so equal
    accepted counts mean something: with ``eh_proj``'s embedding and hidden halves read the other
    way round, llama-server accepts a small fraction of what it accepts with mtpforge's block."""
    gguf_env.need("server")
    trunk = _trunk(src, tmp_path, "f32")
    ours = Path(judged.add_mtp(trunk, src)["output"])
    good, wrong = judged.drafts_with_eh_proj_halves_swapped(trunk, ours, tmp_path)
    assert good["acceptance"] > 0.5 and wrong["acceptance"] < good["acceptance"] / 4, (good, wrong)


def test_an_fp4_expert_with_a_nan_exponent_is_refused(src: Path, tmp_path: Path) -> None:
    """E8M0's 255 stands for NaN: an expert whose exponents hold it is refused in one line
    (``SOURCE_NONFINITE``) though its bytes are only moved, never dequantized; nothing written."""
    import shutil

    bad = tmp_path / "src"
    shutil.copytree(src, bad)
    entries, _ = _entries(bad)
    info = entries["mtp.0.ffn.experts.1.w2.scale"]
    with open(bad / info.file, "r+b") as f:
        f.seek(info.begin)
        f.write(b"\xff")
    trunk = _trunk(src, tmp_path / "t", "f32")
    r = mtpforge("add-mtp", "--source", str(bad), "--target", str(trunk), "--json")
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 1 and "mtp.0.ffn.experts.1.w2" in line and "NaN" in line, r.stderr
    assert json.loads(r.stdout)["error"]["code"] == "SOURCE_NONFINITE"
    assert sorted(p.name for p in trunk.parent.iterdir()) == [trunk.name]


def test_inspect_verify_and_remove_mtp_speak_of_the_deepseek_v4_head(src: Path, tmp_path: Path) -> None:
    """inspect finds the head-less trunk and names DeepSeek-V4's release; after add-mtp it finds a
    clean head with raw norms (the ``e_proj`` / ``h_proj`` pair expected as one ``eh_proj``);
    the release itself is a source, its E8M0 ``.scale`` tensors part of their weights' modules;
    verify decodes identically with the head through llama-server; remove-mtp leaves the trunk as
    the converter wrote it."""
    trunk = _trunk(src, tmp_path, "f32")
    before = gguf_env.sha256(trunk)
    code, rep = judged.inspect_json(trunk)
    (f,) = rep["findings"]
    assert rep["family"] == "deepseek_v4" and f["code"] == "MTP_HEAD_MISSING" and str(trunk) in f["fix"]
    assert "deepseek-ai/DeepSeek-V4-Flash" in f["fix"]
    judged.add_mtp(trunk, src)
    code, rep = judged.inspect_json(trunk, "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-mtp" and rep["norm_convention"] == "raw"
    assert rep["mtp_tensors"] == BLOCK and rep["expert_format"] == "stacked"
    code, rep = judged.inspect_json(src)
    assert {f["code"] for f in rep["findings"]} <= {"HF_SOURCE_CHECKPOINT", "EOS_PAD_INCONSISTENT"}, rep["findings"]
    if (gguf_env.BIN / "llama-server").is_file():
        r = mtpforge("verify", str(trunk), "--json", "--max-tokens", "16", "--prompt", "Count: 3, 4, 5, 6, 7, 8.")
        v = json.loads(r.stdout)
        assert r.returncode == 0 and v["identical"] is True and v["drafted"] > 0, r.stderr
    r = mtpforge("remove-mtp", str(trunk), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "removed", r.stderr
    assert sorted(p.name for p in trunk.parent.iterdir()) == [trunk.name] and gguf_env.sha256(trunk) == before


def test_a_dead_heads_precision_cause_does_not_blame_the_releases_fp4_experts(ref: GgufFile) -> None:
    """Verify's dead-head causes: the MXFP4 experts are the release's own bytes at every
    ``--precision``, so advice to re-create the head at f16 would change nothing there; a head
    whose other matrices are full is "full enough" (its values are what is off)."""
    from mtpforge.gguf.verify import _dead_head

    dead = _dead_head(0.01, 200, ref, 0, "post")
    assert dead is not None and "MXFP4" in dead["head_types"], dead
    assert "full enough" in dead["causes"][0] and "the release's own FP4 experts" in dead["causes"][0]
    assert "--precision f16" not in dead["message"]
