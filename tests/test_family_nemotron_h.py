"""Nemotron-H (``nemotron_h``) heads in MLX folders, judged by the programs that draft with them.

The tiny checkpoint (tests/support/synth/nemotron_h.py, plain and latent MoE) converted by
``mlx_lm.convert -q`` (4-bit: the ``mtp.*`` head dropped, ``num_nextn_predict_layers`` kept) is
the folder users have. add-mtp writes the head's two blocks under the source's own ``mtp.layers.*``
names: the sidecar MTPLX 2.12.2's ``nemotron_h_mtp`` backend reads (plain: bf16; ``--runtime
mtplx``: at the model's bits, router and ``eh_proj`` float), or, with ``--runtime mlx-lm-mtp``,
``model-mtp.safetensors`` in the form mlx-lm pull request #1533 loads (every linear at the
model's bits but the router; that pull request's own code is run on it by hand:
scripts/check_mlx_lm_1533.py). MTPLX loads every tensor it is given (its loader is not strict,
so the test compares each of its head parameters with the file), drafts, and decodes exactly as
its plain decode; the bundled decoder's hybrid head (decoder/hybrid.py, mlx-lm's own
``NemotronHBlock``) decodes exactly as plain greedy decoding.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from tests import mlx_judged as judged
from tests import mlx_vlm_judged as vlm

EXAMPLE = "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16"

#: every parameter of the head MTPLX builds, against the tensor the folder stores for it
MTPLX_PARAMS = """
import json, sys
sys.path.insert(0, sys.argv[2])
import standins
standins.libsystem()
from pathlib import Path
import mlx.core as mx
from mlx.utils import tree_flatten
from mtplx import runtime as R
rt = R.load(sys.argv[1], mtp=True)
stored = {}
for f in [Path(sys.argv[1]) / "mtp.safetensors", *sorted(Path(sys.argv[1]).glob("model*.safetensors"))]:
    if f.is_file():
        stored.update({k[len("mtp."):]: v for k, v in mx.load(str(f)).items() if k.startswith("mtp.")})
params = dict(tree_flatten(rt.model.mtp.parameters()))
print(json.dumps({"params": len(params), "stored": len(stored),
                  "missing": sorted(k for k in params if k not in stored),
                  "unused": sorted(k for k in stored if k not in params),
                  "unequal": sorted(k for k, v in params.items() if k in stored and not mx.array_equal(v, stored[k]))}))
