#!/usr/bin/env python
"""Fuzz every file mtpforge reads: N hypothesis examples per file kind (default 2,000), each a
real command run through the CLI in this process on a case folder with one value changed.

    python scripts/fuzz_inputs.py [-n 2000] [--kinds config,index,...] [--seed 1] [--json fuzz_inputs.json]

Counts per kind: examples, exit codes, commands, seconds; every failure (a traceback, "internal
error", an exit other than 0/1/2, an error that is not one line with a fix, a folder changed by
a command that failed) with what was changed and the command. Writes the JSON after every kind
(an interrupted run still leaves its counts); exits 1 when any example failed. The judging is
``tests/input_fuzz.py``'s, the same as the suite's property test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, Phase, given, seed as hseed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.input_fuzz import KINDS, Bench, Outcome, environment, make_bench, run_example  # noqa: E402


def fuzz_kind(bench: Bench, kind: str, n: int, seed: int, work: Path, log: bool) -> dict:
    outcomes: list[Outcome] = []

    @hseed(seed)
    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        o = run_example(bench, kind, data, work)
        outcomes.append(o)
        if log and not o.ok:
            print(f"  FAIL {kind}: {o.what} | {' '.join(o.argv[:2])} -> {o.exit_code}: {o.problems[0][:300]}", flush=True)

    t0 = time.monotonic()
    one()
    failures = [o for o in outcomes if not o.ok]
    return {
        "kind": kind, "examples": len(outcomes), "seconds": round(time.monotonic() - t0, 1),
        "exit_codes": dict(sorted(Counter(str(o.exit_code) for o in outcomes).items())),
        "commands": dict(sorted(Counter(o.argv[0] + (" --validate" if "--validate" in o.argv else "") for o in outcomes).items())),
        "seconds_by_command": {c: round(sum(o.seconds for o in outcomes if o.argv[0] == c), 1)
                               for c in sorted({o.argv[0] for o in outcomes})},
        "failures": len(failures),
        "failed": [{"what": o.what, "argv": o.argv, "exit_code": o.exit_code, "problems": o.problems} for o in failures[:50]],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=2000, help="examples per file kind (default 2000)")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of: {', '.join(KINDS)}")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="fuzz_inputs.json", help="where to write the counts")
    ap.add_argument("--quiet", action="store_true", help="do not print failures as they are found")
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        ap.error(f"unknown kinds: {', '.join(unknown)}")
    root = Path(tempfile.mkdtemp(prefix="mtpforge-fuzz-"))
    os.environ.update(environment(root / "hf-home"))
    results: dict = {"n_per_kind": args.n, "seed": args.seed, "kinds": {}, "complete": False}
    t0 = time.monotonic()
    try:
        bench = make_bench(root / "bench")
        for kind in kinds:
            print(f"{kind}: {args.n} examples", flush=True)
            r = fuzz_kind(bench, kind, args.n, args.seed, root / "work", not args.quiet)
            results["kinds"][kind] = r
            results["seconds"] = round(time.monotonic() - t0, 1)
            Path(args.json).write_text(json.dumps(results, indent=2))
            print(f"{kind}: {r['examples']} examples in {r['seconds']} s, exits {r['exit_codes']}, {r['failures']} failures",
                  flush=True)
        results["complete"] = True
        Path(args.json).write_text(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    total = sum(r["examples"] for r in results["kinds"].values())
    failed = sum(r["failures"] for r in results["kinds"].values())
    print(f"{total} examples over {len(results['kinds'])} file kinds in {results.get('seconds')} s: {failed} failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
