"""``mtpforge align``: re-fit an MLX folder's MTP head to the quantized trunk it drafts for.

A head is trained on the full-precision model's hidden states; a trunk quantized to 4, 3 or 2 bits
computes slightly different ones, and the head's drafts agree with it less (docs/PERFORMANCE.md:
a trained head loses up to 33 points on a 2-bit trunk). A short fine-tune of the head alone on
the quantized trunk's own behaviour wins most of that back. No data set is needed: the trunk
writes its own training text (continuations it samples after the built-in prompts), and the head
learns to draft the trunk's next-but-one token distribution from the trunk's hidden states — the
same distillation objective the head was trained with. The trunk is never changed, so output
stays the trunk's own; acceptance is measured before and after exactly as ``verify --generate``
measures it, and the new head is written only if it accepts more (never a worse head).

Quantized head weights are dequantized, trained in float and quantized again at the head's own
recorded bits, group size and mode (the head keeps its precision and its size); what is measured
"after" is that re-quantized head, built from the very bytes that are written. The new bytes are
patched over the old ones at their spans (same dtypes and shapes, so every layout is written the
same way) in a staged copy swapped in atomically, and ``mtpforge.json`` records the alignment and
the new measurement; a run that is interrupted, fails, or does not improve leaves the folder as
it was.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import mlx.core as mx

from . import __version__
from .cells import counted
from .errors import InputError, RefusedError
from .progress import Progress

#: AdamW steps by default: what the prototype (benchmarks/proto_align.py) recovered the 2-, 3- and
#: 4-bit trunks' loss with on the tiny models
DEFAULT_STEPS = 150
#: how much text the trunk writes for itself: sequences (spread over the prompts) and new tokens each
SEQUENCES = 256
LENGTH = 96
BATCH = 16
LEARNING_RATE = 1e-3
#: acceptance is measured as verify measures it: greedy, depth 1, this many tokens per prompt
MAX_TOKENS = 64


@dataclass(frozen=True)
class Measured:
    """What verify's decode loop says of one head: acceptance of the better hidden variant."""

    acceptance: float
    hidden: str
    hidden_variants: dict[str, float]
    by_position: list[float]
    identical: bool

    def as_dict(self) -> dict[str, Any]:
        return {"acceptance": round(self.acceptance, 4), "hidden": self.hidden,
                "hidden_variants": {k: round(v, 4) for k, v in self.hidden_variants.items()},
                "identical": self.identical}


def align(
    target: str, *, steps: int = DEFAULT_STEPS, prompts: Sequence[str] | None = None, seed: int = 0,
    max_tokens: int = MAX_TOKENS, dry_run: bool = False, progress: bool = True,
    sequences: int = SEQUENCES, length: int = LENGTH,
) -> dict[str, Any]:
    """Fine-tune ``target``'s head on its own trunk; write it only if acceptance rose.

    ``sequences`` and ``length``: how much text the trunk writes for itself (less is faster and
    recovers less; the tests use less)."""
    from .gguf.addmtp import is_gguf_path

    if is_gguf_path(target):
        raise InputError(f"{target} is a GGUF file: align is MLX-only for now (it trains the head through MLX on the "
                         "trunk's hidden states, and a GGUF trunk is computed by llama.cpp, whose quantized kernels "
                         "give other hidden states than any MLX stand-in)",
                         "align the MLX folder of the same model quantized alike, or measure this head with "
                         f"`mtpforge verify {target}`")
    if steps < 1:
        raise InputError(f"steps must be at least 1, not {steps}", f"pass --steps {DEFAULT_STEPS}")
    if max_tokens < 1:
        raise InputError(f"max_tokens must be at least 1, not {max_tokens}", f"pass --max-tokens {MAX_TOKENS}")
    if sequences < 1 or length < 2:
        raise InputError(f"sequences must be at least 1 and length at least 2, not {sequences} and {length}",
                         f"keep the defaults ({SEQUENCES} sequences of {LENGTH} tokens)")
    if not 0 <= seed < 2**32:
        raise InputError(f"seed must be between 0 and {2**32 - 1}, not {seed}", "e.g. --seed 0")
    from .verify import _check_target

    folder = _check_target(target)
    from .writer.lock import folder_lock

    # held for the whole run: the head measured and trained is the head replaced
    with folder_lock(folder, shared=dry_run):
        return _align(folder, steps=steps, prompts=prompts, seed=seed, max_tokens=max_tokens, dry_run=dry_run,
                      prog=Progress(enabled=progress), sequences=sequences, length=length)


