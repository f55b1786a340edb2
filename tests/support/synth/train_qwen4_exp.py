"""Train the tiny Qwen3.8-Flash-Next-shaped model (``qwen4_exp``) and its MTP head, so that
mlx-vlm's acceptance with the drafter mtpforge writes means something (random weights accept ~0%).

mlx-lm has no ``qwen4_exp`` model; mlx-vlm has, and its drafter, so this trainer runs in mlx-vlm's
virtualenv (``scripts/train_tiny_family.py qwen4_exp`` re-runs itself there). Both models are
mlx-vlm's own, loaded by its own loaders from the random tiny release of ``synth.qwen4_exp``
(float32): the language model (hyper-connection streams, Gated DeltaNet and Qwen Sparse Attention
layers, MoE) trained as a language model on the synthetic corpus, then, trunk frozen, the
``Qwen4ExpMTPDraftModel`` that ``load_drafter`` builds from the release's ``mtp.*``, trained as
mlx-vlm's speculative loop runs it (``mtp_base.AutoregressiveMTPDraftModel``):

    H_t   = the trunk's hyper-connection state before its final mixer (``return_hidden``)
    z     = fuse(embed_tokens(x[t+1]), H_t)       # pre_fc_norm_*, fc_embedding / fc_hidden
    z     = layers.0(z)                            # one QSA + MoE layer on the streams
    logit = lm_head(hyper_connection_mixer(z))     # the trunk's lm_head: drafts x[t+2]

The export needs no hand-written inverse of mlx-vlm's renaming: its loaders only move elements
(names, fused expert stacks split, axes), so loading a copy of the release whose every element is
its own index (float32, exact below 2**24) tells where each parameter element came from, and the
trained values go back there. A loader that added a constant (a norm's +1) would break that; the
same copy loaded with zeros must load zeros, which ``_origin`` checks. The DSA-like indexer gets
no gradient (its top-k only selects); it keeps its random weights, which select all the same.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from .qwen4_exp import TRAINED_VOCAB, build_qwen4_exp, tensor_specs, tiny_config
from .train_family import Recipe, train_and_write
from .train_glm import Feed, GlmTrainSettings

FOLDER = "tiny-qwen4_exp-trained"


def settings(**given: Any) -> GlmTrainSettings:
    """The other families' settings (a few minutes on a busy 2-core machine)."""
    return GlmTrainSettings(**{"backbone_steps": 300, "head_steps": 200, "seq_len": 64, "corpus_docs": 4000, **given})


def _stop_index_gradients() -> None:
    """QSA's block selection scatters with indices computed from the indexer's scores, and mlx
    will not differentiate a scatter with respect to its indices; the selection is discrete
    anyway, so the indices are cut from the gradient (the forward values are unchanged)."""
    put = mx.put_along_axis
    if getattr(put, "_index_gradient_stopped", False):
        return

    def put_along_axis(a: mx.array, indices: mx.array, values: mx.array, axis: int | None = None) -> mx.array:
        return put(a, mx.stop_gradient(indices), values, axis=axis)

    put_along_axis._index_gradient_stopped = True  # type: ignore[attr-defined]
    mx.put_along_axis = put_along_axis


class Trunk(nn.Module):
    """mlx-vlm's Qwen4-Exp model; calling it gives the language model's logits."""

    def __init__(self, folder: Path) -> None:
        from mlx_vlm.utils import load_model

        super().__init__()
        self.vlm = load_model(folder)
        self.vlm.set_dtype(mx.float32)
        self.vlm.vision_tower.freeze()  # trained as a language model: the tower keeps its weights

    @property
    def text(self) -> Any:
        return self.vlm.language_model

    def __call__(self, tokens: mx.array, cache: Any = None) -> mx.array:
        return self.text(tokens, cache=cache).logits

    def streams(self, tokens: mx.array) -> mx.array:
        """The hyper-connection state before the final mixer: what mlx-vlm hands the drafter."""
        return self.text(tokens, return_hidden=True).hidden_states[0]

    def lm_head(self, h: mx.array) -> mx.array:
        return self.text.lm_head(h)

    def make_cache(self) -> list[Any]:
        """mlx-vlm's own cache (``train_glm.greedy`` decodes with it)."""
        return self.text.make_cache()


class Head(nn.Module):
    """mlx-vlm's drafter as its loop calls it, from (H_t, embedding of x[t+1]) to the mixed state
    the trunk's ``lm_head`` projects; positions from 0, as its prefill starts them."""

    def __init__(self, folder: Path) -> None:
        from mlx_vlm.speculative.drafters import load_drafter

        super().__init__()
        self.drafter = load_drafter(str(folder), kind="mtp")[0]
        self.drafter.set_dtype(mx.float32)

    def __call__(self, hidden: mx.array, emb: mx.array) -> mx.array:
        self.drafter._next_position = 0
        tokens = mx.zeros(hidden.shape[:2], dtype=mx.int32)
        return self.drafter._forward_hidden(emb, hidden, tokens, None)[0]


