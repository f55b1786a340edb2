"""DeepSeek-V3 / R1 (``deepseek_v3``) heads for llama.cpp, written by mtpforge and judged by llama.cpp.

llama.cpp's converter drops DeepSeek-V3's NextN layer (``DeepseekV2Model.skip_mtp``): it has no
``--mtp`` export to hold mtpforge's file to, and no DeepSeek-V3 GGUF carries the head. The
reference is therefore what the same converter writes for the same tensors under GLM-4.7-Flash's
config (``Glm4MoeLiteModel``: ``DeepseekV2Model`` with the NextN block kept, the same ``deepseek2``
arch): mtpforge's block must be that block byte for byte (f32 / f16 / bf16 / q8_0, and from the
block-FP8 source the converter's own dequantization of the same bytes), with the same
``deepseek2.*`` metadata. Then llama.cpp itself judges: ``llama-server --spec-type draft-mtp``
drafts with the file beside the converter's f32, Q8_0 and Q4_K_M DeepSeek-V3 trunks and decodes
exactly as without it; only the head's bytes come over the (loopback) Hub; inspect tells the
head-less trunk (the converter's only output) from a complete one and names DeepSeek-V3's release.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mtpforge.gguf.gguffile import read_local
from mtpforge.gguf.names import block_of
from tests import gguf_env
from tests import gguf_judged as judged
from tests.gguf_env import official

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
PRE = "deepseek-v3"  # what the converter detects for DeepSeek-V3's tokenizer (declared for the tiny one)
GLM_PRE = "glm4"
N = 2  # the tiny model's num_hidden_layers: the NextN layer is blk.2
BLOCK = 24  # tensors in the converter's GLM-4.7-Flash NextN block (docs/families/glm4_moe_lite.md)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The bf16 and FP8 sources, and each one's tensors under GLM-4.7-Flash's config."""
    from tests.support.synth.deepseek_v3 import build_deepseek_v3, glm_shaped
    from tests.support.synth.glm4_moe_lite import build_glm4_moe_lite

    root = tmp_path_factory.mktemp("deepseek_v3_gguf")
    src = build_deepseek_v3(root / "tiny-deepseek_v3")
    fp8 = build_deepseek_v3(root / "tiny-deepseek_v3-fp8", fp8=True)
    glm = build_glm4_moe_lite(root / "tiny-glm4_moe_lite")
    return {"src": src, "fp8": fp8, "glm": glm_shaped(src, glm, root / "glm-shaped"),
            "glm-fp8": glm_shaped(fp8, glm, root / "glm-shaped-fp8")}


@pytest.fixture(scope="module")
def src(built: dict[str, Path]) -> Path:
    return built["src"]


def _trunk(src: Path, dst: Path, qtype: str = "f32") -> Path:
    """A private copy of the converter's DeepSeek-V3 GGUF (its plain conversion: it refuses
    ``--no-mtp`` / ``--mtp`` for this model and drops the head anyway), quantized by llama-quantize."""
    p = official(src, "full", "f32", pre=PRE)
    if qtype != "f32":
        p = gguf_env.quantized(p, qtype)
    dst.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(p, dst / f"{src.name}-{qtype}.gguf"))


def _model_kv(path: Path) -> list[tuple[str, object, int]]:
    """The ``deepseek2.*`` metadata (what describes the model, not its tokenizer or name), in order."""
    return [kv for kv in judged.kv_list(read_local(path)) if kv[0].startswith("deepseek2.")]


def _block_bytes(path: Path) -> dict[str, tuple[object, tuple[int, ...], bytes]]:
    g = read_local(path)
    out = {}
    with open(path, "rb") as f:
        for k, t in g.tensors.items():
            if block_of(k) == N:
                f.seek(t.offset)
                out[k] = (t.type, t.shape, f.read(t.nbytes))
    return out


def test_the_converter_drops_deepseek_v3s_head(src: Path) -> None:
    """The converter's full conversion of the source has no NextN block and declares none: what
    every DeepSeek-V3/R1 GGUF is today (if llama.cpp starts to export it, this fails)."""
    full = read_local(official(src, "full", "f32", pre=PRE))
    assert full.block_count == N and full.nextn_layers == 0 and not any(block_of(k) == N for k in full.tensors)
    with pytest.raises(AssertionError, match="not supported for DeepseekV3ForCausalLM"):
        official(src, "mtp", "f32", pre=PRE)


@pytest.mark.parametrize("precision", ["f32", "f16", "bf16", "q8_0"])
def test_the_block_is_the_one_the_converter_writes_for_glm_4_7_flash(built: dict[str, Path], precision: str,
                                                                      tmp_path: Path) -> None:
    """Every tensor of mtpforge's NextN block (``attn_k_b`` / ``attn_v_b`` split from ``kv_b_proj``,
    experts stacked, norms and router F32) is byte for byte what llama.cpp's converter writes for
    the same source tensors as GLM-4.7-Flash's block. The ``deepseek2.*`` metadata is that
    export's, key for key and value for value (``nextn_predict_layers`` 1, ``block_count`` N + 1),
    in the order of the user's trunk (which the converter writes a little differently for
    DeepSeek-V3) with ``nextn_predict_layers`` last, as the export has it."""
    r = judged.add_mtp(_trunk(built["src"], tmp_path), built["src"], "--precision", precision)
    assert r["family"] == "deepseek_v3" and r["architecture"] == "deepseek2"
    ref = official(built["glm"], "mtp", precision, pre=GLM_PRE)
    ours, theirs = _block_bytes(Path(r["output"])), _block_bytes(ref)
    assert len(theirs) == BLOCK and ours.keys() == theirs.keys()
    for k in theirs:
        assert ours[k] == theirs[k], k
    ours_kv, ref_kv, trunk_kv = _model_kv(Path(r["output"])), _model_kv(ref), _model_kv(Path(r["target"]))
    assert sorted(ours_kv, key=str) == sorted(ref_kv, key=str) and ref_kv[-1][0] == "deepseek2.nextn_predict_layers"
    assert [k for k, _, _ in ours_kv] == [k for k, _, _ in trunk_kv] + ["deepseek2.nextn_predict_layers"]
    assert read_local(r["output"]).get("tokenizer.ggml.pre") == PRE


