"""The tiny Step-3.5 checkpoint (tests/support/synth/step3p5.py) holds the facts
docs/families/step3p5.md says were measured with llama.cpp's own converter (skipped where it is
not built): ``--mtp`` keeps the appended layers ``blk.{N+k}`` plus the trunk's embedding, output
norm and output; ``--no-mtp`` drops them and the MTP metadata; every norm is written +1 (the
release stores them zero-centred), every other tensor as stored; the per-layer arrays are
extended per MTP layer (sliding-window head counts, pattern ``True``, SwiGLU clamps ``0.0``);
and llama-server drafts with the MTP-only file, its output identical to the trunk alone.

The converter runs with ``--raw-config``: measured, transformers 5.24 maps ``step3p5`` to
``Step3p7TextConfig``, whose ``to_dict()`` lacks ``num_attention_groups`` (and the MoE keys)
that conversion/step3.py reads, so the unmodified run stops with ``KeyError``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import gguf_env
from tests.support.synth.step3p5 import build_step3p5, mtp_keys, tiny_config

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)

ARCH = "step35"
#: per MTP layer k, the block ``blk.{N+k}`` the converter writes (measured)
BLOCK = ("nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm", "nextn.shared_head_head",
         "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm", "attn_gate",
         "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
SHARED = {"token_embd.weight", "output.weight", "output_norm.weight"}
#: source key (after ``model.layers.{N+k}.``) -> GGUF name (after ``blk.{N+k}.``); the norms are +1
NORMS = {"enorm.weight": "nextn.enorm.weight", "hnorm.weight": "nextn.hnorm.weight",
         "transformer.shared_head.norm.weight": "nextn.shared_head_norm.weight",
         "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
         "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight"}
AS_STORED = {"eh_proj.weight": "nextn.eh_proj.weight", "transformer.shared_head.output.weight": "nextn.shared_head_head.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.g_proj.weight": "attn_gate.weight", "mlp.down_proj.weight": "ffn_down.weight"}


def mtp_names(n: int, k: int) -> set[str]:
    return SHARED | {f"blk.{n + j}.{t}.weight" for j in range(k) for t in BLOCK}


#: cases whose checks do not depend on the layer count run once, on one layer (its prefix names
#: exactly the head's tensors); those that judge every layer run on three, which cover one (MTPLX
#: loads and drafts a one-layer head in tests/test_step3p5_trained.py, trained)
ONE_LAYER = pytest.mark.parametrize("step", [1], ids=["k1"], indirect=True)
THREE_LAYERS = pytest.mark.parametrize("step", [3], ids=["k3"], indirect=True)


@pytest.fixture(scope="module", params=[1, 3], ids=["k1", "k3"])
def step(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    k = request.param
    return build_step3p5(tmp_path_factory.mktemp("step3p5") / f"tiny-step3p5-k{k}", num_nextn_predict_layers=k), k


def test_head_layout(step: tuple[Path, int]) -> None:
    folder, k = step
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "step3p5" and cfg["num_nextn_predict_layers"] == k
    assert len(cfg["layer_types"]) == cfg["num_hidden_layers"] + k
    keys = set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"])
    head = {x for x in keys if x.startswith("model.layers.") and int(x.split(".")[2]) >= 2}
    assert head == set(mtp_keys(tiny_config(num_nextn_predict_layers=k)))
    assert "model.layers.2.transformer.shared_head.output.weight" in head and "model.layers.2.mlp.up_proj.weight" in head


def _source(folder: Path) -> dict[str, np.ndarray]:
    import mlx.core as mx

    return {k: np.array(v.astype(mx.float32)) for f in sorted(folder.glob("model*.safetensors"))
            for k, v in mx.load(str(f)).items() if k.startswith("model.layers.2.")}


def _convert(folder: Path, tmp: Path, mode: str) -> Path:
    from tests.support import family_probe as fp

    c = fp.convert(folder, tmp, mode, pre="qwen35", raw_config=True)
    assert c["rc"] == 0, c.get("error")
    return Path(c["file"])


@ONE_LAYER
def test_converter_needs_the_raw_config(step: tuple[Path, int], tmp_path: Path) -> None:
    gguf_env.need("converter")
    from tests.support import family_probe as fp

    folder, k = step
    c = fp.convert(folder, tmp_path, "mtp", pre="qwen35")
    assert c["rc"] != 0 and "KeyError: 'num_attention_groups'" in c["error"]


def test_llama_cpp_mtp_file_and_draft(step: tuple[Path, int], tmp_path: Path) -> None:
    gguf_env.need("converter")
    from tests.support import family_probe as fp

    folder, k = step
    n = 2
    mtp = _convert(folder, tmp_path, "mtp")
    trunk = _convert(folder, tmp_path, "trunk")
    s, t = fp.gguf_summary(mtp), fp.gguf_summary(trunk)
    assert set(s["tensors"]) == mtp_names(n, k)
    assert not any(x.startswith(f"blk.{n}.") for x in t["tensors"])
    kv, tkv = s["kv"], t["kv"]
    assert kv["general.architecture"] == ARCH and kv[f"{ARCH}.nextn_predict_layers"] == k
    assert f"{ARCH}.nextn_predict_layers" not in tkv
    assert (tkv[f"{ARCH}.block_count"], kv[f"{ARCH}.block_count"]) == (n, n + k)
    # the per-layer arrays grow by one sliding-window entry per MTP layer
    assert kv[f"{ARCH}.attention.head_count"] == [2, 4] + [4] * k
    assert kv[f"{ARCH}.attention.head_count_kv"] == [1, 2] + [2] * k
    assert kv[f"{ARCH}.attention.sliding_window_pattern"] == [False, True] + [True] * k
    assert kv[f"{ARCH}.swiglu_clamp_exp"] == [0.0, 7.0] + [0.0] * k
    assert kv[f"{ARCH}.swiglu_clamp_shexp"] == [0.0] * (n + k)
    # nextn_predict_layers is the family's last key, before general.quantization_version
    keys = list(kv)
    i = keys.index(f"{ARCH}.nextn_predict_layers")
    assert keys[i - 1] == f"{ARCH}.swiglu_clamp_shexp" and keys[i + 1] == "general.quantization_version"
    # the rest of the metadata is the trunk's
    grown = {f"{ARCH}.{x}" for x in ("block_count", "attention.head_count", "attention.head_count_kv",
                                     "attention.sliding_window_pattern", "swiglu_clamp_exp", "swiglu_clamp_shexp")}
    same = [x for x in tkv if x not in grown | {"GGUF.tensor_count", "GGUF.kv_count", "general.size_label"}]
    assert {x: kv[x] for x in same} == {x: tkv[x] for x in same}
    # norms +1, everything else as stored (f32)
    src = _source(folder)
    for a, b in {**NORMS, **AS_STORED}.items():
        want = src["model.layers.2." + a]
        got = fp.gguf_tensor(mtp, "blk.2." + b).reshape(want.shape)
        assert np.array_equal(got, want + 1.0 if a in NORMS else want), a
    gguf_env.need("server")
    runs = fp.llama_server_runs(trunk, mtp, None, n_predict=8, prompts=fp.PROMPTS[:2])
    assert runs["draft_mtp_file"]["ok"], runs["draft_mtp_file"].get("error")
    assert runs["draft_mtp_file"]["drafted"] > 0
    assert runs["draft_mtp_file"]["identical_to_plain"]


# ----------------------------------------------------------------------------- MLX (MTPLX's step3p5_mtp)

#: the head's draft at every position of a fixed sequence, in MTPLX 2.12.2's own model (its
#: ``mtp_forward`` over the whole sequence with a fresh head cache), with each trunk hidden variant
HEAD_PREDS = """
import json, sys
sys.path.insert(0, sys.argv[2])
import standins
standins.libsystem()
import mlx.core as mx
from mtplx import runtime as R
rt = R.load(sys.argv[1], mtp=True)
seq = mx.array([json.loads(sys.argv[3])])
out = {}
for v in ("pre_norm", "post_norm"):
    _, hidden = rt.model(seq, cache=None, return_hidden=True, hidden_variant=v)
    lg = rt.model.mtp_forward(hidden[:, :-1], seq[:, 1:], mtp_cache=rt.model.make_mtp_cache())
    out[v[:-5]] = mx.argmax(lg[0], axis=-1).tolist()
