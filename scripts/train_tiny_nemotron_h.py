#!/usr/bin/env python3
"""Train the tiny Nemotron-H-shaped model (``nemotron_h``) and its two-block MTP head; write it to
tests/data/tiny-nemotron_h-trained/. A thin shell over ``tests.support.synth.train_nemotron_h``.

The MLA trainer's settings (scripts/train_tiny_glm4_moe_lite.py) at Nemotron-H's shapes (Mamba-2,
attention and MoE blocks ``ME*E``; the head two blocks, ``*E``). Seeded: same seed,
same BLAS and thread count, the same weights. The committed folder was made as
``python scripts/train_tiny_nemotron_h.py`` (mlx's CPU BLAS, Linux x86-64).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.synth.train_nemotron_h import build_trained, settings  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "tests" / "data"), help="folder that receives tiny-nemotron_h-trained/")
    p.add_argument("--backbone-steps", type=int, default=None)
    p.add_argument("--head-steps", type=int, default=None)
    a = p.parse_args(argv)
    given = {k: v for k, v in (("backbone_steps", a.backbone_steps), ("head_steps", a.head_steps)) if v is not None}
    build_trained(a.out, settings(**given))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
