"""Trained MLA (GLM-4.7-Flash; GLM-5 and DeepSeek-V3.2: MLA with the DSA indexer) and hybrid
(Nemotron-H) heads: acceptance that tells a working head.

On random weights (tests/test_family_glm4_moe_lite.py, tests/test_family_nemotron_h.py, their GGUF
siblings) a head drafts ~0%, so identity and equal counts were all those tests could show.
``tests/data/tiny-glm4_moe_lite-trained``, ``tests/data/tiny-glm_moe_dsa-trained``,
``tests/data/tiny-deepseek_v32-trained`` and ``tests/data/tiny-nemotron_h-trained``
(``scripts/train_tiny_family.py glm4_moe_lite | glm_moe_dsa | deepseek_v32 | nemotron_h``) are trained — the trunk as a language model, the head as the next-next-token predictor on the trunk's post-norm
hidden state — so here a head mtpforge wrote is judged by what it drafts:

- MLX, offline: ``mlx_lm.convert`` (float32; the 4-bit trunks, MLA's ``kv_b_proj`` kept whole in
  the sidecar, are tests/test_norm_truth_families.py's), ``add-mtp``, ``verify --generate``: output
  identical to plain greedy decoding and a real acceptance;
- llama.cpp: the converter's ``--no-mtp`` trunk (f32, and llama-quantize's Q4_K_M), mtpforge's
  default (f16) MTP file beside it: llama-server decodes exactly as plain and accepts a real share
  of the drafts; at f32 as much as the converter's own ``--mtp`` block beside the same trunk.

The norm cases on these heads are in tests/test_norm_truth_families.py. Measured figures:
docs/families/glm4_moe_lite.md, docs/families/glm_moe_dsa.md, docs/families/deepseek_v32.md,
docs/families/nemotron_h.md. GLM-5's head is also judged by MTPLX's ``deepseek_mtp`` (its sidecar;
DeepSeek-V3.2's shares its weights; the other two are conformance cells).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from mtpforge.pipeline import add_mtp
from mtpforge.verify import verify
from tests import gguf_env
from tests.gguf_env import mtpforge, official

DATA = Path(__file__).resolve().parent / "data"
#: family -> (the committed folder, the converter's pre-tokenizer, config keys that say its shape)
MODELS = {
    "glm4_moe_lite": (DATA / "tiny-glm4_moe_lite-trained", "glm4",
                      {"model_type": "glm4_moe_lite", "q_lora_rank": 64, "kv_lora_rank": 64}),
    "glm_moe_dsa": (DATA / "tiny-glm_moe_dsa-trained", "glm4",
                    {"model_type": "glm_moe_dsa", "index_head_dim": 64, "kv_lora_rank": 64}),
    "deepseek_v32": (DATA / "tiny-deepseek_v32-trained", "deepseek-v3",
                     {"model_type": "deepseek_v32", "index_head_dim": 64, "kv_lora_rank": 64}),
    "nemotron_h": (DATA / "tiny-nemotron_h-trained", "qwen35",
                   {"model_type": "nemotron_h", "hybrid_override_pattern": "ME*E", "mtp_hybrid_override_pattern": "*E"}),
}
#: random weights accept ~0%; the trained heads measured well above this everywhere (module docstring)
ACCEPTANCE_FLOOR = 0.4
#: ours beside the converter's block at f32: f16 rounding of our default file
NOISE = 0.03
QTYPES = ("f32", "Q4_K_M")
#: DeepSeek-V3.2's trained model has GLM-5's weights byte for byte: what it adds is its own
#: converter class and llama.cpp graph, judged on the f32 trunk beside the converter's block (its
#: verify and Q4_K_M figures, measured once, are GLM-5's path: docs/families/deepseek_v32.md)
SAME_WEIGHTS_AS = {"deepseek_v32": "glm_moe_dsa"}


def _cases(family: str) -> tuple[str, ...]:
    return QTYPES[:1] if family in SAME_WEIGHTS_AS else QTYPES


def test_the_committed_models_are_the_shapes_and_small() -> None:
    for family, (model, _, keys) in MODELS.items():
        cfg = json.loads((model / "config.json").read_text())
        assert {k: cfg.get(k) for k in keys} == keys, family
        assert cfg["num_nextn_predict_layers"] == 1
        assert sum(p.stat().st_size for p in model.iterdir()) <= 3 * 2**20, family
        assert json.loads((model / "training.json").read_text())["acceptance_float32_mlx"]["acceptance"] > ACCEPTANCE_FLOOR


@pytest.mark.parametrize("family", [f for f in MODELS if f not in SAME_WEIGHTS_AS])
def test_verify_drafts_well_with_our_head(family: str, tmp_path: Path) -> None:
    """On the float32 trunk (the 4-bit one: the correct heads of tests/test_norm_truth_families.py)."""
    from tests.support.synth import convert_to_mlx

    model = MODELS[family][0]
    t = convert_to_mlx(model, tmp_path / "target", q_bits=None, dtype="float32")
    with contextlib.redirect_stdout(io.StringIO()):
        assert add_mtp(source=str(model), target=str(t), progress=False)["status"] == "written"
    r = verify(str(t), generate=True, progress=False)
    print(f"[trained] {family} mlx float32 trunk: verify acceptance {r['acceptance']:.3f} ({r['drafted']} drafted)")
    assert r["identical"], r
    assert r["drafted"] >= 100 and r["acceptance"] >= ACCEPTANCE_FLOOR, r["acceptance"]


@pytest.fixture(scope="module")
def server_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, dict]]:
    """Per family and trunk type: llama-server plain, with our default MTP file, and (f32) with
    the converter's ``--mtp`` block grafted beside the trunk."""
    gguf_env.need("server")
    gguf_env.need("converter")
    root = tmp_path_factory.mktemp("mla_hybrid_trained")
    out: dict[tuple[str, str], dict[str, dict]] = {}
    for family, (model, pre, _) in MODELS.items():
        for qtype in _cases(family):
            d = root / family / qtype
            trunk = gguf_env.trunk_copy(model, d, qtype, pre=pre)
            r = mtpforge("add-mtp", "--source", str(model), "--target", str(trunk), "--json")
            assert r.returncode == 0, r.stderr
            runs = {"plain": gguf_env.measure(trunk), "ours": gguf_env.measure(trunk, draft=Path(json.loads(r.stdout)["output"]))}
            if qtype == "f32":
                off = gguf_env.graft(official(model, "mtp", "f32", pre=pre), trunk, d / "official" / "mtp-official.gguf")
                runs["official"] = gguf_env.measure(trunk, draft=off)
            print(f"[trained] {family} llama-server {qtype} trunk: "
                  + ", ".join(f"{k} {v['acceptance']:.3f} ({v['drafted']})" for k, v in runs.items() if k != "plain"))
            out[(family, qtype)] = runs
    return out


@pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
@pytest.mark.parametrize("family,qtype", [(f, q) for f in MODELS for q in _cases(f)])
def test_llama_server_decodes_as_plain_and_drafts_well(server_runs, family: str, qtype: str) -> None:
    r = server_runs[(family, qtype)]
    assert r["ours"]["tokens"] == r["plain"]["tokens"]
    assert r["ours"]["drafted"] > 300 and r["ours"]["acceptance"] >= ACCEPTANCE_FLOOR, r["ours"]["acceptance"]


@pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
@pytest.mark.parametrize("family", list(MODELS))
def test_our_head_accepts_as_much_as_the_converters(server_runs, family: str) -> None:
    r = server_runs[(family, "f32")]
    assert r["official"]["tokens"] == r["plain"]["tokens"]
    assert abs(r["ours"]["acceptance"] - r["official"]["acceptance"]) <= NOISE, (r["ours"], r["official"])


@pytest.mark.xdist_group("conformance")
@pytest.mark.parametrize("family", ["glm_moe_dsa"])
def test_mtplx_drafts_well_with_our_dsa_sidecar(family: str, tmp_path: Path) -> None:
    """A DSA head in MTPLX's ``deepseek_mtp``: mtpforge's sidecar (the indexer's five tensors as
    stored) beside ``mlx_lm.convert``'s float32 folder; MTPLX decodes as its plain decode and
    accepts a real share of the drafts. GLM-5's only: DeepSeek-V3.2's trained model has its
    weights and MTPLX's alias runs the same code (28 / 43 accepted for both, measured once)."""
    from tests import mlx_judged as judged
    from tests.support.synth import convert_to_mlx

    judged.require_mtplx()
    model = MODELS[family][0]
    folder = convert_to_mlx(model, tmp_path / "target", q_bits=None, dtype="float32")
    judged.add_mtp(model, folder)
    got = judged.mtplx_drafts(folder)
    print(f"[trained] {family} MTPLX float32 trunk: accepted {got['accepted']} of {got['drafted']}")
    assert got["mtp_enabled"] and got["identical"] and got["drafted"] >= 24, got
    assert got["accepted"] / got["drafted"] >= ACCEPTANCE_FLOOR, got


@pytest.mark.xdist_group("conformance")
def test_mtplx_drafts_the_head_at_the_targets_bits_the_large_head_note_offers(tmp_path: Path) -> None:
    """A giant MLA head is 23.5 GB as plain add-mtp's bf16 beside a 4-bit DeepSeek-V3.2, and the
    note on it offers ``--precision match`` (docs/PRECISION.md). What it offers must draft: beside
    a 4-bit target, MTPLX's ``deepseek_mtp`` loads the plain 4-bit sidecar, decodes as its plain
    decode, and accepts about as many drafts as with the bf16 head (measured: 27 of 42 against 28
    of 41), at under a third of the bytes."""
    import shutil

    from tests import mlx_judged as judged
    from tests.support.synth import convert_to_mlx

    judged.require_mtplx()
    model = MODELS["deepseek_v32"][0]
    target = convert_to_mlx(model, tmp_path / "target", q_bits=4, q_group_size=64, dtype="float32")
    got, size = {}, {}
    for precision in ("bf16", "match"):
        folder = shutil.copytree(target, tmp_path / precision)
        rep = judged.add_mtp(model, folder, "--precision", precision)
        got[precision], size[precision] = judged.mtplx_drafts(folder), rep["mtp_bytes"]
        assert got[precision]["mtp_enabled"] and got[precision]["identical"] and got[precision]["drafted"] >= 24, got
    rate = {p: g["accepted"] / g["drafted"] for p, g in got.items()}
    assert rate["match"] >= ACCEPTANCE_FLOOR and abs(rate["match"] - rate["bf16"]) <= 0.1, got
    assert size["match"] * 3 < size["bf16"], size