# a chain of CHAIN drafts after every prefix: depth 1 over the prefix's pairs, then each depth fed
# the last one's hidden and draft, in the layer and cache MTPLX picks for the depth
out["chain"] = []
for t in range(1, seq.shape[1]):
    caches = rt.model.make_mtp_cache()
    lg, h = rt.model.mtp_forward(hidden[:, :t], seq[:, 1:t + 1], mtp_cache=caches, return_hidden=True, mtp_depth=1)
    drafts = [mx.argmax(lg[:, -1:], axis=-1)]
    h = h[:, -1:]
    for j in range(2, int(sys.argv[4]) + 1):
        lg, h = rt.model.mtp_forward(h, drafts[-1], mtp_cache=caches, return_hidden=True, mtp_depth=j)
        drafts.append(mx.argmax(lg, axis=-1))
    out["chain"].append([d.item() for d in drafts])
print(json.dumps(out))
"""
SEQ = [5, 17, 99, 230, 12, 40, 41, 42, 7, 300, 301, 8, 9, 10, 11, 250, 3, 77, 91, 400]
#: drafts a round in the chained comparison: past the three layers, so depth 4 is layer 0 again
CHAIN = 4


@pytest.fixture(scope="module")
def mlx_target(step: tuple[Path, int], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real ``mlx_lm.convert`` of the tiny checkpoint (4-bit): mlx-lm 0.32's ``step3p5``
    sanitize drops every appended MTP layer and keeps ``num_nextn_predict_layers``."""
    from tests.support.synth import convert_to_mlx

    src, k = step
    mlx = convert_to_mlx(src, tmp_path_factory.mktemp("step-mlx") / "tiny-step3p5-4bit", q_bits=4, q_group_size=32,
                         dtype="float32")
    assert json.loads((mlx / "config.json").read_text())["num_nextn_predict_layers"] == k
    return mlx


