"""Multi-head latent attention for llama.cpp: ``kv_b_proj`` split as llama.cpp's converter splits it.

llama.cpp runs MLA with the absorption optimisation, so its converter (``DeepseekV2Model
.modify_tensors``, which GLM-4.7-Flash's converter inherits) never writes ``kv_b_proj`` itself:
it views the [n·(d_nope+d_v), r_kv] matrix as [n, d_nope+d_v, r_kv], splits each head's rows
into the key part (d_nope rows, then transposed to [n, r_kv, d_nope]: ``attn_k_b``) and the
value part ([n, d_v, r_kv]: ``attn_v_b``). The split only moves float32 values, so the result
quantizes to the converter's bytes at every precision. The table is keyed by Role, so the GGUF
planner and inspect's expected block ask it, never a family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from ..families.spec import Role, Shape


def split_kv_b(w: np.ndarray, d: Mapping[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """(k_b [n, r_kv, d_nope], v_b [n, d_v, r_kv]) of a float32 ``kv_b_proj`` [n·(d_nope+d_v), r_kv];
    ``d`` holds the shape symbols NH, NOPE and VD."""
    n, nope, vd = d["NH"], d["NOPE"], d["VD"]
    if w.ndim != 2 or w.shape[0] != n * (nope + vd):
        raise ValueError(f"the {Role.KV_B_PROJ.value} tensor has shape {list(w.shape)}, not [{n * (nope + vd)}, r_kv]")
    per_head = w.reshape(n, nope + vd, w.shape[-1])
    return (np.ascontiguousarray(per_head[:, :nope, :].transpose(0, 2, 1)),
            np.ascontiguousarray(per_head[:, nope:, :]))


@dataclass(frozen=True)
class Split:
    """One source tensor written as several llama.cpp tensors: each part's role and shape (in
    shape symbols, numpy order), and the function returning the parts in that order."""

    parts: tuple[tuple[Role, Shape], ...]
    fn: Callable[[np.ndarray, Mapping[str, int]], tuple[np.ndarray, ...]]


#: source role -> how llama.cpp's converter splits it
GGUF_SPLITS: dict[Role, Split] = {
    Role.KV_B_PROJ: Split(((Role.K_B, ("NH", "RKV", "NOPE")), (Role.V_B, ("NH", "VD", "RKV"))), split_kv_b),
}


def split_part(role: Role, index: int, d: Mapping[str, int]) -> Callable[[np.ndarray], np.ndarray]:
    """The transform that turns the source tensor of ``role`` into its ``index``-th part."""
    fn = GGUF_SPLITS[role].fn
    return lambda w: fn(w, d)[index]