def _align(folder: Path, *, steps: int, prompts: Sequence[str] | None, seed: int, max_tokens: int, dry_run: bool,
           prog: Progress, sequences: int, length: int) -> dict[str, Any]:
    from .verify import DEFAULT_PROMPTS, _encode, _load

    t_start = time.perf_counter()
    hw, cat, loc = _head_in_place(folder, prog)
    head_folder = hw.folder
    prog.step("loading the backbone with mlx-lm")
    bb, head = _load(folder, hw)
    texts = list(prompts) if prompts else list(DEFAULT_PROMPTS)
    encoded = [_encode(bb.tokenizer, t) for t in texts]

    prog.step(f"measuring acceptance as verify does ({counted(len(encoded), 'prompt')}, {max_tokens} tokens each)")
    before = _measure(bb, head, encoded, max_tokens)
    report: dict[str, Any] = {
        "target": str(folder), "head_folder": str(head_folder), "family": hw.family, "layout": hw.layout,
        "dry_run": dry_run, "train_steps": steps, "seed": seed, "prompts": len(texts), "max_tokens": max_tokens,
        "sequences": sequences, "length": length, "learning_rate": LEARNING_RATE,
        "before": before.as_dict(), "problems": [], "notes": [],
    }
    if not before.identical:
        raise RefusedError(f"MTP output of {folder} already differs from plain greedy decoding before align: the "
                           "decoder or the folder is wrong, and acceptance measures nothing; nothing was changed",
                           f"run `mtpforge verify {folder} --generate` to see where")

    float_head, trainable, requantized = _float_head(hw, bb)
    report["trained_tensors"] = len(trainable)
    report["requantized_modules"] = sorted(requantized)
    prog.step(f"the trunk writes its own text: {sequences} sequences of {length} tokens after the prompts")
    t0 = time.perf_counter()
    data = _self_text(bb, encoded, sequences, length, seed)
    text_s = time.perf_counter() - t0
    prog.step(f"fine-tuning the head alone ({counted(len(trainable), 'tensor')}, "
              f"{counted(len(requantized), 'quantized module')} re-quantized after): {steps} steps, "
              f"{before.hidden}-norm hidden state")
    t0 = time.perf_counter()
    _fit(bb, float_head, data, steps=steps, hidden=before.hidden, seed=seed)
    train_s = time.perf_counter() - t0

    new = _stored_tensors(hw, float_head, trainable)
    changed = {k for k in new if _bytes(new[k]) != cat.read_tensor_bytes(loc.entries[k])}
    from .decoder.head import build_head

    aligned = build_head(hw.family, bb.args, new, hw.quant, compute_dtype=bb.dtype)  # what verify will load
    prog.step("measuring the aligned head")
    after = _measure(bb, aligned, encoded, max_tokens)
    report.update(after=after.as_dict(), gain=round(after.acceptance - before.acceptance, 4),
                  changed_tensors=len(changed), text_seconds=round(text_s, 1), train_seconds=round(train_s, 1))
    if not after.identical:
        report["problems"].append("MTP output with the aligned head differs from plain greedy decoding: not written")
    if report["problems"] or after.acceptance <= before.acceptance or not changed:
        report.update(status="not-improved" if not report["problems"] else "not-written", files_written=[],
                      seconds=round(time.perf_counter() - t_start, 1))
        report["exit_code"] = 1 if report["problems"] else 0
        prog.done(f"acceptance {before.acceptance:.1%} -> {after.acceptance:.1%}: the head was left as it was")
        return report
    if dry_run:
        report.update(status="planned", files_written=[], seconds=round(time.perf_counter() - t_start, 1), exit_code=0)
        prog.done(f"acceptance {before.acceptance:.1%} -> {after.acceptance:.1%}: would write the aligned head")
        return report
    patches = _patches(loc, new, changed)
    report["bytes_rewritten"] = sum(len(d) for ps in patches.values() for _, d, _ in ps)
    report["seconds"] = round(time.perf_counter() - t_start, 1)
    _write(head_folder, loc, patches, report, before, after, prog)
    prog.done(f"acceptance {before.acceptance:.1%} -> {after.acceptance:.1%}: aligned head written to {head_folder}")
    return report


