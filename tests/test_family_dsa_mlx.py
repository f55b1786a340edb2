"""DeepSeek-V3.2 (``deepseek_v32``) and GLM-5 (``glm_moe_dsa``) heads in MLX folders, judged by
MTPLX 2.12.2's own ``deepseek_mtp`` backend, which lists both model types.

Each tiny checkpoint (tests/support/synth/deepseek_v32.py, glm_moe_dsa.py: DeepSeek-V3's NextN head
plus DeepSeek Sparse Attention's indexer in every layer) converted by the real ``mlx_lm.convert``
(4-bit, group 32: ``tests.support.families.mlx_trunk``; mlx-lm's ``deepseek_v32`` sanitize drops
every layer from ``num_hidden_layers`` on, so the whole source converts) is the folder users have.
add-mtp writes DeepSeek-V3's sidecar (the source's names, ``kv_b_proj`` whole) with the indexer's
tensors as stored, from the bf16 and the block-FP8 source, plain and ``--runtime mtplx``: MTPLX
loads it with MTP enabled, holds every indexer tensor as written, drafts and decodes as its plain
decode; its split of ``kv_b_proj`` is the bundled decoder's; inspect is clean; ``verify
--generate`` decodes as plain greedy decoding; only the head's bytes come from the Hub.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests import mlx_judged as judged
from tests.test_family_glm4_moe_lite import _ours_mla

N = 2  # the tiny models' num_hidden_layers: the NextN layer is model.layers.2
P = f"model.layers.{N}."
KV_B = "self_attn.kv_b_proj"
INDEXER = "self_attn.indexer."
FAMILIES = {"deepseek_v32": ("DeepSeek-V3.2", "deepseek-ai/DeepSeek-V3.2"),
            "glm_moe_dsa": ("GLM-5", "zai-org/GLM-5")}


@pytest.fixture(scope="module", params=list(FAMILIES))
def dsa(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    import importlib

    from tests.support.families import mlx_trunk, tiny_source

    family = request.param
    root = tmp_path_factory.mktemp(family)
    src = tiny_source(family, root / f"tiny-{family}")
    fp8 = getattr(importlib.import_module(f"tests.support.synth.{family}"), f"build_{family}_fp8")(root / f"tiny-{family}-fp8")
    mlx = mlx_trunk(family, src, root / f"tiny-{family}-4bit")
    return {"family": family, "root": root, "src": src, "fp8": fp8, "mlx": mlx}


def _sha(a: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


@pytest.mark.xdist_group("conformance")
# the FP8 release once (plain, DeepSeek-V3.2's): its dequantization is the emitters' shared decode, which the
# GGUF tests hold to the converter's bytes; MTPLX's load of a quantized head is the bf16 one's
@pytest.mark.parametrize("source,extra", [("src", []), ("src", ["--runtime", "mtplx"]), ("fp8", [])],
                         ids=["plain", "runtime-mtplx", "fp8-plain"])
def test_mtplx_drafts_with_the_head_mtpforge_writes(dsa, source: str, extra: list[str]) -> None:
    """Plain add-mtp (bf16 sidecar, experts stacked) and ``--runtime mtplx`` (the layer at the
    model's 4 bits, ``eh_proj`` and the router float), from the bf16 and the FP8 release: MTPLX's
    deepseek_mtp loads the head, drafts and decodes exactly as its plain decode; inspect --runtime
    mtplx finds nothing; verify decodes as plain greedy decoding; the indexer is in the sidecar
    and MTPLX holds each of its tensors byte for byte as stored; ``kv_b_proj`` is stored whole
    and MTPLX's split of it is the bundled decoder's, byte for byte."""
    judged.require_mtplx()
    if source == "fp8" and dsa["family"] != "deepseek_v32":
        pytest.skip("GLM-5's FP8 release dequantizes as DeepSeek-V3.2's (one decode): one FP8 case through MTPLX")
    folder = dsa["root"] / f"ours-{source}-{'-'.join(extra) or 'plain'}"
    got = judged.mtplx_judges_the_head(dsa[source], dsa["mlx"], folder, extra, params=(*judged.MLA_PARAMS, ".indexer."))
    assert got["add"]["family"] == dsa["family"] and got["add"]["expert_format"] == "switch_mlp"
    assert got["mtplx"]["model"] == "_MTPLXDeepSeekModel", got["mtplx"]
    head = judged.source_tensors(folder, "mtp.safetensors")
    assert all(k.startswith(P) for k in head) and f"{P}embed_tokens.weight" not in head
    assert not any(k.endswith("_scale_inv") or "embed_q" in k for k in head)
    indexer = {k[len(P) + len("self_attn."):]: v for k, v in head.items() if k.startswith(P + INDEXER)}
    assert {k.split(".")[1] for k in indexer} == {"wq_b", "wk", "k_norm", "weights_proj"}
    theirs = {k.split("mtp_block.")[1]: [v[0], v[2]] for k, v in got["mtplx"]["params"].items() if ".indexer." in k}
    assert theirs == {f"self_attn.{k}": [theirs[f"self_attn.{k}"][0], _sha(v)] for k, v in indexer.items()}
    if extra:
        assert head[f"{P}{KV_B}.weight"].dtype == np.uint32 and f"{P}{KV_B}.scales" in head
        assert f"{P}eh_proj.scales" not in head and f"{P}mlp.gate.scales" not in head
    elif source == "src":
        src = judged.source_tensors(dsa["src"])
        for k in (f"{P}{KV_B}.weight", *(f"{P}self_attn.{k}" for k in indexer)):
            assert head[k].tobytes() == src[k].tobytes(), k
    assert _ours_mla(folder) == judged.mla_of(got["mtplx"]["params"])


def test_inspect_finds_the_head_mlx_lm_convert_dropped_and_names_the_release(dsa) -> None:
    """The converted folder: ``MTP_CONFIG_WITHOUT_WEIGHTS`` with the add-mtp command naming the
    release (no longer a GGUF-only family); the source: a source for add-mtp, its norms raw."""
    judged.inspect_finds_the_dropped_head(dsa["mlx"], dsa["family"], FAMILIES[dsa["family"]][1])
    rep = json.loads(judged.mtpforge("inspect", str(dsa["src"]), "--json").stdout)
    (f,) = rep["findings"]
    assert rep["family"] == dsa["family"] and f["code"] == "HF_SOURCE_CHECKPOINT" and "RMSNorms are raw" in f["message"]


@pytest.mark.parametrize("runtime", ["vllm-mlx", "mlx-vlm", "exo"])
def test_runtimes_that_do_not_draft_the_family_say_so(dsa, runtime: str) -> None:
    """mlx-vlm drafts GLM-5 from the drafter folder add-mtp --runtime mlx-vlm writes
    (tests/test_family_glm5_mlx_vlm.py), and DeepSeek-V3.2 not at all."""
    from mtpforge.runtimes.table import RUNTIMES

    if dsa["family"] not in RUNTIMES[runtime].no_mtp:
        assert (runtime, dsa["family"]) == ("mlx-vlm", "glm_moe_dsa")
        return
    judged.runtime_says_it_does_not_draft(dsa["src"], dsa["mlx"], dsa["root"] / f"nodraft-{runtime}", runtime,
                                          dsa["family"], FAMILIES[dsa["family"]][0])


@pytest.mark.parametrize("source", ["src", "fp8"])
def test_add_mtp_from_the_hub_fetches_only_the_tensors_the_mlx_head_is_made_of(dsa, hub, source: str,
                                                                                tmp_path: Path) -> None:
    """From the (loopback) Hub: the NextN tensors but the ``embed_tokens`` copy (the indexer's and
    the FP8 block scales included), <= 1.01 x their bytes; the sidecar equals the local run's."""
    got = judged.hub_fetches_only_the_sidecars_tensors(hub, dsa[source], dsa["mlx"], tmp_path, P, ("embed_tokens.weight",))
    assert got["fetched"] <= 1.01 * got["head"]
    print(f"{dsa['family']} {source}: fetched {got['fetched']} of {got['head']} head bytes")


def test_a_head_shifted_as_if_zero_centred_is_found_and_repaired_from_the_source(dsa, tmp_path: Path) -> None:
    """The family's norms are raw: a head whose eight norm weights (the indexer's LayerNorm
    ``k_norm`` among them; its bias is no scale) carry +1 is ``MTP_NORMS_SHIFTED`` for inspect
    --source, and repair-norms --source puts back exactly the tensors add-mtp wrote."""
    import shutil

    import mlx.core as mx

    good = tmp_path / "good"
    shutil.copytree(dsa["mlx"], good)
    judged.add_mtp(dsa["src"], good)
    written = mx.load(str(good / "mtp.safetensors"))
    folder = tmp_path / "shifted"
    shutil.copytree(good, folder)
    w = {k: (v.astype(mx.float32) + 1.0).astype(v.dtype) if k.endswith("norm.weight") else v for k, v in written.items()}
    mx.save_safetensors(str(folder / "mtp.safetensors"), w, metadata={"format": "mlx"})
    r = judged.mtpforge("inspect", str(folder), "--json", "--source", str(dsa["src"]))
    assert r.returncode == 1 and [f["code"] for f in json.loads(r.stdout)["findings"]] == ["MTP_NORMS_SHIFTED"], r.stdout
    r = judged.mtpforge("repair-norms", str(folder), "--source", str(dsa["src"]), "--json")
    fixed = json.loads(r.stdout)
    assert r.returncode == 0 and fixed["evidence"] == "source" and len(fixed["changed_norms"]) == 8, fixed
    assert f"{P}{INDEXER}k_norm.weight" in fixed["changed_norms"]
    got = mx.load(str(folder / "mtp.safetensors"))
    assert set(got) == set(written) and all(mx.array_equal(got[k], v).item() for k, v in written.items())


def test_a_sidecar_without_its_indexer_is_found(dsa, tmp_path: Path) -> None:
    """MTPLX's deepseek_mtp loads its head non-strictly, so a sidecar without the indexer's five
    tensors loads and drafts with an indexer left as initialised (measured; below ``index_topk``
    tokens of context the indexer selects nothing, so nothing shows): inspect --runtime mtplx says
    the five are missing."""
    import shutil

    import mlx.core as mx

    folder = tmp_path / "no-indexer"
    shutil.copytree(dsa["mlx"], folder)
    judged.add_mtp(dsa["src"], folder)
    w = {k: v for k, v in mx.load(str(folder / "mtp.safetensors")).items() if INDEXER not in k}
    mx.save_safetensors(str(folder / "mtp.safetensors"), w, metadata={"format": "mlx"})
    r = judged.mtpforge("inspect", str(folder), "--json", "--runtime", "mtplx")
    (f,) = json.loads(r.stdout)["findings"]
    assert r.returncode == 1 and f["code"] == "MTP_MISSING_TENSORS" and "5 MTP tensor" in f["message"], r.stdout
