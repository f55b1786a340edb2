"""GLM-4.5 / 4.6 (``glm4_moe``) heads for llama.cpp, written by mtpforge and judged by llama.cpp.

The references are llama.cpp's own converter on the tiny GLM checkpoints the repo builds
(``--no-mtp`` for the trunk users have, ``--mtp`` for the MTP-only file, neither for the full
file): add-mtp from the trunk and the source's head bytes writes the same tensors and metadata,
``llama-server`` drafts with the result and decodes exactly as without it, only the head's bytes
come over the (loopback) Hub, and inspect tells a head-less trunk from a complete one and a
raw-norm head from a wrongly shifted one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpforge.gguf.gguffile import read_local
from mtpforge.gguf.names import block_of
from tests import gguf_env
from tests import gguf_judged as judged
from tests.gguf_env import mtpforge, official

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP)
PRE = "glm4"  # the converter's pre-tokenizer for the synthetic GLM vocabulary
N = 2  # the tiny model's num_hidden_layers: the NextN layer is blk.2


@pytest.fixture(scope="module")
def glm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """GLM-4.5's shape (its own shared_head.head / embed_tokens) and GLM-4.6's (neither)."""
    from tests.support.synth.glm4_moe import build_glm4_moe

    root = tmp_path_factory.mktemp("glm4_moe_gguf")
    return {"4.5": build_glm4_moe(root / "tiny-glm4_moe"),
            "4.6": build_glm4_moe(root / "tiny-glm4_6", with_shared_head=False, seed=1)}


@pytest.fixture
def src(glm: dict[str, Path]) -> Path:
    """The GLM-4.5-shaped source (its own ``shared_head.head`` and ``embed_tokens`` copies)."""
    return glm["4.5"]


def _trunk(src: Path, dst: Path, qtype: str = "f32") -> Path:
    return gguf_env.trunk_copy(src, dst, qtype, pre=PRE)





@pytest.mark.parametrize("shape", ["4.5", "4.6"])
def test_the_mtp_file_equals_the_converters_mtp_export_at_f32(glm, shape: str, tmp_path: Path) -> None:
    """Everything ``--mtp`` writes (tensors, values, metadata, the file name), from the
    ``--no-mtp`` trunk and the head's bytes; the trunk is only read."""
    src = glm[shape]
    r, ref = judged.equals_mtp_export(src, _trunk(src, tmp_path), PRE)
    assert Path(r["output"]).name == f"mtp-Tiny-{src.name.split('-', 1)[1].title()}-F32.gguf"
    assert r["family"] == "glm4_moe" and r["architecture"] == "glm4moe"
    assert (f"blk.{N}.nextn.shared_head_head.weight" in ref.tensors) == (shape == "4.5")
    assert json.loads(Path(r["manifest"]).read_text())["norm_convention"] == "raw"


@pytest.mark.parametrize("precision", ["f16", "bf16", "q8_0"])
def test_the_mtp_block_equals_the_converters_bit_for_bit(glm, precision: str, tmp_path: Path) -> None:
    """At f16 / bf16 / q8_0 the MTP block is the converter's byte for byte (norms, biases and
    router F32 as there); token_embd / output_norm / output are the user's trunk's own bytes."""
    judged.block_equals_converters(glm["4.5"], _trunk(glm["4.5"], tmp_path), PRE, precision, N, 23)


class TestConverterJudged(judged.ConverterJudged):
    """The tail, llama-server's drafting on f32 / Q8_0 / Q4_K_M trunks, the hub's bytes."""

    pre = PRE