def _decoder_preds(folder: Path) -> dict[str, list[Any]]:
    """verify's decoder (mtpforge's backbone and head) on ``SEQ``: the head's greedy draft at
    every position, with each hidden variant, and the decode loop's drafter's chain of ``CHAIN``
    drafts after every prefix."""
    import mlx.core as mx

    from mtpforge.decoder.backbone import load_backbone
    from mtpforge.decoder.head import build_head
    from mtpforge.decoder.loop import HeadDrafter
    from mtpforge.decoder.sampling import Chooser
    from mtpforge.layouts.read import load_head_weights

    hw = load_head_weights(folder)
    bb = load_backbone(folder, hw.family)
    head = build_head(hw.family, bb.args, hw.tensors, hw.quant, compute_dtype=bb.dtype)
    out: dict[str, list[Any]] = {}
    for v in ("pre", "post"):
        _, h = bb(SEQ, bb.make_cache(), v)
        z = head(h[:, :-1], bb.embed(SEQ[1:]), cache=head.make_cache())
        out[v] = mx.argmax(head.logits(z, bb)[0], axis=-1).tolist()
    drafter = HeadDrafter(bb, head)  # the decode loop's drafter, on the post-norm states of the last v
    out["chain"] = []
    for t in range(1, len(SEQ)):
        drafter.reset()
        drafts, _ = drafter.draft(h[:, :t], SEQ[1:t + 1], CHAIN, Chooser())
        out["chain"].append(drafts.tolist())
    return out


