"""Expert formats: per-expert, fused gate+up, stacked (``switch_mlp``), by Role: the family spec
spells each key.

Everything here works one expert at a time, because a stacked tensor [E, ...] is contiguous per
expert: the writer can place each expert's slice straight into the output file and never hold a
whole multi-GB stack (docs/SPEC.md §4).
"""

from __future__ import annotations

from typing import Iterator, Mapping

import mlx.core as mx

from ..families.spec import FUSED_PARTS, STACKED, FamilySpec, Role

#: the fused stack that holds each expert role (the reverse of ``FUSED_PARTS``)
FUSED_OF: Mapping[Role, Role] = {part: whole for whole, parts in FUSED_PARTS.items() for part in parts}
#: the stacked projections, in the order a stack is written
STACK_ROLES = (Role.EXPERT_GATE, Role.EXPERT_UP, Role.EXPERT_DOWN)


def stack_roles(spec: FamilySpec) -> tuple[Role, ...]:
    """The stacks a family's head has, in ``STACK_ROLES`` order: SwiGLU experts all three,
    Nemotron-H's ReLU² experts up and down only (no gate projection)."""
    have = {r.role for r in spec.expert_rows.get(STACKED, ())}
    return tuple(r for r in STACK_ROLES if r in have)


def fused_rows(role: Role, rows: int) -> tuple[int, int]:
    """[start, end) rows of ``role`` inside one expert's fused gate+up slab of ``rows`` rows:
    its parts in ``FUSED_PARTS`` order (gate first, then up) on axis -2 (docs/SPEC.md §2)."""
    parts = FUSED_PARTS[FUSED_OF[role]]
    n = rows // len(parts)
    k = parts.index(role)
    return k * n, (k + 1) * n


def expert_span(src_fmt: str, role: Role, e: int, n_experts: int, shape: tuple[int, ...],
                nbytes: int) -> tuple[int, int, tuple[int, ...]]:
    """The slice pass the writer runs: where expert ``e``'s ``role`` lies inside the source
    tensor (``shape``, ``nbytes``), as a contiguous byte range and its 2-D shape. A per-expert
    tensor is its own slice; a fused stack [E, rows, cols] is contiguous per expert, and gate and
    up are contiguous row ranges within it."""
    if src_fmt == "per-expert":
        return 0, nbytes, tuple(shape)
    per = nbytes // n_experts
    rows, cols = shape[1], shape[2]
    a, b = fused_rows(role, rows)
    row_bytes = per // rows
    return e * per + a * row_bytes, e * per + b * row_bytes, (b - a, cols)


def split_gate_up(gate_up: mx.array) -> tuple[mx.array, mx.array]:
    """Whole tensor: a fused ``gate_up_proj`` as its gate and up halves (``fused_rows``)."""
    rows = gate_up.shape[-2]
    (g0, g1), (u0, u1) = fused_rows(Role.EXPERT_GATE, rows), fused_rows(Role.EXPERT_UP, rows)
    return gate_up[..., g0:g1, :], gate_up[..., u0:u1, :]


def _specs(spec: FamilySpec | None) -> tuple[FamilySpec, ...]:
    from ..families import FAMILIES

    return (spec,) if spec is not None else tuple(FAMILIES.values())


def parse_expert_key(bare: str, spec: FamilySpec | None = None) -> tuple[str, int, int | None, Role, FamilySpec] | None:
    """(format, MTP layer, expert or None, role, the spec that spells it) for an expert tensor
    key, else None. ``spec`` None: any family's spelling (heads read without their config)."""
    for sp in _specs(spec):
        hit = sp.match(bare)
        if hit is not None and hit[1] is not None:
            row, fmt, i, e = hit
            return fmt, i or 0, e, row.role, sp
    return None


def expert_slices(bare: str, value: mx.array, spec: FamilySpec | None = None) -> Iterator[tuple[str, int, mx.array]]:
    """Yield (stacked key, expert index, 2-D slice) for one source expert tensor."""
    parsed = parse_expert_key(bare, spec)
    if parsed is None:
        raise ValueError(f"{bare} is not an expert tensor")
    fmt, i, e, role, sp = parsed
    if fmt == STACKED:
        for n in range(value.shape[0]):
            yield bare, n, value[n]
    elif e is not None:
        yield sp.key(role, i), e, value
    else:
        for n in range(value.shape[0]):
            for part in FUSED_PARTS[role]:
                a, b = fused_rows(part, value.shape[-2])
                yield sp.key(part, i), n, value[n][a:b]


def to_switch_mlp(tensors: Mapping[str, mx.array], spec: FamilySpec | None = None) -> dict[str, mx.array]:
    """Whole-head conversion to stacked experts (for heads that fit in memory: the decoder
    and tests). Non-expert tensors pass through unchanged."""
    out: dict[str, mx.array] = {}
    parts: dict[str, dict[int, mx.array]] = {}
    for k, v in tensors.items():
        if parse_expert_key(k, spec) is None:
            out[k] = v
            continue
        for dest, e, sl in expert_slices(k, v, spec):
            parts.setdefault(dest, {})[e] = sl
    for dest, by_e in parts.items():
        n = len(by_e)
        if sorted(by_e) != list(range(n)):
            raise ValueError(f"{dest}: experts {sorted(by_e)} are not 0..{n - 1}")
        out[dest] = mx.stack([by_e[e] for e in range(n)])
    return out


def from_switch_mlp(tensors: Mapping[str, mx.array], fmt: str, spec: FamilySpec | None = None) -> dict[str, mx.array]:
    """Stacked experts back to a source format (``per-expert`` or ``fused``)."""
    if fmt not in ("per-expert", "fused"):
        raise ValueError(f"unknown expert format {fmt!r}")
    out: dict[str, mx.array] = {}
    stacks: dict[tuple[int, str], dict[Role, mx.array]] = {}
    specs: dict[str, FamilySpec] = {}
    for k, v in tensors.items():
        parsed = parse_expert_key(k, spec)
        if parsed is None or parsed[0] != STACKED:
            out[k] = v
            continue
        specs[parsed[4].name] = parsed[4]
        stacks.setdefault((parsed[1], parsed[4].name), {})[parsed[3]] = v
    for (i, name), roles in stacks.items():
        sp = specs[name]
        if fmt == "per-expert":
            for role, stack in roles.items():
                for e in range(stack.shape[0]):
                    out[sp.key(role, i, e, fmt)] = stack[e]
            continue
        for whole, parts in FUSED_PARTS.items():
            out[sp.key(whole, i, fmt=fmt)] = mx.concatenate([roles[p] for p in parts], axis=-2)
    return out