def test_from_the_fp8_release_the_block_is_the_converters_dequantization(built: dict[str, Path], tmp_path: Path) -> None:
    """From the block-FP8 source (F8_E4M3 + 128x128 ``weight_scale_inv``), at f32: the values the
    converter computes from the same bytes (its GLM-4.7-Flash export of the FP8 tensors)."""
    r = judged.add_mtp(_trunk(built["src"], tmp_path), built["fp8"], "--precision", "f32")
    ours, theirs = _block_bytes(Path(r["output"])), _block_bytes(official(built["glm-fp8"], "mtp", "f32", pre=GLM_PRE))
    assert len(theirs) == BLOCK and ours.keys() == theirs.keys()
    for k in theirs:
        assert ours[k] == theirs[k], k
    bf16 = _block_bytes(Path(judged.add_mtp(_trunk(built["src"], tmp_path / "bf16"), built["src"], "--precision", "f32")["output"]))
    assert ours[f"blk.{N}.nextn.eh_proj.weight"] != bf16[f"blk.{N}.nextn.eh_proj.weight"]  # FP8 changed it


@pytest.mark.parametrize("qtype", ["f32", "Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("source", ["src", "fp8"])
def test_llama_server_drafts_with_mtpforges_file_exactly_as_plain(built: dict[str, Path], source: str, qtype: str,
                                                                 tmp_path: Path) -> None:
    """On the converter's f32, Q8_0 and Q4_K_M DeepSeek-V3 trunks, with the head from the bf16 and
    the FP8 source: llama.cpp loads the MTP file, drafts, and decodes exactly as without it."""
    gguf_env.need("server")
    trunk = _trunk(built["src"], tmp_path, qtype)
    ours = Path(judged.add_mtp(trunk, built[source])["output"])
    texts = gguf_env.prompts()[:4]
    plain = gguf_env.measure(trunk, texts=texts)
    drafted = gguf_env.measure(trunk, draft=ours, texts=texts)
    assert drafted["drafted"] > 0 and drafted["tokens"] == plain["tokens"], drafted


@pytest.mark.parametrize("source,fetch", [("src", "auto"), ("fp8", "auto"), ("fp8", "stream")])
def test_only_the_heads_bytes_come_from_the_hub(built: dict[str, Path], source: str, fetch: str, hub, tmp_path: Path) -> None:
    """Cached runs, and streamed in the conversion's order (a block-FP8 weight and its scale one
    request, the expert stacks read one expert at a time): the same file either way."""
    judged.fetches_only_the_head(hub, built[source], lambda d: _trunk(built["src"], d), tmp_path, fetch)


def test_inspect_finds_the_missing_head_then_a_clean_one(src: Path, tmp_path: Path) -> None:
    """The converter's trunk: ``MTP_HEAD_MISSING`` (a warning), the fix naming DeepSeek-V3's release; with
    mtpforge's MTP file beside it, or its tail appended: clean, raw norms, the 24-tensor block."""
    trunk = _trunk(src, tmp_path)
    code, rep = judged.inspect_json(trunk)
    (f,) = rep["findings"]
    assert rep["family"] == "deepseek_v3" and f["code"] == "MTP_HEAD_MISSING" and str(trunk) in f["fix"]
    assert judged.inspect_json(trunk, "--strict")[0] == 1  # a warning: the trunk declares no head
    assert f["fix"].startswith("mtpforge add-mtp --source <original Hugging Face repo, e.g. deepseek-ai/DeepSeek-V3>")
    judged.add_mtp(trunk, src)
    code, rep = judged.inspect_json(trunk, "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-mtp" and rep["norm_convention"] == "raw"
    assert rep["family"] == "deepseek_v3" and rep["mtp_tensors"] == BLOCK and rep["expert_format"] == "stacked"
    tail = tmp_path / "with-tail.gguf"
    judged.add_mtp(trunk, src, "--layout", "gguf-tail", "--output", str(tail))
    code, rep = judged.inspect_json(tail, "--source", str(src))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-tail" and rep["family"] == "deepseek_v3"


def test_a_glm_4_7_flash_gguf_is_still_read_as_glm_4_7_flash(built: dict[str, Path]) -> None:
    """The two families share ``deepseek2``; the pre-tokenizer tells them apart."""
    code, rep = judged.inspect_json(official(built["glm"], "full", "f32", pre=GLM_PRE))
    assert code == 0 and rep["family"] == "glm4_moe_lite" and rep["layout"] == "gguf-tail", rep
    assert np.all([f["severity"] != "error" for f in rep["findings"]])
    assert json.dumps(rep).count("DeepSeek") == 0