"""


@pytest.fixture(scope="module", params=["plain", "latent"])
def nemotron(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.support.synth import convert_to_mlx
    from tests.support.synth.nemotron_h import build_nemotron_h

    root = tmp_path_factory.mktemp(f"nemotron_h-{request.param}")
    src = build_nemotron_h(root / "tiny-nemotron_h", **({"moe_latent_size": 64} if request.param == "latent" else {}))
    mlx = convert_to_mlx(src, root / "tiny-nemotron_h-4bit", q_bits=4, q_group_size=32, dtype="float32")
    return {"root": root, "src": src, "mlx": mlx, "variant": request.param}


def _mtplx_loads_every_tensor(folder: Path) -> dict:
    r = judged.mtplx_run(MTPLX_PARAMS, folder)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["params"] > 0 and not got["missing"] and not got["unused"] and not got["unequal"], got
    return got


@pytest.mark.xdist_group("conformance")
@pytest.mark.parametrize("extra", [[], ["--runtime", "mtplx"]], ids=["plain", "runtime-mtplx"])
def test_mtplx_drafts_with_the_head_mtpforge_writes(nemotron, extra: list[str]) -> None:
    """MTPLX's nemotron_h_mtp loads the sidecar (every parameter of its head is a tensor of the
    file, byte for byte: its loader would leave a missing one at its random start), drafts, and
    decodes exactly as its plain decode; inspect --runtime mtplx finds nothing; verify is
    identical to plain greedy decoding. On the plain fixture MTPLX's part is a cell of the
    runtime conformance matrix (every tensor consumed and equal to the file, drafts, identical);
    here MTPLX runs the latent one."""
    from safetensors import safe_open

    judged.require_mtplx()
    folder = nemotron["root"] / f"ours-{'-'.join(extra) or 'plain'}"
    latent = nemotron["variant"] == "latent"
    got = judged.mtplx_judges_the_head(nemotron["src"], nemotron["mlx"], folder, extra, drafts=latent)
    if latent:
        assert got["mtplx"]["model"] == "_MTPLXNemotronHModel"
        _mtplx_loads_every_tensor(folder)
    with safe_open(str(folder / "mtp.safetensors"), "np") as f:
        keys = set(f.keys())
    router, fc = "mtp.layers.1.mixer.gate", "mtp.layers.0.eh_proj"
    assert all(k.startswith("mtp.layers.") for k in keys) and f"{router}.weight" in keys
    assert f"{router}.scales" not in keys and f"{fc}.scales" not in keys  # MTPLX never quantizes these
    stacked = "mtp.layers.1.mixer.switch_mlp.fc1"
    assert (f"{stacked}.scales" in keys) == bool(extra), keys  # --runtime mtplx: the model's bits


@pytest.mark.xdist_group("conformance")
def test_the_mlx_lm_1533_form_loads_in_mtplx_and_leaves_released_mlx_lm_as_it_was(nemotron) -> None:
    """``--runtime mlx-lm-mtp``: the head in ``model-mtp.safetensors`` (in the index) under
    ``mtp.``, experts stacked and every linear but the router at the model's bits, as #1533's
    ``convert`` keeps it; inspect for #1533 is clean; released mlx-lm (which drops ``mtp.*``)
    decodes the folder exactly as before; MTPLX finds the head in the shards and drafts."""
    import mlx_lm
    from safetensors import safe_open

    judged.require_mtplx()
    folder = nemotron["root"] / "ours-1533"
    shutil.copytree(nemotron["mlx"], folder)
    prompt = [5, 17, 99, 230, 12]
    model, tok = mlx_lm.load(str(nemotron["mlx"]))
    before = mlx_lm.generate(model, tok, prompt=prompt, max_tokens=12)
    rep = judged.add_mtp(nemotron["src"], folder, "--runtime", "mlx-lm-mtp")
    assert rep["layout"] == "embedded"
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(str(folder / "model-mtp.safetensors"), "np") as f:
        keys = set(f.keys())
    assert keys and all(index[k] == "model-mtp.safetensors" for k in keys)
    weights = {k[: -len(".weight")] for k in keys if k.endswith(".weight") and "norm" not in k}
    quantized = {k[: -len(".scales")] for k in keys if k.endswith(".scales")}
    assert quantized == weights - {"mtp.layers.1.mixer.gate"}, weights - quantized
    r = judged.mtpforge("inspect", str(folder), "--json", "--runtime", "mlx-lm-mtp")
    assert r.returncode == 0 and json.loads(r.stdout)["findings"] == [], r.stdout
    model, tok = mlx_lm.load(str(folder))
    assert mlx_lm.generate(model, tok, prompt=prompt, max_tokens=12) == before
    got = judged.mtplx_drafts(folder)
    assert got["mtp_enabled"] and got["identical"] and got["drafted"] > 0, got
    _mtplx_loads_every_tensor(folder)
    v = judged.mtpforge("verify", str(folder), "--generate", "--json", "--max-tokens", "24")
    assert v.returncode == 0 and json.loads(v.stdout)["identical"] is True, v.stdout + v.stderr


def _mlx_vlm_probe(target: Path, drafter: Path, *theirs: Path) -> dict:
    """mlx-vlm's loader and decode loop (``mlx_vlm_judged.probe``) on 16 prompts x 24 tokens."""
    rng = random.Random(0)
    prompts = [[5, 17, 99, 230, 12], [40, 41, 42], [300, 301, 7, 8, 9, 10]] + [
        [rng.randrange(3, 500) for _ in range(rng.randrange(1, 12))] for _ in range(13)]
    return vlm.probe(target, drafter, *theirs, prompts=prompts, tokens=24)


