"""A raw-norm family's head convention told by behaviour, offline, as Qwen's is.

The trained tiny GLM-4.5 (``tests/data/tiny-glm4_moe-trained``), GLM-4.7-Flash (MLA,
``tiny-glm4_moe_lite-trained``), DeepSeek-V3 (MLA, ``tiny-deepseek_v3-trained``) and Nemotron-H
(hybrid, ``tiny-nemotron_h-trained``) through
``mlx_lm.convert`` (4-bit), each head written by add-mtp, then left as another tool leaves it (no
mtpforge.json, no card) and broken the way the issue saw in the wild: the head's norms shifted +1
— the Qwen habit applied to a family whose norms are raw — all of them, or one group. ``inspect``
(no --source, offline) names each case with the code a raw-norm family's +1 has in GGUF files
(``MTP_NORMS_SHIFTED``; one group: ``MTP_NORMS_MIXED``) and says the convention was measured;
``repair-norms`` puts the drafts back where the correct head's are (verify's acceptance within a
point); the correct head gets no finding beyond the info that one group is undecided (the drafts
do not depend on it), as Qwen's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import pytest

from mtpforge.inspect import inspect_checkpoint
from mtpforge.pipeline import add_mtp
from mtpforge.repair import repair_norms
from mtpforge.verify import verify
from tests.checkers import folder_state, rewrite

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
MODEL = DATA / "tiny-glm4_moe-trained"
HEAD = "mtp.safetensors"
ALL = ("enorm.weight", "hnorm.weight", "shared_head.norm.weight", "input_layernorm.weight",
       "post_attention_layernorm.weight")


@dataclass(frozen=True)
class Trained:
    """A family's trained tiny model: where its head's keys start in the sidecar, its norm
    groups (bare keys), and the cases: what a buggy tool did -> the code inspect must give."""

    model: Path
    prefix: str
    norms: tuple[str, ...]
    cases: dict[str, tuple[tuple[str, ...], str, str]]
    #: the release keeps the NextN layer under ``model.layers.{N}.`` and mlx-lm's sanitize drops it
    #: only at the release's index (DeepSeek-V3: 61), so the MLX target is converted from a copy
    #: without it, as community conversions of the real model are
    headless: str | None = None


def headless_copy(model: Path, dst: Path, prefix: str) -> Path:
    """``model`` without the tensors under ``prefix`` (shards and index rewritten, the rest copied)."""
    dst.mkdir(parents=True)
    index = json.loads((model / "model.safetensors.index.json").read_text())
    for f in model.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            shutil.copy2(f, dst / f.name)
    for shard in sorted(set(index["weight_map"].values())):
        kept = {k: v for k, v in mx.load(str(model / shard)).items() if not k.startswith(prefix)}
        mx.save_safetensors(str(dst / shard), kept, metadata={"format": "pt"})
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith(prefix)}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return dst


def _cases(norms: tuple[str, ...], *one: str) -> dict[str, tuple[tuple[str, ...], str, str]]:
    return {"all norms +1": (norms, "MTP_NORMS_SHIFTED", "shifted"),
            **{f"{g.rsplit('.', 1)[0]} +1": ((g,), "MTP_NORMS_MIXED", "mixed") for g in one}}


MLA = ALL + ("self_attn.q_a_layernorm.weight", "self_attn.kv_a_layernorm.weight")
HYBRID = ("layers.0.enorm.weight", "layers.0.hnorm.weight", "layers.0.norm.weight", "layers.1.norm.weight",
          "layers.1.final_layernorm.weight")
TRAINED = {
    "glm4_moe": Trained(MODEL, "model.layers.2.", ALL, _cases(ALL, "enorm.weight", "input_layernorm.weight")),
    # one case each keeps the suite's time: MLA's whole head (its q_a/kv_a norms too), one of
    # Nemotron-H's norms alone (the other cases measured once: docs/families/glm4_moe_lite.md,
    # docs/families/nemotron_h.md)
    "glm4_moe_lite": Trained(DATA / "tiny-glm4_moe_lite-trained", "model.layers.2.", MLA, _cases(MLA)),
    "nemotron_h": Trained(DATA / "tiny-nemotron_h-trained", "mtp.", HYBRID,
                          {k: v for k, v in _cases(HYBRID, "layers.0.enorm.weight").items() if k != "all norms +1"}),
    # GLM-4.7-Flash's MLA block under DeepSeek-V3's own config and trained weights
    "deepseek_v3": Trained(DATA / "tiny-deepseek_v3-trained", "model.layers.2.", MLA, _cases(MLA),
                           headless="model.layers.2."),
}
#: a trained head's acceptance on its 4-bit backbone is far above this (random heads: ~0%)
TRAINED_FLOOR = 0.4
#: findings that are no defect: a group the drafts do not depend on is said undecided (info)
QUIET = {"NORM_CONVENTION_PARTIAL"}
#: a repaired head drafts within a point of the correct one
POINT = 0.01


def shift(folder: Path, groups: tuple[str, ...]) -> None:
    """+1 on the head's norms of ``groups`` (stored in the sidecar as the release names them)."""
    def fn(t: dict[str, mx.array]) -> dict[str, mx.array]:
        return {k: ((v.astype(mx.float32) + 1).astype(v.dtype) if any(k.endswith("." + g) for g in groups) else v)
                for k, v in t.items()}

    rewrite(folder / HEAD, fn)


