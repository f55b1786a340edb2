"""Which RMSNorm convention a head's norms are stored in.

Three sources of truth, best first: mtpforge's manifest (checked against the tensors' hashes);
an exact comparison with the source's raw norms; a conservative comparison with the backbone's
norms of the same kind, which answers ``unknown`` rather than guess. Never a value threshold
(SPEC §4).
"""

from __future__ import annotations

from typing import Mapping

import mlx.core as mx

OFFSET_NAMES = {0: "raw", 1: "shifted", 2: "double-shifted"}


def classify_exact(target: mx.array, source: mx.array) -> str:
    """raw / shifted / double-shifted / unknown for one norm, against the raw source tensor.

    The target was rounded once (to bf16, or kept in float32) after adding the offset, so we
    allow one rounding step of bf16 at the target's magnitude.
    """
    if target.shape != source.shape:
        return "unknown"
    t = target.astype(mx.float32)
    s = source.astype(mx.float32)
    for off, name in OFFSET_NAMES.items():
        want = s + off
        tol = mx.maximum(mx.abs(want), 1.0) * (2.0**-7)
        if mx.all(mx.abs(t - want) <= tol).item():
            return name
    return "unknown"


def aggregate(per_tensor: Mapping[str, str]) -> str:
    """One convention for the head: all agree -> that one; shifted and raw together -> mixed."""
    kinds = set(per_tensor.values())
    if not kinds:
        return "none"
    if kinds == {"shifted"}:
        return "shifted"
    if kinds == {"raw"}:
        return "raw"
    if kinds == {"double-shifted"}:
        return "double-shifted"
    if "unknown" in kinds and len(kinds - {"unknown"}) <= 1:
        return "unknown"
    return "mixed"


#: norm kind (bare head key suffix) -> backbone key suffix of the same kind
_BACKBONE_KIND = {
    "input_layernorm.weight": ".input_layernorm.weight",
    "post_attention_layernorm.weight": ".post_attention_layernorm.weight",
    "self_attn.q_norm.weight": ".self_attn.q_norm.weight",
    "self_attn.k_norm.weight": ".self_attn.k_norm.weight",
}


def backbone_kind(bare: str) -> str | None:
    if bare.startswith("layers."):
        return _BACKBONE_KIND.get(bare.split(".", 2)[2])
    return None


def classify_by_backbone(
    target: mx.array, backbone: list[mx.array], backbone_shifted: bool, margin: float = 0.35
) -> str:
    """Compare a head norm's mean with the mean of the backbone's norms of the same kind.

    Trained norms of one kind sit at similar values across layers, and the backbone's
    convention is known from provenance (converted MLX -> shifted). The head is classified only
    when its mean is within ``margin`` of exactly one hypothesis (offset -1, 0, +1 relative to
    the backbone) — else ``unknown``.
    """
    if not backbone:
        return "unknown"
    mb = float(mx.mean(mx.concatenate([b.astype(mx.float32).reshape(-1) for b in backbone])).item())
    mt = float(mx.mean(target.astype(mx.float32)).item())
    base = 1 if backbone_shifted else 0
    close = [base + o for o in (-1, 0, 1) if abs(mt - (mb + o)) < margin]
    if len(close) != 1 or close[0] not in OFFSET_NAMES:
        return "unknown"
    return OFFSET_NAMES[close[0]]
