"""How much does the trunk's quantization cost the head? Acceptance of the same head (kept at
full precision) beside trunks quantized ever lower, on the trained tiny models.

The head was trained on the full-precision backbone's hidden states; a quantized trunk hands it
slightly different ones. If that cost ≥ 3 points somewhere, re-aligning the head to the quantized
trunk (a short fine-tune of the head alone) would be worth building; if it stays under, it is not.

- MLX: ``mlx_lm.convert`` trunks at bf16 and 8/4/3/2 bits (group 64), the head added at bf16
  (``add-mtp --precision bf16``), ``verify --generate`` greedy on verify's prompts plus 20 held-out
  documents, 64 tokens each, depth 1; output identical to plain is checked on every run.
- GGUF: llama.cpp's converter (f32 trunk) and ``llama-quantize`` (Q8_0, Q4_K_M, Q3_K_M, Q2_K),
  the head added at f16, ``llama-server --spec-type draft-mtp`` greedy on the same prompts
  (needs ``scripts/setup_llama_cpp.sh``; ``--no-gguf`` skips it).

    python benchmarks/bench_trunk_quant.py            # ~10 min on 2 cores
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import common as C

sys.path.insert(0, str(C.REPO))

#: the trained tiny models, by head shape
MODELS = {
    "dense (Qwen3.5)": C.REPO / "mtpforge" / "data" / "tiny-qwen3_5",
    "MoE (Qwen3.5-MoE)": C.REPO / "mtpforge" / "data" / "tiny-qwen3_5_moe",
    "MoE (GLM-4.5)": C.REPO / "tests" / "data" / "tiny-glm4_moe-trained",
}
# (the trained DeepSeek-V3-shaped model has no MLX row: mlx-lm's deepseek_v3 drops the head by its
# released index, layer 61, so mlx_lm.convert of the 2-layer tiny model keeps its layer 2 and fails)
MLX_TRUNKS: tuple[int | None, ...] = (None, 8, 4, 3, 2)
GGUF_TRUNKS = ("f32", "Q8_0", "Q4_K_M", "Q3_K_M", "Q2_K")
GGUF_MODELS = ("dense (Qwen3.5)", "MoE (Qwen3.5-MoE)")  # the shapes the llama.cpp suite trains and converts


def mlx_row(name: str, model: Path, work: Path) -> dict[str, Any]:
    from mtpforge.community import convert_to_mlx
    from mtpforge.pipeline import add_mtp
    from mtpforge.verify import verify
    from tests.gguf_env import prompts

    row: dict[str, Any] = {}
    for bits in MLX_TRUNKS:
        label = "bf16" if bits is None else f"{bits}-bit"
        d = work / f"{model.name}-{label}"
        shutil.rmtree(d, ignore_errors=True)
        convert_to_mlx(model, d, q_bits=bits)
        add_mtp(source=str(model), target=str(d), precision="bf16", progress=False)
        r = verify(str(d), generate=True, prompts=prompts(), max_tokens=64, progress=False)
        row[label] = {"acceptance": round(r["acceptance"], 4), "drafted": r["drafted"], "accepted": r["accepted"],
                      "identical": r["identical"]}
        print(f"MLX  {name:20s} {label:6s} {r['acceptance']:.1%} ({r['accepted']}/{r['drafted']}) identical={r['identical']}",
              flush=True)
        shutil.rmtree(d, ignore_errors=True)
    return row


def gguf_row(name: str, model: Path, work: Path) -> dict[str, Any]:
    from tests.gguf_env import measure, trunk_copy

    row: dict[str, Any] = {}
    for qt in GGUF_TRUNKS:
        d = work / f"{model.name}-{qt}"
        shutil.rmtree(d, ignore_errors=True)
        trunk = trunk_copy(model, d, qt)
        plain = measure(trunk)
        head = d / "mtp-f16.gguf"
        r = subprocess.run([sys.executable, "-m", "mtpforge", "add-mtp", "--source", str(model), "--target", str(trunk),
                            "--precision", "f16", "--output", str(head), "--json"],
                           capture_output=True, text=True, cwd=C.REPO, env=C.child_env())
        assert r.returncode == 0, r.stderr
        m = measure(trunk, draft=head)
        same = m["tokens"] == plain["tokens"]
        row[qt] = {"acceptance": round(m["acceptance"], 4), "drafted": m["drafted"], "accepted": m["accepted"],
                   "identical": same}
        print(f"GGUF {name:20s} {qt:6s} {m['acceptance']:.1%} ({m['accepted']}/{m['drafted']}) identical={same}", flush=True)
        shutil.rmtree(d, ignore_errors=True)
    return row


def loss(row: dict[str, Any]) -> float:
    """Points lost from the full-precision trunk (the first column) to the worst quantized one."""
    values = [v["acceptance"] for v in row.values()]
    return round(100 * (values[0] - min(values[1:])), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-gguf", action="store_true", help="MLX trunks only (no llama.cpp needed)")
    a = ap.parse_args()
    work = C.workdir("trunk-quant")
    results: dict[str, dict[str, Any]] = {"mlx": {}, "gguf": {}}
    for name, model in MODELS.items():
        results["mlx"][name] = mlx_row(name, model, work)
    if not a.no_gguf:
        for name in GGUF_MODELS:
            results["gguf"][name] = gguf_row(name, MODELS[name], work)
    for fmt, trunks in (("mlx", ["bf16"] + [f"{b}-bit" for b in MLX_TRUNKS[1:]]), ("gguf", list(GGUF_TRUNKS))):
        rows = [[name, *(f"{row[t]['acceptance']:.1%}" + ("" if row[t]["identical"] else " (differs!)") for t in trunks),
                 loss(row)] for name, row in results[fmt].items()]
        if rows:
            print(C.table(f"{fmt.upper()}: acceptance of a full-precision head by trunk quantization",
                          ["head shape", *trunks, "points lost (worst)"], rows))
    path = C.write_result("trunk_quant", {"prompts": 24, "max_tokens": 64, "results": results,
                                          "loss": {f"{fmt} {n}": loss(r) for fmt in results for n, r in results[fmt].items()}})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