def acceptance(folder: Path) -> float:
    """verify's acceptance with the post-norm hidden state: what these heads were trained on and
    every runtime feeds them (one decode fewer than ``auto``)."""
    r = verify(str(folder), generate=True, hidden="post", progress=False)
    assert r["identical"], r
    return float(r["acceptance"])


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """family -> its correct head as another tool leaves it, and its acceptance (made once)."""
    from tests.support.synth import convert_to_mlx

    made: dict[str, dict[str, Any]] = {}

    def get(family: str) -> dict[str, Any]:
        if family not in made:
            model = TRAINED[family].model
            root = tmp_path_factory.mktemp(f"{family}-norm-truth")
            base = headless_copy(model, root / "headless", TRAINED[family].headless) if TRAINED[family].headless else model
            t = convert_to_mlx(base, root / f"{family}-4bit", q_bits=4, q_group_size=32, dtype="float32")
            add_mtp(source=str(model), target=str(t), progress=False)
            (t / "mtpforge.json").unlink()
            (t / "README.md").unlink()
            made[family] = {"root": root, "ok": t, "acceptance": acceptance(t)}
        return made[family]

    return get


@pytest.fixture(scope="module")
def glm(heads) -> dict[str, Any]:
    return heads("glm4_moe")


def _codes(r: dict[str, Any]) -> set[str]:
    return {f["code"] for f in r["findings"]} - QUIET


@pytest.mark.parametrize("family", list(TRAINED))
def test_a_correct_head_is_measured_raw_with_no_finding(heads, family: str, tmp_path: Path) -> None:
    tr, h = TRAINED[family], heads(family)
    tgt = Path(shutil.copytree(h["ok"], tmp_path / "ok"))
    r = inspect_checkpoint(str(tgt))
    print(f"[norm-truth] {family} correct head: acceptance {h['acceptance']:.3f}, findings {sorted(_codes(r))}")
    assert h["acceptance"] >= TRAINED_FLOOR
    assert _codes(r) == set() and r["exit_code"] == 0, r["findings"]
    assert (r["norm_convention"], r["norm_convention_from"], r["norm_convention_basis"]) == ("raw", "behaviour", "measured")
    assert r["norm_behaviour"]["informative"] and set(r["norm_behaviour"]["groups"]) == set(tr.norms)
    before = folder_state(tgt)
    assert repair_norms(str(tgt), progress=False)["status"] == "nothing-to-repair"
    assert folder_state(tgt) == before


@pytest.mark.parametrize("family,case", [(f, c) for f, tr in TRAINED.items() for c in tr.cases])
def test_a_shifted_head_is_found_offline_and_repaired(heads, family: str, case: str, tmp_path: Path) -> None:
    tr, h = TRAINED[family], heads(family)
    groups, code, conv = tr.cases[case]
    tgt = Path(shutil.copytree(h["ok"], tmp_path / "broken"))
    shift(tgt, groups)
    r = inspect_checkpoint(str(tgt))
    assert _codes(r) == {code} and r["exit_code"] == 1, r["findings"]
    assert (r["norm_convention"], r["norm_convention_basis"]) == (conv, "measured")
    before = acceptance(tgt)

    rep = repair_norms(str(tgt), progress=False)
    assert rep["status"] == "repaired" and rep["evidence"] == "behaviour"
    # a group the drafts barely depend on may be left as found (said undecided), never another one
    changed, shifted = set(rep["changed_norms"]), {tr.prefix + g for g in groups}
    assert changed and changed <= shifted, rep["changed_norms"]
    assert set(rep["changed_norms"].values()) == {"-1"}
    after = inspect_checkpoint(str(tgt))
    assert (after["norm_convention"], after["norm_convention_from"], after["exit_code"]) == ("raw", "manifest", 0)
    assert json.loads((tgt / "mtpforge.json").read_text())["norm_convention"] == "raw"
    got = acceptance(tgt)
    print(f"[norm-truth] {family} {case}: {code}; acceptance correct {h['acceptance']:.3f}, "
          f"broken {before:.3f}, repaired {got:.3f}")
    assert got >= h["acceptance"] - POINT, (got, h["acceptance"])
    assert before < h["acceptance"] - POINT, "the defect must cost acceptance, or this case tests nothing"


