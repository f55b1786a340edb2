"""The real llama.cpp runs what mtpforge writes: llama-server with ``--spec-type draft-mtp``.

For the trained dense and MoE tiny models, on trunks at f32, Q8_0 and Q4_K_M (llama-quantize),
mtpforge's MTP GGUF must load, keep greedy output identical to plain decoding, and draft within
3 points of the official head with the same embedding choice on the same trunk: llama.cpp's own
converted MTP block placed beside the trunk's own token_embd/output (grafted here with gguf-py).
The official MTP-only file (which carries f32 copies of the embeddings) is measured beside them.
24 prompts x 64 greedy tokens give ~570 drafts per run: binomial noise about ±1.3 points.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.synth import build_hf_variant
from mtpforge.verify import DEFAULT_PROMPTS
from tests.gguf_env import XDIST_GROUP, BIN, CACHE, MODELS, graft, measure, mtpforge, need, official, sha256, trunk_copy

RESULTS = CACHE / "gguf-acceptance.json"

pytestmark = pytest.mark.xdist_group(XDIST_GROUP)


@pytest.fixture(autouse=True)
def _llama() -> None:
    need("server")
    need("converter")


def _record(key: str, value: dict) -> None:
    data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    data[key] = value
    tmp = RESULTS.with_name(f".{RESULTS.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, RESULTS)


def test_anchor_official_files_reproduce(tmp_path: Path) -> None:
    """The issue's anchor: llama.cpp's own trunk and MTP-only GGUF of the dense model, 4 default
    prompts x 64 greedy tokens: 109 of 122 drafts accepted, output identical to plain decoding."""
    trunk = official(MODELS["dense"], "trunk", "f32")
    plain = measure(trunk, texts=list(DEFAULT_PROMPTS))
    spec = measure(trunk, draft=official(MODELS["dense"], "mtp", "f32"), texts=list(DEFAULT_PROMPTS))
    _record("anchor", {k: spec[k] for k in ("drafted", "accepted", "acceptance")})
    assert spec["tokens"] == plain["tokens"]
    assert abs(spec["acceptance"] - 109 / 122) <= 0.03, spec


@pytest.mark.parametrize("qtype", ["f32", "Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_mtpforge_head_drafts_like_the_official_one(kind: str, qtype: str, tmp_path: Path) -> None:
    trunk = trunk_copy(MODELS[kind], tmp_path / "m", qtype)
    before = sha256(trunk)
    r = mtpforge("add-mtp", "--source", str(MODELS[kind]), "--target", str(trunk), "--json")
    assert r.returncode == 0, r.stderr
    ours_file = Path(json.loads(r.stdout)["output"])
    assert sha256(trunk) == before

    plain = measure(trunk)
    ours = measure(trunk, draft=ours_file)
    (tmp_path / "graft").mkdir()
    grafted = measure(trunk, draft=graft(official(MODELS[kind], "mtp", "f32"), trunk, tmp_path / "graft" / "mtp-g.gguf"))
    own = measure(trunk, draft=official(MODELS[kind], "mtp", "f32"))
    _record(f"{kind}-{qtype}", {name: {k: m[k] for k in ("drafted", "accepted", "acceptance")}
                                for name, m in (("mtpforge_f16", ours), ("official_grafted", grafted), ("official_file", own))})
    assert ours["tokens"] == plain["tokens"] and grafted["tokens"] == plain["tokens"] and own["tokens"] == plain["tokens"]
    assert ours["drafted"] > 500
    assert ours["acceptance"] >= grafted["acceptance"] - 0.03, (ours["acceptance"], grafted["acceptance"])


@pytest.mark.parametrize("precision", ["f32", "bf16", "q8_0"])
def test_every_precision_loads_and_keeps_output(precision: str, tmp_path: Path) -> None:
    trunk = trunk_copy(MODELS["moe"], tmp_path / "m", "Q4_K_M")
    r = mtpforge("add-mtp", "--source", str(MODELS["moe"]), "--target", str(trunk), "--precision", precision, "--json")
    assert r.returncode == 0, r.stderr
    plain, spec = measure(trunk), measure(trunk, draft=Path(json.loads(r.stdout)["output"]))
    _record(f"moe-Q4_K_M-{precision}", {k: spec[k] for k in ("drafted", "accepted", "acceptance")})
    assert spec["tokens"] == plain["tokens"] and spec["acceptance"] > 0.5


def test_gguf_tail_runs_with_draft_mtp(tmp_path: Path) -> None:
    trunk = trunk_copy(MODELS["dense"], tmp_path / "m", "Q8_0")
    out = tmp_path / "tail.gguf"
    r = mtpforge("add-mtp", "--source", str(MODELS["dense"]), "--target", str(trunk), "--layout", "gguf-tail",
                 "--output", str(out), "--json")
    assert r.returncode == 0, r.stderr
    plain, spec = measure(trunk), measure(out, mtp=True)
    assert spec["tokens"] == plain["tokens"] and spec["acceptance"] > 0.6


def test_qwen3_next_loads_and_decodes_identically(tmp_path: Path) -> None:
    src = build_hf_variant("qwen3_next", tmp_path / "tiny-qwen3_next")
    trunk = trunk_copy(src, tmp_path / "m")
    r = mtpforge("add-mtp", "--source", str(src), "--target", str(trunk), "--json")
    assert r.returncode == 0, r.stderr
    texts = list(DEFAULT_PROMPTS)
    plain, spec = measure(trunk, texts=texts), measure(trunk, draft=Path(json.loads(r.stdout)["output"]), texts=texts)
    assert spec["drafted"] > 0 and spec["tokens"] == plain["tokens"]


def test_verify_command_on_a_gguf(tmp_path: Path) -> None:
    trunk = trunk_copy(MODELS["dense"], tmp_path / "m", "Q8_0")
    r = mtpforge("verify", str(trunk), "--json", "--llama-server", str(BIN / "llama-server"))
    assert r.returncode == 1 and "no MTP head" in r.stderr
    assert mtpforge("add-mtp", "--source", str(MODELS["dense"]), "--target", str(trunk)).returncode == 0
    r = mtpforge("verify", str(trunk), "--json", "--llama-server", str(BIN / "llama-server"), "--min-acceptance", "0.6")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["identical"] is True and rep["drafted"] > 100 and 0.6 <= rep["acceptance"] <= 1
    assert rep["identical_on_cpu"] is None  # nothing differed: no second decoding on the CPU backend
    assert rep["dead_head"] is None  # the trained head drafts
    r = mtpforge("verify", str(trunk), "--json", "--llama-server", str(tmp_path / "no-such-llama-server"))
    assert r.returncode == 2 and r.stderr.count("error:") == 1 and "llama.cpp" in r.stderr and "Traceback" not in r.stderr


def test_verify_names_a_dead_head_with_its_likely_causes(tmp_path: Path) -> None:
    """An untrained head (random weights) beside its own random trunk: llama.cpp accepts almost
    none of its drafts; verify says so with the figure and the causes, in inspect's order."""
    src = build_hf_variant("qwen3_5", tmp_path / "tiny-random")
    trunk = trunk_copy(src, tmp_path / "m", "Q8_0")
    assert mtpforge("add-mtp", "--source", str(src), "--target", str(trunk)).returncode == 0
    r = mtpforge("verify", str(trunk), "--json", "--llama-server", str(BIN / "llama-server"))
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["identical"] is True, r.stderr  # a warning, not a failed check
    dead = rep["dead_head"]
    assert dead is not None and dead["acceptance"] < 0.10 and dead["drafted"] > 50, rep["acceptance"]
    assert [c.split(":")[0] for c in dead["causes"]] == ["precision", "norms", "hidden state"]
    assert dead["head_types"] and "full enough" in dead["causes"][0]  # an f16 head: not its precision
    # the same head in a low type (llama-quantize Q4_0, as users' "-mtp" files come): precision first
    low = tmp_path / "mtp-q4_0.gguf"
    head = next(trunk.parent.glob("mtp-*.gguf"))
    assert subprocess.run([str(BIN / "llama-quantize"), "--allow-requantize", str(head), str(low), "Q4_0"], capture_output=True).returncode == 0
    r = mtpforge("verify", str(trunk), "--draft", str(low), "--llama-server", str(BIN / "llama-server"))
    assert r.returncode == 0 and "Q4_0" in r.stderr and "heads collapse in low types" in r.stderr, r.stderr
    assert "the head accepted" in r.stderr and "Traceback" not in r.stderr


