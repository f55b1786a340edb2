"""DeepSeek-V3 / R1 (``deepseek_v3``) heads in MLX folders, judged by MTPLX's own ``deepseek_mtp`` backend.

The tiny checkpoint (tests/support/synth/deepseek_v3.py) converted by ``mlx_lm.convert -q`` (4-bit,
group 64) from its trunk-only copy (mlx-lm's ``deepseek_v3`` sanitize drops the NextN layer by the
release's index 61, so it cannot load a tiny one with the layer: docs/families/deepseek_v3.md §3;
the declaration is kept, as for the release) is the folder users have. add-mtp writes the sidecar
MTPLX 2.12.2's ``deepseek_mtp`` reads, from the bf16 source and from the block-FP8 one: MTPLX loads
it, drafts and decodes as its plain decode, and splits ``kv_b_proj`` into exactly the absorbed
matrices the bundled decoder (mlx-lm's ``DeepseekV3DecoderLayer``) holds; inspect is clean;
``verify --generate`` decodes as plain greedy decoding; only the head's bytes come from the Hub.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests import mlx_judged as judged
from tests.test_family_glm4_moe_lite import _ours_mla

N = 2  # the tiny model's num_hidden_layers: the NextN layer is model.layers.2
P = f"model.layers.{N}."
KV_B = "self_attn.kv_b_proj"


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.support.synth import convert_to_mlx
    from tests.support.synth.deepseek_v3 import build_deepseek_v3

    root = tmp_path_factory.mktemp("deepseek_v3")
    src = build_deepseek_v3(root / "tiny-deepseek_v3")
    fp8 = build_deepseek_v3(root / "tiny-deepseek_v3-fp8", fp8=True)
    trunk = build_deepseek_v3(root / "tiny-deepseek_v3-trunk", head=False)
    mlx = convert_to_mlx(trunk, root / "tiny-deepseek_v3-4bit", q_bits=4, q_group_size=64, dtype="float32")
    return {"root": root, "src": src, "fp8": fp8, "mlx": mlx}


def test_the_tiny_checkpoint_has_deepseek_v3s_config_and_fp8_layout(ds) -> None:
    """transformers reads the config as DeepSeek-V3's (group-limited routing, YaRN); the FP8 copy
    stores every 2-D projection of the NextN layer as F8_E4M3 with its block scale, and the
    router, norms and vocabulary-sized copies as the bf16 release does."""
    from transformers import AutoConfig

    from mtpforge.checkpoint.safetensors_header import read_local_header
    from tests.support.synth.deepseek_v3 import FP8_KEEP

    cfg = AutoConfig.from_pretrained(ds["src"])
    assert type(cfg).__name__ == "DeepseekV3Config" and (cfg.n_group, cfg.topk_group, cfg.n_routed_experts) == (4, 2, 8)
    assert cfg.routed_scaling_factor == 2.5 and json.loads((ds["fp8"] / "config.json").read_text())["quantization_config"][
        "weight_block_size"] == [128, 128]
    infos = {k: v for f in ds["fp8"].glob("model*.safetensors") for k, v in read_local_header(f, f.name).tensors.items()}
    head = {k: v for k, v in infos.items() if k.startswith(P)}
    fp8 = {k for k, v in head.items() if v.dtype == "F8_E4M3"}
    assert fp8 == {k for k, v in head.items() if len(v.shape) == 2 and k[len(P):] not in FP8_KEEP
                   and not k.endswith("_scale_inv")}
    assert {k + "_scale_inv" for k in fp8} == {k for k in head if k.endswith("_scale_inv")}
    assert not any(v.dtype == "F8_E4M3" for k, v in infos.items() if not k.startswith(P))


@pytest.mark.xdist_group("conformance")
# the FP8 release plain only: its dequantization is the emitters' shared decode (held to the
# converter's bytes by the GGUF tests), and MTPLX's load of a quantized head is the bf16 one's
@pytest.mark.parametrize("source,extra", [("src", []), ("src", ["--runtime", "mtplx"]), ("fp8", [])],
                         ids=["plain", "runtime-mtplx", "fp8-plain"])
def test_mtplx_drafts_with_the_head_mtpforge_writes(ds, source: str, extra: list[str]) -> None:
    """Plain add-mtp (bf16 sidecar, experts stacked) and ``--runtime mtplx`` (the layer at the
    model's 4 bits, ``eh_proj`` and the router float), from the bf16 and the FP8 release: MTPLX's
    deepseek_mtp loads the head, drafts and decodes exactly as its plain decode; inspect --runtime
    mtplx finds nothing; verify decodes as plain greedy decoding; ``kv_b_proj`` is stored whole
    and MTPLX's split of it is the bundled decoder's, byte for byte."""
    judged.require_mtplx()
    folder = ds["root"] / f"ours-{source}-{'-'.join(extra) or 'plain'}"
    got = judged.mtplx_judges_the_head(ds[source], ds["mlx"], folder, extra, params=judged.MLA_PARAMS)
    assert got["add"]["family"] == "deepseek_v3" and got["add"]["expert_format"] == "switch_mlp"
    assert got["mtplx"]["model"] == "_MTPLXDeepSeekModel", got["mtplx"]
    head = judged.source_tensors(folder, "mtp.safetensors")
    assert all(k.startswith(P) for k in head) and f"{P}embed_tokens.weight" not in head
    assert not any(k.endswith("_scale_inv") or "embed_q" in k for k in head)
    if extra:
        assert head[f"{P}{KV_B}.weight"].dtype == np.uint32 and f"{P}{KV_B}.scales" in head
        assert f"{P}eh_proj.scales" not in head and f"{P}mlp.gate.scales" not in head
    elif source == "src":
        src = judged.source_tensors(ds["src"])[f"{P}{KV_B}.weight"]
        assert head[f"{P}{KV_B}.weight"].tobytes() == src.tobytes()
    assert got["inspect"]["norm_convention"] == "raw", got["inspect"]
    assert _ours_mla(folder) == judged.mla_of(got["mtplx"]["params"])


def test_the_fp8_heads_sidecar_is_the_dequantized_release(ds) -> None:
    """From the FP8 source, each projection is its weight times its 128x128 block scale (what
    mlx-lm's ``deepseek_v3`` sanitize computes), rounded once to bf16; the rest as the bf16 run."""
    import mlx.core as mx

    from tests.support.synth.deepseek_v3 import FP8_KEEP

    folder = ds["root"] / "ours-fp8-plain"
    if not folder.exists():
        import shutil

        shutil.copytree(ds["mlx"], folder)
        judged.add_mtp(ds["fp8"], folder)
    head = mx.load(str(folder / "mtp.safetensors"))
    raw = {}
    for f in sorted(ds["fp8"].glob("model*.safetensors")):
        raw.update(mx.load(str(f)))
    key = f"{P}{KV_B}.weight"
    w, s = mx.from_fp8(raw[key], dtype=mx.float32), raw[key + "_scale_inv"]
    want = (w * mx.repeat(mx.repeat(s, 128, 0), 128, 1)[: w.shape[0], : w.shape[1]]).astype(mx.bfloat16)
    assert raw[key].dtype == mx.uint8 and mx.array_equal(head[key], want)
    for k in FP8_KEEP:
        if f"{P}{k}" in head:
            assert raw[f"{P}{k}"].dtype == mx.bfloat16 and mx.array_equal(head[f"{P}{k}"], raw[f"{P}{k}"])


def test_inspect_finds_the_head_mlx_lm_convert_dropped_and_names_deepseek_v3(ds) -> None:
    """The converted folder: ``MTP_CONFIG_WITHOUT_WEIGHTS`` with the add-mtp command naming the
    release; the source itself: a source for add-mtp, its norms raw."""
    judged.inspect_finds_the_dropped_head(ds["mlx"], "deepseek_v3", "deepseek-ai/DeepSeek-V3")
    for src in (ds["src"], ds["fp8"]):
        rep = json.loads(judged.mtpforge("inspect", str(src), "--json").stdout)
        (f,) = rep["findings"]
        assert rep["family"] == "deepseek_v3" and f["code"] == "HF_SOURCE_CHECKPOINT" and "RMSNorms are raw" in f["message"]


@pytest.mark.parametrize("runtime", ["vllm-mlx", "mlx-vlm", "exo"])
def test_runtimes_that_do_not_draft_deepseek_v3_say_so(ds, runtime: str) -> None:
    judged.runtime_says_it_does_not_draft(ds["src"], ds["mlx"], ds["root"] / f"nodraft-{runtime}", runtime,
                                          "deepseek_v3", "DeepSeek-V3")


@pytest.mark.parametrize("source", ["src", "fp8"])
def test_add_mtp_from_the_hub_fetches_only_the_tensors_the_mlx_head_is_made_of(ds, hub, source: str,
                                                                                tmp_path: Path) -> None:
    """From the (loopback) Hub: the NextN tensors but the ``embed_tokens`` copy (with the FP8
    block scales), <= 1.01 x their bytes; the sidecar equals the local run's byte for byte."""
    got = judged.hub_fetches_only_the_sidecars_tensors(hub, ds[source], ds["mlx"], tmp_path, P, ("embed_tokens.weight",))
    assert got["fetched"] <= 1.01 * got["head"]
