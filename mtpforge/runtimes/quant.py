"""Quantization of the runtime rows, both ways.

Write predicates ``(module, shape, ask) -> QSpec | None`` decide each module's precision when
add-mtp writes a head for a runtime. Load checks ``(head) -> None | why`` say whether a
runtime's loader takes a head's stored precisions (``inspect --runtime``). Modules are told
apart by their Role (the family spec reads each path): routers (``ROUTER_ROLES``) are 8-bit group
64 wherever mlx-lm's convention applies; norms and 1-D tensors are never quantized.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ..families.spec import EXPERT_ROLES, ROUTER_ROLES, STACKED, Role
from ..families.tables import is_norm_key, spec_named
from ..passes.quantize import QSpec, quantizable
from .spec import HeadFacts, QuantAsk

ROUTER_Q = QSpec(8, 64, "affine")


def _role(bare: str, family: str) -> Role | None:
    return spec_named(family).role_of(bare)


def is_router(bare: str, family: str) -> bool:
    return _role(bare, family) in ROUTER_ROLES


def is_expert(bare: str, family: str) -> bool:
    return _role(bare, family) in EXPERT_ROLES


def is_fc(bare: str, family: str) -> bool:
    """The head's input projection (what ``--keep-fc-full-precision`` keeps in float)."""
    return _role(bare, family) == Role.FC


def _expert_format(bare: str, family: str) -> str | None:
    hit = spec_named(family).match(bare)
    return hit[1] if hit else None


def never_quantized(bare: str, shape: tuple[int, ...], family: str) -> bool:
    return len(shape) < 2 or is_norm_key(bare, family)


def _fits(bare: str, shape: tuple[int, ...], q: QSpec, ask: QuantAsk) -> Optional[QSpec]:
    if not quantizable(shape, q):
        ask.notes.append(f"{bare} kept unquantized: last dimension {shape[-1]} is not divisible by group size {q.group_size}")
        return None
    return q


def _asked(bare: str, shape: tuple[int, ...], ask: QuantAsk) -> Optional[QSpec]:
    """The user's precision, unless it does not apply to this module (None: keep float)."""
    if never_quantized(bare, shape, ask.family) or ask.base is None:
        return None
    if _role(bare, ask.family) in spec_named(ask.family).mlx_float_roles:
        return None  # a bare parameter in mlx-lm's model: float there, whatever the precision
    if is_fc(bare, ask.family) and ask.keep_fc:
        return None
    if is_expert(bare, ask.family) and ask.out_fmt != STACKED:
        return None  # mlx-lm #990 loads only unquantized experts in the source layout
    return ask.base


def default_quant(bare: str, shape: tuple[int, ...], ask: QuantAsk) -> Optional[QSpec]:
    """The user's precision; routers at 8-bit."""
    q = _asked(bare, shape, ask)
    if q is None:
        return None
    return _fits(bare, shape, ROUTER_Q if is_router(bare, ask.family) else q, ask)


def float_router_quant(bare: str, shape: tuple[int, ...], ask: QuantAsk) -> Optional[QSpec]:
    """mlx-vlm's Nemotron-H drafter: the user's precision; the router float (its ``MoEGate`` is a
    bare parameter, not a Linear: mlx-vlm's loader cannot quantize it, and a strict load refuses
    its scales)."""
    q = _asked(bare, shape, ask)
    if q is None or is_router(bare, ask.family):
        return None
    return _fits(bare, shape, q, ask)


def _model_bits(q: QSpec, ask: QuantAsk) -> QSpec:
    return ask.default_q if ask.default_q is not None and q != ask.default_q else q


def one_precision_quant(bare: str, shape: tuple[int, ...], ask: QuantAsk) -> Optional[QSpec]:
    """vllm-mlx, Qwen3.5/3.6: it dequantizes every triplet with the model's default bits, so
    nothing deviates from them; routers stay float."""
    q = _asked(bare, shape, ask)
    if q is None or is_router(bare, ask.family):
        return None
    return _fits(bare, shape, _model_bits(q, ask), ask)