def test_an_old_manifest_saying_shifted_for_glm_is_read_as_what_mtpforge_wrote(glm, tmp_path: Path) -> None:
    """mtpforge wrote GLM's norms as stored and its older manifests still said "shifted": hashes
    that match are a record of raw norms, not of a +1 (no MTP_NORMS_SHIFTED on a correct head)."""
    tgt = Path(shutil.copytree(glm["ok"], tmp_path / "old"))
    add_mtp(source=str(MODEL), target=str(tgt), force=True, progress=False)
    m = json.loads((tgt / "mtpforge.json").read_text())
    m["norm_convention"] = "shifted"
    (tgt / "mtpforge.json").write_text(json.dumps(m))
    r = inspect_checkpoint(str(tgt), behaviour=False)
    assert (r["norm_convention"], r["norm_convention_from"], r["norm_convention_basis"]) == ("raw", "manifest", "recorded")
    assert _codes(r) == set(), r["findings"]


def test_the_cli_says_how_the_convention_is_known(glm, tmp_path: Path) -> None:
    tgt = Path(shutil.copytree(glm["ok"], tmp_path / "cli"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}
    p = subprocess.run([sys.executable, "-m", "mtpforge", "inspect", str(tgt)], cwd=ROOT, capture_output=True,
                       text=True, env=env)
    assert "raw (measured: behaviour)" in p.stdout and "(from family)" not in p.stdout, p.stdout


# ----------------------------------------------------------------------------- dead heads


def requantize(folder: Path, bits: int, *, redraw: bool = False, group: int = 32) -> None:
    """The sidecar's matrices (the router aside, which MLX keeps unquantized in this head) stored
    at ``bits`` as another tool would; ``redraw``: values redrawn at each matrix's own scale
    first (a head of the right shape that never learnt this backbone)."""
    key = mx.random.key(0)

    def fn(t: dict[str, mx.array]) -> dict[str, mx.array]:
        nonlocal key
        out: dict[str, mx.array] = {}
        for k, v in t.items():
            if not (k.endswith(".weight") and v.ndim >= 2 and ".mlp.gate." not in k):
                out[k] = v
                continue
            x = v.astype(mx.float32)
            if redraw:
                key, sub = mx.random.split(key)
                x = mx.random.normal(x.shape, key=sub) * mx.sqrt(mx.mean(x * x))
            w, s, b = mx.quantize(x, group_size=min(group, x.shape[-1]), bits=bits)
            out[k], out[k[: -len("weight")] + "scales"], out[k[: -len("weight")] + "biases"] = w, s.astype(v.dtype), b.astype(v.dtype)
        return out

    rewrite(folder / HEAD, fn)


def test_a_dead_head_is_reported_with_its_figure_and_causes(glm, tmp_path: Path) -> None:
    """A 2-bit head that drafts nothing its backbone would say: MTP_HEAD_DEAD with the measured
    agreement and the causes most likely first (precision, norms, hidden state)."""
    tgt = Path(shutil.copytree(glm["ok"], tmp_path / "dead"))
    requantize(tgt, 2, redraw=True)
    r = inspect_checkpoint(str(tgt))
    dead = [f for f in r["findings"] if f["code"] == "MTP_HEAD_DEAD"]
    assert dead and dead[0]["severity"] == "warning", r["findings"]
    d = r["dead_head"]
    assert d["agreement"] < 0.1 and d["positions"] >= 200, d
    assert f"{d['agreement']:.1%}" in dead[0]["message"]
    order = [dead[0]["message"].index(w) for w in ("(1) precision: the head's matrices are 2-bit", "(2) norms", "(3) hidden state")]
    assert order == sorted(order), dead[0]["message"]
    assert "--precision 8" in dead[0]["fix"]
    print(f"[dead-head] glm4_moe redrawn 2-bit head: agreement {d['agreement']:.3f}, best norms {d['best_norms']:.3f}")


@pytest.mark.parametrize("bits", [2, 1])
def test_a_low_bit_head_that_still_drafts_is_not_called_dead(glm, tmp_path: Path, bits: int) -> None:
    """The trained tiny GLM head quantized to 2 bits still agrees with its backbone on most
    positions (its figure is reported): a precision that costs acceptance is not a dead head."""
    tgt = Path(shutil.copytree(glm["ok"], tmp_path / f"q{bits}"))
    requantize(tgt, bits, group=128)
    r = inspect_checkpoint(str(tgt))
    ag = r["norm_behaviour"]["agreement"]
    print(f"[dead-head] glm4_moe trained head at {bits} bits (group 128): agreement {ag}")
    assert "MTP_HEAD_DEAD" not in {f["code"] for f in r["findings"]} and ag["as_stored"] > 0.2, ag
