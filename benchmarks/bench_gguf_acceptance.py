"""llama.cpp's own draft acceptance for mtpforge's MTP GGUFs, by trunk quantization and head
precision, beside the official heads — the figures the README reports and the default precision
was chosen from.

For the trained dense and MoE tiny models, trunks made by llama.cpp's converter (f32) and
llama-quantize (Q8_0, Q4_K_M): llama-server greedy, 24 prompts x 64 tokens, --spec-draft-n-max 1.
Rows: mtpforge's head at f32 / f16 / bf16 / q8_0 (beside the trunk's own token_embd/output), the
official MTP block grafted beside the same trunk tensors (same embedding choice), and the
official MTP-only file (its own f32 embedding copies). Every run's output is checked identical
to plain decoding.

    python benchmarks/bench_gguf_acceptance.py        # needs scripts/setup_llama_cpp.sh (~10 min)
"""

from __future__ import annotations

import subprocess
import sys

import common as C

sys.path.insert(0, str(C.REPO))

from tests.gguf_env import MODELS, graft, measure, official, trunk_copy  # noqa: E402

PRECISIONS = ("f32", "f16", "bf16", "q8_0")
TRUNKS = ("f32", "Q8_0", "Q4_K_M")


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default="dense,moe", help="comma-separated: dense, moe")
    ap.add_argument("--trunks", default=",".join(TRUNKS), help="comma-separated trunk types")
    a = ap.parse_args()
    work = C.workdir("gguf-acceptance")
    results: dict[str, dict[str, dict]] = {}
    rows = []
    for kind in a.kinds.split(","):
        for qt in a.trunks.split(","):
            d = work / f"{kind}-{qt}"
            if d.exists():
                subprocess.run(["rm", "-rf", str(d)], check=True)
            trunk = trunk_copy(MODELS[kind], d, qt)
            plain = measure(trunk)
            cells: dict[str, dict] = {}
            for p in PRECISIONS:
                out = d / p
                out.mkdir()
                r = subprocess.run([sys.executable, "-m", "mtpforge", "add-mtp", "--source", str(MODELS[kind]), "--target",
                                    str(trunk), "--precision", p, "--output", str(out / f"mtp-{p}.gguf"), "--json"],
                                   capture_output=True, text=True, cwd=C.REPO, env=C.child_env())
                assert r.returncode == 0, r.stderr
                cells[f"mtpforge {p}"] = measure(trunk, draft=out / f"mtp-{p}.gguf")
            cells["official block, trunk's embeddings"] = measure(trunk, draft=graft(official(MODELS[kind], "mtp", "f32"), trunk, d / "graft" / "mtp-g.gguf"))
            cells["official MTP-only file (f32 embeddings)"] = measure(trunk, draft=official(MODELS[kind], "mtp", "f32"))
            key = f"{kind} / {qt} trunk"
            results[key] = {}
            for name, m in cells.items():
                same = m["tokens"] == plain["tokens"]
                results[key][name] = {"drafted": m["drafted"], "accepted": m["accepted"], "acceptance": round(m["acceptance"], 4),
                                      "identical": same}
                rows.append([key, name, f"{m['accepted']}/{m['drafted']}", f"{m['acceptance']:.1%}", same])
                print(f"{key:22s} {name:42s} {m['accepted']:4d}/{m['drafted']:4d} {m['acceptance']:.1%} identical={same}", flush=True)
    print(C.table("llama.cpp draft-mtp acceptance (greedy, 24 prompts x 64 tokens, n-max 1)",
                  ["trunk", "head", "accepted", "acceptance", "identical"], rows))
    path = C.write_result("gguf_acceptance" + ("" if a.kinds == "dense,moe" else "_" + a.kinds.replace(",", "_")),
                          {"prompts": 24, "max_tokens": 64, "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
