"""The one way a tiny non-Qwen model and its MTP head are trained and written: the trunk as a
language model, then the head with the trunk frozen, its depth-1 acceptance measured, the
release's layout written beside a ``training.json`` record.

What differs between families is data in a :class:`Recipe` (mlx-lm's model, the head's builder,
the export to the release's names, how the head is fed: ``train_glm.Feed``), so a new trained
shape is a recipe, not another copy of this loop. The random streams are drawn in one fixed order
(seed, corpus, trunk, head), so the same seed, BLAS and thread count give the same weights.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .family_common import build_family_tokenizer, write_generation_config
from .train import encode_stream, heldout_prompts, train_backbone, training_corpus
from .train_glm import POST_NORM, Feed, GlmTrainSettings, checked_export, draft_acceptance, train_head
from .write import write_hf_checkpoint


@dataclass(frozen=True)
class Recipe:
    """One trained tiny model: where it goes, its config, tokenizer, trunk, head and export."""

    folder: str
    architecture: str
    config: dict[str, Any]
    #: mlx-lm's model for the config
    model: Callable[[dict[str, Any]], nn.Module]
    #: a fresh head over the trained trunk (seeded by the caller's settings)
    head: Callable[[nn.Module], nn.Module]
    #: trunk and head -> the release's tensors
    export: Callable[[nn.Module, nn.Module, dict[str, Any]], dict[str, mx.array]]
    #: the builder's table of the release's tensors (name -> (shape, ...)): the export must match it
    specs: Callable[[dict[str, Any]], dict[str, Any]]
    #: what ``training.json`` says of the head, under ``head_key``
    head_notes: dict[str, Any]
    head_key: str = "nextn"
    feed: Feed = POST_NORM
    #: writes the tokenizer into a folder (default: the synthetic BPE with ``<|im_end|>``)
    tokenizer: Callable[[Path], None] | None = None
    trained_vocab: int = 0
    #: rewrites the written folder (its tokenizer as the release stores it)
    finish: Callable[[Path], None] | None = None
    #: more of ``training.json``
    extra: dict[str, Any] = field(default_factory=dict)


def add_nextn_parts(layer: nn.Module, hidden: int, eps: float) -> None:
    """The tensors around an MTP layer that drafts from (h[t], x[t+1]), as the releases of
    MiMo-V2-Flash and Ling-3 name them: ``enorm``, ``hnorm``, ``eh_proj`` [H, 2H] and the closing
    ``final_layernorm``."""
    layer.enorm, layer.hnorm = nn.RMSNorm(hidden, eps=eps), nn.RMSNorm(hidden, eps=eps)
    layer.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
    layer.final_layernorm = nn.RMSNorm(hidden, eps=eps)


def train_and_write(out_root: str | Path, r: Recipe, s: GlmTrainSettings,
                    log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Train and write ``out_root/<r.folder>`` (float32); returns the record."""
    from tokenizers import Tokenizer

    folder = Path(out_root) / r.folder
    mx.random.seed(s.seed)
    np.random.seed(s.seed)
    with tempfile.TemporaryDirectory(prefix=f"mtpforge-{r.architecture}-tok-") as tokdir:
        if r.tokenizer is not None:
            r.tokenizer(Path(tokdir))
        else:
            build_family_tokenizer(Path(tokdir), r.trained_vocab, (), eos="<|im_end|>")
        tok = Tokenizer.from_file(str(Path(tokdir) / "tokenizer.json"))
        stream = encode_stream(tok, training_corpus(s))
        model = r.model(r.config)
        b_losses, b_sec = train_backbone(model, stream, s, log)
        head = r.head(model)
        h_losses, h_sec = train_head(model, head, stream, s, log, r.feed)
        acc = draft_acceptance(model, head, heldout_prompts(tok, s), feed=r.feed)
        if log:
            log(f"{r.architecture}: trained (float32) depth-1 acceptance {acc['acceptance']:.3f}")
        tensors = checked_export(r.export(model, head, r.config),
                                 {k: tuple(spec[0]) for k, spec in r.specs(r.config).items()})
        write_hf_checkpoint(folder, r.config, tensors, n_shards=2, tokenizer_dir=Path(tokdir))
    if r.finish is not None:
        r.finish(folder)
    write_generation_config(folder, r.config)
    record = {"model": r.folder, "architecture": r.architecture, "settings": asdict(s),
              "trunk": {"seconds": round(b_sec, 1), "loss": b_losses[-1]},
              r.head_key: {"seconds": round(h_sec, 1), "loss": h_losses[-1], **r.head_notes},
              "acceptance_float32_mlx": acc, **r.extra}
    (folder / "training.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return record


__all__ = ["Recipe", "add_nextn_parts", "train_and_write"]
