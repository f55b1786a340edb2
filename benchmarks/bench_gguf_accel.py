"""llama.cpp drafting with mtpforge's MTP files on an accelerator (CUDA) beside its CPU backend:
is the output still identical to plain decoding when the verifier runs on a GPU, is acceptance
what the CPU measured, and what does drafting do to decode speed?

Why a second backend matters: a draft is accepted when the trunk's verification of two tokens
at once picks the same token as one at a time. On a GPU the two-token batch may take other
kernels (matrix-matrix instead of matrix-vector), so greedy outputs can differ from plain
decoding on near ties — that would be the runtime's numerics, not the head; this script tells.

Two steps, because the machine with the accelerator may have no network and no MLX:

    python benchmarks/bench_gguf_accel.py prepare DIR          # here: trunks + mtpforge heads
    python benchmarks/bench_gguf_accel.py measure DIR --llama-server BIN [--ngl 99] [--out F]

``prepare`` needs scripts/setup_llama_cpp.sh (the converter and llama-quantize) and writes, per
trained tiny model, llama.cpp's f32 / Q8_0 / Q4_K_M trunks and the MTP file add-mtp writes
beside each (default precision), plus ``prompts.json``. ``measure`` needs only the standard
library and ``mtpforge.gguf.server``; it runs llama-server plain and with ``--spec-type
draft-mtp`` per trunk and writes one JSON row per (model, trunk): tokens identical, drafted,
accepted, and tokens per second with and without drafting.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TRUNKS = ("f32", "Q8_0", "Q4_K_M")
#: models whose converter export drafts in llama.cpp: its MTP-only file runs beside mtpforge's,
#: so a difference from plain decoding that both show is the runtime's, not the head's
CONTROLS = ("qwen3_5", "qwen3_5_moe", "glm4_moe", "nemotron_h")
N_PREDICT = 64


def _models() -> dict[str, tuple[Path, str, str]]:
    """name -> (trained folder, the converter's --pre, which export is the head-less trunk)."""
    data, tests = REPO / "mtpforge" / "data", REPO / "tests" / "data"
    return {
        "qwen3_5": (data / "tiny-qwen3_5", "qwen35", "trunk"),
        "qwen3_5_moe": (data / "tiny-qwen3_5_moe", "qwen35", "trunk"),
        "glm4_moe": (tests / "tiny-glm4_moe-trained", "glm4", "trunk"),
        "glm4_moe_lite": (tests / "tiny-glm4_moe_lite-trained", "glm4", "trunk"),
        "nemotron_h": (tests / "tiny-nemotron_h-trained", "qwen35", "trunk"),
        # the converter drops DeepSeek-V3's head: its full export is the head-less trunk
        "deepseek_v3": (tests / "tiny-deepseek_v3-trained", "deepseek-v3", "full"),
        "mimo_v2_flash": (tests / "tiny-mimo_v2_flash-trained", "qwen35", "trunk"),
    }


def prepare(root: Path, only: list[str] | None) -> None:
    from tests import gguf_env

    root.mkdir(parents=True, exist_ok=True)
    (root / "prompts.json").write_text(json.dumps(gguf_env.prompts()))
    for name, (folder, pre, mode) in _models().items():
        if only and name not in only:
            continue
        base = gguf_env.official(folder, mode, "f32", pre=pre)
        for qt in TRUNKS:
            src = base if qt == "f32" else gguf_env.quantized(base, qt)
            d = root / name / qt
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)
            trunk = Path(shutil.copyfile(src, d / f"{name}-{qt}.gguf"))
            r = gguf_env.mtpforge("add-mtp", "--source", str(folder), "--target", str(trunk), "--json")
            if r.returncode != 0:
                raise SystemExit(f"add-mtp failed for {name} {qt}: {r.stderr.strip()}")
            head = Path(json.loads(r.stdout)["output"])
            pair = {"trunk": trunk.name, "head": head.name}
            if mode == "trunk" and name in CONTROLS:  # the converter's own MTP-only file: a control
                pair["control"] = Path(shutil.copyfile(gguf_env.official(folder, "mtp", "f32", pre=pre),
                                                       d / "official-mtp-f32.gguf")).name
            (d / "pair.json").write_text(json.dumps(pair))
            print(f"{name} {qt}: {trunk.name} + {head.name}", flush=True)


