"""Undoing the tokens a rejected draft left in the backbone's caches.

Attention layers keep a KV cache that can simply be trimmed. Gated DeltaNet layers keep a
recurrent conv/SSM state (``ArraysCache``) that already folded the rejected tokens in and cannot
be trimmed (docs/SPEC.md §3): the state is restored from a snapshot taken before the verify pass, and the
caller re-runs the confirmed tokens. MLX arrays are immutable values and the layers *rebind*
the cache entries, so a snapshot is just the list of references — no copy.
"""

from __future__ import annotations

from typing import Any

from mlx_lm.models.cache import ArraysCache

Snapshot = list[tuple[list[Any], Any, Any] | None]


def snapshot(cache: list[Any]) -> Snapshot:
    """The recurrent state of every Gated DeltaNet layer (``None`` for attention layers)."""
    return [(list(c.cache), c.left_padding, c.lengths) if isinstance(c, ArraysCache) else None for c in cache]


def rollback(cache: list[Any], snap: Snapshot, n_tokens: int) -> None:
    """Forget the last ``n_tokens`` of every layer: trim KV caches, restore recurrent states.

    After this the caches are exactly as they were when ``snap`` was taken, provided ``n_tokens``
    is the number of tokens processed since.
    """
    if n_tokens <= 0:
        return
    for c, s in zip(cache, snap):
        if s is not None:
            c.cache, c.left_padding, c.lengths = list(s[0]), s[1], s[2]
        else:
            if not c.is_trimmable():
                raise RuntimeError(f"{type(c).__name__} cannot be trimmed")
            trimmed = c.trim(n_tokens)
            if trimmed != n_tokens:
                raise RuntimeError(f"trimmed {trimmed} of {n_tokens} tokens from a {type(c).__name__}")


def trim(cache: list[Any], n_tokens: int) -> None:
    """Trim attention-only caches (the head's own KV cache)."""
    if n_tokens > 0:
        for c in cache:
            c.trim(n_tokens)
