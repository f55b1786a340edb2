"""GLM-4.5 (``glm4_moe``), measured with the real programs before mtpforge writes a byte of it.

The facts docs/families/glm4_moe.md states, each held by the program it is about: the tiny
checkpoint (tests/support/synth/glm4_moe.py) is what llama.cpp's converter, ``mlx_lm.convert``
and MTPLX's ``glm_mtp`` backend accept; ``mlx_lm.convert`` drops the NextN layer and keeps the
declaration (the folder mtpforge will be asked to repair); the converter's ``--mtp`` file names
and metadata; its norms are the source's bytes (raw: no offset); ``llama-server`` drafts with it
and decodes exactly as without it; MTPLX reads a sidecar of the NextN layer in the source's own
key names and drafts with output identical to its plain decode. The trained tiny GLM in MTPLX
(plain add-mtp and ``--runtime mtplx``: drafts, identical, accepts exactly what verify accepts)
is a row of the runtime conformance matrix (tests/conformance).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests import gguf_env
from tests import mlx_judged as judged

N = 2  # the tiny model's num_hidden_layers: the NextN layer is model.layers.2


@pytest.fixture(scope="module")
def glm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.support.synth import convert_to_mlx
    from tests.support.synth.glm4_moe import build_glm4_moe

    root = tmp_path_factory.mktemp("glm4_moe")
    src = build_glm4_moe(root / "tiny-glm4_moe")
    mlx = convert_to_mlx(src, root / "tiny-glm4_moe-4bit", q_bits=4, q_group_size=32, dtype="float32")
    return {"root": root, "src": src, "mlx": mlx}


def test_the_tiny_checkpoint_has_glm45s_nextn_layer(glm) -> None:
    cfg = json.loads((glm["src"] / "config.json").read_text())
    keys = set(judged.source_tensors(glm["src"]))
    nextn = {k[len(f"model.layers.{N}."):] for k in keys if k.startswith(f"model.layers.{N}.")}
    assert cfg["model_type"] == "glm4_moe" and cfg["num_nextn_predict_layers"] == 1 and cfg["num_hidden_layers"] == N
    assert {"eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight", "shared_head.head.weight",
            "embed_tokens.weight", "mlp.gate.weight", "mlp.gate.e_score_correction_bias",
            "self_attn.q_proj.bias", "mlp.experts.3.down_proj.weight", "mlp.shared_experts.up_proj.weight"} <= nextn
    assert not any(k.startswith(f"model.layers.{N + 1}.") for k in keys)


def test_mlx_lm_convert_drops_the_nextn_layer_and_keeps_its_declaration(glm) -> None:
    """The folder users have: config still says one NextN layer, no tensor of it is stored."""
    from safetensors import safe_open

    cfg = json.loads((glm["mlx"] / "config.json").read_text())
    keys = [k for f in glm["mlx"].glob("model*.safetensors") for k in safe_open(str(f), "np").keys()]
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["quantization"]["bits"] == 4
    assert keys and not any(k.startswith(f"model.layers.{N}.") for k in keys)


@pytest.mark.xdist_group(gguf_env.XDIST_GROUP)
def test_llama_cpp_mtp_export_names_metadata_and_raw_norms(glm) -> None:
    """``--mtp`` writes the NextN block under ``blk.{N}`` (its own tensors as ``blk.{N}.nextn.*``)
    with the trunk's token_embd / output_norm / output, block_count N + 1 and
    ``glm4moe.nextn_predict_layers``; every tensor is the source's bytes (GLM's norms are raw)."""
    from gguf import GGUFReader

    mtp = gguf_env.official(glm["src"], "mtp", "f32", pre="glm4")
    trunk = gguf_env.official(glm["src"], "trunk", "f32", pre="glm4")
    r, t = GGUFReader(mtp), GGUFReader(trunk)
    assert r.fields["general.architecture"].contents() == "glm4moe"
    assert r.fields["glm4moe.block_count"].contents() == N + 1 and t.fields["glm4moe.block_count"].contents() == N
    assert r.fields["glm4moe.nextn_predict_layers"].contents() == 1 and "glm4moe.nextn_predict_layers" not in t.fields
    names = {x.name for x in r.tensors}
    assert {"token_embd.weight", "output_norm.weight", "output.weight"} <= names
    assert {f"blk.{N}.nextn.{n}.weight" for n in ("eh_proj", "enorm", "hnorm", "shared_head_norm", "shared_head_head",
                                                  "embed_tokens")} <= names
    assert all(n.startswith(f"blk.{N}.") or n in ("token_embd.weight", "output_norm.weight", "output.weight") for n in names)
    assert not any(x.name.startswith(f"blk.{N}.") for x in t.tensors)
    src = judged.source_tensors(glm["src"])
    by_name = {x.name: x for x in r.tensors}
    for g, s in [(f"blk.{N}.nextn.enorm.weight", "enorm.weight"), (f"blk.{N}.nextn.hnorm.weight", "hnorm.weight"),
                 (f"blk.{N}.nextn.shared_head_norm.weight", "shared_head.norm.weight"),
                 (f"blk.{N}.attn_norm.weight", "input_layernorm.weight"), (f"blk.{N}.nextn.eh_proj.weight", "eh_proj.weight")]:
        want = src[f"model.layers.{N}.{s}"]
        assert np.array_equal(np.asarray(by_name[g].data).reshape(want.shape), want), g


@pytest.mark.xdist_group(gguf_env.XDIST_GROUP)
def test_llama_server_drafts_with_the_official_mtp_file_and_tail_exactly_as_plain(glm) -> None:
    gguf_env.need("server")
    trunk = gguf_env.official(glm["src"], "trunk", "f32", pre="glm4")
    mtp = gguf_env.official(glm["src"], "mtp", "f32", pre="glm4")
    texts = gguf_env.prompts()[:4]
    plain = gguf_env.measure(trunk, texts=texts)
    drafted = gguf_env.measure(trunk, draft=mtp, texts=texts)
    assert drafted["drafted"] > 0 and drafted["tokens"] == plain["tokens"]
    tail = gguf_env.measure(gguf_env.official(glm["src"], "full", "f32", pre="glm4"), mtp=True, texts=texts)
    assert tail["drafted"] > 0 and tail["tokens"] == plain["tokens"]


MTPLX_PROBE = judged.MTPLX_PROBE


@pytest.mark.xdist_group("conformance")
def test_mtplx_glm_mtp_drafts_from_a_sidecar_of_the_nextn_layer_in_source_names(glm) -> None:
    """MTPLX 2.12.2's ``glm_mtp`` backend reads ``mtp.safetensors`` with the source's own
    ``model.layers.{N}.*`` keys (experts per expert: it stacks them; unquantized: it quantizes
    only modules stored with scales) and drafts with output identical to its plain decode."""
    import mlx.core as mx

    judged.require_mtplx()
    folder = glm["root"] / "mtplx"
    shutil.copytree(glm["mlx"], folder)
    head = {k: mx.array(v) for k, v in judged.source_tensors(glm["src"]).items() if k.startswith(f"model.layers.{N}.")}
    mx.save_safetensors(str(folder / "mtp.safetensors"), head, metadata={"format": "mlx"})
    got = judged.mtplx_drafts(folder)
    assert got["mtp_enabled"] and got["identical"] and got["drafted"] > 0, got


@pytest.mark.xdist_group("conformance")
@pytest.mark.parametrize("extra", [[], ["--runtime", "mtplx"], ["--runtime", "mtplx", "--precision", "8"]],
                         ids=["plain", "runtime-mtplx", "runtime-mtplx-8bit"])
def test_mtplx_drafts_with_the_head_mtpforge_writes(glm, extra: list[str]) -> None:
    """The judge for mtpforge's MLX output of this family: MTPLX's own ``glm_mtp`` backend loads
    what plain add-mtp (bf16 sidecar, experts stacked) and ``--runtime mtplx`` (MTPLX's template:
    the layer at the model's bits) write, drafts, and decodes exactly as its plain decode (those
    two: cells of the runtime conformance matrix, on the trained tiny GLM; here MTPLX runs the
    8-bit head only); inspect finds nothing and verify's decode is identical too."""
    judged.require_mtplx()
    judged.mtplx_judges_the_head(glm["src"], glm["mlx"], glm["root"] / f"ours-{'-'.join(extra) or 'plain'}", extra,
                                 drafts="--precision" in extra)


