"""Qwen3.8-Flash-Next (``qwen4_exp``) heads as mlx-vlm's drafter, judged by mlx-vlm's own code.

The tiny checkpoint (tests/support/synth/qwen4_exp.py: hyper-connections, Gated DeltaNet and
Qwen Sparse Attention layers, fused MoE experts, the 31-tensor ``mtp.*`` head, a Qwen3-VL vision
tower) is converted by mlx-vlm 0.7.10's own ``convert`` (4-bit, group 32; it drops ``mtp.*`` as
the published quants do; mlx-lm has no ``qwen4_exp`` model, so mlx-lm's convert cannot). add-mtp
``--runtime mlx-vlm`` writes ``<model>-mtp-drafter``; mlx-vlm's ``load_drafter`` builds its
``Qwen4ExpMTPDraftModel`` from it (every parameter equal to a stored tensor, dtype included, none
missing or unused) and its ``stream_generate`` drafts with it and decodes exactly as plain; at
``--precision bf16`` every parameter equals the drafter mlx-vlm's own ``Qwen4ExpMTPSplitter``
builds from the whole source checkpoint (``load_drafter`` on the source folder). From the
(loopback) Hub only the head's bytes are fetched.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests import mlx_judged as judged
from tests import mlx_vlm_judged as vlm

EXAMPLE = "Qwen/Qwen3.8-Flash-Next"
HEAD_TENSORS = 31


@pytest.fixture(scope="module")
def qwen4(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.support.synth.qwen4_exp import build_qwen4_exp

    root = tmp_path_factory.mktemp("qwen4_exp")
    src = build_qwen4_exp(root / "tiny-qwen4_exp")
    return {"root": root, "src": src, "mlx": vlm.convert(src, root / "tiny-qwen4_exp-4bit")}


def test_the_tiny_release_has_the_heads_31_tensors_and_mlx_vlm_convert_drops_them(qwen4) -> None:
    """The source spreads ``mtp.*`` (31 tensors) over its last two shards between backbone
    tensors; mlx-vlm's convert keeps the declared ``mtp_num_hidden_layers`` and drops the
    tensors; inspect finds the missing head and names the add-mtp command."""
    from safetensors import safe_open

    index = json.loads((qwen4["src"] / "model.safetensors.index.json").read_text())["weight_map"]
    head = {k: f for k, f in index.items() if k.startswith("mtp.")}
    assert len(head) == HEAD_TENSORS and len(set(head.values())) == 2
    assert all(any(not k.startswith("mtp.") for k, g in index.items() if g == f) for f in set(head.values()))
    with safe_open(str(qwen4["mlx"] / "model.safetensors"), "np") as f:
        assert not [k for k in f.keys() if "mtp." in k]
    assert json.loads((qwen4["mlx"] / "config.json").read_text())["text_config"]["mtp_num_hidden_layers"] == 1
    judged.inspect_finds_the_dropped_head(qwen4["mlx"], "qwen4_exp", EXAMPLE)


@pytest.mark.xdist_group("conformance")
def test_mlx_vlm_drafts_with_the_drafter_mtpforge_writes(qwen4) -> None:
    """``<target>-mtp-drafter`` (``model_type`` ``qwen4_exp_mtp``, bare keys, experts stacked,
    every matrix at the model's 4 bits but the routers): mlx-vlm 0.7.10's ``load_drafter`` builds
    its ``Qwen4ExpMTPDraftModel`` from it, every parameter equal to a stored tensor, none missing
    or unused; its speculative ``stream_generate`` drafts and decodes exactly as its plain one;
    inspect --runtime mlx-vlm finds no error."""
    from safetensors import safe_open

    folder = qwen4["root"] / "vlm-runtime"
    shutil.copytree(qwen4["mlx"], folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    rep = judged.add_mtp(qwen4["src"], folder, "--runtime", "mlx-vlm")
    drafter = folder.parent / f"{folder.name}-mtp-drafter"
    assert rep["layout"] == "mlx-vlm-drafter" and rep["family"] == "qwen4_exp" and rep["output"] == str(drafter), rep
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # the model folder is untouched
    cfg = json.loads((drafter / "config.json").read_text())
    assert cfg["model_type"] == "qwen4_exp_mtp" and cfg["text_config"]["mtp_num_hidden_layers"] == 1
    assert cfg["text_config"]["hc_count"] == 2 and cfg["quantization"] == {"group_size": 32, "bits": 4, "mode": "affine"}
    with safe_open(str(drafter / "model.safetensors"), "np") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    keys = set(shapes)
    weights = {k[: -len(".weight")] for k, s in shapes.items() if k.endswith(".weight") and len(s) > 1}
    quantized = {k[: -len(".scales")] for k in keys if k.endswith(".scales")}
    assert quantized == weights - {"layers.0.mlp.gate", "layers.0.mlp.shared_expert_gate"}, weights - quantized
    assert "layers.0.mlp.switch_mlp.gate_proj.weight" in keys and not [k for k in keys if "experts." in k]
    got = vlm.probe(qwen4["mlx"], drafter)
    assert got["kind"] == "mtp" and got["drafter"] == "Qwen4ExpMTPDraftModel", got
    assert got["params"] == got["stored"] == len(keys) and not (got["missing"] or got["unused"] or got["unequal"]), got
    assert got["drafted"] > 0 and got["identical"], got
    r = judged.mtpforge("inspect", str(drafter), "--json", "--runtime", "mlx-vlm")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["family"] == "qwen4_exp" and rep["layout"] == "mlx-vlm-drafter", r.stdout
    assert not [f for f in rep["findings"] if f["severity"] != "info"], r.stdout


def test_plain_add_mtp_writes_the_same_drafter(qwen4, tmp_path: Path) -> None:
    """Plain add-mtp (no ``--runtime``) writes this family's head as mlx-vlm's drafter, the one
    MLX form any runtime drafts it from: the same tensors, byte for byte, and the same config."""
    runs = {}
    for name, extra in (("plain", ()), ("runtime", ("--runtime", "mlx-vlm"))):
        shutil.copytree(qwen4["mlx"], tmp_path / name)
        rep = judged.add_mtp(qwen4["src"], tmp_path / name, *extra)
        drafter = tmp_path / f"{name}-mtp-drafter"
        assert rep["layout"] == "mlx-vlm-drafter" and rep["output"] == str(drafter), rep
        runs[name] = [(drafter / f).read_bytes() for f in ("model.safetensors", "config.json")]
    assert runs["plain"] == runs["runtime"]


@pytest.mark.xdist_group("conformance")
def test_the_bf16_drafter_is_the_one_mlx_vlm_builds_from_the_whole_source(qwen4) -> None:
    """``--precision bf16``: every parameter of the drafter mlx-vlm loads from mtpforge's folder
    equals (dtype, shape, values) the one its own ``Qwen4ExpMTPSplitter`` builds from the whole
    source checkpoint; it drafts and decodes as plain."""
    folder = qwen4["root"] / "vlm-bf16"
    shutil.copytree(qwen4["mlx"], folder)
    judged.add_mtp(qwen4["src"], folder, "--runtime", "mlx-vlm", "--precision", "bf16")
    got = vlm.probe(qwen4["mlx"], folder.parent / f"{folder.name}-mtp-drafter", qwen4["src"])
    assert got["params"] == got["theirs"] == 32 and got["vs_theirs"] == [], got
    assert not (got["missing"] or got["unused"] or got["unequal"]), got
    assert got["drafted"] > 0 and got["identical"], got


#: mlx-vlm's own dequantization of the FP8 release's MTP experts (``mlx_vlm.fp8``), stacked per
#: projection, against the drafter's stacks (argv: source, drafter folder)
VLM_FP8_EXPERTS = """
import glob, json, sys
import mlx.core as mx
from mlx_vlm.fp8 import _dequantize_fp8_weight
src, drafter = sys.argv[1], sys.argv[2]
w = {}
for f in glob.glob(src + "/*.safetensors"):
    w.update({k: v for k, v in mx.load(f).items() if k.startswith("mtp.layers.0.mlp.experts.")})
ours = mx.load(drafter + "/model.safetensors")
n = len({k.split(".")[5] for k in w})
out = {}
for proj in ("gate_proj", "up_proj", "down_proj"):
    p = "mtp.layers.0.mlp.experts.{}." + proj + ".weight"
    deq = mx.stack([_dequantize_fp8_weight(w[p.format(e)], w[p.format(e) + "_scale_inv"]) for e in range(n)])
    mine = ours["layers.0.mlp.switch_mlp." + proj + ".weight"]
    out[proj] = bool(mx.array_equal(deq.astype(mine.dtype), mine)) and mine.shape == deq.shape
print(json.dumps(out))
"""


@pytest.mark.xdist_group("conformance")
def test_an_fp8_release_gives_the_drafter_its_experts_as_mlx_vlm_dequantizes_them(qwen4, tmp_path: Path) -> None:
    """The FP8 release (experts one by one, block-FP8 with ``weight_scale_inv``, as mlx-vlm's
    ``convert_qwen4_exp_fp8_weights`` reads it): add-mtp ``--runtime mlx-vlm`` into the 4-bit
    target writes a drafter mlx-vlm loads (every parameter a stored tensor) and decodes with
    exactly as plain; at ``--precision bf16`` its expert stacks are mlx-vlm's own dequantization
    of the FP8 experts, cast to bf16, bit for bit, and every other parameter equals the drafter
    mlx-vlm's splitter builds from the same release (whose experts it keeps as MXFP8)."""
    from tests.support.synth.qwen4_exp import build_qwen4_exp_fp8

    src = build_qwen4_exp_fp8(tmp_path / "fp8")
    for precision in ("match", "bf16"):
        folder = tmp_path / precision
        shutil.copytree(qwen4["mlx"], folder)
        judged.add_mtp(src, folder, "--runtime", "mlx-vlm", "--precision", precision)
        drafter = tmp_path / f"{precision}-mtp-drafter"
        got = vlm.probe(qwen4["mlx"], drafter, *((src,) if precision == "bf16" else ()))
        assert got["identical"] and got["drafted"] > 0, got
        assert got["params"] == got["stored"] and not (got["missing"] or got["unused"] or got["unequal"]), got
    r = vlm.run(VLM_FP8_EXPERTS, src, drafter)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout) == {"gate_proj": True, "up_proj": True, "down_proj": True}
    experts = {f"layers.0.mlp.switch_mlp.{p}.{a}" for p in ("gate_proj", "up_proj", "down_proj") for a in ("weight", "scales")}
    assert set(got["vs_theirs"]) == experts, got["vs_theirs"]


