"""The target's backbone, as mlx-lm builds it, with the two things a drafter needs exposed.

The backbone is mlx-lm's own model class loaded by mlx-lm's own loader, so ``verify`` decodes
exactly what an mlx-lm user runs. Nothing in mlx-lm is patched: the hidden state the head needs
is read by replacing the inner model's final ``norm`` *on this instance* with a tap that records
its input (pre-norm) and output (post-norm); the embedding and lm_head are the instance's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map

from ..errors import MtpforgeError, RefusedError
from ..families import FAMILIES
from ..families.spec import FamilySpec

HIDDEN_VARIANTS = ("pre", "post")


def compute_dtype_for_device() -> mx.Dtype | None:
    """float32 on the CPU, else ``None`` (keep the stored dtype).

    On the CPU build of MLX bf16 matmuls are slow and unquantized expert stacks (``gather_mm``)
    run only in float32 (docs/SPEC.md §4). On a GPU the stored half type is the fast one, and casting a
    large unquantized model to float32 would double its memory.
    """
    return mx.float32 if mx.default_device().type == mx.DeviceType.cpu else None


class _Seen:
    """Plain holder (not a Module child, so its arrays never become parameters)."""

    pre: mx.array | None = None
    post: mx.array | None = None


class NormTap(nn.Module):
    """Stands in for the backbone's final norm and remembers what went in and out of it."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.seen = _Seen()

    def __call__(self, x: mx.array) -> mx.array:
        y = self.norm(x)
        self.seen.pre, self.seen.post = x, y
        return y


@dataclass
class Backbone:
    """A loaded mlx-lm model plus handles on its embedding, lm_head and final-norm tap."""

    model: nn.Module
    tokenizer: Any
    family: str
    args: Any  # the text model's args: what build_head needs
    inner: nn.Module  # the module holding the embedding, the layers and the final norm
    lm_module: nn.Module  # the module holding lm_head (or tied embedding)
    tap: NormTap
    dtype: mx.Dtype
    embedding: nn.Module  # the inner model's token embedding (the head shares it)

    def make_cache(self) -> list[Any]:
        """mlx-lm's cache, a sliding-window layer's rotating cache replaced by a plain one: a full
        rotating cache cannot be trimmed, which the rollback of a rejected draft needs, and mlx-lm
        puts the window in the mask (``create_attention_mask(..., window_size=...)``), so the plain
        cache attends the same keys (Step-3.5's sliding layers)."""
        from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

        return [KVCache() if isinstance(c, RotatingKVCache) else c for c in make_prompt_cache(self.model)]

    def embed(self, tokens: list[int] | mx.array) -> mx.array:
        """Embeddings [1, L, H] of ``tokens`` (the backbone's table, shared with the head)."""
        return self.embedding(_row(tokens))

    def lm_head(self, z: mx.array) -> mx.array:
        # Nemotron-H's args have no such field: its lm_head is never tied
        if getattr(self.args, "tie_word_embeddings", False):
            return self.embedding.as_linear(z)
        return self.lm_module.lm_head(z)

    def __call__(self, tokens: list[int] | mx.array, cache: list[Any], hidden: str) -> tuple[mx.array, mx.array]:
        """Logits [1, L, V] and the chosen hidden state [1, L, H] for ``tokens`` appended to
        ``cache`` (lazy: nothing is computed until evaluated)."""
        logits = self.model(_row(tokens), cache=cache)
        h = self.tap.seen.pre if hidden == "pre" else self.tap.seen.post
        assert h is not None
        return logits, h

    @property
    def eos_ids(self) -> set[int]:
        ids = getattr(self.tokenizer, "eos_token_ids", None) or []
        return {int(i) for i in ids}


def _row(tokens: list[int] | mx.array) -> mx.array:
    return tokens.reshape(1, -1) if isinstance(tokens, mx.array) else mx.array([tokens])


def _without_mtp(model_class: type, spec: FamilySpec, config: dict[str, Any]) -> type:
    """A subclass whose ``sanitize`` also drops the head's keys after mlx-lm's own.

    Released mlx-lm drops them for Qwen3.5/3.6, but its Qwen3-Next ``sanitize`` returns early on
    a converted model, so a head stored inside ``model*.safetensors`` (the vllm-mlx layout) would
    reach the strict loader (docs/SPEC.md §4). The backbone never needs those keys.
    """

    def sanitize(self: Any, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        if hasattr(model_class, "sanitize"):
            weights = model_class.sanitize(self, weights)
        return {k: v for k, v in weights.items() if not spec.is_head_key(k, config)}

    return type(model_class.__name__, (model_class,), {"sanitize": sanitize})


def _cast(model: nn.Module, dtype: mx.Dtype) -> None:
    """Cast every floating parameter (incl. quantization scales/biases) to ``dtype``."""

    def cast(p: mx.array) -> mx.array:
        return p.astype(dtype) if mx.issubdtype(p.dtype, mx.floating) and p.dtype != dtype else p

    model.update(tree_map(cast, model.parameters()))


def load_backbone(folder: str | Path, family: str) -> Backbone:
    """Load ``folder``'s backbone and tokenizer with mlx-lm, ready for drafting."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from mlx_lm.utils import load_model

    path = Path(folder)
    spec = FAMILIES[family]

    def classes(config: dict[str, Any]) -> tuple[type, type]:
        # mlx-lm's public per-model modules (one file per model: Model, ModelArgs)
        model_class, args_class = spec.mlx_lm_classes()
        return _without_mtp(model_class, spec, config), args_class

    try:
        model, config = load_model(path, get_model_classes=classes)
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except MtpforgeError:
        raise
    except Exception as e:  # noqa: BLE001 - mlx-lm reads the folder's files itself; what it cannot use is the folder's defect
        what = str(e).splitlines()[0][:200] if str(e) else ""
        raise RefusedError(f"mlx-lm cannot load the backbone of {path}: {e.__class__.__name__}: {what}",
                           f"run `mtpforge inspect {path}` to see what is wrong with the folder") from None
    lm_module = model
    for attr in spec.lm_module_path:
        lm_module = getattr(lm_module, attr)
    names = spec.mlx_backbone
    inner = getattr(lm_module, names.inner)
    norm = getattr(inner, names.final_norm)
    dtype = compute_dtype_for_device()
    if dtype is not None:
        _cast(model, dtype)
    else:
        dtype = norm.weight.dtype
    tap = NormTap(norm)
    setattr(inner, names.final_norm, tap)
    model.eval()
    mx.eval(model.parameters())
    return Backbone(model, tokenizer, family, lm_module.args, inner, lm_module, tap, dtype,
                    getattr(inner, names.embed))


__all__ = ["Backbone", "HIDDEN_VARIANTS", "NormTap", "compute_dtype_for_device", "load_backbone"]