@pytest.mark.xdist_group("conformance")
def test_inspect_predicts_what_mtplx_does_with_a_head_off_the_models_bits(glm) -> None:
    """``--layout sidecar --precision 8`` (the layout's own rule: 8-bit head and routers in a
    4-bit model, per-path entries) is a head MTPLX's glm_mtp cannot load — it reads no per-path
    entry — and inspect --runtime mtplx says so before anyone tries."""
    judged.require_mtplx()
    folder = glm["root"] / "mtplx-8bit-sidecar"
    shutil.copytree(glm["mlx"], folder)
    judged.add_mtp(glm["src"], folder, "--layout", "sidecar", "--precision", "8")
    rep = json.loads(judged.mtpforge("inspect", str(folder), "--json", "--runtime", "mtplx").stdout)
    assert [f["code"] for f in rep["findings"]] == ["RUNTIME_QUANT_UNSUPPORTED"], rep["findings"]
    p = judged.mtplx_run(MTPLX_PROBE, folder)
    assert p.returncode != 0 or not json.loads(p.stdout.strip().splitlines()[-1])["mtp_enabled"], p.stdout


def test_inspect_finds_the_head_mlx_lm_convert_dropped(glm) -> None:
    """The converted folder declares a NextN layer and stores none: the finding, with the
    add-mtp command that fixes it (a GLM repo as the example source)."""
    judged.inspect_finds_the_dropped_head(glm["mlx"], "glm4_moe", "zai-org/GLM-4.5-Air")


@pytest.mark.parametrize("runtime", ["vllm-mlx", "mlx-vlm", "exo"])
def test_runtimes_that_do_not_draft_glm_say_so(glm, runtime: str) -> None:
    """inspect --runtime on a GLM folder with its head: the runtime's own words for why it has no
    MTP path for the family; add-mtp --runtime refuses where the runtime's layout is not one the
    family has, in one line, and touches nothing."""
    judged.runtime_says_it_does_not_draft(glm["src"], glm["mlx"], glm["root"] / f"nodraft-{runtime}", runtime,
                                          "glm4_moe", "GLM")


def test_add_mtp_from_the_hub_fetches_only_the_tensors_the_mlx_head_is_made_of(glm, hub, tmp_path: Path) -> None:
    """From the (loopback) Hub, only the NextN tensors the sidecar is made of come over the
    wire: ≤ 1.01 × their bytes, the release's ``embed_tokens`` copy (which no MLX runtime reads)
    not among them; the folder written equals the one from the local source."""
    from safetensors import safe_open

    p = f"model.layers.{N}."
    judged.hub_fetches_only_the_sidecars_tensors(hub, glm["src"], glm["mlx"], tmp_path, p, ("embed_tokens.weight",))
    keys = set(safe_open(str(tmp_path / "hub" / "mtp.safetensors"), "np").keys())
    assert f"{p}eh_proj.weight" in keys and f"{p}shared_head.head.weight" in keys and f"{p}embed_tokens.weight" not in keys
