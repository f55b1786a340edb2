"""Which RMSNorm convention a head's norms are in, told by running the head (no manifest, no network).

The folder holds the backbone the head was trained against, so the backbone is the oracle: on a
short built-in text its distribution of token t+2 (its logits at position t+1) is what a working
head reproduces from (H[t], x[t+1]). Each norm group (every RMSNorm kind of the head: the seven
zero-centred kinds of docs/SPEC.md §4 for Qwen, the raw ones of GLM and Nemotron-H) is tried as
the release's raw values, shifted +1 and shifted +2 — for Qwen that is stored +1, as stored and
stored -1; for a raw-norm family as stored, -1 and -2 — the offsets that make the head's drafts closest to the
backbone (mean KL over positions) name the convention per group, so a head whose groups disagree
is reported ``mixed``. A group is decided only when its best offset beats both others by a paired
margin that the per-position spread cannot explain, and only when the head beats a draft that
knows nothing (the backbone's average t+2 distribution): an untrained head explains nothing, so
its convention stays ``unknown``. No norm value is ever compared with a threshold (docs/SPEC.md §4).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import mlx.core as mx

from ..families.spec import NORM_ROLES, FamilySpec, Role
from ..families.tables import is_norm_key

#: offset that, added to the stored weights, gives MLX's x̂·w -> what the stored group is, for a
#: zero-centred group (MLX adds +1 to the release's values); ``verdict_of`` is the general rule
OFFSET_VERDICT = {0: "shifted", 1: "raw", -1: "double-shifted"}
OFFSETS = (0, 1, -1)
#: what a stored group carries over the release's raw values -> its name (docs/SPEC.md §4)
SHIFT_NAMES = {0: "raw", 1: "shifted", 2: "double-shifted"}
#: the hypotheses tried per group, as shifts over the raw values (for a zero-centred group:
#: the offsets 0, +1, -1 of ``OFFSETS``, in that order)
SHIFTS = (1, 0, 2)


def verdict_of(expect: int, offset: int) -> str:
    """What a group is stored as when ``offset`` makes it what MLX applies, for a group MLX
    applies ``expect`` over the release's values (1 zero-centred, 0 raw)."""
    return SHIFT_NAMES[expect - offset]


def offset_for(expect: int, verdict: str) -> int:
    """The offset that puts a group stored as ``verdict`` into MLX's convention."""
    return expect - {v: k for k, v in SHIFT_NAMES.items()}[verdict]
#: a group is decided when its best offset beats each other one by a likelihood ratio of 1000:1
#: (Jeffreys' "decisive") on tokens drawn from the backbone at these positions. The expected log
#: ratio of two drafts on a token drawn from p is KL(p||q_b) - KL(p||q_a), so the evidence is the
#: sum of KL differences over positions (evidence about behaviour, never a norm value)
DECISIVE_NATS = math.log(1000.0)
#: positions the check uses at most (a prompt set of a few hundred tokens is plenty)
MAX_POSITIONS = 384
#: coordinate-descent rounds over the groups after the uniform start
MAX_ROUNDS = 2

#: plain text and a chat turn: the same kinds verify decodes (the bundled models know them)
TEXTS: tuple[str, ...] = (
    "The old man reads the map after the rain.\n",
    "A small boat carries seven stones under the bridge.\nCount: 12, 13,",
    "<|im_start|>user\nWhat does the robot do?<|im_end|>\n<|im_start|>assistant\nThe robot builds a wooden box.<|im_end|>\n",
    "Count: 3, 4, 5, 6, 7, 8.\n25 + 17 =",
)
#: greedy tokens the backbone adds to each text, so the positions are text the backbone itself
#: finds likely (any model, any training corpus)
CONTINUE_TOKENS = 64


def group_of(bare: str, spec: FamilySpec | None = None) -> str | None:
    """The norm kind of a bare head key (``layers.0.self_attn.q_norm.weight`` -> ``self_attn.q_norm.weight``).

    With ``spec``: any RMSNorm of that family's head (its row's key without the MTP layer's
    ``{i}.``; Nemotron-H's ``layers.0.norm`` and ``layers.1.norm`` are two kinds), raw-norm
    families included. Without: a zero-centred kind of any family (a key read without its config)."""
    if spec is not None:
        hit = spec.match(bare)
        if hit is None or hit[0].role not in NORM_ROLES:
            return None
        return hit[0].key.split("{i}.")[-1]
    if not is_norm_key(bare):
        return None
    return bare.split(".", 2)[2] if bare.startswith("layers.") else bare