def test_inspect_finds_the_missing_head_then_a_clean_one_with_raw_norms(glm, tmp_path: Path) -> None:
    src = glm["4.5"]
    trunk = _trunk(src, tmp_path)
    code, rep = judged.inspect_json(trunk)
    (f,) = rep["findings"]
    assert rep["family"] == "glm4_moe" and f["code"] == "MTP_HEAD_MISSING" and str(trunk) in f["fix"]
    assert f["fix"].startswith("mtpforge add-mtp --source <original Hugging Face repo, e.g. zai-org/GLM-")
    judged.add_mtp(trunk, src)
    code, rep = judged.inspect_json(trunk, "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-mtp" and rep["norm_convention"] == "raw"
    assert rep["mtp_tensors"] == 23 and rep["expert_format"] == "stacked"
    code, rep = judged.inspect_json(trunk)
    assert rep["norm_convention"] == "raw" and rep["norm_convention_from"] == "manifest"


def test_inspect_finds_glm_norms_shifted_as_if_they_were_qwens(glm, tmp_path: Path) -> None:
    """GLM's norms are raw: a head whose norms got Qwen's +1 is found against the source."""
    from tests.test_gguf import _rewrite

    src = glm["4.5"]
    full = official(src, "full", "f32", pre=PRE)
    bad = _rewrite(full, tmp_path / "shifted.gguf",
                   edit=lambda k, a: a + 1 if block_of(k) == N and k.endswith(("norm.weight", "enorm.weight", "hnorm.weight"))
                   else None)
    code, rep = judged.inspect_json(bad, "--source", str(src))
    assert code == 1 and {f["code"] for f in rep["findings"]} == {"MTP_NORMS_SHIFTED"}
    code, rep = judged.inspect_json(full, "--source", str(src))
    assert code == 0 and rep["norm_convention"] == "raw" and rep["findings"] == []


def test_a_source_whose_own_head_copy_has_another_shape_is_refused(glm, tmp_path: Path) -> None:
    """GLM-4.5's ``shared_head.head`` may be absent, but when present it must have the shape
    the config implies: refused in one line (exit 1), nothing written beside the trunk."""
    import shutil

    from safetensors.numpy import load_file, save_file

    src = Path(shutil.copytree(glm["4.5"], tmp_path / "src"))
    key = f"model.layers.{N}.shared_head.head.weight"
    for shard in sorted(src.glob("model*.safetensors")):
        t = load_file(shard)
        if key in t:
            t[key] = t[key][:-1]
            save_file(t, shard, metadata={"format": "pt"})
    trunk = _trunk(glm["4.5"], tmp_path / "t")
    r = mtpforge("add-mtp", "--source", str(src), "--target", str(trunk))
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 1 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr
    assert "shared_head.head.weight has shape" in lines[0]
    assert sorted(p.name for p in trunk.parent.iterdir()) == [trunk.name]


def test_a_trunk_that_does_not_state_the_shared_experts_width_is_no_shape_mismatch(glm, tmp_path: Path) -> None:
    """llama.cpp's converter states the shared experts' width (``expert_shared_count``; some
    trunks ``expert_shared_feed_forward_length``): a trunk written without it leaves that width
    unknown, which inspect must not read as 0 and call the head's shared experts of another
    model size. A head of another size is still found by the widths the trunk does state."""
    from tests.test_gguf import _rewrite

    src = glm["4.5"]
    trunk = _trunk(src, tmp_path / "t")
    judged.add_mtp(trunk, src)
    keys = ("glm4moe.expert_shared_count", "glm4moe.expert_shared_feed_forward_length")
    (tmp_path / "bare").mkdir()
    (tmp_path / "wrong").mkdir()
    bare = _rewrite(trunk, tmp_path / "bare" / trunk.name, drop_kv=keys)
    for f in trunk.parent.iterdir():
        if f != trunk and not (bare.parent / f.name).exists():
            (bare.parent / f.name).write_bytes(f.read_bytes())
    code, rep = judged.inspect_json(bare)
    assert not set(keys) & set(read_local(bare).kv)
    assert code == 0 and "MTP_SHAPE_MISMATCH" not in {f["code"] for f in rep["findings"]}, rep["findings"]
    wrong = _rewrite(bare, tmp_path / "wrong" / trunk.name, kv={"glm4moe.expert_feed_forward_length": 7})
    for f in bare.parent.iterdir():
        if f != bare and not (wrong.parent / f.name).exists():
            (wrong.parent / f.name).write_bytes(f.read_bytes())
    assert "MTP_SHAPE_MISMATCH" in {f["code"] for f in judged.inspect_json(wrong)[1]["findings"]}
