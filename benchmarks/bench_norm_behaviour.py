"""How many hand-broken norm conventions ``inspect`` finds without ``--source`` and offline, and
what the behavioural check costs.

For each bundled trained model: ``mlx_lm.convert`` (4-bit), a correct bf16 head written "by
another tool" (no manifest), then every breakage — all norms raw, all +2, and each of the seven
norm groups alone at -1 (raw) and at +1 (+2), 17 folders per model. Default mode runs the
decision on one probe per model (the backbone pass and the head are the same for every broken
copy; only the stored norms differ), which is exactly what inspect decides on; ``--folders``
runs ``mtpforge inspect FOLDER --json`` in a child process per broken folder instead (slow:
about half a minute each on a busy 2-core machine) and reports its wall time.

    python benchmarks/bench_norm_behaviour.py [--folders]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import mlx.core as mx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.common import child_env, environment, markdown_table, mtpforge_cmd, run_measured, table, workdir, write_result  # noqa: E402
from mtpforge.checks import norm_behaviour as nb  # noqa: E402
from mtpforge.families.tables import NORM_SUFFIXES  # noqa: E402
from mtpforge.pipeline import add_mtp  # noqa: E402
from tests.support.synth import convert_to_mlx  # noqa: E402

DATA = HERE.parent / "mtpforge" / "data"
MODELS = {"dense": DATA / "tiny-qwen3_5", "moe": DATA / "tiny-qwen3_5_moe"}
CODE = {"shifted": None, "raw": "MTP_NORMS_RAW", "double-shifted": "MTP_NORMS_DOUBLE_SHIFTED",
        "mixed": "MTP_NORMS_MIXED", "unknown": "NORM_CONVENTION_UNKNOWN"}


def cases() -> dict[str, tuple[dict[str, int], str]]:
    out = {"correct": ({}, "shifted"), "all raw": ({g: -1 for g in NORM_SUFFIXES}, "raw"),
           "all +2": ({g: 1 for g in NORM_SUFFIXES}, "double-shifted")}
    for g in NORM_SUFFIXES:
        out[f"{g.removesuffix('.weight')} raw"] = ({g: -1}, "mixed")
        out[f"{g.removesuffix('.weight')} +2"] = ({g: 1}, "mixed")
    return out


def third_party(kind: str) -> Path:
    t = workdir("norm-behaviour") / kind
    if not (t / "config.json").is_file():
        shutil.rmtree(t, ignore_errors=True)
        convert_to_mlx(MODELS[kind], t)
        add_mtp(source=str(MODELS[kind]), target=str(t), layout="embedded", precision="bf16", progress=False)
        (t / "mtpforge.json").unlink()
    return t


def broken_folder(base: Path, name: str, offsets: dict[str, int]) -> Path:
    dst = base.parent / f"{base.name}-{name.replace(' ', '_').replace('+', 'p')}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(base, dst)
    f = dst / "model-mtp.safetensors"
    t = dict(mx.load(str(f)))
    for k, v in list(t.items()):
        o = offsets.get(nb.group_of(k.removeprefix("language_model.mtp.")) or "", 0)
        if o:
            t[k] = (v.astype(mx.float32) + o).astype(v.dtype)
    tmp = f.with_name("tmp.safetensors")
    mx.save_safetensors(str(tmp), t, metadata={"format": "mlx"})
    tmp.replace(f)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folders", action="store_true", help="inspect each broken folder in a child process")
    ap.add_argument("--only", action="append", default=[], metavar="TEXT",
                    help="run only the breakages whose name contains TEXT (repeatable); the result file gets no update")
    args = ap.parse_args()
    rows, runs = [], []
    for kind, model in MODELS.items():
        if not (model / "config.json").is_file():
            continue
        base = third_party(kind)
        t0 = time.perf_counter()
        pr = nb.probe(base) if not args.folders else None
        probe_s = time.perf_counter() - t0
        for name, (offsets, want) in cases().items():
            if args.only and not any(o in name for o in args.only):
                continue
            t1 = time.perf_counter()
            if args.folders:
                folder = broken_folder(base, name, offsets)
                m = run_measured(mtpforge_cmd("inspect", str(folder), "--json"), env=child_env(HF_HUB_OFFLINE="1"), check=False)
                rep = json.loads(m.stdout)
                got = rep["norm_convention"]
                codes = {f["code"] for f in rep["findings"]}
                cost = rep.get("norm_behaviour", {}).get("cost", {})
                passes, secs = cost.get("head_passes"), m.wall_s
                shutil.rmtree(folder)
            else:
                p = pr.broken(offsets)
                got = nb.decide(p)[0]
                codes = {CODE[got]} - {None}
                passes, secs = p.passes, time.perf_counter() - t1
            found = (CODE[want] in codes) if CODE[want] else not (codes & {c for c in CODE.values() if c} - {"NORM_CONVENTION_UNKNOWN"})
            # not found, but inspect says which group it cannot decide (--folders only)
            flagged = not found and "NORM_CONVENTION_PARTIAL" in codes
            runs.append({"model": kind, "case": name, "expected": want, "got": got, "found": found, "flagged": flagged,
                         "codes": sorted(codes), "head_passes": passes, "seconds": round(secs, 2)})
            rows.append([kind, name, want, got, "yes" if found else ("undecided" if flagged else "NO"), passes, f"{secs:.1f}"])
            print(" | ".join(str(c) for c in rows[-1]), flush=True)
        if pr is not None:
            runs.append({"model": kind, "probe_seconds": round(probe_s, 2), "positions": int(pr.logp.shape[0]),
                         "backbone_passes": pr.backbone_passes})
    headers = ["model", "breakage", "truth", "inspect says", "found", "head passes", "seconds"]
    defects = [r for r in runs if "case" in r and r["expected"] != "shifted"]
    clean = [r for r in runs if "case" in r and r["expected"] == "shifted"]
    summary = {"defects_found": sum(r["found"] for r in defects), "defects": len(defects),
               "defects_said_undecided": sum(r["flagged"] for r in defects),
               "clean_without_error": sum(r["found"] for r in clean), "clean": len(clean)}
    print(table("norm convention by behaviour (no --source, offline)", headers, rows))
    print(summary)
    if args.only:
        return
    write_result("norm_behaviour" + ("_folders" if args.folders else ""), {
        "environment": environment(), "mode": "folders" if args.folders else "decide", "summary": summary,
        "runs": runs, "markdown": markdown_table(headers, rows)})


if __name__ == "__main__":
    main()