@pytest.mark.parametrize("release", ["bf16", "fp8"])
def test_add_mtp_from_the_hub_fetches_only_the_heads_bytes(qwen4, hub, tmp_path: Path, release: str) -> None:
    """From the (loopback) Hub only the ``mtp.*`` tensors come over the wire (<= 1.01x their
    bytes: the 31 of the bf16 release, the FP8 release's experts one by one with their scales);
    the drafter equals the one written from the local source, byte for byte."""
    from tests.support.synth.qwen4_exp import build_qwen4_exp_fp8

    src = qwen4["src"] if release == "bf16" else build_qwen4_exp_fp8(tmp_path / "fp8")
    repo, _ = hub.publish(src)
    head = sum(v.nbytes for k, v in judged.source_tensors(src).items() if k.startswith("mtp."))
    folder, local = tmp_path / "hub", tmp_path / "local"
    shutil.copytree(qwen4["mlx"], folder)
    shutil.copytree(qwen4["mlx"], local)
    hub.server.clear_log()
    r = hub.run("add-mtp", "--source", repo, "--target", str(folder), "--runtime", "mlx-vlm")
    assert r.code == 0, r.stderr
    fetched = hub.tensor_bytes(repo)
    assert 0 < fetched <= 1.01 * head and r.json["fetched_bytes"] == fetched, (fetched, head)
    judged.add_mtp(src, local, "--runtime", "mlx-vlm")
    ours, theirs = (p.parent / f"{p.name}-mtp-drafter" / "model.safetensors" for p in (folder, local))
    assert ours.read_bytes() == theirs.read_bytes()


