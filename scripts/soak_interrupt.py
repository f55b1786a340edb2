#!/usr/bin/env python
"""Soak test: interrupt ``mtpforge add-mtp`` / ``remove-mtp`` N times (default 120) at seeded
moments with SIGINT (Ctrl-C) and SIGKILL alternately, across every crash scenario, and check
that each folder is exactly as before or exactly as after, that a Ctrl-C leaves one truthful
line ("committed" when the folder holds the new state, "left as it was" when not) and never a
traceback, and that a re-run finishes the job.

    python scripts/soak_interrupt.py [-n 120] [--seed 1] [--json soak_interrupt.json] [--variants qwen3_5]

Writes the counts (interrupts really delivered mid-run, by signal, state and phase; failures)
to JSON; exits 1 on any damage or untruthful message.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.crash_harness import SCENARIOS, kill_once, make_bench, plan_kills, summarize  # noqa: E402


def run(n: int, seed: int, variants: list[str], root: Path, check_load: bool = False, log: bool = True,
        json_path: Path | None = None) -> dict:
    """The soak itself (the test suite runs a small seeded sample through here)."""
    from tests.support.synth import build_hf_variant, convert_to_mlx

    t0 = time.monotonic()
    benches = []
    for v in variants:
        hf = build_hf_variant(v, root / "hf" / v)
        mlx = convert_to_mlx(hf, root / "mlx" / v, q_bits=4, q_group_size=64, dtype="bfloat16")
        for s in SCENARIOS:
            if s == "replace-force" and v == "qwen3_next":  # no embedded layout to replace
                continue
            benches.append(make_bench(s, hf, mlx, root / "bench", v))
    per, extra = divmod(n, len(benches))
    outcomes = []
    for bi, bench in enumerate(benches):
        quota, delivered = per + (bi < extra), 0
        for i, plan in enumerate(plan_kills(bench, 3 * quota + 3, seed)):
            if delivered == quota:
                break
            sig = signal.SIGINT if (bi + i) % 2 == 0 else signal.SIGKILL
            work = root / "work" / f"{bi}-{i}"
            o = kill_once(bench, work, plan, check_load=check_load, sig=sig)
            shutil.rmtree(work, ignore_errors=True)
            outcomes.append(o)
            delivered += o.killed
            if json_path is not None:  # after every run: an interrupted soak still leaves its counts
                partial = summarize(outcomes)
                partial.update(seconds=round(time.monotonic() - t0, 1), seed=seed, complete=False)
                json_path.write_text(json.dumps(partial, indent=2))
            if log:
                at = f"{o.anchor}+{o.delay * 1000:.0f}ms" if o.anchor else f"t={o.delay * 1000:.0f}ms"
                print(f"{len(outcomes):4d} {o.signal:7s} {bench.name:30s} {at:18s} {o.state:7s} {o.phase}"
                      + ("" if o.ok else f"  DAMAGE: {o.problems}"), flush=True)
    s = summarize(outcomes)
    s["seconds"] = round(time.monotonic() - t0, 1)
    s["seed"] = seed
    s["outcomes"] = [o.__dict__ for o in outcomes]
    s["complete"] = True
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=120, help="interrupts really delivered mid-run (default 120)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="soak_interrupt.json", help="where to write the results")
    ap.add_argument("--variants", default="qwen3_5")
    ap.add_argument("--load", action="store_true", help="also mlx_lm.load every complete folder (slower)")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mtpforge-soak-int-"))
    try:
        s = run(args.n, args.seed, args.variants.split(","), root, check_load=args.load, json_path=Path(args.json))
        Path(args.json).write_text(json.dumps(s, indent=2))
        print(json.dumps({k: s[k] for k in ("runs", "killed", "intact", "by_signal", "by_state", "by_phase", "seconds")}, indent=2))
        print(f"{s['intact']}/{s['runs']} runs intact; {s['killed']} interrupts delivered mid-run")
        return 0 if s["intact"] == s["runs"] else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
