#!/usr/bin/env python
"""Soak test: N racing pairs (default 20) of ``mtpforge`` runs on one folder — two add-mtp with
different layouts, add-mtp against remove-mtp, add-mtp against an --output run, the same command
twice — started a seeded moment apart. Each pair must end with every run either done (exit 0) or
refused in one line (exit 1), no traceback, no leftovers, and a folder that ``inspect`` finds
clean and that ``remove-mtp`` (when it holds a head) restores byte for byte to the original.

    python scripts/soak_race.py [-n 20] [--seed 1] [--json soak_race.json]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.checkers import folder_state  # noqa: E402
from tests.crash_harness import cli_env, leftovers, run_cli  # noqa: E402

#: pair name -> (starts with a head?, first command, second command); {out} is a fresh --output
PAIRS: dict[str, tuple[bool, list[str], list[str]]] = {
    "add|add-sidecar-force": (False, ["add"], ["add", "--layout", "sidecar", "--force"]),
    "add|add": (False, ["add"], ["add"]),
    "remove|add-sidecar-force": (True, ["remove"], ["add", "--layout", "sidecar", "--force"]),
    "add|add-output": (False, ["add"], ["add", "--output", "{out}"]),
    "remove|remove": (True, ["remove"], ["remove"]),
}


def _argv(cmd: list[str], source: Path, target: Path, out: Path) -> list[str]:
    if cmd[0] == "remove":
        return ["remove-mtp", str(target)]
    return ["add-mtp", "--source", str(source), "--target", str(target)] + [a.replace("{out}", str(out)) for a in cmd[1:]]


def race_once(name: str, source: Path, pristine: Path, with_head: Path, work: Path, offset: float) -> dict:
    starts_with_head, a, b = PAIRS[name]
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    target = work / "model"
    shutil.copytree(with_head if starts_with_head else pristine, target, symlinks=True)
    original = folder_state(pristine)
    env = cli_env()
    p1 = subprocess.Popen([sys.executable, "-m", "mtpforge", *_argv(a, source, target, work / "out-a")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    time.sleep(offset)
    overlapped = p1.poll() is None  # the first was still running when the second started
    p2 = subprocess.Popen([sys.executable, "-m", "mtpforge", *_argv(b, source, target, work / "out-b")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    errs = [p.communicate(timeout=300)[1] for p in (p1, p2)]
    rcs = [p1.returncode, p2.returncode]
    problems = []
    for rc, err in zip(rcs, errs):
        lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
        if "Traceback" in err:
            problems.append(f"traceback: {err[-300:]}")
        if rc not in (0, 1):
            problems.append(f"exit {rc}: {err[-300:]}")
        if rc == 1 and len(lines) != 1:
            problems.append(f"refused without one line: {lines}")
    if leftovers(work):
        problems.append(f"leftovers {leftovers(work)}")
    from mtpforge.inspect import inspect_checkpoint

    # the original itself may have findings (a converted Qwen3.5 config still declares the head
    # it lacks): only what the race added counts
    known = {f["code"] for f in inspect_checkpoint(str(pristine))["findings"] if f["severity"] == "error"}
    for folder in [target] + [work / o for o in ("out-a", "out-b") if (work / o).exists()]:
        errors = [f["code"] for f in inspect_checkpoint(str(folder))["findings"]
                  if f["severity"] == "error" and f["code"] not in known]
        if errors:
            problems.append(f"inspect errors in {folder.name}: {errors}")
    if (target / "mtpforge.json").exists():
        r = run_cli(["remove-mtp", str(target)])
        if r.returncode != 0:
            problems.append(f"remove-mtp after the race failed: {r.stderr.strip()[-300:]}")
    if folder_state(target) != original:
        problems.append("the original folder could not be restored: its first state was lost")
    busy = sum("another mtpforge run" in e for e in errs)
    return {"pair": name, "offset": round(offset, 3), "overlapped": overlapped, "exits": rcs, "refused_busy": busy,
            "problems": problems}


def run(n: int, seed: int, root: Path, log: bool = True) -> dict:
    """The soak itself (the test suite runs a small seeded sample through here)."""
    from mtpforge.pipeline import add_mtp
    from tests.support.synth import build_hf_variant, convert_to_mlx

    t0 = time.monotonic()
    source = build_hf_variant("qwen3_5", root / "hf")
    pristine = convert_to_mlx(source, root / "mlx", q_bits=4, q_group_size=64, dtype="bfloat16")
    with_head = root / "with-head"
    shutil.copytree(pristine, with_head)
    add_mtp(source=str(source), target=str(with_head), progress=False)
    probe = root / "probe"
    shutil.copytree(pristine, probe)
    t = time.monotonic()
    assert run_cli(_argv(["add"], source, probe, root / "x")).returncode == 0
    clean = time.monotonic() - t  # one whole add-mtp run on this machine, now
    shutil.rmtree(probe)
    rng = random.Random(seed)
    names = list(PAIRS)
    results = []
    for i in range(n):
        name = names[i % len(names)]
        # most pairs overlap: the second starts while the first starts up, reads, converts or stages
        offset = rng.uniform(0.0, 1.2 * clean)
        res = race_once(name, source, pristine, with_head, root / "work" / str(i), offset)
        shutil.rmtree(root / "work" / str(i), ignore_errors=True)
        results.append(res)
        if log:
            print(f"{i + 1:3d} {name:26s} +{res['offset'] * 1000:5.0f}ms {'overlap' if res['overlapped'] else 'after  '} exits={res['exits']} "
                  + ("ok" if not res["problems"] else f"DAMAGE: {res['problems']}"), flush=True)
    return {
        "pairs": n, "intact": sum(not r["problems"] for r in results),
        "overlapped": sum(r["overlapped"] for r in results),
        "overlapping_refused_busy": sum(r["refused_busy"] > 0 for r in results),
        "by_pair": {p: sum(r["pair"] == p for r in results) for p in names},
        "seconds": round(time.monotonic() - t0, 1), "seed": seed, "results": results,
        "failures": [r for r in results if r["problems"]],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=20, help="racing pairs (default 20)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="soak_race.json")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mtpforge-soak-race-"))
    try:
        s = run(args.n, args.seed, root)
        Path(args.json).write_text(json.dumps(s, indent=2))
        print(json.dumps({k: s[k] for k in ("pairs", "intact", "overlapped", "overlapping_refused_busy", "by_pair", "seconds")}, indent=2))
        print(f"{s['intact']}/{s['pairs']} racing pairs intact")
        return 0 if s["intact"] == s["pairs"] else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