def test_remove_mtp_undoes_the_drafter_byte_for_byte(qwen4, tmp_path: Path) -> None:
    """remove-mtp on the model folder takes the drafter folder away and leaves the model folder
    as mlx-vlm's convert wrote it; inspect then finds the missing head again."""
    judged.remove_takes_the_drafter_away(qwen4["src"], qwen4["mlx"], tmp_path, "qwen4_exp", EXAMPLE)


def test_verify_says_mtpforge_cannot_decode_this_family(qwen4, tmp_path: Path) -> None:
    """mtpforge's reference decoder runs mlx-lm's model classes, and mlx-lm has no qwen4_exp:
    verify refuses in one line and names mlx-vlm's drafting command."""
    folder = tmp_path / "m"
    shutil.copytree(qwen4["mlx"], folder)
    judged.add_mtp(qwen4["src"], folder, "--runtime", "mlx-vlm")
    r = judged.mtpforge("verify", str(folder), "--json")
    assert r.returncode != 0 and "mlx-lm has no qwen4_exp model" in r.stdout + r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("runtime", ["mtplx", "vllm-mlx", "exo", "omlx", "mlx-lm-mtp"])
def test_runtimes_that_do_not_draft_qwen4_exp_say_so(qwen4, runtime: str) -> None:
    judged.runtime_says_it_does_not_draft(qwen4["src"], qwen4["mlx"], qwen4["root"] / "nodraft", runtime,
                                          "qwen4_exp", "Qwen3.8-Flash-Next")


@pytest.mark.parametrize("bad", ["2", 2.0, True, -1, 1 << 30, None])
def test_a_family_dimension_key_is_read_as_a_bounded_integer_or_refused(bad: object) -> None:
    """``hc_count`` is no key config.json's reader types: ``tables.dims`` reads it from the file as
    written, an integer in 0..MAX_DIM only; any other value is refused naming the key."""
    from mtpforge.errors import CorruptFileError
    from mtpforge.families.tables import dims
    from tests.support.synth.qwen4_exp import tiny_config

    d = dims(tiny_config())
    assert (d["CH"], d["R"], d["IX"], d["2QD"]) == (128, 32, 96, 256)
    with pytest.raises(CorruptFileError, match="hc_count"):
        dims(tiny_config(hc_count=bad))