def _decode(server: Path, trunk: Path, draft: Path | None, prompts: list[str], ngl: int, threads: int) -> dict[str, Any]:
    from mtpforge.gguf.server import decode_all, llama_server

    extra = ["-ngl", str(ngl)]
    with llama_server(server, trunk, draft=draft, threads=threads, extra=extra) as srv:
        srv.complete(prompts[0], 8)  # warm-up: kernels loaded, graphs built
        t0 = time.perf_counter()
        outs = decode_all(srv, prompts, N_PREDICT)
        wall = time.perf_counter() - t0
    n = sum(len(c.tokens) for c in outs)
    d, a = sum(c.drafted for c in outs), sum(c.accepted for c in outs)
    rates = [c.tok_s for c in outs if c.tok_s]
    return {"tokens": [c.tokens for c in outs], "generated": n, "drafted": d, "accepted": a,
            "acceptance": round(a / d, 4) if d else 0.0, "wall_s": round(wall, 3),
            "tok_s_server_mean": round(sum(rates) / len(rates), 1) if rates else None,
            "tok_s_wall": round(n / wall, 1) if wall else None}


def measure(root: Path, server: Path, ngl: int, threads: int, out: Path | None) -> list[dict[str, Any]]:
    prompts = json.loads((root / "prompts.json").read_text())
    rows: list[dict[str, Any]] = []
    for pair in sorted(root.glob("*/*/pair.json")):
        d = pair.parent
        p = json.loads(pair.read_text())
        trunk, head = d / p["trunk"], d / p["head"]
        row: dict[str, Any] = {"model": d.parent.name, "trunk": d.name, "ngl": ngl}
        try:
            plain = _decode(server, trunk, None, prompts, ngl, threads)
            mtp = _decode(server, trunk, head, prompts, ngl, threads)
        except Exception as e:  # one failing pair is a row, not the end of the run
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        else:
            same = sum(a == b for a, b in zip(plain["tokens"], mtp["tokens"]))
            first = next((i for i, (a, b) in enumerate(zip(plain["tokens"], mtp["tokens"])) if a != b), None)
            if p.get("control"):
                ctl = _decode(server, trunk, d / p["control"], prompts, ngl, threads)
                row["control_prompts_identical"] = f"{sum(a == b for a, b in zip(plain['tokens'], ctl['tokens']))}/{len(prompts)}"
                row["control_acceptance"] = ctl["acceptance"]
                row["control_same_as_ours"] = ctl["tokens"] == mtp["tokens"]
            row.update({"identical": same == len(prompts), "prompts_identical": f"{same}/{len(prompts)}",
                        "first_differing_prompt": first, "drafted": mtp["drafted"], "accepted": mtp["accepted"],
                        "acceptance": mtp["acceptance"], "plain_tok_s": plain["tok_s_wall"], "mtp_tok_s": mtp["tok_s_wall"],
                        "plain_server_tok_s": plain["tok_s_server_mean"], "mtp_server_tok_s": mtp["tok_s_server_mean"],
                        "speedup_wall": round(plain["wall_s"] / mtp["wall_s"], 3) if mtp["wall_s"] else None})
        rows.append(row)
        print(json.dumps(row), flush=True)
        if out is not None:
            out.write_text(json.dumps({"host": platform.node(), "server": str(server), "rows": rows}, indent=1))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("dir", type=Path)
    p.add_argument("--models", default="", help="comma-separated subset of the trained models")
    m = sub.add_parser("measure")
    m.add_argument("dir", type=Path)
    m.add_argument("--llama-server", type=Path, required=True)
    m.add_argument("--ngl", type=int, default=99, help="layers offloaded to the accelerator (0: CPU)")
    m.add_argument("--threads", type=int, default=4)
    m.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.cmd == "prepare":
        prepare(a.dir, [s for s in a.models.split(",") if s] or None)
    else:
        measure(a.dir, a.llama_server, a.ngl, a.threads, a.out)


if __name__ == "__main__":
    main()
