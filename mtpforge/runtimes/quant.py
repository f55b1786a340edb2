"""Quantization predicates of the runtime rows: ``(module, shape, ask) -> QSpec | None``.

Routers (``mlp.gate``, ``shared_expert_gate``) are 8-bit group 64 wherever they are quantized
(mlx-lm's own convention); norms and 1-D tensors never are.
"""

from __future__ import annotations

from typing import Optional

from ..families.tables import is_norm_key
from ..passes.quantize import QSpec, quantizable
from .spec import QuantAsk

ROUTER_Q = QSpec(8, 64, "affine")


def is_router(bare: str) -> bool:
    return bare.endswith("mlp.gate") or bare.endswith("shared_expert_gate")


def is_expert(bare: str) -> bool:
    return ".experts" in bare or ".switch_mlp." in bare


def never_quantized(bare: str, shape: tuple[int, ...]) -> bool:
    return len(shape) < 2 or is_norm_key(bare + ".weight")


def _fits(bare: str, shape: tuple[int, ...], q: QSpec, ask: QuantAsk) -> Optional[QSpec]:
    if not quantizable(shape, q):
        ask.notes.append(f"{bare} kept unquantized: last dimension {shape[-1]} is not divisible by group size {q.group_size}")
        return None
    return q


def _asked(bare: str, shape: tuple[int, ...], ask: QuantAsk) -> Optional[QSpec]:
    """The user's precision, unless it does not apply to this module (None: keep float)."""
    if never_quantized(bare, shape) or ask.base is None:
        return None
    if bare == "fc" and ask.keep_fc:
        return None
    if is_expert(bare) and ask.out_fmt in ("per-expert", "fused"):
        return None  # mlx-lm #990 loads only unquantized experts in the source layout
    return ask.base


def default_quant(bare: str, shape: tuple[int, ...], ask: QuantAsk) -> Optional[QSpec]:
    """The user's precision; routers at 8-bit."""
    q = _asked(bare, shape, ask)
    if q is None:
        return None
    return _fits(bare, shape, ROUTER_Q if is_router(bare) else q, ask)


def one_precision_quant(bare: str, shape: tuple[int, ...], ask: QuantAsk) -> Optional[QSpec]:
    """vllm-mlx, Qwen3.5/3.6: it dequantizes every triplet with the model's default bits, so
    nothing deviates from them; routers stay float."""
    q = _asked(bare, shape, ask)
    if q is None or is_router(bare):
        return None
    if ask.default_q is not None and q != ask.default_q:
        q = ask.default_q
    return _fits(bare, shape, q, ask)


def every_linear_but_fc_quant(bare: str, shape: tuple[int, ...], ask: QuantAsk) -> Optional[QSpec]:
    """vllm-mlx, Qwen3-Next: it quantizes every linear but fc at the model's bits (routers
    8-bit); a float head breaks its first forward, so the user's precision is not asked."""
    if never_quantized(bare, shape) or bare == "fc" or ask.default_q is None:
        return None
    q = ROUTER_Q if is_router(bare) else ask.default_q
    return q if quantizable(shape, q) else None
