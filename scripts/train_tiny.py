#!/usr/bin/env python3
"""Train the bundled tiny Qwen3.5 models (dense and MoE) and their MTP heads; export them in
Hugging Face layout to mtpforge/data/. A thin shell over ``tests.support.synth.train_bundle``.

Takes a few minutes per model on a 2-core CPU. Optional, for speed only (never needed by the
product): preload the system OpenBLAS, whose fp32 matmul is much faster than the mlx CPU wheel's,

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 OPENBLAS_NUM_THREADS=1 \\
        python scripts/train_tiny.py --model qwen3_5

Same seed, same BLAS and thread count: the same run (two runs here had identical loss curves; the
bundled models were made exactly as above, on Linux x86-64). Another BLAS or thread count sums in another order and ends
at slightly different weights of the same quality. ``--check-only`` re-measures an exported
folder (convert + add-mtp + verify, and the known conversion bugs) without training.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.synth.train import VARIANT_OF, TrainSettings  # noqa: E402
from tests.support.synth.train_bundle import build_bundled, folder_name, recheck  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=[*VARIANT_OF, "all"], default="all")
    p.add_argument("--out", default=str(ROOT / "mtpforge" / "data"), help="folder that receives tiny-<model>/")
    p.add_argument("--no-check", action="store_true", help="skip the convert + add-mtp self-check")
    p.add_argument("--check-only", action="store_true",
                   help="do not train: re-run the convert + add-mtp checks on the exported folder(s)")
    defaults = TrainSettings()
    for f in dataclasses.fields(TrainSettings):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(defaults, f.name)), default=None)
    a = p.parse_args(argv)
    names = list(VARIANT_OF) if a.model == "all" else [a.model]
    for name in names:
        if a.check_only:
            recheck(Path(a.out) / folder_name(name))
            continue
        given = {f.name: getattr(a, f.name) for f in dataclasses.fields(TrainSettings) if getattr(a, f.name) is not None}
        build_bundled(name, a.out, TrainSettings(**given), check=not a.no_check)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
