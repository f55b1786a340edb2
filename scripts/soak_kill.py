#!/usr/bin/env python
"""Soak test: SIGKILL ``mtpforge add-mtp`` / ``remove-mtp`` N times (default 200) at seeded
moments, across every crash scenario of ``tests/test_crash_safety.py``, and check that each
folder is exactly as before or exactly as after, and that a re-run finishes the job.

    python scripts/soak_kill.py [-n 200] [--seed 1] [--json soak.json] [--variants qwen3_5,qwen3_next]

Prints one line per run and then "N/N intact" over the N runs really killed mid-run (runs
that ended before their signal are checked too and reported apart); exits 1 on any damage.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.crash_harness import SCENARIOS, kill_once, make_bench, plan_kills, summarize  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200, help="number of kills (default 200)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="soak_kill.json", help="where to write the results")
    ap.add_argument("--variants", default="qwen3_5,qwen3_next")
    ap.add_argument("--no-load", action="store_true", help="skip mlx_lm.load of complete folders (faster)")
    args = ap.parse_args(argv)

    from tests.support.synth import build_hf_variant, convert_to_mlx

    root = Path(tempfile.mkdtemp(prefix="mtpforge-soak-"))
    t0 = time.monotonic()
    try:
        benches = []
        for v in args.variants.split(","):
            hf = build_hf_variant(v, root / "hf" / v)
            mlx = convert_to_mlx(hf, root / "mlx" / v, q_bits=4, q_group_size=64, dtype="bfloat16")
            for s in SCENARIOS:
                if s == "replace-force" and v == "qwen3_next":  # no embedded layout to replace
                    continue
                benches.append(make_bench(s, hf, mlx, root / "bench", v))
        per, extra = divmod(args.n, len(benches))
        outcomes = []
        for bi, bench in enumerate(benches):
            quota, kills = per + (bi < extra), 0
            # a timed kill can come after the run ended: it is recorded but not counted, and
            # the next seeded moment is tried, so N means N processes really killed
            for i, plan in enumerate(plan_kills(bench, 3 * quota, args.seed)):
                if kills == quota:
                    break
                work = root / "work" / f"{bi}-{i}"
                o = kill_once(bench, work, plan, check_load=not args.no_load)
                shutil.rmtree(work, ignore_errors=True)
                outcomes.append(o)
                kills += o.killed
                at = f"{o.anchor}+{o.delay * 1000:.0f}ms" if o.anchor else f"t={o.delay * 1000:.0f}ms"
                print(f"{len(outcomes):4d} {bench.name:32s} {at:18s} {o.state:7s} {o.phase}"
                      + ("" if o.ok else f"  DAMAGE: {o.problems}"), flush=True)
        s = summarize(outcomes)
        s["seconds"] = round(time.monotonic() - t0, 1)
        s["seed"] = args.seed
        s["outcomes"] = [o.__dict__ for o in outcomes]
        Path(args.json).write_text(json.dumps(s, indent=2))
        print(json.dumps({k: s[k] for k in ("killed", "by_state", "by_phase", "by_scenario", "seconds")}, indent=2))
        killed_ok = sum(o.ok for o in outcomes if o.killed)
        print(f"{killed_ok}/{s['killed']} intact ({s['runs'] - s['killed']} more runs ended before their signal: "
              f"{s['intact'] - killed_ok} of them intact)")
        return 0 if s["intact"] == s["runs"] else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