def whole_head_quant(bare: str, shape: tuple[int, ...], ask: QuantAsk) -> Optional[QSpec]:
    """exo #2110: one precision for the whole head, the model's default bits (routers too)."""
    q = _asked(bare, shape, ask)
    return None if q is None else _fits(bare, shape, _model_bits(q, ask), ask)


def every_linear_but_fc_quant(bare: str, shape: tuple[int, ...], ask: QuantAsk) -> Optional[QSpec]:
    """What the vllm-mlx layout wrote for Qwen3-Next before runtimes were measured: every linear
    but fc at the model's bits (routers 8-bit), expert stacks included."""
    if never_quantized(bare, shape, ask.family) or is_fc(bare, ask.family) or ask.default_q is None:
        return None
    q = ROUTER_Q if is_router(bare, ask.family) else ask.default_q
    return q if quantizable(shape, q) else None


def vllm_next_quant(bare: str, shape: tuple[int, ...], ask: QuantAsk) -> Optional[QSpec]:
    """vllm-mlx 0.6.0, Qwen3-Next: it quantizes every ``nn.Linear`` of its head but fc at the
    model's bits (routers 8-bit) before loading; expert stacks are not ``nn.Linear`` and stay
    float (quantized ones land in float modules: "[gather_mm] Last dimension ... must match")."""
    return None if is_expert(bare, ask.family) else every_linear_but_fc_quant(bare, shape, ask)


def mtplx_template_quant(bare: str, shape: tuple[int, ...], ask: QuantAsk) -> Optional[QSpec]:
    """MTPLX 2.12.2 keeps a quantized head only when its key set is one of its templates; any
    other set is dequantized with the model's default bits. Dense: the user's precision
    (template "all"). MoE, stacked experts: ``fc`` and the router ``mlp.gate`` float, the rest
    quantized, ``shared_expert_gate`` 8-bit (its per-path entry says so). MoE, fused experts: the
    experts and ``fc`` float, the routers 8-bit. Per-expert experts match no template: one
    precision, routers float."""
    if ask.out_fmt == "none":
        return default_quant(bare, shape, ask)
    if ask.out_fmt == "per-expert":
        return one_precision_quant(bare, shape, ask)
    q = _asked(bare, shape, ask)
    role = _role(bare, ask.family)
    if q is None or role == Role.FC or (ask.out_fmt == STACKED and role == Role.ROUTER):
        return None
    return _fits(bare, shape, ROUTER_Q if role in ROUTER_ROLES else q, ask)


def mtplx_scales_quant(bare: str, shape: tuple[int, ...], ask: QuantAsk) -> Optional[QSpec]:
    """MTPLX 2.12.2's ``glm_mtp`` and ``nemotron_h_mtp`` backends quantize exactly the modules
    stored with scales, at config.json's bits and group size (they read no per-path entry), and
    build the router as a plain gate they never quantize: the head at the model's bits, the input
    projection and the router float as in its Qwen templates."""
    q = _asked(bare, shape, ask)
    role = _role(bare, ask.family)
    if q is None or role == Role.FC or role in ROUTER_ROLES:
        return None
    return _fits(bare, shape, _model_bits(q, ask), ask)


# ----------------------------------------------------------------------------- load checks

def _quantized(head: HeadFacts) -> dict[str, Mapping[str, Any]]:
    return {m: p for m, p in head.precisions.items() if p.get("quantized")}


def _linears(head: HeadFacts) -> set[str]:
    """Modules with a 2-D (or stacked) weight: what a loader could quantize."""
    return {m for m in head.precisions if not is_norm_key(m, head.family)}


def _at(p: Mapping[str, Any], q: Optional[QSpec]) -> bool:
    want = q or QSpec(4, 64)  # loaders fall back to 4-bit group 64 without a quantization entry
    return p.get("bits") == want.bits and p.get("group_size") == want.group_size


def _off_default(head: HeadFacts) -> list[str]:
    return sorted(m for m, p in _quantized(head).items() if not _at(p, head.default_q))