def test_gguf_recipe_runs_end_to_end(tmp_path: Path) -> None:
    """recipes/tiny-gguf.yaml as CI runs it: add-mtp beside a Q4_K_M trunk, strict inspect,
    verify through llama-server."""
    trunk = trunk_copy(MODELS["dense"], tmp_path / "build", "Q4_K_M", name="tiny-qwen3_5-Q4_K_M.gguf")
    recipe = tmp_path / "recipes" / "tiny-gguf.yaml"
    recipe.parent.mkdir()
    text = (Path(__file__).resolve().parents[1] / "recipes" / "tiny-gguf.yaml").read_text()
    recipe.write_text(text.replace("../mtpforge/data/tiny-qwen3_5", str(MODELS["dense"])))
    r = mtpforge("run", str(recipe), "--json", env={"LLAMA_SERVER": str(BIN / "llama-server")})
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["check_results"] == {"inspect": "passed", "verify": "passed"}
    assert rep["steps"]["verify"]["identical"] is True and rep["steps"]["verify"]["acceptance"] >= 0.6
    assert (trunk.parent / "mtp-Tiny-Qwen3_5-F16.gguf").is_file()


def test_a_split_trunk_gets_the_head_its_whole_trunk_gets(tmp_path: Path) -> None:
    """A 300 GB+ model's GGUF is published in parts (gguf-split, the converter's
    ``--split-max-*``). Given any part, add-mtp writes byte for byte the MTP-only file it writes
    for the same trunk whole (no ``split.*`` keys: llama-server refused an MTP file carrying the
    trunk's as a draft, "invalid split file name", and the trunk's output norm lies in its last
    part); llama-server drafts with it beside the parts with output identical to plain and the
    whole trunk's counts; inspect, verify and remove-mtp take any part; a missing part is one line."""
    from tests.gguf_env import convert

    folder = tmp_path / "split"
    folder.mkdir()
    rc, log = convert(MODELS["dense"], folder / "Tiny-F32.gguf", "f32", ["--no-mtp", "--split-max-tensors", "12"],
                      pre="qwen35")
    assert rc == 0, log[-2000:]
    parts = sorted(folder.glob("Tiny-F32-*-of-*.gguf"))
    assert len(parts) >= 3, parts
    whole = trunk_copy(MODELS["dense"], tmp_path / "whole")
    outs = []
    for trunk in (parts[1], whole):
        r = mtpforge("add-mtp", "--source", str(MODELS["dense"]), "--target", str(trunk), "--json")
        assert r.returncode == 0, r.stderr
        outs.append(Path(json.loads(r.stdout)["output"]))
    assert outs[0].parent == folder and outs[0].name == outs[1].name and sha256(outs[0]) == sha256(outs[1])

    plain, spec, spec_whole = measure(parts[0]), measure(parts[0], draft=outs[0]), measure(whole, draft=outs[1])
    assert spec["tokens"] == plain["tokens"] and spec["drafted"] > 500
    assert (spec["drafted"], spec["accepted"]) == (spec_whole["drafted"], spec_whole["accepted"])

    r = mtpforge("inspect", str(parts[-1]), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["layout"] == "gguf-mtp", r.stdout + r.stderr
    r = mtpforge("verify", str(parts[2]), "--json", "--llama-server", str(BIN / "llama-server"))
    assert r.returncode == 0 and json.loads(r.stdout)["identical"] is True, r.stderr
    r = mtpforge("remove-mtp", str(parts[2]))
    assert r.returncode == 0 and not outs[0].exists(), r.stderr

    parts[-1].rename(tmp_path / parts[-1].name)
    r = mtpforge("add-mtp", "--source", str(MODELS["dense"]), "--target", str(parts[0]))
    assert r.returncode == 2 and r.stderr.count("error:") == 1 and parts[-1].name in r.stderr and "Traceback" not in r.stderr
    assert sorted(folder.iterdir()) == parts[:-1]
