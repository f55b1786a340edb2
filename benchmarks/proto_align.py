"""Prototype: re-align a head to the quantized trunk it will draft for.

bench_trunk_quant.py measures what a trunk's quantization costs a full-precision head. Where that
is several points, this asks whether a short fine-tune of the head alone on the quantized trunk's
own behaviour wins them back — with no data set: the trunk writes its own training text (sampled
continuations of a newline), and the head learns to draft the trunk's next-but-one token
distribution from the trunk's hidden states (the same distillation objective the tiny heads were
trained with). The trunk is frozen, so greedy output stays the trunk's own (acceptance here is
measured along its greedy path, as verify's speculative loop would accept).

    python benchmarks/proto_align.py                  # dense tiny model, 4/3/2-bit trunks (~10 min)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from typing import Any

import common as C

sys.path.insert(0, str(C.REPO))

MODEL = C.REPO / "mtpforge" / "data" / "tiny-qwen3_5"


def self_written_text(model: Any, start: int, n: int, length: int, seed: int) -> Any:
    """``n`` sequences the trunk samples (temperature 1) after ``start``: its own distribution."""
    import mlx.core as mx

    mx.random.seed(seed)
    cache = model.make_cache()
    toks = mx.full((n, 1), start, dtype=mx.int32)
    out = [toks]
    logits = model(toks, cache=cache)
    for _ in range(length - 1):
        toks = mx.random.categorical(logits[:, -1, :])[:, None].astype(mx.int32)
        out.append(toks)
        logits = model(toks, cache=cache)
        mx.eval(logits)
    return mx.concatenate(out, axis=1)


def realign(model: Any, head: Any, data: Any, steps: int, lr: float, batch: int, seed: int) -> float:
    """The head alone, AdamW on the distillation loss against the frozen quantized trunk."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    import numpy as np

    from tests.support.synth.train import TrainSettings, head_loss

    settings = TrainSettings(distill_weight=1.0, ce_weight=0.0)
    model.freeze()
    head.train()
    opt = optim.AdamW(learning_rate=optim.cosine_decay(lr, steps, lr / 10), weight_decay=0.0)
    fn = nn.value_and_grad(head, lambda hd, b: head_loss(model, hd, b, settings, "post"))
    rng = np.random.RandomState(seed)
    t0 = time.perf_counter()
    for _ in range(steps):
        idx = mx.array(rng.randint(0, data.shape[0], size=batch))
        loss, grads = fn(head, data[idx])
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        opt.update(head, grads)
        mx.eval(head.parameters(), opt.state, loss)
    head.eval()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bits", default="4,3,2")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--sequences", type=int, default=256)
    ap.add_argument("--length", type=int, default=96)
    ap.add_argument("--control", action="store_true", help="re-align the head on the bf16 trunk as well")
    a = ap.parse_args()

    from tokenizers import Tokenizer

    from mtpforge.community import convert_to_mlx
    from mtpforge.pipeline import add_mtp
    from tests.gguf_env import prompts
    from tests.support.synth.train import draft_acceptance
    from tests.support.synth.train_check import load_backbone, load_head

    work = C.workdir("align")
    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    held = [tok.encode(t).ids for t in prompts()]
    newline = tok.encode("\n").ids[-1]
    results: dict[str, Any] = {}
    rows = []
    for label, bits in [("bf16", None)] + [(f"{b}-bit", int(b)) for b in a.bits.split(",") if b]:
        d = work / label
        shutil.rmtree(d, ignore_errors=True)
        convert_to_mlx(MODEL, d, q_bits=bits)
        add_mtp(source=str(MODEL), target=str(d), precision="bf16", progress=False)
        model = load_backbone(d)
        head = load_head(d, model)
        before = draft_acceptance(model, head, held, n_new=64)["acceptance"]
        cell: dict[str, Any] = {"before": before}
        if bits is not None or a.control:  # the bf16 trunk re-aligned too: what the fine-tune gives anyway
            t0 = time.perf_counter()
            data = self_written_text(model, newline, a.sequences, a.length, seed=1)
            gen_s = time.perf_counter() - t0
            train_s = realign(model, head, data, a.steps, a.lr, batch=16, seed=2)
            cell.update(after=draft_acceptance(model, head, held, n_new=64)["acceptance"], text_seconds=round(gen_s, 1),
                        train_seconds=round(train_s, 1))
        results[label] = cell
        rows.append([label, f"{before:.1%}", f"{cell['after']:.1%}" if "after" in cell else "-",
                     f"{cell.get('text_seconds', 0) + cell.get('train_seconds', 0):.0f}"])
        print(label, cell, flush=True)
        shutil.rmtree(d, ignore_errors=True)
    print(C.table(f"re-aligning the bf16 head to the trunk ({a.steps} steps, {a.sequences} self-written sequences)",
                  ["trunk", "acceptance as written", "after re-alignment", "seconds"], rows))
    path = C.write_result("align" + ("-control" if a.control else ""), {"steps": a.steps, "lr": a.lr, "sequences": a.sequences, "length": a.length,
                                    "prompts": len(held), "max_tokens": 64, "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
