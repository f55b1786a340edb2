#!/usr/bin/env python3
"""Train the tiny MiMo-V2-Flash-shaped model (``mimo_v2_flash``) and its MTP layers; write it to
tests/data/tiny-mimo_v2_flash-trained/. A thin shell over ``tests.support.synth.train_mimo_v2_flash``.

The sibling of scripts/train_tiny_deepseek_v3.py, at MiMo-V2-Flash's shapes (hybrid full /
sliding-window attention with sinks, a narrower value head, a sigmoid-routed MoE), MTP layer 0
fed the trunk's pre-norm hidden state as llama.cpp's mimo2 graph feeds it. Seeded: same seed, same
BLAS and thread count, the same weights. The committed folder (about 10 minutes on a busy 2-core
machine) was made as ``python scripts/train_tiny_mimo_v2_flash.py`` (mlx's CPU BLAS, Linux x86-64).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.synth.train_mimo_v2_flash import build_trained, settings  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "tests" / "data"), help="folder that receives tiny-mimo_v2_flash-trained/")
    p.add_argument("--backbone-steps", type=int, default=None)
    p.add_argument("--head-steps", type=int, default=None)
    a = p.parse_args(argv)
    given = {k: v for k, v in (("backbone_steps", a.backbone_steps), ("head_steps", a.head_steps)) if v is not None}
    build_trained(a.out, settings(**given))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