def _head_in_place(folder: Path, prog: Progress) -> tuple[Any, Any, Any]:
    """(head weights, catalogue, head location) of an MLX folder whose head align can rewrite in
    place; a raw checkpoint, experts stored per expert or a record that cannot be kept are refused
    before any work."""
    from .checkpoint.catalogue import load_catalogue
    from .checkpoint.store import LocalStore
    from .layouts.detect import locate_head
    from .layouts.read import load_head_weights
    from .repair import _read_old_manifest

    prog.step(f"loading the MTP head of {folder}")
    hw = load_head_weights(folder)
    if hw.layout == "hf":
        raise RefusedError(f"{folder} is a raw Hugging Face checkpoint (mlx-lm shifts its norms on load), not an MLX "
                           "folder: align re-fits a head inside an MLX model folder",
                           f"convert it first: `mtpforge convert --hf-path {folder}`")
    cat = load_catalogue(LocalStore(hw.folder))
    loc = locate_head(cat, hw.family)
    if set(loc.entries) != set(hw.tensors):
        raise RefusedError(f"the head in {hw.folder} is stored in a form align cannot write back in place "
                           f"({hw.layout} layout, experts stored per expert): nothing was changed",
                           "re-add the head with `mtpforge add-mtp --experts switch_mlp --force`, then align")
    _read_old_manifest(hw.folder)
    return hw, cat, loc


def _measure(bb: Any, head: Any, encoded: list[list[int]], max_tokens: int) -> Measured:
    """verify's own decode (both hidden variants, greedy, depth 1), judged as verify judges it."""
    from .decoder.backbone import HIDDEN_VARIANTS
    from .verify import _decode

    variants = list(HIDDEN_VARIANTS)
    _, _, per = _decode(bb, head, encoded, variants, max_tokens=max_tokens, depth=1, temp=0.0, seed=None)
    best = max(variants, key=lambda v: (per[v]["acceptance"], v == "post"))
    return Measured(per[best]["acceptance"], best, {v: per[v]["acceptance"] for v in variants},
                    list(per[best]["acceptance_by_position"]), all(not per[v]["differences"] for v in variants))


def _float_head(hw: Any, bb: Any) -> tuple[Any, list[str], set[str]]:
    """The head in float32 (quantized modules dequantized), with every parameter frozen but the
    ones stored one-to-one in the folder (so each trained value has bytes to go back to)."""
    from mlx.utils import tree_flatten

    from .decoder.head import build_head

    tensors: dict[str, mx.array] = {}
    for k, v in hw.tensors.items():
        mod = k.rsplit(".", 1)[0]
        if mod in hw.quant:
            if k.endswith(".weight"):
                q = hw.quant[mod]
                biases = hw.tensors.get(mod + ".biases")
                tensors[k] = mx.dequantize(v, hw.tensors[mod + ".scales"], biases, group_size=q["group_size"],
                                           bits=q["bits"], mode=q["mode"]).astype(mx.float32)
            continue
        tensors[k] = v
    head = build_head(hw.family, bb.args, tensors, None, compute_dtype=mx.float32)
    params = dict(tree_flatten(head.parameters()))
    trainable = sorted(k for k, v in params.items() if k in tensors and tuple(v.shape) == tuple(tensors[k].shape)
                       and mx.issubdtype(v.dtype, mx.floating))
    modules = dict(head.named_modules())
    head.freeze()
    for k in trainable:
        path, leaf = k.rsplit(".", 1) if "." in k else ("", k)
        modules[path].unfreeze(recurse=False, keys=[leaf])
    return head, trainable, {k.rsplit(".", 1)[0] for k in trainable if k.rsplit(".", 1)[0] in hw.quant}


