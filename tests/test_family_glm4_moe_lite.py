"""GLM-4.7-Flash (``glm4_moe_lite``) heads in MLX folders, judged by MTPLX's own ``glm_mtp`` backend.

The tiny checkpoint (tests/support/synth/glm4_moe_lite.py) converted by ``mlx_lm.convert -q``
(4-bit, group 64: the NextN layer dropped, its declaration kept) is the folder users have. add-mtp
writes the sidecar MTPLX 2.12.2 reads, in the source's own names with MLA's ``kv_b_proj`` whole
(MTPLX splits it into mlx-lm's ``embed_q`` / ``unembed_out`` on load); MTPLX loads it, drafts
and decodes as its plain decode, and the bundled decoder (mlx-lm's ``Glm4MoeLiteDecoderLayer``,
``kv_b_proj`` split by ``passes/mla.py``) holds exactly the absorbed matrices MTPLX builds. The
shared checks are GLM-4.5's (tests/mlx_judged.py); this module adds what MLA changes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests import mlx_judged as judged

N = 2  # the tiny model's num_hidden_layers: the NextN layer is model.layers.2
P = f"model.layers.{N}."
KV_B = "self_attn.kv_b_proj"

#: the absorbed MLA matrices MTPLX builds from the sidecar, as raw bytes per parameter
MTPLX_MLA = """
import hashlib, json, sys
sys.path.insert(0, sys.argv[2])
import standins
standins.libsystem()
from mlx.utils import tree_flatten
from mtplx import runtime as R
rt = R.load(sys.argv[1], mtp=True)
print(json.dumps({k.split("self_attn.")[1]: [str(v.dtype), list(v.shape), hashlib.sha256(bytes(memoryview(v))).hexdigest()]
                  for k, v in tree_flatten(rt.model.mtp.parameters()) if "embed_q" in k or "unembed_out" in k}))
"""


@pytest.fixture(scope="module")
def flash(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.support.synth import convert_to_mlx
    from tests.support.synth.glm4_moe_lite import build_glm4_moe_lite

    root = tmp_path_factory.mktemp("glm4_moe_lite")
    src = build_glm4_moe_lite(root / "tiny-glm4_moe_lite")
    mlx = convert_to_mlx(src, root / "tiny-glm4_moe_lite-4bit", q_bits=4, q_group_size=64, dtype="float32")
    return {"root": root, "src": src, "mlx": mlx}


def _ours_mla(folder: Path) -> dict[str, list]:
    """The absorbed MLA matrices the bundled decoder loads from ``folder``'s head."""
    import hashlib

    from mtpforge.families import FAMILIES
    from mtpforge.layouts.read import load_head_weights
    from mtpforge.passes.mla import to_mlx_layer

    hw = load_head_weights(folder)
    spec = FAMILIES[hw.family]
    args = spec.mlx_lm_classes()[1].from_dict(hw.text_config)
    tensors, _ = to_mlx_layer(spec, args, hw.tensors, hw.quant)
    return {k.split("self_attn.")[1]: [str(v.dtype), list(v.shape), hashlib.sha256(bytes(memoryview(v))).hexdigest()]
            for k, v in tensors.items() if "embed_q" in k or "unembed_out" in k}


@pytest.mark.xdist_group("conformance")
@pytest.mark.parametrize("extra", [[], ["--runtime", "mtplx"], ["--runtime", "mtplx", "--precision", "8"]],
                         ids=["plain", "runtime-mtplx", "runtime-mtplx-8bit"])
