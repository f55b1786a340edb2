"""inspect tells a third-party head's norm convention without ``--source`` and offline, and
``repair-norms`` fixes it — on heads written "by another tool" (no mtpforge manifest) into real
``mlx_lm.convert`` conversions of the bundled TRAINED models, then broken by hand.

Only a trained head can show this: behaviour is evidence only where the head explains its
backbone. The untrained (synthetic) head shows the other side: unknown, and repair refuses.
The full matrix (every norm group, both directions, both models) is
``benchmarks/bench_norm_behaviour.py``; these tests cover each kind of defect.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import pytest

from mtpforge.checks import norm_behaviour as nb
from mtpforge.families.tables import NORM_SUFFIXES
from mtpforge.inspect import inspect_checkpoint
from mtpforge.pipeline import add_mtp
from mtpforge.repair import repair_norms
from mtpforge.errors import RefusedError
from tests.support.synth import convert_to_mlx
from mtpforge.verify import DEFAULT_PROMPTS, verify

from tests.checkers import codes, folder_state, rewrite

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "mtpforge" / "data"
MODELS = {"dense": DATA / "tiny-qwen3_5", "moe": DATA / "tiny-qwen3_5_moe"}
HEAD = "model-mtp.safetensors"
ALL = {g: 1 for g in NORM_SUFFIXES}


def needs(kind: str) -> Any:
    return pytest.mark.skipif(not (MODELS[kind] / "config.json").is_file(), reason=f"{MODELS[kind].name} is not bundled")


KINDS = [pytest.param("dense", marks=needs("dense")), pytest.param("moe", marks=needs("moe"))]


def breakage(folder: Path, offsets: dict[str, int]) -> None:
    """Add ``offsets`` (per norm group) to the stored head's norms, as a buggy tool would."""
    def fn(t: dict[str, mx.array]) -> dict[str, mx.array]:
        out = {}
        for k, v in t.items():
            o = offsets.get(nb.group_of(k.removeprefix("language_model.mtp.")) or "", 0)
            out[k] = (v.astype(mx.float32) + o).astype(v.dtype) if o else v
        return out

    rewrite(folder / HEAD, fn)