@dataclass
class GroupVerdict:
    verdict: str  # shifted | raw | double-shifted | unknown
    offset: int  # the offset of the best assignment (what a repair would add)
    #: evidence (nats) that this group's offset is right: how much worse the best assignment
    #: that moves this group elsewhere explains the backbone
    evidence: float

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "offset": self.offset, "evidence_nats": round(self.evidence, 2)}


@dataclass
class BehaviourResult:
    """What running the head told: one convention for the head, and per group."""

    convention: str  # shifted | raw | double-shifted | mixed | unknown
    groups: dict[str, GroupVerdict]
    hidden: str
    #: nats by which the reported convention beats the best assignment of any other label
    evidence: float
    #: mean KL (nats/position) of the best assignment and of a draft that knows nothing
    kl_best: float
    kl_baseline: float
    informative: bool
    positions: int
    head_passes: int
    backbone_passes: int
    seconds: float
    notes: list[str] = field(default_factory=list)
    #: bare norm key -> its group (the family's, ``group_of(key, spec)``)
    keys: dict[str, str] = field(default_factory=dict)
    #: group -> the shift MLX applies over the release's values (1 zero-centred, 0 raw)
    expect: dict[str, int] = field(default_factory=dict)
    #: share of positions where the head's greedy draft is the backbone's greedy token t+2 (what
    #: depth-1 greedy acceptance counts): as stored (best hidden state), with the best norm
    #: assignment, and for a draft that always names the most frequent token
    agreement: dict[str, float] = field(default_factory=dict)

    def group(self, key: str) -> str | None:
        """The group of a bare norm key (the family's grouping; a zero-centred kind's otherwise)."""
        return self.keys.get(key) or group_of(key)
    def weak_groups(self) -> list[str]:
        """Groups with a verdict the drafts cannot back by ``DECISIVE_NATS`` on their own."""
        return [g for g, v in self.groups.items() if v.verdict != "unknown" and v.evidence < DECISIVE_NATS]

    def verdicts(self, keys: list[str]) -> dict[str, str]:
        """Per bare norm key: its group's verdict (``unknown`` where behaviour cannot tell)."""
        return {k: (self.groups[g].verdict if (g := self.group(k)) in self.groups else "unknown") for k in keys}

    def repair_offsets(self) -> dict[str, int]:
        """Offset per group (zeros left out) of the assignment a repair applies: of those that
        explain the backbone best within the margin, the one that changes fewest groups. Empty
        when the convention is unknown."""
        if self.convention == "unknown":
            return {}
        return {g: v.offset for g, v in self.groups.items() if v.offset != 0}

    def as_dict(self) -> dict[str, Any]:
        return {
            "convention": self.convention, "evidence_nats": round(self.evidence, 2),
            "groups": {g: v.as_dict() for g, v in self.groups.items()},
            "hidden": self.hidden, "kl_best": round(self.kl_best, 5), "kl_baseline": round(self.kl_baseline, 5),
            "informative": self.informative,
            "agreement": {k: round(v, 4) for k, v in self.agreement.items()},
            "cost": {"positions": self.positions, "head_passes": self.head_passes,
                     "backbone_passes": self.backbone_passes, "seconds": round(self.seconds, 3)},
            "notes": self.notes,
        }


def _sign_z(worse: mx.array, better: mx.array) -> float:
    """Sign test over positions: (where ``better`` wins - where it loses) / sqrt(their sum).

    A guard against one outlying position carrying a sum of KL differences."""
    d = (worse - better).astype(mx.float32)
    wins, losses = int(mx.sum(d > 0).item()), int(mx.sum(d < 0).item())
    return (wins - losses) / math.sqrt(wins + losses) if wins + losses else 0.0


def _kl_rows(logp: mx.array, logq: mx.array) -> mx.array:
    """KL(p || q) per row, for log-probabilities [N, V]."""
    return mx.sum(mx.exp(logp) * (logp - logq), axis=-1)


