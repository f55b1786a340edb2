"""GLM-5 (``glm_moe_dsa``) heads as mlx-vlm's ``glm_moe_dsa_mtp`` drafter, judged by mlx-vlm's own code.

The tiny GLM-5 (tests/support/synth/glm_moe_dsa.py) converted by ``mlx_lm.convert`` (4-bit, group
32, float32: ``tests.support.families.mlx_trunk``, the form the published MLX quants have; mlx-vlm
loads it as its own ``glm_moe_dsa`` model). mlx-vlm 0.7.10's own convert cannot make this target:
its ``glm_moe_dsa`` model calls mlx-lm's ``cast_predicate`` property as a function whenever a
conversion dtype applies (measured; the release's ``torch_dtype`` is one). add-mtp ``--runtime
mlx-vlm`` writes ``<model>-mtp-drafter``: the NextN layer under ``mtp.``, ``shared_head_norm``,
``kv_b_proj`` split into ``embed_q`` / ``unembed_out``, experts stacked, the NextN layer's
``embed_tokens`` / ``shared_head.head`` left out (the drafter binds the target's). mlx-vlm's
``load_drafter`` loads it strictly; every stored tensor equals what mlx-vlm's own
``GlmMoeDsaMTPSplitter`` builds from the whole source (at 4 bits, group 32, and in bf16); its
``stream_generate`` drafts with it and decodes exactly as plain.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import external
from tests import mlx_judged as judged

FAMILY = "glm_moe_dsa"
N = 2  # the tiny model's num_hidden_layers: the NextN layer is model.layers.2
P = f"model.layers.{N}."
#: the NextN layer's tensors the drafter model has no parameter for (it binds the target's)
FROM_TARGET = ("embed_tokens.weight", "shared_head.head.weight")

#: mlx-vlm 0.7.10 on each drafter folder (argv: target, source, drivers, then folder/name pairs):
#: ``load_drafter(kind="mtp")`` (every parameter against the stored tensor), the stored tensors
#: against ``GlmMoeDsaMTPSplitter().prepare`` of the whole source (quantized at the folder's bits
#: and group where it stores scales), then ``stream_generate`` greedy, plain and drafting
VLM_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[3])
import standins
from pathlib import Path
import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_vlm import load
from mlx_vlm.generate import stream_generate
from mlx_vlm.speculative.drafters import load_drafter
from mlx_vlm.speculative.drafters.glm_moe_dsa_mtp.split import GlmMoeDsaMTPSplitter
model, processor = load(sys.argv[1])
standins.float32_expert_stacks(model)
same = lambda a, b: a.dtype == b.dtype and a.shape == b.shape and bool(mx.array_equal(a, b).item())
prompts = [[15, 17, 99, 230, 12], [300, 301, 7, 8, 9, 10], [40, 41, 42, 43], [200, 100, 50, 25, 12, 6, 3]]
dec = lambda ids, **kw: [int(r.token) for r in stream_generate(model, processor, "", input_ids=mx.array([ids]),
                                                               max_tokens=32, temperature=0.0, **kw)]
plain, out = [dec(p) for p in prompts], {}
for folder, name in zip(sys.argv[4::2], sys.argv[5::2]):
    draft, kind = load_drafter(folder, kind="mtp")
    stored = mx.load(str(Path(folder) / "model.safetensors"))
    params = dict(tree_flatten(draft.parameters()))
    q = json.loads((Path(folder) / "config.json").read_text())["quantization"]
    opts = {"q_bits": q["bits"], "q_group_size": q["group_size"]} if any(k.endswith(".scales") for k in stored) else {}
    _, theirs = GlmMoeDsaMTPSplitter().prepare(Path(sys.argv[2]), **opts)
    o = {"kind": kind, "drafter": type(draft).__name__, "params": len(params), "stored": len(stored),
         "missing": sorted(k for k in params if k not in stored), "unused": sorted(k for k in stored if k not in params),
         "unequal": sorted(k for k, v in params.items() if k in stored and not same(v, stored[k])),
         "only_theirs": sorted(set(theirs) - set(stored)),
         "vs_theirs": sorted(k for k in stored if k not in theirs or not same(stored[k], theirs[k]))}
    standins.float32_expert_stacks(draft)
    mtp, drafted, accepted = [], 0, 0
    for p in prompts:
        mtp.append(dec(p, draft_model=draft, draft_kind="mtp"))
        drafted, accepted = drafted + sum(draft.draft_lens), accepted + sum(draft.accept_lens)
    out[name] = {**o, "drafted": drafted, "accepted": accepted, "identical": mtp == plain,
                 "tokens": sum(map(len, plain))}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def glm5(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny release, its 4-bit MLX folder, and the drafters add-mtp --runtime mlx-vlm writes
    beside three copies of it: at the model's precision and ``--precision bf16`` from the bf16
    release, and at the model's precision from the block-FP8 release (GLM-5's own form)."""
    from tests.support.families import mlx_trunk, tiny_source
    from tests.support.synth.glm_moe_dsa import build_glm_moe_dsa_fp8

    root = tmp_path_factory.mktemp(FAMILY)
    src = tiny_source(FAMILY, root / f"tiny-{FAMILY}")
    mlx = mlx_trunk(FAMILY, src, root / f"tiny-{FAMILY}-4bit")
    fp8 = build_glm_moe_dsa_fp8(root / f"tiny-{FAMILY}-fp8")
    out = {"root": root, "src": src, "mlx": mlx}
    for name, source, extra in (("q4", src, ()), ("bf16", src, ("--precision", "bf16")), ("fp8", fp8, ())):
        folder = root / name
        shutil.copytree(mlx, folder)
        rep = judged.add_mtp(source, folder, "--runtime", "mlx-vlm", *extra)
        assert rep["layout"] == "mlx-vlm-drafter" and rep["family"] == FAMILY, rep
        out[name] = Path(rep["output"])
    return out


