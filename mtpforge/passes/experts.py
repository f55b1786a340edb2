"""Expert formats: per-expert, fused ``gate_up_proj``, stacked ``switch_mlp``.

Everything here works one expert at a time, because a stacked tensor [E, ...] is contiguous per
expert: the writer can place each expert's slice straight into the output file and never hold a
whole multi-GB stack (docs/SPEC.md §4).
"""

from __future__ import annotations

import re
from typing import Iterator, Mapping

import mlx.core as mx

_PER_EXPERT = re.compile(r"^(layers\.\d+\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED = re.compile(r"^(layers\.\d+\.mlp)\.experts\.(gate_up_proj|down_proj)$")
_SWITCH = re.compile(r"^(layers\.\d+\.mlp)\.switch_mlp\.(gate_proj|up_proj|down_proj)\.weight$")


def fused_rows(proj: str, rows: int) -> tuple[int, int]:
    """[start, end) rows of ``proj`` inside one expert's fused ``gate_up_proj`` slab of ``rows``
    rows: gate first, then up, on axis -2 (docs/SPEC.md §2)."""
    half = rows // 2
    return (half, rows) if proj == "up_proj" else (0, half)


def expert_span(src_fmt: str, proj: str, e: int, n_experts: int, shape: tuple[int, ...],
                nbytes: int) -> tuple[int, int, tuple[int, ...]]:
    """The slice pass the writer runs: where expert ``e``'s ``proj`` lies inside the source
    tensor (``shape``, ``nbytes``), as a contiguous byte range and its 2-D shape. A per-expert
    tensor is its own slice; a fused stack [E, rows, cols] is contiguous per expert, and gate and
    up are contiguous row ranges within it."""
    if src_fmt == "per-expert":
        return 0, nbytes, tuple(shape)
    per = nbytes // n_experts
    rows, cols = shape[1], shape[2]
    if proj == "down_proj":
        return e * per, (e + 1) * per, (rows, cols)
    a, b = fused_rows(proj, rows)
    row_bytes = per // rows
    return e * per + a * row_bytes, e * per + b * row_bytes, (b - a, cols)


def split_gate_up(gate_up: mx.array) -> tuple[mx.array, mx.array]:
    """Whole tensor: a fused ``gate_up_proj`` as its gate and up halves (``fused_rows``)."""
    rows = gate_up.shape[-2]
    (g0, g1), (u0, u1) = fused_rows("gate_proj", rows), fused_rows("up_proj", rows)
    return gate_up[..., g0:g1, :], gate_up[..., u0:u1, :]


def switch_key(mlp: str, proj: str) -> str:
    return f"{mlp}.switch_mlp.{proj}.weight"


def per_expert_key(mlp: str, e: int, proj: str) -> str:
    return f"{mlp}.experts.{e}.{proj}.weight"


def parse_expert_key(bare: str) -> tuple[str, str, int | None, str] | None:
    """(format, mlp prefix, expert or None, projection) for an expert tensor key, else None."""
    if m := _PER_EXPERT.match(bare):
        return "per-expert", m.group(1), int(m.group(2)), m.group(3)
    if m := _FUSED.match(bare):
        return "fused", m.group(1), None, m.group(2)
    if m := _SWITCH.match(bare):
        return "switch_mlp", m.group(1), None, m.group(2)
    return None


def expert_slices(bare: str, value: mx.array) -> Iterator[tuple[str, int, mx.array]]:
    """Yield (switch_mlp key, expert index, 2-D slice) for one source expert tensor."""
    parsed = parse_expert_key(bare)
    if parsed is None:
        raise ValueError(f"{bare} is not an expert tensor")
    fmt, mlp, e, proj = parsed
    if fmt == "per-expert":
        assert e is not None
        yield switch_key(mlp, proj), e, value
    elif fmt == "switch_mlp":
        for i in range(value.shape[0]):
            yield bare, i, value[i]
    elif proj == "gate_up_proj":
        for i in range(value.shape[0]):
            g, u = split_gate_up(value[i])
            yield switch_key(mlp, "gate_proj"), i, g
            yield switch_key(mlp, "up_proj"), i, u
    else:
        for i in range(value.shape[0]):
            yield switch_key(mlp, "down_proj"), i, value[i]


def to_switch_mlp(tensors: Mapping[str, mx.array]) -> dict[str, mx.array]:
    """Whole-head conversion to stacked ``switch_mlp`` (for heads that fit in memory: the decoder
    and tests). Non-expert tensors pass through unchanged."""
    out: dict[str, mx.array] = {}
    parts: dict[str, dict[int, mx.array]] = {}
    for k, v in tensors.items():
        if parse_expert_key(k) is None:
            out[k] = v
            continue
        for dest, e, sl in expert_slices(k, v):
            parts.setdefault(dest, {})[e] = sl
    for dest, by_e in parts.items():
        n = len(by_e)
        if sorted(by_e) != list(range(n)):
            raise ValueError(f"{dest}: experts {sorted(by_e)} are not 0..{n - 1}")
        out[dest] = mx.stack([by_e[e] for e in range(n)])
    return out


def from_switch_mlp(tensors: Mapping[str, mx.array], fmt: str) -> dict[str, mx.array]:
    """Stacked ``switch_mlp`` back to a source format (``per-expert`` or ``fused``)."""
    out: dict[str, mx.array] = {}
    stacks: dict[str, dict[str, mx.array]] = {}
    for k, v in tensors.items():
        parsed = parse_expert_key(k)
        if parsed is None or parsed[0] != "switch_mlp":
            out[k] = v
            continue
        stacks.setdefault(parsed[1], {})[parsed[3]] = v
    for mlp, projs in stacks.items():
        if fmt == "per-expert":
            for proj, stack in projs.items():
                for e in range(stack.shape[0]):
                    out[per_expert_key(mlp, e, proj)] = stack[e]
        elif fmt == "fused":
            out[f"{mlp}.experts.gate_up_proj"] = mx.concatenate([projs["gate_proj"], projs["up_proj"]], axis=-2)
            out[f"{mlp}.experts.down_proj"] = projs["down_proj"]
        else:
            raise ValueError(f"unknown expert format {fmt!r}")
    return out