def _log_softmax(x: mx.array) -> mx.array:
    x = x.astype(mx.float32)
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def label(assign: Mapping[str, int], expect: Mapping[str, int] | None = None) -> str:
    """The head's convention if ``assign`` (offsets per group) is what it needs; ``expect``:
    per group, the shift MLX applies over the release's values (default 1: zero-centred)."""
    names = {verdict_of((expect or {}).get(g, 1), o) for g, o in assign.items()}
    return names.pop() if len(names) == 1 else "mixed"


def decide(pr: "Probe") -> tuple[str, dict[str, GroupVerdict], str, float, dict[tuple[int, ...], float]]:
    """Search offsets per group and name the convention (see the module docstring).

    Coordinate descent over the groups from each uniform start (every group -1, 0, +1) finds the
    assignments that explain the backbone best. The head's convention is the label (shifted,
    raw, double-shifted, mixed) of the best one, decided only when it beats the best assignment
    of every other label by ``DECISIVE_NATS``; "mixed" must beat every uniform convention so, or
    the best uniform one stands (a mixed head is claimed on evidence, never for a sliver of KL).
    A group is decided when every assignment that comes within ``DECISIVE_NATS`` of the best
    agrees on its offset.
    """
    groups = pr.groups
    exp = {g: pr.expect.get(g, 1) for g in groups}
    cands = {g: [exp[g] - s for s in SHIFTS] for g in groups}
    uniform = {s: {g: exp[g] - s for g in groups} for s in SHIFTS}
    starts = [(uniform[s], h) for s in SHIFTS for h in ("post", "pre")]
    _, hidden = min(starts, key=lambda s: float(mx.sum(pr.kl(*s)).item()))
    total: dict[tuple[int, ...], float] = {}

    def cost(a: Mapping[str, int]) -> float:
        key = tuple(a[g] for g in groups)
        if key not in total:
            total[key] = float(mx.sum(pr.kl(a, hidden)).item())
        return total[key]

    # from the head as stored and from the best uniform convention: a single wrong group sits
    # next to the first, a uniform error at the second
    best_s = min(SHIFTS, key=lambda s: cost(uniform[s]))
    for start in ({g: 0 for g in groups}, uniform[best_s]):
        cur = dict(start)
        for _ in range(MAX_ROUNDS):
            changed = False
            for g in groups:
                best = min(cands[g], key=lambda x: cost({**cur, g: x}))
                if best != cur[g]:
                    cur[g], changed = best, True
            if not changed:
                break
    assigns = {k: dict(zip(groups, k)) for k in total}
    best_of: dict[str, tuple[int, ...]] = {}
    for k, a in assigns.items():
        lab = label(a, exp)
        if lab not in best_of or total[k] < total[best_of[lab]]:
            best_of[lab] = k
    uniform_labels = [l for l in best_of if l != "mixed"]
    best_uniform = min(uniform_labels, key=lambda l: total[best_of[l]])
    top = best_uniform
    if "mixed" in best_of and total[best_of[best_uniform]] - total[best_of["mixed"]] >= DECISIVE_NATS \
            and _sign_z(pr.kl(assigns[best_of[best_uniform]], hidden), pr.kl(assigns[best_of["mixed"]], hidden)) > 0:
        top = "mixed"
    # mixed must beat every uniform label; a uniform label must beat the other uniform ones (a
    # mixed assignment within reach does not unseat it: see above)
    others = [total[best_of[l]] for l in uniform_labels if l != top]
    margin = min(others) - total[best_of[top]] if others else math.inf
    conv = top if margin >= DECISIVE_NATS else "unknown"
    if top != "mixed" and conv != "unknown":
        best_k = best_of[top]
        # each group's own evidence: how much worse the best assignment that moves it explains
        # the backbone (a group the drafts barely depend on is weak, whatever the label's margin)
        verdicts = {g: GroupVerdict(conv, best_k[i], _moved_by(total, best_k, i)) for i, g in enumerate(groups)}
        return conv, verdicts, hidden, margin, total
    best = min(total.values())
    near = [k for k in total if total[k] - best < DECISIVE_NATS]
    # of the assignments the evidence cannot tell apart, the one that changes fewest groups: a
    # repair touches only what the evidence demands
    best_k = min(near, key=lambda k: (sum(1 for x in k if x), total[k]))
    verdicts = {}
    for i, g in enumerate(groups):
        ev = _moved_by(total, best_k, i)
        agreed = all(k[i] == best_k[i] for k in near)
        v = verdict_of(exp[g], best_k[i]) if agreed and conv != "unknown" else "unknown"
        verdicts[g] = GroupVerdict(v, best_k[i], ev)
    return conv, verdicts, hidden, margin, total


