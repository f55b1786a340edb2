#!/usr/bin/env python
"""Soak test: interrupt ``mtpforge add-mtp`` / ``remove-mtp`` N times (default 120) at seeded
moments with SIGINT (Ctrl-C) and SIGKILL alternately, across every crash scenario, and check
that each folder is exactly as before or exactly as after, that a Ctrl-C leaves one truthful
line ("committed" when the folder holds the new state, "left as it was" when not) and never a
traceback, and that a re-run finishes the job.

    python scripts/soak_interrupt.py [-n 120] [--seed 1] [--json soak_interrupt.json] [--variants qwen3_5]
                                    [--early 0.3] [--sigint 0.5] [--phase validating]

``--early`` is the share of anchored interrupts that land in the first milliseconds after their
progress line, where the phase imports what it needs (a Ctrl-C inside an import once exited
-2, killed by the signal, instead of 130). Writes the counts (interrupts really delivered
mid-run, by signal, state and phase; every Ctrl-C run's exit status; failures) to JSON; exits
1 on any damage, untruthful message or exit status other than 0 or 130 after a Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.crash_harness import ANCHORS, SCENARIOS, kill_once, make_bench, plan_kills, summarize  # noqa: E402


def run(n: int, seed: int, variants: list[str], root: Path, check_load: bool = False, log: bool = True,
        json_path: Path | None = None, early: float = 0.0, sigint: float = 0.5, phase: str | None = None) -> dict:
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
    if phase is not None:
        benches = [b for b in benches if phase in b.anchor_seconds]
    per, extra = divmod(n, len(benches))
    rng = random.Random(seed)
    outcomes = []
    for bi, bench in enumerate(benches):
        quota, delivered = per + (bi < extra), 0
        for i, plan in enumerate(plan_kills(bench, 3 * quota + 3, seed, early_share=early, only=phase)):
            if delivered == quota:
                break
            # alternately by default; ``sigint`` is the share of Ctrl-C among the interrupts
            sig = signal.SIGINT if ((bi + i) % 2 == 0 if sigint == 0.5 else rng.random() < sigint) else signal.SIGKILL
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
                print(f"{len(outcomes):4d} {o.signal:7s} {bench.name:30s} {at:18s} {o.state:7s} rc={o.rc} {o.phase}"
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
    ap.add_argument("--early", type=float, default=0.3,
                    help="share of anchored interrupts in the first milliseconds of their phase (default 0.3)")
    ap.add_argument("--sigint", type=float, default=0.5,
                    help="share of interrupts that are Ctrl-C (SIGINT) rather than SIGKILL (default 0.5: alternately)")
    ap.add_argument("--phase", choices=ANCHORS, default=None,
                    help="interrupt only the phase that starts with this progress line (scenarios without it are skipped)")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mtpforge-soak-int-"))
    try:
        s = run(args.n, args.seed, args.variants.split(","), root, check_load=args.load, json_path=Path(args.json),
              early=args.early, sigint=args.sigint, phase=args.phase)
        Path(args.json).write_text(json.dumps(s, indent=2))
        print(json.dumps({k: s[k] for k in ("runs", "killed", "intact", "by_signal", "sigint_exits", "by_state", "by_phase", "seconds")}, indent=2))
        print(f"{s['intact']}/{s['runs']} runs intact; {s['killed']} interrupts delivered mid-run")
        return 0 if s["intact"] == s["runs"] else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
