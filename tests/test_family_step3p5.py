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
from pathlib import Path

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


def test_converter_needs_the_raw_config(step: tuple[Path, int], tmp_path: Path) -> None:
    gguf_env.need("converter")
    from tests.support import family_probe as fp

    folder, k = step
    if k != 1:
        pytest.skip("once is enough")
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


@pytest.mark.xdist_group("conformance")
def test_mlx_lm_convert_drops_the_mtp_layers_and_mtplx_drafts_from_a_sidecar_of_them(step: tuple[Path, int],
                                                                                   tmp_path: Path) -> None:
    """mtpforge writes this family for llama.cpp only; what a user of an MLX folder can do today,
    measured: ``mlx_lm.convert`` drops every appended MTP layer and keeps
    ``num_nextn_predict_layers``; inspect finds that and its fix names the MLX runtime that drafts
    the head (MTPLX 2.12.2's ``step3p5_mtp``), which loads an ``mtp.safetensors`` of the source's
    own ``model.layers.{N+i}.*`` tensors, drafts, and decodes exactly as its plain decode; inspect
    reads such a folder (the head in the sidecar, every step's tensors counted) and verify says
    in one line that it cannot decode this family's head from an MLX folder."""
    import mlx.core as mx

    from mtpforge.families import FAMILIES
    from tests import mlx_judged as judged
    from tests.support.synth import convert_to_mlx

    judged.require_mtplx()
    src, k = step
    n = tiny_config(num_nextn_predict_layers=k)["num_hidden_layers"]
    mlx = convert_to_mlx(src, tmp_path / "tiny-step3p5-4bit", q_bits=4, q_group_size=32, dtype="float32")
    assert json.loads((mlx / "config.json").read_text())["num_nextn_predict_layers"] == k
    rep = json.loads(judged.mtpforge("inspect", str(mlx), "--json").stdout)
    (f,) = rep["findings"]
    assert f["code"] == "MTP_CONFIG_WITHOUT_WEIGHTS" and "MTPLX 2.12.2 drafts it" in f["fix"], f
    assert f["fix"].endswith(FAMILIES["step3p5"].mlx_drafted_by or "-")
    head = {key: v for shard in sorted(src.glob("model*.safetensors")) for key, v in mx.load(str(shard)).items()
            if any(key.startswith(f"model.layers.{n + i}.") for i in range(k))}  # as stored: bf16
    assert {v.dtype for v in head.values()} == {mx.bfloat16}
    assert len(head) == 17 * k
    mx.save_safetensors(str(mlx / "mtp.safetensors"), head, metadata={"format": "mlx"})
    cfg = json.loads((mlx / "config.json").read_text())
    cfg["mlx_lm_extra_tensors"] = {"mtp_file": "mtp.safetensors", "mtp_tensor_count": len(head)}
    (mlx / "config.json").write_text(json.dumps(cfg))
    got = judged.mtplx_drafts(mlx)
    assert got["mtp_enabled"] and got["model"] == "_MTPLXStepModel" and got["identical"] and got["drafted"] > 0, got
    # inspect reads the folder so made (it used to stop with an internal error: no MLX placement)
    # (no MLX convention of mtpforge's to hold its norms to: MTPLX takes the release's raw norms)
    for extra in ((), ("--runtime", "mtplx"), ("--source", str(src)), ("--source", str(src), "--runtime", "mtplx")):
        r = judged.mtpforge("inspect", str(mlx), "--json", *extra)
        rep = json.loads(r.stdout)
        assert r.returncode == 0 and rep["layout"] == "sidecar" and rep["mtp_tensors"] == 17 * k, (extra, rep)
        assert rep["findings"] == [], (extra, rep["findings"])
    assert rep["norm_convention"] == "raw"
    # verify says in one line that its decoder has no head for this family (it said the head did
    # not fit the backbone, listing 17 keys a line)
    r = judged.mtpforge("verify", str(mlx))
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert r.returncode == 1 and "for llama.cpp only" in line and "mtpforge verify TRUNK.gguf" in line, r.stderr
    assert "Traceback" not in r.stderr and "MTP_SHAPE_MISMATCH" not in r.stderr, r.stderr
    # and repair-norms refuses in one line, touching nothing (it stopped with an internal error)
    before = {f.name: f.read_bytes() for f in mlx.iterdir() if f.is_file()}
    r = judged.mtpforge("repair-norms", str(mlx))
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert r.returncode == 1 and "for llama.cpp only" in line and "Traceback" not in r.stderr, r.stderr
    assert {f.name: f.read_bytes() for f in mlx.iterdir() if f.is_file()} == before