def _moved_by(total: Mapping[tuple[int, ...], float], best_k: tuple[int, ...], i: int) -> float:
    """Nats by which the best assignment that gives group ``i`` another offset is worse."""
    moved = [total[k] for k in total if k[i] != best_k[i]]
    return (min(moved) - total[best_k]) if moved else math.inf


def judge_norms(folder: str | Path, *, seed: int = 0) -> BehaviourResult:
    """Run the folder's head against its own backbone and name its norm convention."""
    t0 = time.perf_counter()
    pr = probe(folder, seed=seed)
    conv, verdicts, hidden, margin, total = decide(pr)
    best_k = min(total, key=total.__getitem__)
    final = pr.kl(dict(zip(pr.groups, best_k)), hidden)
    # the know-nothing draft: the backbone's average t+2 distribution over these positions
    marginal = mx.log(mx.mean(mx.exp(pr.logp), axis=0, keepdims=True) + 1e-30)
    kl_base = _kl_rows(pr.logp, mx.broadcast_to(marginal, pr.logp.shape))
    informative = float(mx.sum(kl_base - final).item()) >= DECISIVE_NATS and _sign_z(kl_base, final) > 0
    notes = []
    if not informative:
        notes.append("the head's drafts explain the backbone no better than a draft that knows nothing (an untrained "
                     "or damaged head): its norm convention cannot be told by behaviour")
        conv = "unknown"
        verdicts = {g: GroupVerdict("unknown", v.offset, v.evidence) for g, v in verdicts.items()}
    top = mx.argmax(pr.logp, axis=-1)
    agreement = {"as_stored": max(pr.agree({}, h) for h in ("post", "pre")),
                 "best_norms": max(pr.agree(dict(zip(pr.groups, best_k)), h) for h in ("post", "pre")),
                 "most_frequent_token": float(mx.mean(top == mx.argmax(mx.sum(mx.exp(pr.logp), axis=0))).item())}
    return BehaviourResult(conv, verdicts, hidden, margin, float(mx.mean(final).item()), float(mx.mean(kl_base).item()),
                           informative, int(pr.logp.shape[0]), pr.passes, pr.backbone_passes,
                           time.perf_counter() - t0, notes, dict(pr.keys), dict(pr.expect), agreement)


@dataclass
class Probe:
    """The head, its stored norms and the backbone's targets at the probe positions."""

    head: Any
    dtype: Any
    lm_head: Any
    stored: dict[str, mx.array]
    groups: list[str]
    logp: mx.array  # [N, V] backbone log-probabilities of token t+2
    inputs: dict[str, mx.array]  # hidden variant -> [texts, n, H], right-padded
    emb: mx.array  # [texts, n, H]
    keep: mx.array  # flat indices of the real (unpadded) positions
    backbone_passes: int
    passes: int = 0
    cache: dict[tuple[str, tuple[int, ...]], mx.array] = field(default_factory=dict)
    #: bare norm key -> group, and group -> the shift MLX applies over the release (see decide)
    keys: dict[str, str] = field(default_factory=dict)
    expect: dict[str, int] = field(default_factory=dict)

    def group(self, key: str) -> str:
        return self.keys.get(key) or group_of(key) or ""

    def kl(self, offsets: Mapping[str, int], hidden: str) -> mx.array:
        """KL(backbone || head) per position with ``offsets`` added to each norm group."""
        key = (hidden, tuple(offsets.get(g, 0) for g in self.groups))
        if key in self.cache:
            return self.cache[key]
        self.passes += 1
        self.head.load_weights([(k, (v + offsets.get(self.group(k), 0)).astype(self.dtype))
                                for k, v in self.stored.items()], strict=False)
        # every text in one batch, right-padded: causal attention keeps the padding out of the
        # real positions, which are picked back out by ``keep``
        logq = _log_softmax(self.lm_head(self.head(self.inputs[hidden], self.emb)))
        out = _kl_rows(self.logp, logq.reshape(-1, logq.shape[-1])[self.keep])
        mx.eval(out)
        self.cache[key] = out
        return out

    def agree(self, offsets: Mapping[str, int], hidden: str) -> float:
        """Share of positions whose greedy draft (``offsets`` on the norms) is the backbone's
        greedy token t+2: a head that drafts well agrees on most, a dead one on almost none."""
        self.head.load_weights([(k, (v + offsets.get(self.group(k), 0)).astype(self.dtype))
                                for k, v in self.stored.items()], strict=False)
        logits = self.lm_head(self.head(self.inputs[hidden], self.emb))
        draft = mx.argmax(logits.reshape(-1, logits.shape[-1])[self.keep], axis=-1)
        return float(mx.mean(draft == mx.argmax(self.logp, axis=-1)).item())

    def broken(self, offsets: Mapping[str, int]) -> "Probe":
        """The same probe for a head whose norm groups carry ``offsets`` more (tests, repairs)."""
        stored = {k: v + offsets.get(self.group(k), 0) for k, v in self.stored.items()}
        return replace(self, stored=stored, passes=0, cache={})


