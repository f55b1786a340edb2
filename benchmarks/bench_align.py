"""What ``mtpforge align`` wins back on quantized trunks, measured through the command itself.

The bundled dense tiny model through the real ``mlx_lm.convert`` at each trunk precision, its
head put back by ``add-mtp`` (full precision, and at the trunk's own bits: add-mtp's default for
a dense head), then ``align`` with its defaults: acceptance before and after as ``verify
--generate`` measures it (verify's 4 prompts, 64 tokens, greedy, depth 1; output identical to
plain decoding is checked on both), and the wall time on this machine. The bf16 trunk is the
control: what the fine-tune gives where the trunk costs nothing.

    python benchmarks/bench_align.py                      # ~25 min on 2 busy cores
    python benchmarks/bench_align.py --cells 2-bit:bf16   # one cell
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from typing import Any

import common as C

sys.path.insert(0, str(C.REPO))

MODEL = C.REPO / "mtpforge" / "data" / "tiny-qwen3_5"
CELLS = "bf16:bf16,4-bit:bf16,3-bit:bf16,2-bit:bf16,4-bit:match,2-bit:match"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default=CELLS, help="trunk:head pairs (trunk bf16 or N-bit; head bf16 or match)")
    ap.add_argument("--steps", type=int, default=None, help="align's --steps (default: align's own)")
    a = ap.parse_args()

    from mtpforge.align import DEFAULT_STEPS, align
    from mtpforge.community import convert_to_mlx
    from mtpforge.pipeline import add_mtp
    from mtpforge.verify import verify

    steps = a.steps or DEFAULT_STEPS
    work = C.workdir("align-cmd")
    results: dict[str, Any] = {}
    rows = []
    for cell in a.cells.split(","):
        trunk, head = cell.split(":")
        bits = None if trunk == "bf16" else int(trunk.split("-")[0])
        d = work / f"{trunk}-{head}"
        shutil.rmtree(d, ignore_errors=True)
        convert_to_mlx(MODEL, d, q_bits=bits)
        add_mtp(source=str(MODEL), target=str(d), precision=head, progress=False)
        t0 = time.perf_counter()
        r = align(str(d), steps=steps, progress=False)
        wall = time.perf_counter() - t0
        v = verify(str(d), generate=True, progress=False)  # the folder as written, by verify itself
        results[cell] = {"before": r["before"]["acceptance"], "after": r["after"]["acceptance"], "status": r["status"],
                         "verify_after": v["acceptance"], "identical": v["identical"],
                         "requantized": r["requantized_modules"], "text_seconds": r["text_seconds"],
                         "train_seconds": r["train_seconds"], "wall_seconds": round(wall, 1)}
        rows.append([trunk, head, f"{r['before']['acceptance']:.1%}", f"{r['after']['acceptance']:.1%}", r["status"],
                     f"{v['acceptance']:.1%}", v["identical"], f"{wall:.0f}"])
        print(cell, results[cell], flush=True)
        shutil.rmtree(d, ignore_errors=True)
    print(C.table(f"mtpforge align ({steps} steps) on the dense tiny model",
                  ["trunk", "head", "before", "after", "status", "verify after", "identical", "seconds"], rows))
    path = C.write_result("align-cmd", {"steps": steps, "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
