"""The query/key row order of llama.cpp's Llama-derived converters: each head's rows reordered.

``LlamaModel.modify_tensors`` (with ``undo_permute``, which Granite's and so Nemotron-H's
converter inherits) views a query or key projection [n·d, H] as [n, 2, d/2, H] and swaps the
two middle axes: Hugging Face's rotate-half layout becomes GGML's interleaved pairs. It does so
even where the attention has no rotary embedding (Nemotron-H): the same order on the query and
the key leaves every dot product as it was, so it is a layout, not a change to the head. It only
moves float32 values, so the result quantizes to the converter's bytes at every precision. The
table is keyed by Role; a family says whether its converter permutes
(``FamilySpec.gguf_permutes_qk``).
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from ..families.spec import Role

#: role -> the shape symbol of the head count its rows are grouped by (the converter permutes
#: a key projection by the KV heads)
PERMUTED: Mapping[Role, str] = {Role.Q_PROJ: "NH", Role.K_PROJ: "KV", Role.Q_BIAS: "NH", Role.K_BIAS: "KV"}


def permute_heads(w: np.ndarray, n_head: int) -> np.ndarray:
    """``LlamaModel.permute``: rows [n·d, ...] as [n, 2, d/2, ...], axes 1 and 2 swapped."""
    if w.shape[0] % (2 * n_head):
        raise ValueError(f"a query/key tensor of {w.shape[0]} rows does not split into {n_head} heads of even width")
    return np.ascontiguousarray(w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def qk_permutation(role: Role | None, d: Mapping[str, int]) -> Callable[[np.ndarray], np.ndarray] | None:
    """The converter's transform of a tensor of ``role`` (None: written as stored); ``d`` holds
    the shape symbols."""
    if role not in PERMUTED:
        return None
    n = d[PERMUTED[role]]
    return lambda w: permute_heads(w, n)