@pytest.mark.xdist_group("conformance")
def test_mlx_vlm_drafts_with_the_drafter_mtpforge_writes(nemotron) -> None:
    """``<target>-mtp-drafter`` (``model_type`` ``nemotron_h_mtp``, bare ``layers.{0,1}.*`` keys,
    experts stacked, every linear at the model's bits but the router): mlx-vlm 0.7.10's
    ``load_drafter`` builds its ``NemotronHMTPDraftModel`` from it, every parameter equal to a
    stored tensor (dtype included), none missing or unused; its speculative ``stream_generate``
    drafts and decodes exactly as its plain one; inspect --runtime mlx-vlm finds no error.
    ``--layout mlx-vlm-drafter`` alone writes the same files, byte for byte."""
    from safetensors import safe_open

    folder = nemotron["root"] / "vlm-runtime"
    shutil.copytree(nemotron["mlx"], folder)
    rep = judged.add_mtp(nemotron["src"], folder, "--runtime", "mlx-vlm")
    drafter = folder.parent / f"{folder.name}-mtp-drafter"
    by_layout = nemotron["root"] / "vlm-layout"
    shutil.copytree(nemotron["mlx"], by_layout)
    judged.add_mtp(nemotron["src"], by_layout, "--layout", "mlx-vlm-drafter")
    for f in ("model.safetensors", "config.json"):
        assert (drafter / f).read_bytes() == (by_layout.parent / f"{by_layout.name}-mtp-drafter" / f).read_bytes(), f
    assert rep["layout"] == "mlx-vlm-drafter" and rep["family"] == "nemotron_h", rep
    cfg = json.loads((drafter / "config.json").read_text())
    assert cfg["model_type"] == "nemotron_h_mtp" and cfg["text_config"]["num_nextn_predict_layers"] == 1
    assert "quantization" not in cfg["text_config"] and cfg["quantization"]["bits"] == 4
    with safe_open(str(drafter / "model.safetensors"), "np") as f:
        keys = set(f.keys())
    weights = {k[: -len(".weight")] for k in keys if k.endswith(".weight") and "norm" not in k}
    quantized = {k[: -len(".scales")] for k in keys if k.endswith(".scales")}
    assert quantized == weights - {"layers.1.mixer.gate"}, weights - quantized
    got = _mlx_vlm_probe(nemotron["mlx"], drafter)
    assert got["kind"] == "mtp" and got["drafter"] == "NemotronHMTPDraftModel", got
    assert got["params"] == got["stored"] == len(keys) and not (got["missing"] or got["unused"] or got["unequal"]), got
    assert got["drafted"] > 0 and got["identical"], got
    r = judged.mtpforge("inspect", str(drafter), "--json", "--runtime", "mlx-vlm")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["family"] == "nemotron_h" and rep["layout"] == "mlx-vlm-drafter", r.stdout
    assert not [f for f in rep["findings"] if f["severity"] != "info"], r.stdout


@pytest.mark.xdist_group("conformance")
def test_the_bf16_drafter_is_the_one_mlx_vlm_builds_from_the_source(nemotron) -> None:
    """``--precision bf16``: the drafter mlx-vlm loads from mtpforge's folder equals, parameter for
    parameter, the one its own ``NemotronHMTPSplitter`` builds from the original checkpoint."""
    folder = nemotron["root"] / "vlm-bf16"
    shutil.copytree(nemotron["mlx"], folder)
    judged.add_mtp(nemotron["src"], folder, "--runtime", "mlx-vlm", "--precision", "bf16")
    got = _mlx_vlm_probe(nemotron["mlx"], folder.parent / f"{folder.name}-mtp-drafter", nemotron["src"])
    assert got["vs_theirs"] == [] and not (got["missing"] or got["unused"] or got["unequal"]), got
    assert got["drafted"] > 0 and got["identical"], got


def test_inspect_finds_the_head_mlx_lm_convert_dropped(nemotron) -> None:
    judged.inspect_finds_the_dropped_head(nemotron["mlx"], "nemotron_h", EXAMPLE)


@pytest.mark.parametrize("runtime", ["vllm-mlx", "exo", "omlx"])
def test_runtimes_that_do_not_draft_nemotron_h_say_so(nemotron, runtime: str) -> None:
    if nemotron["variant"] != "plain":
        pytest.skip("one variant says it")
    judged.runtime_says_it_does_not_draft(nemotron["src"], nemotron["mlx"], nemotron["root"] / f"nodraft-{runtime}",
                                          runtime, "nemotron_h", "Nemotron-H")


def test_add_mtp_from_the_hub_fetches_only_the_heads_tensors(nemotron, hub, tmp_path: Path) -> None:
    """The head is every ``mtp.`` tensor of the release (it has no copies of the trunk's)."""
    got = judged.hub_fetches_only_the_sidecars_tensors(hub, nemotron["src"], nemotron["mlx"], tmp_path, "mtp.", ())
    assert got["fetched"] <= 1.01 * got["head"]
