"""The approach today's one-off MTP scripts take, as a baseline for the benchmarks.

Read the index, download every shard that holds an ``mtp.*`` tensor (``hf_hub_download``: the
whole shard), load it (``mx.load``), keep the ``mtp.*`` tensors, shift the zero-centred norms,
stack per-expert experts into ``switch_mlp`` (what a sidecar runtime loads), optionally quantize,
and save one file with ``mx.save_safetensors``. Written the way those scripts are written — the
whole head in memory at once — but correct, so the comparison is about cost, not bugs.

    python benchmarks/baseline_extract.py --repo org/name OUT.safetensors      # via the Hub
    python benchmarks/baseline_extract.py --source DIR OUT.safetensors [--bits 4]
Prints one JSON line: shards downloaded, their bytes, head tensors and bytes written.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

NORMS = ("pre_fc_norm_hidden", "pre_fc_norm_embedding", "mtp.norm", "input_layernorm",
         "post_attention_layernorm", "q_norm", "k_norm")
PER_EXPERT = re.compile(r"^(.*\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def main() -> None:
    ap = argparse.ArgumentParser()
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--repo")
    src.add_argument("--source")
    ap.add_argument("out")
    ap.add_argument("--bits", type=int, default=None)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--cache-dir", default=None)
    a = ap.parse_args()

    import mlx.core as mx

    if a.repo:
        from huggingface_hub import hf_hub_download

        get = lambda f: hf_hub_download(a.repo, f, cache_dir=a.cache_dir)  # noqa: E731
    else:
        get = lambda f: os.path.join(a.source, f)  # noqa: E731
    index = json.loads(Path(get("model.safetensors.index.json")).read_text())
    shards = sorted({f for k, f in index["weight_map"].items() if k.startswith("mtp.")})

    head: dict[str, mx.array] = {}
    shard_bytes = 0
    for f in shards:
        path = get(f)
        shard_bytes += os.path.getsize(path)
        weights = mx.load(path)
        head.update({k: v for k, v in weights.items() if k.startswith("mtp.")})
        del weights

    out: dict[str, mx.array] = {}
    experts: dict[tuple[str, str], dict[int, mx.array]] = {}
    for k, v in head.items():
        if m := PER_EXPERT.match(k):
            experts.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = v
        elif v.ndim == 1 and any(n in k for n in NORMS):
            out[k] = (v.astype(mx.float32) + 1.0).astype(v.dtype)
        else:
            out[k] = v
    for (mlp, proj), by_e in experts.items():
        out[f"{mlp}.switch_mlp.{proj}.weight"] = mx.stack([by_e[e] for e in range(len(by_e))])
    if a.bits:
        for k in list(out):
            v = out[k]
            if v.ndim >= 2 and v.shape[-1] % a.group_size == 0 and k.endswith(".weight"):
                w, s, b = mx.quantize(v, group_size=a.group_size, bits=a.bits)
                base = k[: -len(".weight")]
                out[k], out[base + ".scales"], out[base + ".biases"] = w, s, b
    mx.save_safetensors(a.out, out, metadata={"format": "mlx"})
    print(json.dumps({"shards": shards, "shard_bytes": shard_bytes, "head_tensors_in": len(head),
                      "head_bytes_in": sum(v.nbytes for v in head.values()),
                      "tensors_out": len(out), "bytes_out": os.path.getsize(a.out)}))


if __name__ == "__main__":
    main()
