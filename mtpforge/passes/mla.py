"""Multi-head latent attention: ``kv_b_proj`` split as llama.cpp's converter and mlx-lm split it.

Neither runs MLA from ``kv_b_proj`` itself: both use the absorption optimisation, so llama.cpp's
converter (``DeepseekV2Model.modify_tensors``, which GLM-4.7-Flash's converter inherits) and
mlx-lm's ``sanitize`` (``glm4_moe_lite``, ``deepseek_v3``; MTPLX's ``glm_mtp`` repeats it for the
head on load) view the [n·(d_nope+d_v), r_kv] matrix as [n, d_nope+d_v, r_kv] and split each
head's rows into the key part (d_nope rows, transposed to [n, r_kv, d_nope]: llama.cpp's
``attn_k_b``, mlx-lm's ``embed_q``) and the value part ([n, d_v, r_kv]: ``attn_v_b``,
``unembed_out``). The split only moves values, so the result quantizes to the converter's bytes
at every precision. The table is keyed by Role, so the GGUF planner, inspect's expected block
and the bundled decoder ask it, never a family.

The MLX sidecar keeps ``kv_b_proj`` whole, as the source stores it (MTPLX splits it on load,
measured: docs/families/glm4_moe_lite.md); only the decoder, whose layer is mlx-lm's, splits it
(:func:`to_mlx_layer`), exactly as MTPLX does, so verify computes what MTPLX runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import mlx.core as mx
import numpy as np

from ..families.spec import FamilySpec, Role, Shape


def split_kv_b(w: Any, d: Mapping[str, int], contiguous: Callable[[Any], Any] = np.ascontiguousarray) -> tuple[Any, Any]:
    """(k_b [n, r_kv, d_nope], v_b [n, d_v, r_kv]) of a float ``kv_b_proj`` [n·(d_nope+d_v), r_kv];
    ``d`` holds the shape symbols NH, NOPE and VD. A numpy array (the GGUF writer) or, with
    ``contiguous=mx.contiguous``, an MLX one (the decoder): the same views either way."""
    n, nope, vd = d["NH"], d["NOPE"], d["VD"]
    if w.ndim != 2 or w.shape[0] != n * (nope + vd):
        raise ValueError(f"the {Role.KV_B_PROJ.value} tensor has shape {list(w.shape)}, not [{n * (nope + vd)}, r_kv]")
    per_head = w.reshape(n, nope + vd, w.shape[-1])
    return contiguous(per_head[:, :nope, :].transpose(0, 2, 1)), contiguous(per_head[:, nope:, :])


@dataclass(frozen=True)
class Split:
    """One source tensor written as several tensors: each part's role and shape (in shape
    symbols, numpy order), and the function returning the parts in that order
    (``(tensor, dims[, contiguous])``)."""

    parts: tuple[tuple[Role, Shape], ...]
    fn: Callable[..., tuple[Any, ...]]
    #: the source's rows come in units, ``count`` of them (a head each), each of the ``rows``
    #: symbols' rows, split unit by unit: a block of whole units splits into the parts' rows of
    #: those units, so a large tensor converts a row block at a time
    count: str = "NH"
    rows: tuple[str, ...] = ("NOPE", "VD")


#: source role -> how llama.cpp's converter and mlx-lm's sanitize split it
SPLITS: dict[Role, Split] = {
    Role.KV_B_PROJ: Split(((Role.K_B, ("NH", "RKV", "NOPE")), (Role.V_B, ("NH", "VD", "RKV"))), split_kv_b),
}


def split_part(role: Role, index: int, d: Mapping[str, int]) -> Callable[[np.ndarray], np.ndarray]:
    """The transform that turns the source tensor of ``role`` — or a block of its whole units
    (``split_unit``) — into its ``index``-th part (of those units)."""
    sp, unit = SPLITS[role], split_unit(role, d)
    return lambda w: sp.fn(w, {**d, sp.count: w.shape[0] // unit})[index]


def split_unit(role: Role, d: Mapping[str, int]) -> int:
    """Rows of one unit of the source tensor of ``role``: row blocks of whole units split alone."""
    return sum(d[s] for s in SPLITS[role].rows)


def _layer_dims(spec: FamilySpec, args: Any) -> dict[str, int]:
    """The shape symbols a split needs, from mlx-lm's model args (named by the family's config keys)."""
    return {sym: v for sym, key in spec.dim_keys.items()
            if isinstance(key, str) and isinstance(v := getattr(args, key, None), int)}


def to_mlx_layer(spec: FamilySpec, args: Any, tensors: Mapping[str, mx.array],
                 quant: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, mx.array], dict[str, dict[str, Any]]]:
    """Bare head tensors and their quantization (bare module -> bits, group size, mode) as
    mlx-lm's decoder layer holds them: each tensor the family stores whole and mlx-lm splits
    (``FamilySpec.mlx_layer_parts``) replaced by its parts, as mlx-lm's sanitize and MTPLX's
    ``glm_mtp`` split it. A quantized one is dequantized, split and re-quantized at its own bits
    and group size, in the scales' dtype, op for op as they do: the decoder then holds the
    values MTPLX drafts with, not a better or worse copy."""
    out, q_out = dict(tensors), {k: dict(v) for k, v in quant.items()}
    if not spec.mlx_layer_parts:
        return out, q_out
    d = _layer_dims(spec, args)
    for key in [k for k in tensors if k.endswith(".weight")]:
        mod = key[: -len(".weight")]
        hit = spec.match(mod)
        if hit is None or hit[0].role not in SPLITS:
            continue
        w, q = out.pop(key), q_out.pop(mod, None)
        if q is not None:
            w = mx.dequantize(w, out.pop(f"{mod}.scales"), out.pop(f"{mod}.biases", None), group_size=q["group_size"],
                              bits=q["bits"], mode=q["mode"])
        split = SPLITS[hit[0].role]
        for (part, _), value in zip(split.parts, split.fn(w, d, mx.contiguous)):
            path = spec.mlx_layer_parts[part].format(i=hit[2] or 0)
            if q is None:
                out[f"{path}.weight"] = value
                continue
            packed = mx.quantize(value, group_size=q["group_size"], bits=q["bits"], mode=q["mode"])
            out.update(zip((f"{path}.weight", f"{path}.scales", f"{path}.biases"), packed))
            q_out[path] = dict(q)
    return out, q_out
