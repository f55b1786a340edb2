#!/usr/bin/env python3
"""Measure acceptance against head precision for each head shape, on the trained tiny models, and
write the table add-mtp's precision warning reads.

Shapes and the trained model each is measured on (``SHAPES``): dense (Qwen3.5,
``mtpforge/data/tiny-qwen3_5``), MoE (Qwen3.6-style, ``mtpforge/data/tiny-qwen3_5_moe``), MLA
(GLM-4.7-Flash, ``tests/data/tiny-glm4_moe_lite-trained``) and hybrid (Nemotron-H,
``tests/data/tiny-nemotron_h-trained``).

- MLX: ``mlx_lm.convert`` to an 8-bit group-64 trunk (the same trunk for every head, so only the
  head's precision varies; an unquantized trunk cannot take a quantized head: add-mtp writes the
  head's per-module entries into a config.json that has no default ``group_size``, which mlx-lm's
  loader then reads), then for each precision ``add-mtp --precision P --force`` and
  ``verify --generate`` (post-norm hidden state, ``PROMPTS`` prompts x 64 tokens): acceptance,
  output identical to plain decoding.
- GGUF (``--gguf``, llama.cpp built): the converter's f32 ``--no-mtp`` trunk, ``add-mtp --precision
  f16 / q8_0``, llama-server's own draft counters (tests/gguf_env.py, 24 prompts x 64 tokens).

The knee of a shape is the lowest MLX bit width whose acceptance, and that of every wider one, is
within ``TOLERANCE`` of the bf16 head's. Writes ``mtpforge/data/head_precision.json`` (the numbers,
the knees, which families each shape covers) and ``docs/PRECISION.md``. Run from the repository
root: ``python scripts/measure_precision.py [--gguf] [--only mla,hybrid]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: shape -> (the trained model it is measured on, the converter's pre-tokenizer, the families whose head has that shape)
SHAPES: dict[str, tuple[Path, str, tuple[str, ...]]] = {
    "dense": (ROOT / "mtpforge" / "data" / "tiny-qwen3_5", "qwen35", ("qwen3_5",)),
    "moe": (ROOT / "mtpforge" / "data" / "tiny-qwen3_5_moe", "qwen35", ("qwen3_5_moe", "qwen3_next", "glm4_moe", "step3p5")),
    "mla": (ROOT / "tests" / "data" / "tiny-glm4_moe_lite-trained", "glm4",
            ("glm4_moe_lite", "deepseek_v3", "deepseek_v32", "glm_moe_dsa")),
    "hybrid": (ROOT / "tests" / "data" / "tiny-nemotron_h-trained", "qwen35", ("nemotron_h",)),
}
MLX_PRECISIONS = ("bf16", "8", "6", "5", "4", "3", "2")
GGUF_PRECISIONS = ("f16", "q8_0")
#: the lower types users' "-mtp" GGUFs come in, made by llama-quantize from mtpforge's f16 head
#: (add-mtp writes none of them); its K- and IQ-quants need rows of 256, so on these tiny heads'
#: 64-wide rows some tensors fall back to another type — counted per cell
GGUF_LOW = ("Q4_0", "Q3_K_S", "Q2_K", "IQ3_S")
#: a head precision that loses more than this against bf16 is past the knee (about the noise of
#: a few hundred drafts; the issue's line for a trunk's cost)
TOLERANCE = 0.03
#: verify's prompts per measurement (its 4 defaults and held-out documents), 64 tokens each
PROMPTS = 12
TABLE = ROOT / "mtpforge" / "data" / "head_precision.json"
DOC = ROOT / "docs" / "PRECISION.md"


def _prompts() -> list[str]:
    from tests.gguf_env import prompts

    return prompts()[:PROMPTS]


def measure_mlx(model: Path, work: Path) -> dict[str, dict[str, Any]]:
    from mtpforge.community import convert_to_mlx
    from mtpforge.pipeline import add_mtp
    from mtpforge.verify import verify

    target = convert_to_mlx(model, work / "8bit", q_bits=8, q_group_size=64, dtype="float32")
    out: dict[str, dict[str, Any]] = {}
    for p in MLX_PRECISIONS:
        with contextlib.redirect_stdout(io.StringIO()):
            add_mtp(source=str(model), target=str(target), precision=p, force=True, progress=False)
        r = verify(str(target), generate=True, prompts=_prompts(), hidden="post", progress=False)
        out[p] = {"acceptance": round(float(r["acceptance"]), 4), "drafted": r["drafted"], "accepted": r["accepted"],
                  "identical": r["identical"]}
        print(f"  mlx {p:>4}: {out[p]['acceptance']:.1%} ({r['accepted']}/{r['drafted']}), identical {r['identical']}")
    return out


def measure_gguf(model: Path, pre: str, work: Path) -> dict[str, dict[str, Any]]:
    from tests import gguf_env

    out: dict[str, dict[str, Any]] = {}
    for p in GGUF_PRECISIONS:
        trunk = gguf_env.trunk_copy(model, work / p, "f32", pre=pre)
        r = gguf_env.mtpforge("add-mtp", "--source", str(model), "--target", str(trunk), "--precision", p, "--json")
        if r.returncode != 0:
            out[p] = {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
            continue
        head = Path(json.loads(r.stdout)["output"])
        m = gguf_env.measure(trunk, draft=head)
        out[p] = {"acceptance": round(m["acceptance"], 4), "drafted": m["drafted"], "accepted": m["accepted"]}
        print(f"  gguf {p:>4}: {m['acceptance']:.1%} ({m['accepted']}/{m['drafted']})")
        if p != "f16":
            continue
        for q in GGUF_LOW:
            low = head.with_name(f"low-{q}.gguf")
            qr = subprocess.run([str(gguf_env.BIN / "llama-quantize"), "--allow-requantize", str(head), str(low), q],
                                capture_output=True, text=True)
            if qr.returncode != 0:
                out[q] = {"error": f"llama-quantize {q} failed"}
                continue
            fb = re.search(r"(\d+) of (\d+) tensor\(s\) required fallback", qr.stdout + qr.stderr)
            m = gguf_env.measure(trunk, draft=low)
            out[q] = {"acceptance": round(m["acceptance"], 4), "drafted": m["drafted"], "accepted": m["accepted"],
                      "fallback": f"{fb.group(1)}/{fb.group(2)}" if fb else "0"}
            print(f"  gguf {q:>6}: {m['acceptance']:.1%} ({m['accepted']}/{m['drafted']}), fallback {out[q]['fallback']}")
    return out


def knee(mlx: dict[str, dict[str, Any]]) -> int | None:
    """The lowest measured bit width from which every wider one keeps bf16's acceptance within
    ``TOLERANCE`` (None: not even 8 bits does)."""
    ref = mlx["bf16"]["acceptance"]
    best = None
    for bits in sorted((int(p) for p in mlx if p.isdigit()), reverse=True):
        if mlx[str(bits)]["acceptance"] < ref - TOLERANCE:
            break
        best = bits
    return best


def render(table: dict[str, Any]) -> str:
    shapes = table["shapes"]
    cols = list(MLX_PRECISIONS)
    lines = [
        "# Head precision and acceptance",
        "",
        "How far an MTP head can be quantized before its drafts suffer, per head shape, measured on the",
        "trained tiny models by `scripts/measure_precision.py` (numbers in `mtpforge/data/head_precision.json`,",
        "which `add-mtp` reads). Each MLX figure is `verify --generate` on one 8-bit trunk per shape (only the",
        f"head's precision varies; {table['prompts']} prompts x 64 tokens, greedy, depth 1, post-norm hidden state),",
        "output identical to plain decoding in every cell. The knee is the lowest bit width from which every",
        f"wider one keeps the bf16 head's acceptance within {table['tolerance'] * 100:.0f} points; `add-mtp --precision BITS`",
        "below a shape's knee writes the head and says so in a note (one line; the head is still written).",
        "",
        "| shape (measured on) | " + " | ".join(c if c == "bf16" else f"{c}-bit" for c in cols) + " | knee |",
        "|---|" + "---|" * (len(cols) + 1),
    ]
    for name, s in shapes.items():
        cells = [f"{s['mlx'][c]['acceptance']:.1%}" if c in s["mlx"] else "" for c in cols]
        k = f"{s['knee_bits']}-bit" if s["knee_bits"] else "above 8-bit"
        lines.append(f"| {name} (`{s['model']}`) | " + " | ".join(cells) + f" | {k} |")
    if any(s.get("gguf") for s in shapes.values()):
        gcols = [c for c in (*GGUF_PRECISIONS, *GGUF_LOW) if any(c in (s.get("gguf") or {}) for s in shapes.values())]
        lines += ["", "GGUF heads (`add-mtp --precision`) beside the converter's f32 trunk, llama-server's own draft counters",
                  "(24 prompts x 64 tokens); the lower types are llama-quantize's of the f16 head (add-mtp",
                  "writes none of them), with the share of its tensors that fell back to another type (its K- and",
                  "IQ-quants need rows of 256; these heads' rows are 64 wide, so those columns mostly measure the",
                  "fallback type, and only Q4_0 quantizes every matrix):", "",
                  "| shape | " + " | ".join(gcols) + " |", "|---|" + "---|" * len(gcols)]

        def cell(g: dict[str, Any], p: str) -> str:
            c = g.get(p, {})
            if "acceptance" not in c:
                return str(c.get("error", ""))
            return f"{c['acceptance']:.1%}" + (f" (fallback {c['fallback']})" if c.get("fallback", "0") != "0" else "")

        for name, s in shapes.items():
            g = s.get("gguf") or {}
            lines.append(f"| {name} | " + " | ".join(cell(g, p) for p in gcols) + " |")
    lines += ["", "Families per shape (the knee `add-mtp` applies to each): "
              + "; ".join(f"{n}: {', '.join(f'`{f}`' for f in s['families'])}" for n, s in shapes.items()) + ".",
              "", f"Measured {table['measured']} ({table['machine']}). Each cell rests on 320-480 drafts: two or",
              "three points either way are noise (a 3-bit head above its 4-bit one is that noise), so a knee",
              "says where these tiny heads bent, not where a real model's will.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", action="store_true", help="also measure GGUF heads in llama-server (llama.cpp built)")
    ap.add_argument("--gguf-only", action="store_true", help="measure the GGUF heads only (the MLX rows kept from the table)")
    ap.add_argument("--only", default="", help="comma-separated shapes to measure again (the others kept from the table)")
    ap.add_argument("--render-only", action="store_true", help="rewrite docs/PRECISION.md from the table, measuring nothing")
    a = ap.parse_args(argv)
    if a.render_only:
        DOC.write_text(render(json.loads(TABLE.read_text())), encoding="utf-8")
        return 0
    only = [s for s in a.only.split(",") if s] or list(SHAPES)
    old = json.loads(TABLE.read_text()) if TABLE.is_file() else {"shapes": {}}
    table = {"tolerance": TOLERANCE, "prompts": PROMPTS, "measured": time.strftime("%Y-%m-%d"),
             "machine": f"{platform.system()} {platform.machine()}, mlx CPU", "shapes": dict(old.get("shapes", {}))}
    with tempfile.TemporaryDirectory(prefix="mtpforge-precision-") as tmp:
        for name in only:
            model, pre, families = SHAPES[name]
            print(f"{name}: {model.relative_to(ROOT)}")
            mlx = table["shapes"][name]["mlx"] if a.gguf_only else measure_mlx(model, Path(tmp) / name)
            row = {"model": str(model.relative_to(ROOT)), "families": list(families), "mlx": mlx, "knee_bits": knee(mlx)}
            if a.gguf or a.gguf_only:
                row["gguf"] = measure_gguf(model, pre, Path(tmp) / f"{name}-gguf")
            table["shapes"][name] = row
            shutil.rmtree(Path(tmp) / name, ignore_errors=True)
            table["shapes"] = {k: table["shapes"][k] for k in SHAPES if k in table["shapes"]}
            TABLE.write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
            DOC.write_text(render(table), encoding="utf-8")
    print(f"wrote {TABLE.relative_to(ROOT)} and {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