@pytest.mark.xdist_group("conformance")
@THREE_LAYERS
def test_add_mtp_writes_every_mtp_layer_as_mtplx_loads_and_drafts_it(step: tuple[Path, int], mlx_target: Path,
                                                                     tmp_path: Path) -> None:
    """inspect finds the head ``mlx_lm.convert`` dropped and names add-mtp; plain add-mtp writes
    ``mtp.safetensors`` with the source's own ``model.layers.{N+i}.*`` keys for every MTP layer,
    bf16, the seven norms +1 (mlx-lm's ``ZeroCenteredRMSNorm`` multiplies as stored), everything
    else byte for byte; MTPLX's ``step3p5_mtp`` loads it (MTP enabled), drafts and decodes as its
    plain decode; inspect --runtime mtplx finds nothing; verify decodes as plain greedy decoding,
    and its head drafts what MTPLX's head drafts at every position, with either hidden variant
    (the two variants draft differently, so the comparison can fail), also past the sliding window;
    ``--runtime mtplx`` writes the same bytes."""
    from tests import mlx_judged as judged

    judged.require_mtplx()
    src, k = step
    n = tiny_config(num_nextn_predict_layers=k)["num_hidden_layers"]
    judged.inspect_finds_the_dropped_head(mlx_target, "step3p5", "stepfun-ai/Step-3.5-Flash")
    got = judged.mtplx_judges_the_head(src, mlx_target, tmp_path / "plain", [])
    folder = tmp_path / "plain"
    assert got["add"]["mtp_tensors"] == 17 * k and got["mtplx"]["model"] == "_MTPLXStepModel", got
    assert got["verify"]["identical"] and got["verify"]["drafted"] > 0, got["verify"]
    stored = judged.source_tensors(folder, "mtp.safetensors")
    source = {key: v for key, v in judged.source_tensors(src).items()
              if any(key.startswith(f"model.layers.{n + i}.") for i in range(k))}
    assert set(stored) == set(source) and len(source) == 17 * k
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["mlx_lm_extra_tensors"] == {"mtp_file": "mtp.safetensors", "mtp_tensor_count": 17 * k}
    for key, want in source.items():
        bare = key.split(".", 3)[3]
        if bare in NORMS:  # bf16 bit patterns: the source + 1 in float32, rounded to bf16
            want = _bf16_bits(_from_bf16_bits(want) + 1.0)
        np.testing.assert_array_equal(stored[key], want, err_msg=key)
    mine, theirs = _decoder_preds(folder), json.loads(
        judged.mtplx_run(HEAD_PREDS, folder, json.dumps(SEQ), str(CHAIN)).stdout.strip().splitlines()[-1])
    assert mine == theirs and mine["pre"] != mine["post"], (mine, theirs)
    # every depth in the layer MTPLX runs there (layer 0 again at depth 4), each with its own
    # shared head and cache: re-applying layer 0 at every depth drafted MTPLX's depth-1 token at
    # all 19 positions and none of its deeper ones
    assert len(mine["chain"]) == len(SEQ) - 1 and {len(c) for c in mine["chain"]} == {CHAIN}
    # past the sliding window (128 in the tiny config), three drafts a round (one a layer): the
    # rollback trims every cache
    v = judged.mtpforge("verify", str(folder), "--generate", "--json", "--max-tokens", "160", "--hidden", "pre",
                        "--depth", "3", "--prompt", "The cat sees the red ball in the garden and")
    assert v.returncode == 0 and json.loads(v.stdout)["identical"] is True, v.stdout + v.stderr
    shutil.copytree(mlx_target, tmp_path / "runtime")
    judged.add_mtp(src, tmp_path / "runtime", "--runtime", "mtplx")
    assert (tmp_path / "runtime" / "mtp.safetensors").read_bytes() == (folder / "mtp.safetensors").read_bytes()