def test_mtplx_drafts_with_the_head_mtpforge_writes(flash, extra: list[str]) -> None:
    """Plain add-mtp (bf16 sidecar, experts stacked) and ``--runtime mtplx`` (the layer at the
    model's 4 bits, ``eh_proj`` and the router float): MTPLX loads the head, drafts and decodes
    exactly as its plain decode (those two: cells of the runtime conformance matrix; here MTPLX
    drafts with the 8-bit head only); inspect finds nothing, norms raw; verify decodes as plain
    greedy decoding; ``kv_b_proj`` is stored whole (the source's bytes in bf16) and the decoder's
    split of it is MTPLX's, byte for byte."""
    judged.require_mtplx()
    folder = flash["root"] / f"ours-{'-'.join(extra) or 'plain'}"
    got = judged.mtplx_judges_the_head(flash["src"], flash["mlx"], folder, extra, drafts="--precision" in extra)
    assert got["add"]["family"] == "glm4_moe_lite" and got["add"]["expert_format"] == "switch_mlp"
    head = judged.source_tensors(folder, "mtp.safetensors")
    assert all(k.startswith(P) for k in head) and not any("embed_q" in k or "unembed_out" in k for k in head)
    if extra:
        assert head[f"{P}{KV_B}.weight"].dtype == np.uint32 and f"{P}{KV_B}.scales" in head
        assert f"{P}eh_proj.scales" not in head and f"{P}mlp.gate.scales" not in head
    else:
        src = judged.source_tensors(flash["src"])[f"{P}{KV_B}.weight"]
        assert head[f"{P}{KV_B}.weight"].tobytes() == src.tobytes()
    r = judged.mtpforge("inspect", str(folder), "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["findings"] == [] and rep["norm_convention"] == "raw", r.stdout
    p = judged.mtplx_run(MTPLX_MLA, folder)
    assert p.returncode == 0, p.stderr[-2000:]
    theirs = json.loads(p.stdout.strip().splitlines()[-1])
    assert set(theirs) == ({"embed_q.weight", "unembed_out.weight"} if not extra else
                           {f"{m}.{s}" for m in ("embed_q", "unembed_out") for s in ("weight", "scales", "biases")})
    assert _ours_mla(folder) == theirs


@pytest.mark.xdist_group("conformance")
def test_inspect_predicts_that_mtplx_cannot_load_a_head_off_the_models_bits(flash) -> None:
    """``--layout sidecar --precision 8`` in a 4-bit model (the layout's own rule, per-path
    entries MTPLX's glm_mtp does not read): inspect --runtime mtplx says it will not load, and
    MTPLX indeed does not draft with it."""
    judged.require_mtplx()
    folder = flash["root"] / "mtplx-8bit-sidecar"
    shutil.copytree(flash["mlx"], folder)
    judged.add_mtp(flash["src"], folder, "--layout", "sidecar", "--precision", "8")
    rep = json.loads(judged.mtpforge("inspect", str(folder), "--json", "--runtime", "mtplx").stdout)
    assert [f["code"] for f in rep["findings"]] == ["RUNTIME_QUANT_UNSUPPORTED"], rep["findings"]
    p = judged.mtplx_run(judged.MTPLX_PROBE, folder)
    assert p.returncode != 0 or not json.loads(p.stdout.strip().splitlines()[-1])["mtp_enabled"], p.stdout


def test_inspect_finds_the_head_mlx_lm_convert_dropped_and_names_the_source_for_it(flash) -> None:
    """The converted folder: ``MTP_CONFIG_WITHOUT_WEIGHTS`` with the add-mtp command naming the
    release; the source itself: a source for add-mtp into an MLX folder (no longer GGUF only)."""
    judged.inspect_finds_the_dropped_head(flash["mlx"], "glm4_moe_lite", "zai-org/GLM-4.7-Flash")
    (f,) = json.loads(judged.mtpforge("inspect", str(flash["src"]), "--json").stdout)["findings"]
    assert f["code"] == "HF_SOURCE_CHECKPOINT" and "RMSNorms are raw" in f["message"]
    assert f["fix"].startswith(f"put its head into your MLX conversion: mtpforge add-mtp --source {flash['src']} "
                               "--target <your MLX folder>"), f["fix"]


@pytest.mark.parametrize("runtime", ["vllm-mlx", "mlx-vlm", "exo"])
def test_runtimes_that_do_not_draft_glm_4_7_flash_say_so(flash, runtime: str) -> None:
    """mlx-vlm 0.7.10 prepares a GLM-4.7-Flash drafter it cannot build (measured): still no MTP."""
    judged.runtime_says_it_does_not_draft(flash["src"], flash["mlx"], flash["root"] / f"nodraft-{runtime}", runtime,
                                          "glm4_moe_lite", "GLM-4.7-Flash")


def test_add_mtp_from_the_hub_fetches_only_the_tensors_the_mlx_head_is_made_of(flash, hub, tmp_path: Path) -> None:
    """From the (loopback) Hub: the NextN tensors but the ``embed_tokens`` copy, <= 1.01 x their
    bytes, ``kv_b_proj`` among them; the sidecar equals the local run's byte for byte."""
    from safetensors import safe_open

    judged.hub_fetches_only_the_sidecars_tensors(hub, flash["src"], flash["mlx"], tmp_path, P, ("embed_tokens.weight",))
    keys = set(safe_open(str(tmp_path / "hub" / "mtp.safetensors"), "np").keys())
    assert {f"{P}{KV_B}.weight", f"{P}shared_head.head.weight"} <= keys and f"{P}embed_tokens.weight" not in keys