def _self_text(bb: Any, encoded: list[list[int]], n: int, length: int, seed: int) -> list[mx.array]:
    """``n`` continuations the trunk samples (temperature 1) after the prompts, one batch per
    prompt: its own distribution, which a few greedy paths (the text acceptance is measured on)
    would not show."""
    key = mx.random.key(seed)
    per = max(1, -(-n // len(encoded)))
    out = []
    for p in encoded:
        cache = bb.make_cache()
        toks = mx.array([p] * per, dtype=mx.int32)
        seq = [toks]
        logits = bb.model(toks, cache=cache)
        for _ in range(length):
            key, sub = mx.random.split(key)
            toks = mx.random.categorical(logits[:, -1, :].astype(mx.float32), key=sub)[:, None].astype(mx.int32)
            seq.append(toks)
            logits = bb.model(toks, cache=cache)
            mx.eval(toks, logits)
        out.append(mx.concatenate(seq, axis=1))
    return out


def _trunk_states(bb: Any, data: list[mx.array], hidden: str) -> list[tuple[mx.array, mx.array, mx.array, bool]]:
    """The frozen trunk run once over its own text: (tokens, hidden state fed to the head, what
    the teacher is computed from, whether that is the post-norm state) per chunk of ``BATCH``
    sequences. Storing the post-norm state and applying ``lm_head`` per step is exact where the
    trunk's logits are ``lm_head(norm(x))`` (checked here on the first chunk) and stores H floats a
    token instead of a vocabulary's; a trunk whose logits are computed otherwise keeps its logits."""
    out = []
    exact: bool | None = None
    for group in data:
        for i in range(0, group.shape[0], BATCH):
            batch = group[i:i + BATCH]
            logits = bb.model(batch)
            post = bb.tap.seen.post
            h = bb.tap.seen.pre if hidden == "pre" else post
            if exact is None:
                exact = bool(mx.allclose(bb.lm_head(post), logits, rtol=1e-4, atol=1e-4).item())
            teacher = post if exact else logits
            mx.eval(h, teacher)
            out.append((batch, h, teacher, exact))
    return out


def _fit(bb: Any, head: Any, data: list[mx.array], *, steps: int, hidden: str, seed: int) -> None:
    """AdamW on the head's trainable parameters: the cross-entropy of its draft of x[t+2] from
    (H[t], x[t+1]) against the frozen trunk's own distribution of x[t+2]."""
    import mlx.nn as nn
    import mlx.optimizers as optim
    import numpy as np

    from .interrupts import check

    states = _trunk_states(bb, data, hidden)
    opt = optim.AdamW(learning_rate=optim.cosine_decay(LEARNING_RATE, steps, LEARNING_RATE / 10), weight_decay=0.0)

    def loss_fn(hd: Any, h: mx.array, e: mx.array, teacher: mx.array) -> mx.array:
        logp = nn.log_softmax(hd.logits(hd(h, e), bb).astype(mx.float32), axis=-1)
        return -(teacher * logp).sum(axis=-1).mean()

    grad = nn.value_and_grad(head, loss_fn)
    rng = np.random.RandomState(seed)
    head.train()
    for _ in range(steps):
        check()  # a Ctrl-C stops here; nothing has been written
        batch, h, t, exact = states[rng.randint(len(states))]
        rows = mx.array(rng.randint(0, batch.shape[0], size=BATCH))
        batch, h, t = batch[rows], h[rows], t[rows]
        teacher = mx.softmax((bb.lm_head(t[:, 1:]) if exact else t[:, 1:]).astype(mx.float32), axis=-1)
        h, e = h[:, :-1], bb.embedding(batch[:, 1:])
        loss, grads = grad(head, h, e, mx.stop_gradient(teacher))
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        opt.update(head, grads)
        mx.eval(head.parameters(), opt.state, loss)
    head.eval()


def _stored_tensors(hw: Any, head: Any, trainable: list[str]) -> dict[str, mx.array]:
    """The head's tensors as they will be stored: trained floats in their stored dtype, trained
    quantized weights quantized again at the module's recorded bits, group size and mode."""
    from mlx.utils import tree_flatten

    params = dict(tree_flatten(head.parameters()))
    new = dict(hw.tensors)
    for k in trainable:
        mod = k.rsplit(".", 1)[0]
        if mod in hw.quant and k.endswith(".weight"):
            q = hw.quant[mod]
            parts = mx.quantize(params[k], group_size=q["group_size"], bits=q["bits"], mode=q["mode"])
            new[k] = parts[0].astype(hw.tensors[k].dtype)
            new[mod + ".scales"] = parts[1].astype(hw.tensors[mod + ".scales"].dtype)
            if mod + ".biases" in hw.tensors:
                new[mod + ".biases"] = parts[2].astype(hw.tensors[mod + ".biases"].dtype)
        else:
            new[k] = params[k].astype(hw.tensors[k].dtype)
    mx.eval(new)
    return new


def _bytes(a: mx.array) -> bytes:
    from .checkpoint.tensors import to_bytes

    return to_bytes(a)


def _patches(loc: Any, new: dict[str, mx.array], changed: set[str]) -> dict[str, list[tuple[int, bytes, str]]]:
    """file -> (offset, new bytes, stored key) of every tensor the alignment changed."""
    patches: dict[str, list[tuple[int, bytes, str]]] = {}
    for k in sorted(changed):
        info = loc.entries[k]
        data = _bytes(new[k])
        if len(data) != info.nbytes:  # same dtype and shape by construction; a mismatch is a bug, not a write
            raise RefusedError(f"{loc.stored_keys.get(k, k)}: the aligned tensor is {len(data)} bytes where the folder "
                               f"stores {info.nbytes}; nothing was changed", "report this with `mtpforge env`")
        patches.setdefault(info.file, []).append((info.begin, data, loc.stored_keys.get(k, k)))
    return patches


def _write(head_folder: Path, loc: Any, patches: dict[str, list[tuple[int, bytes, str]]], report: dict[str, Any],
           before: Measured, after: Measured, prog: Progress) -> None:
    """Patch the staged copies, record the alignment, refresh the card, swap in one step."""
    from .layouts.table import MANIFEST
    from .layouts.write import dump_json
    from .manifest import _refresh_card
    from .model_card import CARD
    from .repair import _patch_file
    from .writer.atomic import StagedFolder, check_writable_parent, cleanup_leftovers

    cleanup_leftovers(head_folder)
    check_writable_parent(head_folder)
    report["files_written"] = sorted(patches) + [MANIFEST]
    prog.step(f"writing {counted(report['changed_tensors'], 'tensor')} ({report['bytes_rewritten']:,} bytes) "
              f"in {', '.join(sorted(patches))}")
    with StagedFolder(head_folder) as stage:
        for rel, ps in patches.items():
            _patch_file(head_folder, stage, rel, ps)
        changed = {key for ps in patches.values() for _, _, key in ps}
        manifest = _manifest(stage.stage, head_folder, changed, report, before, after, sorted(patches))
        card = _refresh_card(stage.stage, manifest) if manifest.get("model_card") else None
        if card is not None:
            stage.write_bytes(CARD, card)
            report["files_written"].append(CARD)
        stage.write_bytes(MANIFEST, dump_json(manifest))
        prog.step("committing")
        stage.commit()
    report.update(status="aligned", exit_code=0)


def _manifest(stage: Path, folder: Path, changed: set[str], report: dict[str, Any], before: Measured, after: Measured,
              patched: list[str]) -> dict[str, Any]:
    """The folder's manifest after the alignment: the changed tensors' hashes, verify's record
    replaced by the new measurement (the old one measured the old head), and an ``aligned`` entry."""
    from .checkpoint.catalogue import load_catalogue
    from .checkpoint.store import LocalStore
    from .layouts.detect import locate_head
    from .repair import _read_old_manifest, _rehash

    manifest = _read_old_manifest(folder)
    if "mtpforge_manifest" not in manifest:
        from .layouts.table import MANIFEST
        from .manifest import MANIFEST_VERSION

        manifest = {"mtpforge_manifest": MANIFEST_VERSION, "family": report["family"], "layout": report["layout"],
                    "head_written_by": "another tool", "added": [MANIFEST], "changed": {}}
    cat = load_catalogue(LocalStore(stage))
    new_loc = locate_head(cat, report["family"])
    tensors = manifest["tensors"] = dict(manifest.get("tensors") or {})
    for bare, info in new_loc.entries.items():
        stored = new_loc.stored_keys.get(bare, bare)
        if stored in tensors or stored in changed:
            tensors[stored] = {"sha256": hashlib.sha256(cat.read_tensor_bytes(info)).hexdigest(), "dtype": info.dtype,
                               "shape": list(info.shape)}
    _rehash(manifest, folder, stage, patched)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    manifest["verify"] = {
        "hidden_state": after.hidden, "acceptance": round(after.acceptance, 4),
        "hidden_variants": {k: round(v, 4) for k, v in after.hidden_variants.items()},
        "acceptance_by_position": [round(a, 4) for a in after.by_position], "depth": 1, "temp": 0.0,
        "max_tokens": report["max_tokens"], "prompts": report["prompts"], "identical": after.identical,
        "measured_at": at, "mtpforge_version": __version__,
    }
    manifest["aligned"] = list(manifest.get("aligned") or [])
    manifest["aligned"].append({
        "acceptance_before": round(before.acceptance, 4), "acceptance_after": round(after.acceptance, 4),
        "hidden_state": before.hidden, "steps": report["train_steps"], "seed": report["seed"],
        "sequences": report["sequences"], "length": report["length"], "learning_rate": report["learning_rate"],
        "prompts": report["prompts"], "max_tokens": report["max_tokens"], "changed_tensors": report["changed_tensors"],
        "requantized_modules": report["requantized_modules"], "mtpforge_version": __version__, "at": at,
    })
    return manifest


__all__ = ["DEFAULT_STEPS", "align"]