def _from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, rounded to nearest even (as MLX casts)."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.xdist_group("conformance")
@ONE_LAYER
def test_a_quantized_head_and_the_runtimes_that_do_not_draft_it(step: tuple[Path, int], mlx_target: Path,
                                                                tmp_path: Path) -> None:
    """MTPLX's ``step3p5_mtp`` builds float linears and checks the stored names and shapes against
    them before anything could quantize them: a 4-bit head fails its load (measured, in its own
    words), add-mtp says so before writing and inspect --runtime mtplx reports it as an error. The
    other MLX runtimes have no MTP path for Step-3.5, each in its own words."""
    from tests import mlx_judged as judged

    judged.require_mtplx()
    src, k = step
    folder = tmp_path / "q4"
    shutil.copytree(mlx_target, folder)
    rep = judged.add_mtp(src, folder, "--runtime", "mtplx", "--precision", "4")
    words = "Step MTP overlay does not match runtime module tree"
    assert any(x.startswith("will not work in mtplx") and words in x for x in rep["notes"]), rep["notes"]
    codes = {f["code"]: f for f in json.loads(judged.mtpforge("inspect", str(folder), "--json", "--runtime",
                                                               "mtplx").stdout)["findings"]}
    assert codes["RUNTIME_QUANT_UNSUPPORTED"]["severity"] == "error", codes
    p = judged.mtplx_run(judged.MTPLX_PROBE, folder)
    assert p.returncode != 0 and words in p.stderr and "extra=['layers.0.eh_proj.biases'" in p.stderr, p.stderr[-800:]
    for runtime in ("vllm-mlx", "mlx-vlm", "exo", "omlx", "mlx-lm-mtp"):
        judged.runtime_says_it_does_not_draft(src, mlx_target, tmp_path / "nodraft", runtime, "step3p5", "Step-3.5")


@THREE_LAYERS
def test_norms_left_raw_or_shifted_twice_are_found_and_repaired(step: tuple[Path, int], mlx_target: Path,
                                                                tmp_path: Path) -> None:
    """The head's seven norm kinds are zero-centred in the release and +1 in the MLX head: a head
    whose norms were left raw or shifted a second time (every MTP layer's) is found by inspect
    --source, and repair-norms --source puts back exactly the tensors add-mtp wrote. (MTPLX itself
    adds 1 to a stored norm whose mean is below 0.5: that rescues a raw head of small norms, and
    inspect --runtime mtplx warns that it re-shifts.)"""
    import mlx.core as mx

    from tests import mlx_judged as judged

    src, k = step
    good = tmp_path / "good"
    shutil.copytree(mlx_target, good)
    judged.add_mtp(src, good)
    written = mx.load(str(good / "mtp.safetensors"))
    for name, delta, code in (("raw", -1.0, "MTP_NORMS_RAW"), ("double", 1.0, "MTP_NORMS_DOUBLE_SHIFTED")):
        folder = tmp_path / name
        shutil.copytree(good, folder)
        w = {key: (v.astype(mx.float32) + delta).astype(v.dtype) if key.endswith("norm.weight") else v
             for key, v in written.items()}
        mx.save_safetensors(str(folder / "mtp.safetensors"), w, metadata={"format": "mlx"})
        r = judged.mtpforge("inspect", str(folder), "--json", "--source", str(src))
        rep = json.loads(r.stdout)
        assert r.returncode == 1 and [f["code"] for f in rep["findings"]] == [code], rep["findings"]
        if name == "raw":
            r = judged.mtpforge("inspect", str(folder), "--json", "--runtime", "mtplx")
            assert "RUNTIME_RESHIFTS_NORMS" in {f["code"] for f in json.loads(r.stdout)["findings"]}, r.stdout
        r = judged.mtpforge("repair-norms", str(folder), "--source", str(src), "--json")
        fixed = json.loads(r.stdout)
        assert r.returncode == 0 and fixed["evidence"] == "source" and len(fixed["changed_norms"]) == 7 * k, fixed
        got = mx.load(str(folder / "mtp.safetensors"))
        assert all(mx.array_equal(got[key], v).item() for key, v in written.items())
        r = judged.mtpforge("inspect", str(folder), "--json", "--source", str(src))
        assert r.returncode == 0 and json.loads(r.stdout)["findings"] == [], r.stdout


@ONE_LAYER
def test_add_mtp_from_the_hub_fetches_only_the_mtp_layers(step: tuple[Path, int], mlx_target: Path, hub,
                                                          tmp_path: Path) -> None:
    """From the (loopback) Hub only the appended MTP layer's tensors come over the wire (≤ 1.01 ×
    their bytes), and the sidecar equals the one written from the local source, byte for byte."""
    from tests import mlx_judged as judged

    src, k = step
    n = tiny_config(num_nextn_predict_layers=k)["num_hidden_layers"]
    got = judged.hub_fetches_only_the_sidecars_tensors(hub, src, mlx_target, tmp_path, f"model.layers.{n}.", ())
    assert got["fetched"] <= 1.01 * got["head"]
