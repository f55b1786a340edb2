#!/usr/bin/env python3
"""Train the tiny GLM-4.5-style model (``glm4_moe``) and its NextN head; write it to
tests/data/tiny-glm4_moe-trained/. A thin shell over ``tests.support.synth.train_glm``.

The sibling of scripts/train_tiny.py (the Qwen3.5 bundles): the GLM model is a test fixture
only, so it lives under tests/data, not in the package. Seeded: same seed, same BLAS and thread
count, the same weights (a second run here wrote byte-identical shards). About 8 minutes on a 2-core CPU (the committed folder was made as
``python scripts/train_tiny_glm.py``, mlx's own CPU BLAS, Linux x86-64).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.synth.train_glm import GlmTrainSettings, build_trained  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "tests" / "data"), help="folder that receives tiny-glm4_moe-trained/")
    defaults = GlmTrainSettings()
    for f in dataclasses.fields(GlmTrainSettings):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(defaults, f.name)), default=None)
    a = p.parse_args(argv)
    given = {f.name: getattr(a, f.name) for f in dataclasses.fields(GlmTrainSettings) if getattr(a, f.name) is not None}
    build_trained(a.out, GlmTrainSettings(**given))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
