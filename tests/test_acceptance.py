"""Acceptance on the bundled tiny TRAINED models: the numbers that make verify's verdict mean something.

The path is the user's: trained HF source -> the real ``mlx_lm.convert`` (drops the head) ->
``add_mtp`` -> ``verify``. A random head accepts nothing, so only a trained head can show that
a correct conversion keeps acceptance and that each known conversion bug destroys it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import pytest

from mtpforge.decoder.backbone import load_backbone
from mtpforge.decoder.head import build_head
from mtpforge.decoder.loop import HeadDrafter, mtp_decode, plain_decode
from mtpforge.decoder.sampling import Chooser
from mtpforge.decoder.stats import summarize
from mtpforge.families.tables import is_norm_key
from mtpforge.passes.experts import to_switch_mlp
from mtpforge.pipeline import add_mtp
from tests.support.synth import convert_to_mlx
from tests.support.synth.tokenizer import default_corpus
from mtpforge.verify import DEFAULT_PROMPTS, verify

from tests.checkers import rewrite, source_head

DATA = Path(__file__).resolve().parent.parent / "mtpforge" / "data"
MODELS = {"dense": DATA / "tiny-qwen3_5", "moe": DATA / "tiny-qwen3_5_moe"}
#: issue 4's done-when floors at depth 1
FLOOR = {"dense": 0.60, "moe": 0.50}
MAX_TOKENS = 64
HEAD_FILE = "model-mtp.safetensors"
PREFIX = "language_model.mtp."


def _prompts() -> list[str]:
    """verify's default prompts plus held-out documents (another seed than any training run)."""
    docs = default_corpus(40, seed=424242)
    extra = [docs[i] + "\n" + docs[i + 1][: max(4, len(docs[i + 1]) // 3)] for i in range(0, 16, 2)]
    return list(DEFAULT_PROMPTS) + extra


PROMPTS = _prompts()


def report(what: str, value: Any) -> None:
    """Measured figures, for the record (shown with ``pytest -s``)."""
    print(f"[acceptance] {what}: {value}")


def needs(kind: str) -> Any:
    return pytest.mark.skipif(not (MODELS[kind] / "config.json").is_file(),
                              reason=f"the bundled trained model {MODELS[kind].name} is not in the tree yet")


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``converted(kind) -> Path``: the trained source through mlx_lm.convert (4-bit, as community
    conversions are) and add_mtp --precision bf16. Shared: copy before changing it."""
    root = tmp_path_factory.mktemp("trained")
    done: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in done:
            target = convert_to_mlx(MODELS[kind], root / f"{kind}-4bit")
            add_mtp(source=str(MODELS[kind]), target=str(target), layout="embedded", precision="bf16", progress=False)
            done[kind] = target
        return done[kind]

    return get


def _verify(target: Path, prompts: list[str] = PROMPTS, **kw: Any) -> dict[str, Any]:
    return verify(str(target), generate=True, prompts=prompts, max_tokens=MAX_TOKENS, progress=False, **kw)


@pytest.fixture(scope="module")
def measured(converted) -> Callable[[str], dict[str, Any]]:
    """``measured(kind)``: verify of the converted folder at depth 1, both hidden states — the
    floor, the float32 comparison and the mutations' baseline read the one run (greedy decoding
    is deterministic: a second run measures the same)."""
    done: dict[str, dict[str, Any]] = {}

    def get(kind: str) -> dict[str, Any]:
        if kind not in done:
            done[kind] = _verify(converted(kind), depth=1)
        return done[kind]

    return get


# ----------------------------------------------------------------------------- identity, both paths


@pytest.mark.parametrize("kind", [pytest.param("dense", marks=needs("dense")), pytest.param("moe", marks=needs("moe"))])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_greedy_identity_with_accepts_and_rejections(converted, kind: str, depth: int) -> None:
    target = converted(kind)
    from mtpforge.layouts.read import load_head_weights

    hw = load_head_weights(target)
    bb = load_backbone(target, hw.family)
    head = build_head(hw.family, bb.args, hw.tensors, hw.quant, compute_dtype=bb.dtype)
    accepted = rejected = 0
    for text in PROMPTS[:4]:
        prompt = [int(t) for t in bb.tokenizer.encode(text)]
        want = plain_decode(bb, prompt, max_tokens=MAX_TOKENS, chooser=Chooser()).tokens
        for hidden in ("pre", "post"):
            run = mtp_decode(bb, HeadDrafter(bb, head), prompt, max_tokens=MAX_TOKENS, depth=depth, hidden=hidden,
                             chooser=Chooser())
            assert run.tokens == want, (text, hidden)
            accepted += sum(run.accepted)
            rejected += run.rollbacks
    assert accepted > 0 and rejected > 0, "both the accept and the reject/rollback paths ran"


# ----------------------------------------------------------------------------- done-when numbers


@pytest.mark.parametrize("kind", [pytest.param("dense", marks=needs("dense")), pytest.param("moe", marks=needs("moe"))])
def test_acceptance_floor_depth_1_and_per_position_depth_2_3(converted, measured, kind: str) -> None:
    target = converted(kind)
    r1 = measured(kind)
    report(f"{kind}_depth1", r1["hidden_variants"])
    assert r1["ok"] and r1["identical"] is True and r1["acceptance"] >= FLOOR[kind], r1["problems"]
    assert set(r1["hidden_variants"]) == {"pre", "post"}
    for depth in (2, 3):  # on verify's four prompts: the margins are far above their noise
        r = _verify(target, PROMPTS[:4], depth=depth, hidden=r1["hidden"])
        report(f"{kind}_depth{depth}", r["acceptance_by_position"])
        assert r["identical"] is True and len(r["acceptance_by_position"]) == depth
        assert r["acceptance_by_position"][0] >= FLOOR[kind] - 0.05
        assert r["accepted_per_verify"] > r1["accepted_per_verify"] * 0.9


# ----------------------------------------------------------------------------- preservation


def _reference_acceptance(target: Path, source: Path, hidden: str) -> float:
    """Acceptance of a head built in float32 straight from the source's raw tensors (norms + 1
    in float32, experts split from the source format) on the target's converted backbone."""
    raw = source_head(source)
    ref = {k: v.astype(mx.float32) + 1.0 if is_norm_key(k) else v.astype(mx.float32) for k, v in raw.items()}
    ref = to_switch_mlp(ref)
    from mtpforge.layouts.read import load_head_weights

    family = load_head_weights(target).family
    bb = load_backbone(target, family)
    head = build_head(family, bb.args, ref, None, compute_dtype=mx.float32)
    runs = [mtp_decode(bb, HeadDrafter(bb, head), [int(t) for t in bb.tokenizer.encode(p)], max_tokens=MAX_TOKENS,
                       depth=1, hidden=hidden, chooser=Chooser()) for p in PROMPTS]
    return summarize(runs, [])["acceptance"]


@pytest.mark.parametrize("kind", [pytest.param("dense", marks=needs("dense")), pytest.param("moe", marks=needs("moe"))])
def test_bf16_conversion_preserves_the_float32_reference_acceptance(converted, measured, kind: str) -> None:
    target = converted(kind)
    got = measured(kind)
    for hidden in ("pre", "post"):
        want = _reference_acceptance(target, MODELS[kind], hidden)
        report(f"{kind} {hidden}", {"add_mtp_bf16": got["hidden_variants"][hidden], "float32_reference": want})
        assert abs(got["hidden_variants"][hidden] - want) <= 0.01, (hidden, got["hidden_variants"][hidden], want)


# ----------------------------------------------------------------------------- mutations


def _norms(delta: float) -> Callable[[str, mx.array], mx.array | None]:
    def f(bare: str, v: mx.array) -> mx.array | None:
        return (v.astype(mx.float32) + delta).astype(v.dtype) if is_norm_key(bare) else None

    return f


def _swap_fc_halves(bare: str, v: mx.array) -> mx.array | None:
    if bare != "fc.weight":
        return None
    h = v.shape[1] // 2
    return mx.concatenate([v[:, h:], v[:, :h]], axis=1)


def _swap_halves(v: mx.array, axis: int) -> mx.array:
    a, b = mx.split(v, 2, axis=axis)
    return mx.concatenate([b, a], axis=axis)


def _roll_experts(bare: str, v: mx.array) -> mx.array | None:
    if ".mlp.experts." in bare or ".mlp.switch_mlp." in bare:
        return mx.concatenate([v[1:], v[:1]], axis=0) if v.ndim == 3 else None
    return None


def _mutate(target: Path, dst: Path, edit: Callable[[dict[str, mx.array]], dict[str, mx.array]]) -> Path:
    shutil.copytree(target, dst, symlinks=True)
    rewrite(dst / HEAD_FILE, edit)
    return dst


def _per_tensor(fn: Callable[[str, mx.array], mx.array | None]) -> Callable[[dict[str, mx.array]], dict[str, mx.array]]:
    def edit(tensors: dict[str, mx.array]) -> dict[str, mx.array]:
        out = {}
        for k, v in tensors.items():
            new = fn(k[len(PREFIX):], v) if k.startswith(PREFIX) else None
            out[k] = v if new is None else new
        changed = sum(1 for k in tensors if out[k] is not tensors[k])
        assert changed, "the mutation changed nothing"
        return out

    return edit


def _swap_gate_up(tensors: dict[str, mx.array]) -> dict[str, mx.array]:
    """Gate and up exchanged: a fused ``gate_up_proj`` split on the wrong half (the routed
    experts); in a dense head, whose source stores them apart, ``gate_proj`` / ``up_proj``."""
    out = dict(tensors)
    fused = [k for k in tensors if k.endswith("mlp.experts.gate_up_proj")]
    for k in fused:
        out[k] = _swap_halves(tensors[k], axis=-2)
    moe = fused or any(".experts." in k or ".switch_mlp." in k for k in tensors)
    pairs = [(k, k.replace("gate_proj", "up_proj")) for k in tensors if k.endswith("gate_proj.weight")
             and (".experts." in k or ".switch_mlp." in k or not moe)]
    for g, u in pairs:
        out[g], out[u] = tensors[u], tensors[g]
    assert fused or pairs
    return out


#: Each known conversion bug and the least relative fall of acceptance it must cause here.
#: Norms, concat order and expert order break what every draft passes through: acceptance at
#: least halves (issue 4; measured on the MoE model 83.5% -> 3.1%, 4.0%, 38.2%). Gate and up
#: exchanged falls by about a third (89.4% -> 56.6% dense, 83.5% -> 53.7% MoE), not half: for
#: small pre-activations silu(g)·u ≈ g·u/2 + g²u/4 is nearly symmetric in g and u, and a head
#: this small leans little on its MLP (the bundled heads were retrained with their MLP input at
#: gain 4 to make it lean more, which took the fall from ~10% to ~35%). On real models it is
#: far worse; this floor proves verify still sees it.
#: The last figure: how many prompts measure it — the falls to a few percent show on verify's
#: four; the others are measured on all twelve, as the baseline is.
MUTATIONS: dict[str, tuple[Callable[[dict[str, mx.array]], dict[str, mx.array]], float, int]] = {
    "norms_not_shifted": (_per_tensor(_norms(-1.0)), 0.5, 4),
    "concat_order_swapped": (_per_tensor(_swap_fc_halves), 0.5, 4),
    "experts_out_of_order": (_per_tensor(_roll_experts), 0.5, len(PROMPTS)),
    "gate_up_swapped": (_swap_gate_up, 0.3, len(PROMPTS)),
}
MOE_ONLY = ("experts_out_of_order",)
#: the mutations of what the MoE head has alike (its norms, its fc): measured on the dense model
#: only (the MoE run cost ~20 s of the suite for the same verdict: 83.5% -> 3.1% and 4.0%)
DENSE_ONLY = ("norms_not_shifted", "concat_order_swapped")


@pytest.mark.parametrize("kind", [pytest.param("dense", marks=needs("dense")), pytest.param("moe", marks=needs("moe"))])
def test_each_known_conversion_bug_lowers_acceptance(converted, measured, kind: str, tmp_path: Path) -> None:
    target = converted(kind)
    good = measured(kind)["hidden_variants"]["post"]
    assert good >= FLOOR[kind]
    for name, (edit, least_fall, n_prompts) in MUTATIONS.items():
        if (name in MOE_ONLY and kind == "dense") or (name in DENSE_ONLY and kind == "moe"):
            continue
        bad = _verify(_mutate(target, tmp_path / name, edit), PROMPTS[:n_prompts], hidden="post")
        report(f"{kind} {name}", {"good": good, "mutated": bad["acceptance"]})
        assert bad["identical"] is True, "a broken head may draft badly but never changes the output"
        assert bad["acceptance"] <= good * (1 - least_fall), (name, bad["acceptance"], good)


@pytest.mark.parametrize("kind", [pytest.param("dense", marks=needs("dense"))])
def test_a_double_shift_lowers_acceptance_measurably(converted, kind: str, tmp_path: Path) -> None:
    """+2 instead of +1 only rescales what the next layer sees, and a tiny model absorbs most of
    that: the fall is 1.5-2 points (88.2% -> 86.8% dense, 85.7% -> 83.9% MoE), below the noise
    of a dozen prompts, so this measures on 48 held-out documents. The dense model only: the
    mutation touches the seven norm kinds, which the MoE head has alike (its experts are not
    involved), and the MoE run cost 40 s of the suite for the same verdict."""
    target = converted(kind)
    docs = default_corpus(200, seed=424242)
    prompts = list(DEFAULT_PROMPTS) + [docs[i] + "\n" + docs[i + 1][: max(4, len(docs[i + 1]) // 3)] for i in range(0, 96, 2)]

    def acceptance(folder: Path) -> float:
        """The drafting runs only (verify would decode every prompt plainly too, the same tokens
        for both folders: the backbone is one)."""
        from mtpforge.layouts.read import load_head_weights

        hw = load_head_weights(folder)
        bb = load_backbone(folder, hw.family)
        head = build_head(hw.family, bb.args, hw.tensors, hw.quant, compute_dtype=bb.dtype)
        runs = [mtp_decode(bb, HeadDrafter(bb, head), [int(t) for t in bb.tokenizer.encode(p)], max_tokens=MAX_TOKENS,
                           depth=1, hidden="post", chooser=Chooser()) for p in prompts]
        return summarize(runs, [])["acceptance"]

    good = acceptance(target)
    bad = acceptance(_mutate(target, tmp_path / "double", _per_tensor(_norms(+1.0))))
    report(f"{kind} double_shift", {"good": good, "double_shifted": bad})
    assert bad < good - 0.01, (good, bad)
