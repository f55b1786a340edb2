"""Peak memory of ``add-mtp`` on a large MoE head, against today's load-the-shard approach.

A synthetic Qwen3-Next-shaped source whose MTP head has per-expert experts (512 at full size,
about 2.3 GiB in bf16), streamed to disk tensor by tensor; a 4-layer MLX target with the same
dimensions. For 128 / 256 / 512 experts and bf16 / 4-bit output, each tool runs in its own child
process; we report its peak RSS minus that of an idle interpreter importing the same modules.
Target: mtpforge <= 25% of the head's bytes, flat in expert count.

    python benchmarks/bench_memory.py                 # full size (~5 min)
    python benchmarks/bench_memory.py --quick         # small dims, for development
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import common as C


def memory_config(experts: int, hidden: int, moe_inter: int) -> dict[str, Any]:
    """Qwen3-Next-80B's head dimensions (hidden 2048, 16 heads x 256, 2 KV heads, shared expert
    512), a dense 4-layer backbone (``mlp_only_layers``) so that only the head is large."""
    from tests.support.synth import tiny_config

    return tiny_config(
        "qwen3_next", hidden_size=hidden, num_attention_heads=16, head_dim=256, num_key_value_heads=2,
        num_experts=experts, num_experts_per_tok=10, moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=512, intermediate_size=1024, num_hidden_layers=4,
        mlp_only_layers=[0, 1, 2, 3], vocab_size=512,
    )


def build(experts: int, hidden: int, moe_inter: int) -> tuple[Path, Path, dict[str, Any]]:
    """(source, 4-bit target) for one expert count, cached in the work dir by config."""
    from tests.support.synth import hf_tensor_specs
    from tests.support.synth.write import natural_key

    cfg = memory_config(experts, hidden, moe_inter)
    tag = f"e{experts}-h{hidden}-i{moe_inter}-{C.folder_fingerprint(cfg)}"
    root = C.workdir("memory")
    src, tgt = root / f"src-{tag}", root / f"tgt-{tag}"
    if not (src / "config.json").is_file():
        shutil.rmtree(src, ignore_errors=True)
        specs = hf_tensor_specs(cfg)
        backbone = sorted((k for k in specs if not k.startswith("mtp.")), key=natural_key)
        # Qwen3-Next's layout: backbone over the shards, the head in the last one next to lm_head
        shard_of = {k: (0 if i < len(backbone) // 2 else 1) for i, k in enumerate(backbone)}
        shard_of.update({k: 2 for k in specs if k.startswith("mtp.") or k == "lm_head.weight"})
        C.stream_hf_source(src, cfg, shard_of, 3)
    if not (tgt / "config.json").is_file():
        C.make_mlx_target(cfg, tgt, q_bits=4, tokenizer_from=src)
    return src, tgt, cfg


def run_mtpforge(src: Path, tgt: Path, precision: str) -> C.Measured:
    out = tgt.with_name(tgt.name + f"-out-{precision}")
    shutil.rmtree(out, ignore_errors=True)
    m = C.run_measured(C.mtpforge_cmd("add-mtp", "--source", str(src), "--target", str(tgt), "--output", str(out),
                                      "--precision", precision, "--json"), env=C.child_env())
    shutil.rmtree(out, ignore_errors=True)
    return m


def run_baseline(src: Path, tgt: Path, bits: int | None) -> C.Measured:
    out = tgt.with_name(tgt.name + "-baseline.safetensors")
    cmd = [C.PY, str(C.HERE / "baseline_extract.py"), "--source", str(src), str(out)] + (["--bits", str(bits)] if bits else [])
    m = C.run_measured(cmd, env=C.child_env())
    out.unlink(missing_ok=True)
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--moe-intermediate", type=int, default=384)
    ap.add_argument("--quick", action="store_true", help="hidden 512, moe_intermediate 128 (development)")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--name", default=None, help="result file name (default: memory, or memory-quick)")
    a = ap.parse_args()
    if a.quick:
        a.hidden, a.moe_intermediate = 512, 128

    idle = [C.idle_interpreter(env=C.child_env()).maxrss_bytes for _ in range(3)]
    idle_rss = sorted(idle)[1]
    # the baseline script imports less; its floor is an interpreter with its own imports
    bidle = [C.idle_interpreter(C.BASELINE_IMPORTS, env=C.child_env()).maxrss_bytes for _ in range(3)]
    bidle_rss = sorted(bidle)[1]
    rows: list[dict[str, Any]] = []
    for E in a.experts:
        src, tgt, _ = build(E, a.hidden, a.moe_intermediate)
        head, n_tensors = C.head_bytes(src)
        for precision, bits in (("bf16", None), ("4", 4)):
            m = run_mtpforge(src, tgt, precision)
            rep = m.json()
            row = {"experts": E, "output": "bf16" if bits is None else "4-bit", "head_bytes": head,
                   "head_tensors": n_tensors, "mtpforge_peak_rss": m.maxrss_bytes,
                   "mtpforge_delta": m.maxrss_bytes - idle_rss, "mtpforge_wall_s": m.wall_s,
                   "mtpforge_bytes_written": rep.get("mtp_bytes")}
            row["mtpforge_delta_frac"] = row["mtpforge_delta"] / head
            if not a.no_baseline:
                b = run_baseline(src, tgt, bits)
                row.update(baseline_peak_rss=b.maxrss_bytes, baseline_delta=b.maxrss_bytes - bidle_rss,
                           baseline_wall_s=b.wall_s)
                row["baseline_delta_frac"] = row["baseline_delta"] / head
                row["mtpforge_vs_baseline"] = row["mtpforge_delta"] / max(row["baseline_delta"], 1)
            rows.append(row)
            print(f"  E={E} {row['output']}: mtpforge +{C.mib(row['mtpforge_delta']):.0f} MiB"
                  + (f", baseline +{C.mib(row['baseline_delta']):.0f} MiB" if "baseline_delta" in row else ""), flush=True)

    deltas = [r["mtpforge_delta"] for r in rows]
    biggest = max(r["head_bytes"] for r in rows)
    headers = ["experts", "output", "head MiB", "mtpforge +MiB", "% of head", "baseline +MiB", "% of head", "mtpforge/baseline"]
    trows = [[r["experts"], r["output"], C.mib(r["head_bytes"]), C.mib(r["mtpforge_delta"]), 100 * r["mtpforge_delta_frac"],
              C.mib(r.get("baseline_delta", 0)) if "baseline_delta" in r else "-",
              100 * r["baseline_delta_frac"] if "baseline_delta_frac" in r else "-",
              r.get("mtpforge_vs_baseline", "-")] for r in rows]
    print()
    print(C.table(f"Peak RSS above an idle interpreter with the same imports ({C.mib(idle_rss):.0f} MiB for mtpforge, "
                  f"{C.mib(bidle_rss):.0f} MiB for the baseline); add-mtp default layout (sidecar, switch_mlp)",
                  headers, trows))
    target_ok = all(r["mtpforge_delta_frac"] <= 0.25 for r in rows)
    spread = max(max(ds) - min(ds) for ds in ([r["mtpforge_delta"] for r in rows if r["output"] == o] for o in ("bf16", "4-bit")))
    print(f"\ntarget <= 25% of head bytes: {'met' if target_ok else 'MISSED'}; largest spread across expert counts "
          f"(same output): {C.mib(spread):.1f} MiB ({100 * spread / biggest:.2f}% of the largest head)")
    path = C.write_result(a.name or ("memory-quick" if a.quick else "memory"), {
        "idle_rss_bytes": idle_rss, "idle_samples": idle, "baseline_idle_rss_bytes": bidle_rss, "hidden": a.hidden, "moe_intermediate": a.moe_intermediate,
        "rows": rows, "target_met": target_ok, "spread_bytes": spread,
        "markdown": C.markdown_table(headers, trows),
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
