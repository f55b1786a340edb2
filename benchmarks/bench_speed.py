"""Conversion speed of ``add-mtp`` from a local source, against ``cp`` of the same bytes.

Two heads: the 512-expert Qwen3-Next-shaped head of bench_memory (2.3 GiB bf16; sidecar layout,
so every expert is restacked into switch_mlp) and a dense Qwen3.5-27B-shaped head (hidden 5120,
intermediate 17408: 849,398,784 bytes, exactly the real one; embedded layout). Per head,
interleaved repetitions of: ``cp`` of a file holding the head's bytes (with and without fsync,
since add-mtp fsyncs what it writes), ``add-mtp --precision bf16`` (passthrough) and
``add-mtp --precision 4`` (quantization). Page cache warm for all (the files were just written).
Targets: bf16 wall <= 2x cp; quantization throughput in MB/s of source bytes.

    python benchmarks/bench_speed.py              # ~6 min
    python benchmarks/bench_speed.py --quick      # small heads, for development
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import common as C
from bench_memory import build as build_moe


def dense_config(hidden: int, inter: int) -> dict[str, Any]:
    """Qwen3.5-27B's head dimensions (24 heads x 256, 4 KV heads) on a one-layer backbone."""
    from tests.support.synth import tiny_config

    return tiny_config("qwen3_5", hidden_size=hidden, intermediate_size=inter, num_attention_heads=24, head_dim=256,
                       num_key_value_heads=4, num_hidden_layers=1, vocab_size=512)


def build_dense(hidden: int, inter: int) -> tuple[Path, Path]:
    from tests.support.synth import hf_tensor_specs

    cfg = dense_config(hidden, inter)
    tag = f"dense-h{hidden}-i{inter}-{C.folder_fingerprint(cfg)}"
    root = C.workdir("speed")
    src, tgt = root / f"src-{tag}", root / f"tgt-{tag}"
    if not (src / "config.json").is_file():
        shutil.rmtree(src, ignore_errors=True)
        specs = hf_tensor_specs(cfg)
        # the head spread over the last two of three shards, next to backbone tensors
        mtp = sorted(k for k in specs if k.startswith("mtp."))
        shard_of = {k: (0 if "layers" in k else 2) for k in specs if not k.startswith("mtp.")}
        shard_of.update({k: (1 if i < len(mtp) // 2 else 2) for i, k in enumerate(mtp)})
        shard_of.update({k: 1 for k in specs if k.endswith("embed_tokens.weight")})
        C.stream_hf_source(src, cfg, shard_of, 3)
    if not (tgt / "config.json").is_file():
        C.make_mlx_target(cfg, tgt, q_bits=4, n_layers=1, tokenizer_from=src)
    return src, tgt


def add_mtp(src: Path, tgt: Path, precision: str, keep: Path | None = None) -> C.Measured:
    out = tgt.with_name(tgt.name + f"-speed-{precision}")
    shutil.rmtree(out, ignore_errors=True)
    m = C.run_measured(C.mtpforge_cmd("add-mtp", "--source", str(src), "--target", str(tgt), "--output", str(out),
                                      "--precision", precision, "--json"), env=C.child_env())
    if keep is not None:
        f = next(Path(x) for x in m.json()["files_written"] if x.endswith(".safetensors"))
        shutil.copyfile(f, keep)
    shutil.rmtree(out, ignore_errors=True)
    return m


def cp(src: Path, fsync: bool) -> C.Measured:
    dst = src.with_name(src.name + ".cp")
    dst.unlink(missing_ok=True)
    # a real byte copy: GNU cp would otherwise clone the extents on CoW file systems (free)
    cmd = ["cp", *(["--reflink=never"] if sys.platform.startswith("linux") else []), str(src), str(dst)]
    if fsync:  # cp, then fsync the copy: what add-mtp's writer does before its rename
        cmd = [C.PY, "-S", "-c", "import os,subprocess,sys; subprocess.run(sys.argv[1:], check=True); "
               "fd=os.open(sys.argv[-1], os.O_RDONLY); os.fsync(fd)", *cmd]
    m = C.run_measured(cmd)
    dst.unlink(missing_ok=True)
    return m


def bench_head(name: str, src: Path, tgt: Path, reps: int) -> dict[str, Any]:
    head, n = C.head_bytes(src)
    blob = tgt.with_name(tgt.name + "-head.safetensors")
    add_mtp(src, tgt, "bf16", keep=blob)  # warm-up, and a file of the head's bytes for cp
    runs: dict[str, list[float]] = {"cp": [], "cp+fsync": [], "bf16": [], "4-bit": []}
    for _ in range(reps):
        runs["cp"].append(cp(blob, False).wall_s)
        runs["cp+fsync"].append(cp(blob, True).wall_s)
        runs["bf16"].append(add_mtp(src, tgt, "bf16").wall_s)
        runs["4-bit"].append(add_mtp(src, tgt, "4").wall_s)
        print(f"  {name}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in runs.items()), flush=True)
    blob_bytes = blob.stat().st_size
    blob.unlink(missing_ok=True)
    med = {k: C.median_spread(v) for k, v in runs.items()}
    return {"head": name, "head_bytes": head, "head_tensors": n, "cp_bytes": blob_bytes, "runs_s": runs, "stats": med,
            "bf16_vs_cp": med["bf16"]["median"] / med["cp"]["median"],
            "bf16_vs_cp_fsync": med["bf16"]["median"] / med["cp+fsync"]["median"],
            "bf16_MBps": head / 1e6 / med["bf16"]["median"], "q4_MBps": head / 1e6 / med["4-bit"]["median"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        heads = [("moe-64x", *build_moe(64, 512, 128)[:2]), ("dense-small", *build_dense(1024, 2048))]
    else:
        heads = [("qwen3-next-like 512 experts", *build_moe(512, 2048, 384)[:2]),
                 ("qwen3.5-27b-like dense", *build_dense(5120, 17408))]
    startup = C.median_spread([C.idle_interpreter(env=C.child_env()).wall_s for _ in range(3)])["median"]
    rows = [bench_head(n, s, t, a.reps) for n, s, t in heads]

    headers = ["head", "MiB", "cp s", "cp+fsync s", "bf16 s", "bf16/cp", "bf16/(cp+fsync)", "bf16 MB/s", "4-bit s", "4-bit MB/s"]
    trows = [[r["head"], C.mib(r["head_bytes"]), r["stats"]["cp"]["median"], r["stats"]["cp+fsync"]["median"],
              r["stats"]["bf16"]["median"], r["bf16_vs_cp"], r["bf16_vs_cp_fsync"], r["bf16_MBps"],
              r["stats"]["4-bit"]["median"], r["q4_MBps"]] for r in rows]
    print()
    print(C.table(f"add-mtp from a local source, medians of {a.reps} interleaved runs "
                  f"(wall, including {startup:.2f}s interpreter + import startup)", headers, trows))
    spread = [[r["head"]] + [f"{r['stats'][k]['min']:.2f}-{r['stats'][k]['max']:.2f}" for k in ("cp", "cp+fsync", "bf16", "4-bit")]
              for r in rows]
    print()
    print(C.table("spread (min-max seconds)", ["head", "cp", "cp+fsync", "bf16", "4-bit"], spread))
    ok = all(r["bf16_vs_cp"] <= 2.0 for r in rows)
    print(f"\ntarget bf16 <= 2x cp: {'met' if ok else 'MISSED'}")
    path = C.write_result("speed-quick" if a.quick else "speed", {
        "reps": a.reps, "startup_s": startup, "rows": rows, "target_met": ok,
        "markdown": C.markdown_table(headers, trows)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
