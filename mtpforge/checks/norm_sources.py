"""The two ways inspect tells a third-party head's norm convention without ``--source`` or a manifest.

Best first: the source named by the folder's model card (``base_model``, as Hub conversions
write it), compared exactly; then the head's behaviour against its own backbone
(:mod:`.norm_behaviour`). Each answers ``None`` when it cannot decide, and the caller falls back
to the next kind of evidence. What decided each norm is recorded per tensor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import mlx.core as mx

from ..errors import MtpforgeError
from ..layouts.table import LAYOUTS
from . import norms as normchk

#: layouts whose folder holds the backbone the head drafts for (a drafter folder does not; a raw
#: Hugging Face checkpoint's convention is known from provenance)
BEHAVIOUR_LAYOUTS = tuple(name for name, spec in LAYOUTS.items() if spec.has_backbone)


@dataclass
class NormAnswer:
    convention: str
    how: str  # source | behaviour
    verdicts: dict[str, str]  # bare norm key -> shifted | raw | double-shifted | unknown
    evidence: dict[str, str]  # bare norm key -> source | behaviour | unknown
    report: dict[str, Any] = field(default_factory=dict)  # extra keys for inspect's JSON


def network_allowed() -> bool:
    """False under HF_HUB_OFFLINE (huggingface_hub's own switch)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("1", "true", "yes", "on")


def from_model_card(
    base_model: str | None, values: dict[str, mx.array],
    exact: Callable[[str], dict[str, str]], notes: list[str],
) -> NormAnswer | None:
    """Exact comparison with ``base_model``'s norms (a few KB), when the network is allowed.

    ``exact(source) -> per-tensor verdicts`` is inspect's ``--source`` comparison. A card that
    names a repo which is unreachable, private or not this model's source is a hint that did
    not pan out: a note, and the next kind of evidence decides.
    """
    if not base_model or not network_allowed():
        return None
    try:
        verdicts = exact(base_model)
    except (MtpforgeError, OSError, ValueError, KeyError) as e:
        notes.append(f"the model card names {base_model} as the source, but its norms could not be read "
                     f"({getattr(e, 'message', e)}); pass --source to compare exactly")
        return None
    if not verdicts or any(v == "unknown" for v in verdicts.values()):
        notes.append(f"the model card's base_model {base_model} does not hold this head's norms exactly; "
                     "it was not used")
        return None
    return NormAnswer(normchk.aggregate(verdicts), "source", verdicts, {k: "source" for k in verdicts},
                      {"norm_source": base_model})


def from_behaviour(folder: Any, layout: str, values: dict[str, mx.array], notes: list[str],
                   backbone: Callable[[dict[str, mx.array]], dict[str, str]]) -> NormAnswer | None:
    """Run the head against the folder's backbone; ``None`` when that cannot tell. A group the
    drafts barely depend on is settled by ``backbone`` (the backbone's norms of its kind)."""
    from .norm_behaviour import judge_norms

    keys = list(values)
    if layout not in BEHAVIOUR_LAYOUTS:
        return None
    try:
        res = judge_norms(folder)
    except Exception as e:  # noqa: BLE001 - evidence, never a reason for inspect to fail on a folder
        # mlx-lm refusing a damaged backbone, a hostile config, a missing tokenizer: those have
        # their own findings; this evidence is then simply absent
        notes.append(f"the head could not be run against its backbone ({getattr(e, 'message', e)}), so its norm "
                     "convention was not measured")
        return None
    extra = {"norm_behaviour": res.as_dict()}
    notes.extend(res.notes)
    if res.convention == "unknown":
        return NormAnswer("unknown", "behaviour", {k: "unknown" for k in keys}, {k: "unknown" for k in keys}, extra)
    verdicts, evidence, undecided, overridden = settle_weak_groups(res, values, backbone, notes)
    if undecided:
        extra["norm_undecided_groups"] = undecided
    # the head's label stands on the whole-head margin; only a group the backbone re-told changes it
    told = {v for v in verdicts.values() if v != "unknown"}
    conv = res.convention if not overridden else (told.pop() if len(told) == 1 else ("mixed" if told else "unknown"))
    if conv == "mixed" and len(told) == 1:
        # the groups that made the head mixed were too weak to stand on the drafts and the
        # backbone did not tell them: what is decided is one convention (the rest undecided)
        conv = told.pop()
    return NormAnswer(conv, "behaviour", verdicts, evidence, extra)


def settle_weak_groups(res: Any, values: dict[str, mx.array], backbone: Callable[[dict[str, mx.array]], dict[str, str]],
                       notes: list[str]) -> tuple[dict[str, str], dict[str, str], list[str], bool]:
    """Per-norm verdicts and evidence from behaviour, the groups left undecided, and whether the
    backbone re-told any group's verdict.

    A group whose offsets the drafts cannot tell apart (a wrong ±1 there changes them too little
    to see) takes the backbone comparison's verdict when that one is decided, else it is
    ``unknown``: the best fit of a group the drafts do not depend on is no evidence."""
    verdicts = res.verdicts(list(values))
    evidence = {k: ("behaviour" if v != "unknown" else "unknown") for k, v in verdicts.items()}
    weak = set(res.weak_groups())
    if not weak:
        return verdicts, evidence, [], False
    told = backbone({k: v for k, v in values.items() if res.group(k) in weak})
    undecided: set[str] = set()
    overridden = False
    for k in values:
        g = res.group(k)
        if g not in weak:
            continue
        v = told.get(k, "unknown")
        if v == "unknown":
            undecided.add(g or k)
            verdicts[k], evidence[k] = "unknown", "unknown"
            continue
        if v != verdicts[k]:
            notes.append(f"the drafts barely depend on {g}; its level against the backbone's norms of "
                         f"that kind says {v}, not {verdicts[k]}")
            overridden = True
        verdicts[k], evidence[k] = v, "backbone"
    if undecided:
        notes.append(f"the drafts do not depend measurably on {', '.join(sorted(undecided))}, and the backbone's "
                     "norms of that kind do not tell its level either: its convention is unknown (a wrong ±1 there "
                     "costs no measurable acceptance); pass --source to check it exactly")
    return verdicts, evidence, sorted(undecided), overridden