def _mtplx_template(head: HeadFacts) -> bool:
    """The head's quantized set is one of MTPLX's templates (mtplx/constants.py)."""
    linears, quant, fam = _linears(head), set(_quantized(head)), head.family
    fc = {m for m in linears if is_fc(m, fam)}
    if not any(is_expert(m, fam) for m in linears):
        return quant in (linears, linears - fc)
    routers = {m for m in linears if _role(m, fam) == Role.ROUTER}
    if any(_expert_format(m, fam) == STACKED for m in linears):
        return quant == linears - fc - routers
    fused = {m for m in linears if _expert_format(m, fam) == "fused"}
    return bool(fused) and quant == linears - fc - fused


def mtplx_loads(head: HeadFacts) -> Optional[str]:
    if not _quantized(head) or _mtplx_template(head):
        return None
    off = _off_default(head)
    if not off:
        return None
    return (f"MTPLX keeps a quantized head only in one of its templates; it dequantizes every other head with the "
            f"model's default bits, and {off[0]} is not at them: \"[dequantize] Shape of scales and biases does not match\"")


def mtplx_scales_loads(head: HeadFacts) -> Optional[str]:
    quant = _quantized(head)
    off = _off_default(head)
    if off:  # measured: the error MTPLX raises at the first draft
        return (f"MTPLX's MTP backend for {head.family} quantizes every module stored with scales at config.json's "
                f"bits and reads no per-path entry, and {off[0]} is not at them: \"[quantized_matmul] The shapes of "
                "the weight and scales are incompatible\"")
    routers = sorted(m for m in quant if is_router(m, head.family))
    if routers:  # read in its code: the gate is not a Linear, so nothing turns it into a quantized module
        return (f"MTPLX builds the {head.family} router {routers[0]} as a plain gate it cannot quantize, so its "
                "scales have no place")
    return None


def mtplx_float_loads(head: HeadFacts) -> Optional[str]:
    """MTPLX 2.12.2's ``step3p5_mtp``: it builds the head's linears float and checks the stored
    names and shapes against them before anything could quantize them, so a module stored with
    scales fails its load (measured)."""
    quant = sorted(_quantized(head))
    if not quant:
        return None
    return (f"MTPLX's MTP backend for {head.family} loads float linears only, and {quant[0]} is quantized: "
            "\"Step MTP overlay does not match runtime module tree: extra=[... .scales ...]\"")


def one_precision_loads(head: HeadFacts) -> Optional[str]:
    off = _off_default(head)
    if not off:
        return None
    return (f"vllm-mlx dequantizes every quantized module of a Qwen3.5/3.6 head with the model's default bits, "
            f"and {off[0]} is not at them (shape error at load)")


def whole_head_loads(head: HeadFacts) -> Optional[str]:
    quant = _quantized(head)
    if not quant:
        return None
    float_linears = sorted(_linears(head) - set(quant))
    off = _off_default(head)
    if not float_linears and not off:
        return None
    what = f"{float_linears[0]} is float" if float_linears else f"{off[0]} is not at the model's default bits"
    return (f"exo loads a quantized head only in one precision, routers included (the model's default bits), and "
            f"{what}: \"Expected shape ... but received ...\"")


def vllm_next_loads(head: HeadFacts) -> Optional[str]:
    quant = _quantized(head)
    fam = head.family
    experts = sorted(m for m in quant if is_expert(m, fam))
    if experts:
        return (f"vllm-mlx quantizes only nn.Linear modules of a Qwen3-Next head, so the quantized expert stack "
                f"{experts[0]} lands in a float module: \"[gather_mm] Last dimension ... must match\"")
    if head.default_q is None:
        return None if not quant else f"vllm-mlx quantizes nothing in an unquantized model, but {sorted(quant)[0]} is quantized"
    fc = {m for m in _linears(head) if is_fc(m, fam)}
    want = _linears(head) - fc - {m for m in _linears(head) if is_expert(m, fam)}
    wrong = sorted((want - set(quant)) | (fc & set(quant)))
    wrong += sorted(m for m in quant if not _at(quant[m], ROUTER_Q if is_router(m, fam) else head.default_q))
    if not wrong:
        return None
    return (f"vllm-mlx quantizes every Qwen3-Next head linear but fc at the model's bits (routers 8-bit) before "
            f"loading, and {wrong[0]} is stored otherwise: its first forward breaks")