@pytest.fixture(scope="module")
def third_party(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``third_party(kind) -> Path``: the trained source through mlx_lm.convert (4-bit) with a
    correct bf16 head and no manifest (as another tool leaves it). Shared: copy before changing."""
    root = tmp_path_factory.mktemp("third-party")
    done: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in done:
            t = convert_to_mlx(MODELS[kind], root / kind)
            add_mtp(source=str(MODELS[kind]), target=str(t), layout="embedded", precision="bf16", progress=False)
            (t / "mtpforge.json").unlink()
            done[kind] = t
        return done[kind]

    return get


@pytest.fixture(scope="module")
def probes(third_party: Callable[[str], Path]) -> Callable[[str], nb.Probe]:
    """One probe (backbone pass, head loaded) per model; each broken head reuses it."""
    done: dict[str, nb.Probe] = {}

    def get(kind: str) -> nb.Probe:
        if kind not in done:
            done[kind] = nb.probe(third_party(kind))
        return done[kind]

    return get


def copy_of(folder: Path, tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(folder, dst)
    return dst


# ----------------------------------------------------------------------------- decisions


#: (what the tool did to the correct head, what behaviour must call it). Mixed cases: one group
#: wrong in each direction, in groups the head is sensitive to on both models (the matrix over
#: all 7 groups is the benchmark: groups it cannot see change no draft, see test below)
CASES = {
    "raw": ({g: -1 for g in NORM_SUFFIXES}, "raw"),
    "double-shifted": (ALL, "double-shifted"),
    "mixed: mtp.norm raw": ({"norm.weight": -1}, "mixed"),
    "mixed: input_layernorm +2": ({"input_layernorm.weight": 1}, "mixed"),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(CASES))
def test_behaviour_names_the_convention(probes, kind: str, case: str) -> None:
    offsets, want = CASES[case]
    pr = probes(kind).broken(offsets)
    conv, groups, hidden, margin, _ = nb.decide(pr)
    assert conv == want, (conv, margin, {g: v.as_dict() for g, v in groups.items()})
    assert margin >= nb.DECISIVE_NATS
    if want in ("raw", "double-shifted"):
        assert all(v.offset == {"raw": 1, "double-shifted": -1}[want] for v in groups.values())
    if want == "mixed":
        # which groups a mixed head got wrong is told up to what the head cannot tell apart
        # (a common scale of the residual stream, undone by its final norm); what must hold is
        # that the repair's offsets make it draft like the correct head
        fix = {g: v.offset for g, v in groups.items() if v.offset}
        assert fix
        repaired = float(mx.mean(pr.kl(fix, hidden)).item())
        correct = float(mx.mean(probes(kind).kl({}, hidden)).item())
        assert repaired <= correct + 0.01, (repaired, correct, fix)


@pytest.mark.parametrize("kind", KINDS[:1])
def test_a_group_the_head_does_not_use_is_not_claimed(probes, kind: str) -> None:
    """The head's MLP input norm sits at gain ~4 (trained so): ±1 there changes its drafts by
    under 0.01 nats per position, so behaviour cannot see it and must not claim a defect — and
    the head drafts as well as the correct one, which is what the convention is for."""
    base = probes(kind)
    ok = float(mx.mean(base.kl({}, "post")).item())
    for o in (-1, 1):
        pr = base.broken({"post_attention_layernorm.weight": o})
        conv, groups, _, _, _ = nb.decide(pr)
        assert conv == "shifted", conv
        assert abs(float(mx.mean(base.kl({"post_attention_layernorm.weight": o}, "post")).item()) - ok) < 0.01


# ----------------------------------------------------------------------------- inspect, end to end


@pytest.mark.parametrize("kind", KINDS)
def test_inspect_offline_without_source_finds_a_mixed_head_and_repair_fixes_it(third_party, tmp_path, kind) -> None:
    tgt = copy_of(third_party(kind), tmp_path, "broken")
    breakage(tgt, {"norm.weight": -1, "pre_fc_norm_embedding.weight": -1})
    r = inspect_checkpoint(str(tgt))
    assert codes(r).get("MTP_NORMS_MIXED") == "error" and r["exit_code"] == 1, r["findings"]
    assert r["norm_convention_from"] == "behaviour"
    ev = r["norm_evidence"]
    assert ev["language_model.mtp.norm.weight"] == "behaviour" and set(ev.values()) <= {"behaviour", "backbone", "unknown"}
    cost = r["norm_behaviour"]["cost"]
    assert cost["positions"] >= 200 and 0 < cost["head_passes"] <= 120
    print(f"[norm-behaviour] {kind}: {cost}")

    rep = repair_norms(str(tgt), progress=False)
    assert rep["status"] == "repaired" and rep["bytes_rewritten"] < 4096
    assert rep["changed_norms"] and rep["evidence"] == "behaviour"
    after = inspect_checkpoint(str(tgt))
    assert after["exit_code"] == 0 and after["norm_convention"] == "shifted" and after["norm_convention_from"] == "manifest"
    # the repaired head drafts at the trained head's rate
    kw: dict[str, Any] = {"generate": True, "hidden": "post", "prompts": list(DEFAULT_PROMPTS[:2]), "progress": False}
    want = verify(str(third_party(kind)), **kw)["acceptance"]
    got = verify(str(tgt), **kw)
    print(f"[norm-behaviour] {kind}: acceptance trained {want:.3f}, repaired {got['acceptance']:.3f}")
    assert got["identical"] and got["acceptance"] >= want - 0.03


@pytest.mark.parametrize("kind", KINDS)
def test_groups_the_drafts_barely_see_are_told_by_the_backbone_or_said_undecided(third_party, tmp_path, kind) -> None:
    """q_norm +2 changes the drafts too little to decide on its own: the backbone's q_norms sit
    at the head's level, so the extra +1 shows there (MTP_NORMS_MIXED). post_attention_layernorm
    ±1 changes no draft and the head's gain (~4) is nowhere near the backbone's (~0.9): its
    convention is said to be undecided, per tensor and in an info finding, never claimed."""
    tgt = copy_of(third_party(kind), tmp_path, "q")
    breakage(tgt, {"self_attn.q_norm.weight": 1})
    r = inspect_checkpoint(str(tgt))
    assert r["norm_convention"] == "mixed" and codes(r).get("MTP_NORMS_MIXED") == "error", r["findings"]
    assert r["norm_evidence"]["language_model.mtp.layers.0.self_attn.q_norm.weight"] == "backbone"
    assert r["norm_verdicts"]["language_model.mtp.layers.0.self_attn.q_norm.weight"] == "double-shifted"
    rep = repair_norms(str(tgt), progress=False)
    assert rep["changed_norms"] == {"language_model.mtp.layers.0.self_attn.q_norm.weight": "-1"}, rep["changed_norms"]

    tgt = copy_of(third_party(kind), tmp_path, "pa")
    breakage(tgt, {"post_attention_layernorm.weight": -1})
    r = inspect_checkpoint(str(tgt))
    key = "language_model.mtp.layers.0.post_attention_layernorm.weight"
    assert r["norm_verdicts"][key] == "unknown" and r["norm_evidence"][key] == "unknown"
    assert codes(r) == {"NORM_CONVENTION_PARTIAL": "info"} and r["exit_code"] == 0, r["findings"]


@pytest.mark.parametrize("kind", KINDS)
def test_correct_third_party_head_is_clean_and_repair_leaves_it(third_party, tmp_path, kind) -> None:
    tgt = copy_of(third_party(kind), tmp_path, "ok")
    r = inspect_checkpoint(str(tgt))
    # the only thing said: the group the drafts do not depend on is undecided (info), not claimed
    assert r["exit_code"] == 0 and {f["code"]: f["severity"] for f in r["findings"]} == {"NORM_CONVENTION_PARTIAL": "info"}, r["findings"]
    assert r["norm_undecided_groups"] == ["post_attention_layernorm.weight"]
    assert (r["norm_convention"], r["norm_convention_from"]) == ("shifted", "behaviour")
    if kind == "dense":
        before = folder_state(tgt)
        assert repair_norms(str(tgt), progress=False)["status"] == "nothing-to-repair"
        assert folder_state(tgt) == before


def test_cli_raw_head_found_and_repaired(third_party, tmp_path) -> None:
    if not (MODELS["dense"] / "config.json").is_file():
        pytest.skip("tiny-qwen3_5 is not bundled")
    tgt = copy_of(third_party("dense"), tmp_path, "raw")
    breakage(tgt, {g: -1 for g in NORM_SUFFIXES})

    def cli(*args: str) -> tuple[int, dict[str, Any]]:
        p = subprocess.run([sys.executable, "-m", "mtpforge", *args, "--json"], cwd=ROOT, capture_output=True, text=True,
                           env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
        return p.returncode, json.loads(p.stdout)

    code, r = cli("inspect", str(tgt))
    assert code == 1 and r["norm_convention"] == "raw", r["findings"]
    assert {f["code"] for f in r["findings"]} - {"NORM_CONVENTION_PARTIAL"} == {"MTP_NORMS_RAW"}
    assert "behaviour" in set(r["norm_evidence"].values()) <= {"behaviour", "backbone", "unknown"}
    code, rep = cli("repair-norms", str(tgt))
    assert code == 0 and rep["status"] == "repaired" and set(rep["changed_norms"].values()) == {"+1"}
    code, r = cli("inspect", str(tgt))
    assert code == 0 and r["norm_convention"] == "shifted"


# ----------------------------------------------------------------------------- untrained head


def test_untrained_head_is_unknown_and_repair_refuses(make_hf, make_target) -> None:
    """A random head explains nothing about its backbone: behaviour is no evidence there."""
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    add_mtp(source=str(hf), target=str(tgt), layout="embedded", precision="bf16", progress=False)
    (tgt / "mtpforge.json").unlink()
    breakage(tgt, {g: -1 for g in NORM_SUFFIXES})
    r = inspect_checkpoint(str(tgt))
    assert r["norm_behaviour"]["informative"] is False and r["norm_behaviour"]["convention"] == "unknown"
    assert r["norm_convention_from"] != "behaviour"
    before = folder_state(tgt)
    with pytest.raises(RefusedError, match="not decisive"):
        repair_norms(str(tgt), progress=False)
    assert folder_state(tgt) == before


# ----------------------------------------------------------------------------- model card source


def test_model_card_base_model_is_compared_exactly_unless_offline(hub, synth, make_target) -> None:
    """A Hub conversion's card names its source: inspect fetches that source's norms (a few KB)
    and compares exactly, saying which source it used; offline it does not try."""
    src = synth.hf("qwen3_5")
    repo, _ = hub.publish(src)
    tgt = make_target("qwen3_5")
    add_mtp(source=str(src), target=str(tgt), layout="embedded", precision="bf16", progress=False)
    (tgt / "mtpforge.json").unlink()
    breakage(tgt, {"norm.weight": -1})
    (tgt / "README.md").write_text(f"---\nbase_model: {repo}\nlibrary_name: mlx\n---\n# converted\n")
    r = hub.run("inspect", str(tgt)).json
    assert (r["norm_convention"], r["norm_convention_from"], r["norm_source"]) == ("mixed", "source", repo), r
    assert set(r["norm_evidence"].values()) == {"source"} and "MTP_NORMS_MIXED" in {f["code"] for f in r["findings"]}
    assert 0 < hub.tensor_bytes(repo) < 64 * 1024
    hub.server.clear_log()
    off = hub.run("inspect", str(tgt), HF_HUB_OFFLINE="1").json
    assert off["norm_convention_from"] != "source" and "norm_source" not in off and hub.log() == []


def test_repair_with_source_is_exact_and_needs_no_trained_head(make_hf, make_target) -> None:
    hf, tgt = make_hf("qwen3_5_moe"), make_target("qwen3_5_moe")
    add_mtp(source=str(hf), target=str(tgt), layout="embedded", precision="bf16", progress=False)
    (tgt / "mtpforge.json").unlink()
    breakage(tgt, {"norm.weight": -1, "self_attn.q_norm.weight": 1})
    assert inspect_checkpoint(str(tgt), source=str(hf))["norm_convention"] == "mixed"
    rep = repair_norms(str(tgt), source=str(hf), progress=False)
    assert rep["evidence"] == "source" and rep["changed_norms"] == {
        "language_model.mtp.norm.weight": "+1", "language_model.mtp.layers.0.self_attn.q_norm.weight": "-1"}
    r = inspect_checkpoint(str(tgt), source=str(hf))
    assert (r["norm_convention"], r["exit_code"]) == ("shifted", 0)
    # the manifest now records the repair: inspect and a second repair decide from it, exactly
    assert inspect_checkpoint(str(tgt), behaviour=False)["norm_convention_from"] == "manifest"
    again = repair_norms(str(tgt), progress=False)
    assert (again["status"], again["evidence"]) == ("nothing-to-repair", "manifest")
