"""The RMSNorm convention change, zero-centred ``x̂·(1+w)`` -> MLX's ``x̂·w``.

Applied by provenance (a raw Hugging Face source), never by looking at values: raw q_norm/k_norm
sit near 0.75 and correctly shifted pre_fc norms can sit near 0.3, so any value threshold is
wrong for some tensor (docs/SPEC.md §4).
"""

from __future__ import annotations

from typing import Mapping

import mlx.core as mx
import numpy as np

from ..families.spec import FamilySpec
from ..families.tables import is_norm_key

NORM_OFFSET = 1.0


def add_offset(w32: "mx.array | np.ndarray", offset: float = NORM_OFFSET) -> "mx.array | np.ndarray":
    """The slice pass the writer runs: a float32 slice (or row block) of a norm, plus the
    offset; the caller rounds once, when it casts or quantizes."""
    return w32 + offset


def shift_norm(w: mx.array, offset: float = NORM_OFFSET) -> mx.array:
    """Whole tensor: ``w + offset`` computed in float32, then rounded once to its dtype."""
    return add_offset(w.astype(mx.float32), offset).astype(w.dtype)


def shift_norms(tensors: Mapping[str, mx.array], offset: float = NORM_OFFSET,
                family: "str | FamilySpec | None" = None) -> dict[str, mx.array]:
    """Shift exactly the zero-centred norm kinds of a head given by bare keys (``family``'s,
    or any family's when None)."""
    return {k: shift_norm(v, offset) if is_norm_key(k, family) else v for k, v in tensors.items()}
