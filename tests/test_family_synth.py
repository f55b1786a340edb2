"""The tiny GLM-4.7-Flash and Nemotron-H checkpoints (tests/support/synth/glm4_moe_lite.py,
nemotron_h.py) have the release layout their families' programs read: released mlx-lm loads the
trunk and drops the head, and llama.cpp's converter (skipped where it is not built) writes the
MTP-only GGUF with exactly the names docs/families/*.md list, which llama-server drafts with.
The full measurements are the probe scripts' (scripts/probe_family.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest

from tests import gguf_env
from tests.support.synth.glm4_moe_lite import build_glm4_moe_lite, nextn_keys
from tests.support.synth.nemotron_h import build_nemotron_h, mtp_keys

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP)

GLM_GGUF_MTP = {
    "token_embd.weight", "output.weight", "output_norm.weight",
    *(f"blk.2.{t}.weight" for t in (
        "nextn.eh_proj", "nextn.embed_tokens", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_head",
        "nextn.shared_head_norm", "attn_norm", "ffn_norm", "attn_q_a", "attn_q_a_norm", "attn_q_b", "attn_kv_a_mqa",
        "attn_kv_a_norm", "attn_k_b", "attn_v_b", "attn_output", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps",
        "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")),
    "blk.2.exp_probs_b.bias",
}
NEMOTRON_GGUF_MTP = {
    "token_embd.weight", "output.weight", "output_norm.weight",
    *(f"blk.4.{t}.weight" for t in (
        "nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm", "attn_norm", "attn_q", "attn_k",
        "attn_v", "attn_output", "post_attention_norm", "ffn_gate_inp", "ffn_up_exps", "ffn_down_exps",
        "ffn_up_shexp", "ffn_down_shexp")),
    "blk.4.exp_probs_b.bias",
}


@pytest.fixture(scope="module")
def glm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_glm4_moe_lite(tmp_path_factory.mktemp("glm") / "tiny-glm4_moe_lite")


@pytest.fixture(scope="module")
def nemotron(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_nemotron_h(tmp_path_factory.mktemp("nemotron") / "tiny-nemotron_h")


def _keys(folder: Path) -> set[str]:
    return set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"])


def test_glm_head_layout(glm: Path) -> None:
    cfg = json.loads((glm / "config.json").read_text())
    head = {k for k in _keys(glm) if k.startswith("model.layers.2.")}
    assert head == set(nextn_keys(cfg))
    for suffix in ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight", "shared_head.head.weight",
                   "embed_tokens.weight", "self_attn.q_a_proj.weight", "self_attn.q_a_layernorm.weight",
                   "self_attn.q_b_proj.weight", "self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_layernorm.weight",
                   "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight", "mlp.gate.e_score_correction_bias",
                   "mlp.experts.3.down_proj.weight", "mlp.shared_experts.up_proj.weight"):
        assert f"model.layers.2.{suffix}" in head, suffix
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["model_type"] == "glm4_moe_lite"


def test_glm_q_proj_variant(tmp_path: Path) -> None:
    folder = build_glm4_moe_lite(tmp_path / "g", q_lora_rank=None)
    keys = _keys(folder)
    assert "model.layers.2.self_attn.q_proj.weight" in keys and not any("q_a_proj" in k for k in keys)


def test_nemotron_head_layout(nemotron: Path) -> None:
    cfg = json.loads((nemotron / "config.json").read_text())
    head = {k for k in _keys(nemotron) if k.startswith("mtp.")}
    assert head == set(mtp_keys(cfg))
    assert {"mtp.layers.0.eh_proj.weight", "mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight",
            "mtp.layers.0.mixer.q_proj.weight", "mtp.layers.1.mixer.gate.weight",
            "mtp.layers.1.mixer.experts.0.up_proj.weight", "mtp.layers.1.final_layernorm.weight"} <= head
    assert not any(k.startswith("mtp.layers.1.") and ("eh_proj" in k or "enorm" in k) for k in head)
    assert cfg["mtp_hybrid_override_pattern"] == "*E"


@pytest.mark.parametrize("family", ["glm", "nemotron"])
def test_released_mlx_lm_loads_the_trunk(family: str, request: pytest.FixtureRequest) -> None:
    from mlx.utils import tree_flatten
    from mlx_lm import load

    folder = request.getfixturevalue(family)
    model, tok = load(str(folder))
    model.set_dtype(mx.float32)  # MLX's CPU gather_mm (unquantized experts) is float32-only
    names = [k for k, _ in tree_flatten(model.parameters())]
    assert not any(k.startswith(("mtp.", "model.layers.2.")) for k in names)
    logits = model(mx.array([tok.encode("Count: 3, 4, 5,")]))
    assert logits.shape[-1] == 512 and bool(mx.all(mx.isfinite(logits)).item())


def _convert(folder: Path, tmp: Path, mode: str, pre: str) -> Path:
    from tests.support import family_probe as fp

    c = fp.convert(folder, tmp, mode, pre=pre)
    assert c["rc"] == 0, c.get("error")
    return Path(c["file"])


@pytest.mark.parametrize("family,pre,names,arch", [
    ("glm", "glm4", GLM_GGUF_MTP, "deepseek2"),
    ("nemotron", "qwen35", NEMOTRON_GGUF_MTP, "nemotron_h_moe"),
])
def test_llama_cpp_mtp_file_and_draft(family: str, pre: str, names: set[str], arch: str, tmp_path: Path,
                                      request: pytest.FixtureRequest) -> None:
    gguf_env.need("converter")
    from tests.support import family_probe as fp

    folder = request.getfixturevalue(family)
    mtp = _convert(folder, tmp_path, "mtp", pre)
    summary = fp.gguf_summary(mtp)
    assert set(summary["tensors"]) == names
    assert summary["kv"]["general.architecture"] == arch
    assert summary["kv"][f"{arch}.nextn_predict_layers"] == 1
    gguf_env.need("server")
    trunk = _convert(folder, tmp_path, "trunk", pre)
    runs = fp.llama_server_runs(trunk, mtp, None, n_predict=8, prompts=fp.PROMPTS[:2])
    assert runs["draft_mtp_file"]["ok"], runs["draft_mtp_file"].get("error")
    assert runs["draft_mtp_file"]["drafted"] > 0
    assert runs["draft_mtp_file"]["identical_to_plain"]