def probe(folder: str | Path, *, seed: int = 0) -> Probe:
    """Load head and backbone, and run the backbone once over each built-in text."""
    from ..decoder.backbone import load_backbone
    from ..decoder.head import build_head
    from ..layouts.read import load_head_weights

    from ..families.tables import spec_named

    hw = load_head_weights(folder)
    bb = load_backbone(folder, hw.family)
    head = build_head(hw.family, bb.args, hw.tensors, hw.quant, compute_dtype=bb.dtype)
    spec = spec_named(hw.family)
    keys = {k: g for k in hw.tensors if (g := group_of(k, spec))}
    stored = {k: v.astype(mx.float32) for k, v in hw.tensors.items() if k in keys}
    expect = {g: int(spec.offset_of(k)) for k, g in keys.items()}
    order = list(Role)
    groups = sorted(set(keys.values()), key=lambda g: (order.index(spec.role_of(next(k for k in keys if keys[k] == g)) or Role.FC), g))
    seqs, steps = _texts(bb, seed)
    targets: list[mx.array] = []
    hid: dict[str, list[mx.array]] = {"pre": [], "post": []}
    emb: list[mx.array] = []
    budget = MAX_POSITIONS
    for seq in seqs:
        if len(seq) < 3 or budget <= 0:
            continue
        seq = seq[: budget + 2]
        logits, _ = bb(seq, bb.make_cache(), "post")
        n = len(seq) - 2  # positions t whose t+2 distribution the backbone gives (its logits at t+1)
        targets.append(_log_softmax(logits[0, 1 : n + 1]))
        hid["pre"].append(bb.tap.seen.pre[0, :n])
        hid["post"].append(bb.tap.seen.post[0, :n])
        emb.append(bb.embed(seq[1 : n + 1])[0])
        mx.eval(targets[-1], hid["pre"][-1], hid["post"][-1], emb[-1])
        budget -= n
    width = max(e.shape[0] for e in emb)

    def batch(rows: list[mx.array]) -> mx.array:
        return mx.stack([mx.pad(r, [(0, width - r.shape[0]), (0, 0)]) for r in rows])

    keep = mx.array([i * width + j for i, e in enumerate(emb) for j in range(e.shape[0])])
    return Probe(head, bb.dtype, bb.lm_head, stored, groups, mx.concatenate(targets, axis=0),
                 {h: batch(v) for h, v in hid.items()}, batch(emb), keep, steps + len(targets), keys=keys, expect=expect)


def _texts(bb: Any, seed: int) -> tuple[list[list[int]], int]:
    """The built-in texts, each continued by the backbone itself (sampled at temperature 1 from
    a seeded generator: its own likely text, with the uncertain positions that tell heads apart)."""
    import numpy as np

    from mlx_lm.generate import generate_step

    rng = np.random.default_rng(seed)

    def sample(logprobs: mx.array) -> mx.array:
        p = np.exp(np.asarray(logprobs.astype(mx.float32), dtype=np.float64)[0])
        c = np.cumsum(p)
        return mx.array([int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(p) - 1))])

    seqs, steps = [], 0
    for text in TEXTS:
        ids = [int(t) for t in bb.tokenizer.encode(text)]
        if not ids:
            continue
        cont: list[int] = []
        for tok, _ in generate_step(mx.array(ids), bb.model, max_tokens=CONTINUE_TOKENS, sampler=sample):
            cont.append(int(tok))
            steps += 1
            if cont[-1] in bb.eos_ids:
                break
        seqs.append(ids + cont)
    return seqs, steps