FEED = Feed(hidden=lambda model, tokens: model.streams(tokens),
            teacher=lambda model, h: model.lm_head(model.text.model.hyper_connection_mixer(h)),
            embed=lambda model, tokens: model.text.model.embed_tokens(tokens))


def _release_copy(src: Path, dst: Path, fill: Callable[[int, tuple[int, ...]], np.ndarray]) -> dict[str, tuple[int, int]]:
    """``src`` copied to ``dst`` in float32 with each tensor's elements from ``fill(first index,
    shape)``; returns name -> (first index, count)."""
    from safetensors.numpy import save_file

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["text_config"]["dtype"] = "float32"
    (dst / "config.json").write_text(json.dumps(config))
    spans: dict[str, tuple[int, int]] = {}
    base = 1  # 0 stays "not from the release"
    for shard in sorted(dst.glob("model*.safetensors")):
        out = {}
        for k, v in sorted(mx.load(str(shard)).items()):
            out[k] = fill(base, tuple(v.shape)).astype(np.float32)
            spans[k] = (base, v.size)
            base += v.size
        save_file(out, str(shard), metadata={"format": "pt"})
    if base >= 2**24:
        raise ValueError("too many elements for exact float32 indices")
    return spans


def _origin(src: Path) -> tuple[dict[str, tuple[int, int]], dict[str, np.ndarray]]:
    """Where each element of mlx-vlm's model and drafter parameters comes from in the release:
    (release name -> (first index, count), parameter name -> its elements' indices); the
    drafter's names carry a ``drafter.`` prefix, the model's ``vlm.``, as in the trainer."""
    out: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory(prefix="mtpforge-qwen4-origin-") as tmp:
        spans = _release_copy(src, Path(tmp) / "index", lambda b, s: np.arange(b, b + int(np.prod(s))).reshape(s))
        _release_copy(src, Path(tmp) / "zero", lambda b, s: np.zeros(s))
        for name, folder in (("index", Path(tmp) / "index"), ("zero", Path(tmp) / "zero")):
            trunk, head = Trunk(folder), Head(folder)
            params = {**{f"vlm.{k}": v for k, v in tree_flatten(trunk.vlm.parameters())},
                      **{f"drafter.{k}": v for k, v in tree_flatten(head.drafter.parameters())}}
            arrays = {k: np.array(v.astype(mx.float32)) for k, v in params.items()}
            if name == "zero":
                if any(a.any() for a in arrays.values()):
                    raise ValueError("mlx-vlm's loaders add a constant to some parameter: indices cannot be inverted")
            else:
                out = {k: a.astype(np.int64) for k, a in arrays.items()}
    flat = np.concatenate([a.ravel() for a in out.values()])
    total = sum(n for _, n in spans.values())
    if len(flat) != total or len(np.unique(flat)) != total or flat.min() < 1:
        raise ValueError(f"mlx-vlm's parameters are not a rearrangement of the release's {total} elements")
    return spans, out


def release_tensors(model: Trunk, head: Head, src: Path) -> dict[str, mx.array]:
    """The trained parameters put back where mlx-vlm's loaders took each element from."""
    spans, origin = _origin(src)
    values = {**{f"vlm.{k}": v for k, v in tree_flatten(model.vlm.parameters())},
              **{f"drafter.{k}": v for k, v in tree_flatten(head.drafter.parameters())}}
    flat = np.zeros(sum(n for _, n in spans.values()) + 1, dtype=np.float32)
    for k, idx in origin.items():
        flat[idx.ravel()] = np.array(values[k].astype(mx.float32)).ravel()
    shapes = {k: tuple(spec[0]) for k, spec in tensor_specs(tiny_config()).items()}
    return {k: mx.array(flat[b:b + n].reshape(shapes[k])) for k, (b, n) in spans.items()}


def build_trained(out_root: str | Path, s: GlmTrainSettings, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Train and write ``out_root/tiny-qwen4_exp-trained`` (float32); returns the record."""
    _stop_index_gradients()
    with tempfile.TemporaryDirectory(prefix="mtpforge-qwen4-start-") as tmp:
        start = build_qwen4_exp(Path(tmp) / "start", seed=s.seed, dtype="float32")
        return train_and_write(out_root, Recipe(
            FOLDER, "qwen4_exp", json.loads((start / "config.json").read_text()),
            model=lambda config: Trunk(start), head=lambda model: Head(start),
            export=lambda model, head, config: release_tensors(model, head, start), specs=tensor_specs,
            head_notes={"hidden": "the hyper-connection streams before the trunk's final mixer (return_hidden)",
                        "drafter": "mlx-vlm 0.7.10's Qwen4ExpMTPDraftModel, built by load_drafter from the release"},
            head_key="mtp", feed=FEED, trained_vocab=TRAINED_VOCAB), s, log)
