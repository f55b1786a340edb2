"""The bundled MTP decoder on real mlx-lm backbones and real heads written by add-mtp.

Greedy MTP decoding must reproduce plain greedy decoding token for token, whatever the drafts
were. Random-weight heads reject almost every draft, so the accept and partial-accept paths are
driven by an *oracle drafter* that proposes the true continuation with mistakes at known places:
the decoder under test (verify pass, acceptance, KV trim, Gated DeltaNet snapshot/restore, head
catch-up) is the real one; only the proposals are scripted.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from mtpforge.decoder.backbone import Backbone, load_backbone
from mtpforge.decoder.head import MTPHead, build_head
from mtpforge.decoder.loop import HeadDrafter, mtp_decode, plain_decode
from mtpforge.decoder.rollback import rollback, snapshot
from mtpforge.decoder.sampling import Chooser
from mtpforge.layouts.read import load_head_weights
from mtpforge.pipeline import add_mtp
from tests.support.synth import VARIANTS

PROMPT_TEXT = "The cat sees the red ball in the garden."
MAX_TOKENS = 24


class Loaded:
    def __init__(self, folder: Path) -> None:
        hw = load_head_weights(folder)
        self.folder = folder
        self.hw = hw
        self.bb: Backbone = load_backbone(folder, hw.family)
        self.head: MTPHead = build_head(hw.family, self.bb.args, hw.tensors, hw.quant, compute_dtype=self.bb.dtype)
        self.prompt = [int(t) for t in self.bb.tokenizer.encode(PROMPT_TEXT)]
        # mlx-lm's own greedy decoding, never stopped early, is the reference for identity
        self.reference = plain_decode(self.bb, self.prompt, max_tokens=MAX_TOKENS, chooser=Chooser()).tokens


@pytest.fixture(scope="module")
def headed(synth: Any, tmp_path_factory: pytest.TempPathFactory):
    """``headed(variant, precision, layout=None) -> Loaded``: a converted target with its head
    added by add_mtp, loaded once per module."""
    cache: dict[tuple[str, str, str | None], Loaded] = {}
    root = tmp_path_factory.mktemp("headed")

    def get(variant: str, precision: str = "match", layout: str | None = None) -> Loaded:
        key = (variant, precision, layout)
        if key not in cache:
            dst = root / f"{variant}-{precision}-{layout}"
            shutil.copytree(synth.target(variant), dst, symlinks=True)
            add_mtp(source=str(synth.hf(variant)), target=str(dst), precision=precision, layout=layout, progress=False)
            cache[key] = Loaded(dst)
        return cache[key]

    return get


class OracleDrafter:
    """Proposes the true continuation (``full``), wrong wherever ``wrong(position)`` says.

    It learns where it is from the pairs the decoder feeds it, exactly as the head does.
    Records how many drafts of each step the decoder accepted, via ``steps``.
    """

    def __init__(self, full: list[int], wrong, vocab: int) -> None:
        self.full, self.wrong, self.vocab = full, wrong, vocab
        self.reset()

    def reset(self) -> None:
        self.seen = 1  # the first prompt token has no pair
        self.steps: list[int] = []

    def draft(self, pend_h: mx.array, pend_x: list[int], k: int, chooser: Chooser) -> tuple[mx.array, list[Any]]:
        assert pend_h.shape[1] == len(pend_x), "one hidden state per pending token"
        self.seen += len(pend_x)
        drafts = []
        for j in range(k):
            pos = self.seen + j
            true = self.full[pos] if pos < len(self.full) else 0
            drafts.append((true + 1) % self.vocab if self.wrong(pos) else true)
        return mx.array(drafts), [None] * k


def _wrong_sometimes(pos: int) -> bool:
    """About one position in four, spread irregularly so every depth sees full accepts,
    partial accepts and first-draft rejections."""
    return (pos * 37) % 11 < 3


# ----------------------------------------------------------------------------- rollback


@pytest.mark.parametrize("variant", ["qwen3_5", "qwen3_next"])
def test_rollback_restores_gated_deltanet_state(headed, variant: str) -> None:
    """After rejected tokens are rolled back, the caches continue exactly as a fresh cache that
    never saw them; trimming the KV caches alone (no GDN restore) does not — so the check bites."""
    m = headed(variant)
    bb, prompt = m.bb, m.prompt
    fresh = bb.make_cache()
    want, _ = bb(prompt + [11, 12], fresh, "post")

    cache = bb.make_cache()
    bb(prompt, cache, "post")
    snap = snapshot(cache)
    assert any(s is not None for s in snap) and any(s is None for s in snap), "hybrid: both layer kinds"
    bb([40, 41, 42], cache, "post")
    rollback(cache, snap, 3)
    got, _ = bb([11, 12], cache, "post")
    assert mx.allclose(got[0, -2:], want[0, -2:], atol=1e-4, rtol=1e-4).item()

    broken = bb.make_cache()
    bb(prompt, broken, "post")
    bb([40, 41, 42], broken, "post")
    for c in broken:
        if c.is_trimmable():
            c.trim(3)
    bad, _ = bb([11, 12], broken, "post")
    assert float(mx.abs(bad[0, -2:] - want[0, -2:]).max().item()) > 1e-2


# ----------------------------------------------------------------------------- greedy identity


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("precision", ["match", "bf16"])
def test_greedy_identity_with_the_real_head(headed, variant: str, precision: str) -> None:
    """The head drafts (random weights: mostly rejected); output == plain greedy, token for
    token, for depth 1-3 and both hidden variants, with quantized (match) and bf16 heads."""
    m = headed(variant, precision)
    if precision == "match":
        assert m.hw.quant, "the matched-precision head holds quantized modules"
    for depth in (1, 2, 3):
        for hidden in ("pre", "post"):
            run = mtp_decode(m.bb, HeadDrafter(m.bb, m.head), m.prompt, max_tokens=MAX_TOKENS, depth=depth,
                             hidden=hidden, chooser=Chooser())
            assert run.tokens == m.reference, (depth, hidden)
            assert sum(run.drafted) > 0 and run.verify_passes > 0


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_greedy_identity_through_accepts_partial_accepts_and_rollbacks(headed, variant: str, depth: int) -> None:
    m = headed(variant)
    full = m.prompt + m.reference
    oracle = OracleDrafter(full, _wrong_sometimes, m.bb.args.vocab_size)
    run = mtp_decode(m.bb, oracle, m.prompt, max_tokens=MAX_TOKENS, depth=depth, hidden="post", chooser=Chooser())
    assert run.tokens == m.reference
    accepted, drafted = sum(run.accepted), sum(run.drafted)
    assert 0 < accepted < drafted, "both accepted and rejected drafts"
    assert 0 < run.rollbacks < run.verify_passes, "both full accepts and rollbacks"
    assert run.accepted[0] > 0 and run.drafted[-1] > 0


@pytest.mark.parametrize("variant", ["qwen3_5", "qwen3_5_moe"])
def test_perfect_drafts_need_no_rollback(headed, variant: str) -> None:
    m = headed(variant)
    oracle = OracleDrafter(m.prompt + m.reference, lambda pos: False, m.bb.args.vocab_size)
    run = mtp_decode(m.bb, oracle, m.prompt, max_tokens=MAX_TOKENS, depth=3, hidden="pre", chooser=Chooser())
    assert run.tokens == m.reference and run.rollbacks == 0 and sum(run.accepted) == sum(run.drafted)
    assert run.verify_passes <= -(-(len(m.reference) - 1) // 4) + 1  # 4 tokens per pass


# ----------------------------------------------------------------------------- head KV cache


class HeadUnderOracle(HeadDrafter):
    """The real head drafts (so its KV cache evolves as in production); the oracle's proposals
    are submitted instead, so that accepted catch-up pairs are exercised."""

    def __init__(self, m: Loaded, oracle: OracleDrafter) -> None:
        super().__init__(m.bb, m.head)
        self.oracle = oracle

    def reset(self) -> None:
        super().reset()
        self.oracle.reset()

    def draft(self, pend_h, pend_x, k, chooser):
        super().draft(pend_h, pend_x, k, chooser)
        return self.oracle.draft(pend_h, pend_x, k, chooser)


@pytest.mark.parametrize("depth", [1, 3])
def test_head_cache_holds_exactly_the_true_pairs(headed, depth: int) -> None:
    """After decoding, the head's KV cache equals a cold prefill on (H[i], x[i+1]) of the final
    sequence: prompt prefill, catch-up on accepted tokens and the trim of depth>1 entries agree."""
    m = headed("qwen3_5")
    full = m.prompt + m.reference
    drafter = HeadUnderOracle(m, OracleDrafter(full, _wrong_sometimes, m.bb.args.vocab_size))
    run = mtp_decode(m.bb, drafter, m.prompt, max_tokens=MAX_TOKENS, depth=depth, hidden="post", chooser=Chooser())
    assert run.tokens == m.reference and 0 < run.rollbacks < run.verify_passes
    n = drafter.cache[0].offset
    assert len(m.prompt) - 1 < n < len(full)
    _, hid = m.bb(full, m.bb.make_cache(), "post")
    cold = m.head.make_cache()
    m.head(hid[:, :n], m.bb.embed(full[1 : n + 1]), cache=cold)
    k_got, v_got = drafter.cache[0].keys[..., :n, :], drafter.cache[0].values[..., :n, :]
    k_want, v_want = cold[0].keys[..., :n, :], cold[0].values[..., :n, :]
    assert mx.allclose(k_got, k_want, atol=1e-4).item() and mx.allclose(v_got, v_want, atol=1e-4).item()


# ----------------------------------------------------------------------------- sampling


def test_sampling_is_reproducible_with_a_seed(headed) -> None:
    m = headed("qwen3_5")

    def sample(seed: int, depth: int) -> list[int]:
        return mtp_decode(m.bb, HeadDrafter(m.bb, m.head), m.prompt, max_tokens=MAX_TOKENS, depth=depth,
                          hidden="post", chooser=Chooser(0.7, seed)).tokens

    assert sample(1, 2) == sample(1, 2)
    assert sample(1, 1) == sample(1, 1)
    assert len({tuple(sample(s, 1)) for s in (1, 2, 3)}) > 1, "the seed matters"


def test_speculative_sampling_emits_the_backbones_distribution() -> None:
    """min(1, p/q) acceptance with residual resampling from max(p - q, 0) makes the emitted token
    distributed as p, whatever q is (the rule verify relies on for --temp > 0)."""
    p_logits = mx.array([2.0, 1.0, 0.0, -1.0, 0.5])
    q_logits = mx.array([-1.0, 0.0, 2.5, 1.0, 0.0])
    ch = Chooser(1.0, seed=0)
    n = 20000
    counts = np.zeros(5)
    for _ in range(n):
        d, q = ch.draft(q_logits)
        k, nxt, ds = ch.judge(mx.stack([p_logits, p_logits]), d, [q])
        counts[ds[0] if k == 1 else nxt] += 1
    p = np.exp(np.array(p_logits)) / np.exp(np.array(p_logits)).sum()
    assert np.abs(counts / n - p).max() < 0.015
    # and not just q: the draft distribution alone is far from p
    q = np.exp(np.array(q_logits)) / np.exp(np.array(q_logits)).sum()
    assert np.abs(q - p).max() > 0.3


def test_tie_margin_tells_a_real_divergence_from_rounding(headed) -> None:
    """Where greedy outputs part, verify asks how far apart the two tokens' logits were: the
    backbone's own runner-up is a real difference (far above float32 rounding); a token against
    itself is a tie."""
    from mtpforge.decoder.stats import tie_margin

    m = headed("qwen3_5")
    d = 5
    logits, _ = m.bb(m.prompt + m.reference[:d], m.bb.make_cache(), "post")
    order = mx.argsort(-logits[0, -1]).tolist()
    assert order[0] == m.reference[d]
    margin, tol = tie_margin(m.bb, m.prompt, m.reference[:d], order[0], order[1])
    assert margin > tol > 0 and tol < 1e-3
    assert tie_margin(m.bb, m.prompt, m.reference[:d], order[0], order[0])[0] <= tol