@pytest.fixture(scope="module")
def probe(glm5: dict[str, Path]) -> dict:
    """mlx-vlm's verdict on both drafters, in one run of its virtualenv."""
    external.require("mlx-vlm", judged.setup_runtimes.is_ready("mlx-vlm"),
                     f"no virtualenv at {judged.setup_runtimes.venv_dir('mlx-vlm')}")
    args = [glm5["mlx"], glm5["src"], judged.DRIVERS, glm5["q4"], "q4", glm5["bf16"], "bf16", glm5["fp8"], "fp8"]
    r = subprocess.run([str(judged.setup_runtimes.venv_python("mlx-vlm")), "-c", VLM_PROBE, *map(str, args)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_drafter_is_spelled_as_mlx_vlm_splits_it_and_inspect_is_clean(glm5) -> None:
    """``<target>-mtp-drafter`` (``model_type`` ``glm_moe_dsa_mtp``, the target's config as its
    ``text_config``): every key under ``mtp.``, the final norm as ``shared_head_norm``,
    ``kv_b_proj`` only as its two parts, experts stacked, no ``embed_tokens`` / ``shared_head.head``;
    the router float, every other matrix at the model's 4 bits; the model folder untouched;
    inspect --runtime mlx-vlm finds nothing."""
    from safetensors import safe_open

    cfg = json.loads((glm5["q4"] / "config.json").read_text())
    assert cfg["model_type"] == "glm_moe_dsa_mtp" and cfg["text_config"]["num_nextn_predict_layers"] == 1
    assert cfg["quantization"] == {"group_size": 32, "bits": 4, "mode": "affine"}
    with safe_open(str(glm5["q4"] / "model.safetensors"), "np") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    assert all(k.startswith("mtp.") for k in shapes) and "mtp.shared_head_norm.weight" in shapes
    assert shapes["mtp.self_attn.embed_q.weight"][:1] == [2] and "mtp.self_attn.unembed_out.scales" in shapes
    assert not [k for k in shapes if "kv_b_proj" in k or ".experts." in k or "embed_tokens" in k or "head.head" in k]
    weights = {k[: -len(".weight")] for k, s in shapes.items() if k.endswith(".weight") and len(s) > 1}
    quantized = {k[: -len(".scales")] for k in shapes if k.endswith(".scales")}
    assert quantized == weights - {"mtp.mlp.gate"}, weights - quantized
    folder = {p.name: p.read_bytes() for p in glm5["mlx"].iterdir() if p.is_file()}
    assert {p.name: p.read_bytes() for p in (glm5["root"] / "q4").iterdir() if p.is_file()} == folder
    for drafter in (glm5["q4"], glm5["bf16"], glm5["fp8"]):
        r = judged.mtpforge("inspect", str(drafter), "--json", "--runtime", "mlx-vlm")
        rep = json.loads(r.stdout)
        assert r.returncode == 0 and rep["family"] == FAMILY and rep["layout"] == "mlx-vlm-drafter", r.stdout
        assert not [f for f in rep["findings"] if f["severity"] != "info"], r.stdout


@pytest.mark.xdist_group("conformance")
def test_mlx_vlm_drafts_with_the_drafter_mtpforge_writes(probe) -> None:
    """mlx-vlm's ``load_drafter`` builds its ``GlmMoeDsaMTPDraftModel`` from each folder, every
    parameter equal to a stored tensor, none missing or unused; its speculative
    ``stream_generate`` drafts and decodes exactly as its plain one (the tiny head is random:
    its drafts are rejected, which is what the identity is checked through). The drafter from the
    FP8 release (its projections dequantized from 128x128 blocks, then at the model's 4 bits)
    loads and drafts the same way."""
    assert set(probe) == {"q4", "bf16", "fp8"}, probe
    for name, got in probe.items():
        assert got["kind"] == "mtp" and got["drafter"] == "GlmMoeDsaMTPDraftModel", got
        assert got["params"] == got["stored"] and not (got["missing"] or got["unused"] or got["unequal"]), got
        assert got["drafted"] > 0 and got["identical"], got
        print(f"{name}: {got['params']} parameters, drafted {got['drafted']}, accepted {got['accepted']} "
              f"over {got['tokens']} tokens")
    assert probe["bf16"]["params"] == 27 and probe["q4"]["params"] == probe["fp8"]["params"] == 59, probe


@pytest.mark.xdist_group("conformance")
def test_the_drafters_are_the_ones_mlx_vlm_splits_from_the_whole_source(probe) -> None:
    """Every tensor of each drafter equals (dtype, shape, values) the one mlx-vlm's own
    ``GlmMoeDsaMTPSplitter`` builds from the whole source (``--precision bf16``: float; the model's
    precision: its ``q_bits`` 4, ``q_group_size`` 32); the splitter's only other tensors are the
    NextN layer's ``embed_tokens`` / ``shared_head.head`` (and their quantization), which its own
    strict ``load_drafter`` refuses ("parameters not in model"). (The FP8 drafter is another
    release's: the splitter here reads the bf16 one.)"""
    for got in (probe["q4"], probe["bf16"]):
        assert got["vs_theirs"] == [], got
        assert {k.split(".scales")[0].split(".biases")[0].removesuffix(".weight") for k in got["only_theirs"]} == \
            {"mtp.embed_tokens", "mtp.shared_head.head"}, got


def test_add_mtp_from_the_hub_fetches_only_the_drafters_bytes(glm5, hub, tmp_path: Path) -> None:
    """From the (loopback) Hub only the NextN tensors the drafter is made of come over the wire
    (not the layer's ``embed_tokens`` / ``shared_head.head``): <= 1.01x their bytes; the drafter
    equals the one written from the local source, byte for byte."""
    repo, _ = hub.publish(glm5["src"])
    head = sum(v.nbytes for k, v in judged.source_tensors(glm5["src"]).items()
               if k.startswith(P) and not k.endswith(FROM_TARGET))
    folder = tmp_path / "hub"
    shutil.copytree(glm5["mlx"], folder)
    hub.server.clear_log()
    r = hub.run("add-mtp", "--source", repo, "--target", str(folder), "--runtime", "mlx-vlm")
    assert r.code == 0, r.stderr
    fetched = hub.tensor_bytes(repo)
    assert 0 < fetched <= 1.01 * head and r.json["fetched_bytes"] == fetched, (fetched, head)
    print(f"fetched {fetched} of {head} head bytes ({fetched / head:.4f}x)")
    ours = tmp_path / "hub-mtp-drafter" / "model.safetensors"
    assert ours.read_bytes() == (glm5["q4"] / "model.safetensors").read_bytes()


def test_remove_mtp_takes_the_drafter_away(glm5, tmp_path: Path) -> None:
    """remove-mtp on the model folder takes the drafter folder away and leaves the model folder
    as converted; inspect then finds the missing head again."""
    judged.remove_takes_the_drafter_away(glm5["src"], glm5["mlx"], tmp_path, FAMILY, "zai-org/GLM-5")
