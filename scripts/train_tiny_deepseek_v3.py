#!/usr/bin/env python3
"""Train the tiny DeepSeek-V3-shaped model (``deepseek_v3``) and its NextN head; write it to
tests/data/tiny-deepseek_v3-trained/. A thin shell over ``tests.support.synth.train_mla``.

The sibling of scripts/train_tiny_glm.py, at DeepSeek-V3's shapes (MLA, group-limited routing,
YaRN), fewer steps. Seeded: same seed, same BLAS and thread count, the same weights. The committed
folder was made as ``python scripts/train_tiny_deepseek_v3.py`` (mlx's CPU BLAS, Linux x86-64).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.synth.train_mla import build_trained, settings  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "tests" / "data"), help="folder that receives tiny-deepseek_v3-trained/")
    p.add_argument("--backbone-steps", type=int, default=None)
    p.add_argument("--head-steps", type=int, default=None)
    a = p.parse_args(argv)
    given = {k: v for k, v in (("backbone_steps", a.backbone_steps), ("head_steps", a.head_steps)) if v is not None}
    build_trained(a.out, settings(**given), shape="deepseek_v3")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
