"""Decode speed with the MTP head on the bundled trained tiny model: ``mtpforge verify`` at
depth 1, 2 and 3.

The bundled HF checkpoint (mtpforge/data/tiny-qwen3_5) is converted the way community models
are (mlx_lm.convert, 4-bit, group 64: the head is dropped), the head is added back with
``add-mtp`` (default options), then ``verify --generate`` runs repeatedly, depths interleaved
(the order rotates each round), each run in its own process; medians and min-max of the
MTP/plain tok/s ratio, with acceptance beside each. On this CPU a tiny model is
overhead-bound and docs/SPEC.md §4 expects break-even at best; the numbers are reported as measured.

    python benchmarks/bench_decode.py            # ~4 min
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path
from typing import Any

import common as C

BUNDLED = C.REPO / "mtpforge" / "data" / "tiny-qwen3_5"


def prepare(source: Path) -> Path:
    from tests.support.synth import convert_to_mlx

    tgt = C.workdir("decode") / "tiny-qwen3_5-4bit"
    shutil.rmtree(tgt, ignore_errors=True)
    convert_to_mlx(source, tgt, q_bits=4, q_group_size=64)
    C.run_measured(C.mtpforge_cmd("add-mtp", "--source", str(source), "--target", str(tgt), "--json"), env=C.child_env())
    return tgt


def verify(tgt: Path, depth: int, hidden: str, max_tokens: int) -> dict[str, Any]:
    m = C.run_measured(C.mtpforge_cmd("verify", str(tgt), "--generate", "--json", "--depth", str(depth),
                                      "--hidden", hidden, "--max-tokens", str(max_tokens)), env=C.child_env(), check=False)
    if m.returncode not in (0, 1):
        raise RuntimeError(f"verify exited {m.returncode}: {m.stderr[-2000:]}")
    return m.json()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=BUNDLED)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    if not (a.source / "config.json").is_file():
        raise SystemExit(f"no model at {a.source}: pass --source DIR (an HF-layout Qwen3.5 checkpoint with its head)")

    tgt = prepare(a.source)
    probe = verify(tgt, 1, "auto", a.max_tokens)
    hidden = probe["hidden"]
    print(f"hidden state variants at depth 1: {probe['hidden_variants']} -> using {hidden}", flush=True)
    runs: dict[int, list[dict[str, Any]]] = {d: [] for d in a.depths}
    for r in range(a.rounds):
        order = a.depths[r % len(a.depths):] + a.depths[: r % len(a.depths)]
        for d in order:
            rep = verify(tgt, d, hidden, a.max_tokens)
            runs[d].append({k: rep.get(k) for k in ("baseline_tok_s", "mtp_tok_s", "speedup", "acceptance",
                                                     "acceptance_by_position", "accepted_per_verify", "identical",
                                                     "tokens", "drafted", "accepted")})
        print(f"  round {r + 1}: " + ", ".join(f"d{d} {runs[d][-1]['speedup']:.3f}x" for d in a.depths), flush=True)

    rows = []
    for d in a.depths:
        rs = runs[d]
        sp = C.median_spread([x["speedup"] for x in rs])
        rows.append({
            "depth": d, "speedup": sp, "baseline_tok_s": C.median_spread([x["baseline_tok_s"] for x in rs]),
            "mtp_tok_s": C.median_spread([x["mtp_tok_s"] for x in rs]),
            "acceptance": statistics.median(x["acceptance"] for x in rs),
            "acceptance_by_position": rs[0]["acceptance_by_position"],
            "accepted_per_verify": statistics.median(x["accepted_per_verify"] for x in rs),
            "identical": all(x["identical"] for x in rs), "runs": rs,
        })
    headers = ["depth", "acceptance", "by position", "accepted/verify", "plain tok/s", "MTP tok/s", "speedup (median)",
               "speedup min-max", "identical"]
    trows = [[r["depth"], f"{100 * r['acceptance']:.1f}%", " ".join(f"{100 * p:.0f}%" for p in r["acceptance_by_position"]),
              r["accepted_per_verify"], r["baseline_tok_s"]["median"], r["mtp_tok_s"]["median"],
              f"{r['speedup']['median']:.3f}x", f"{r['speedup']['min']:.3f}-{r['speedup']['max']:.3f}", r["identical"]]
             for r in rows]
    print()
    print(C.table(f"verify --generate on the bundled tiny model (4-bit g64 + add-mtp), {hidden}-norm hidden, "
                  f"{a.max_tokens} tokens/prompt, {a.rounds} interleaved rounds", headers, trows))
    path = C.write_result("decode", {"source": str(a.source), "hidden": hidden, "hidden_variants": probe["hidden_variants"],
                                     "rounds": a.rounds, "max_tokens": a.max_tokens, "rows": rows,
                                     "markdown": C.markdown_table(headers, trows)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
