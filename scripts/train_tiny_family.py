#!/usr/bin/env python3
"""Train one of the tiny non-Qwen models and its MTP head; write it to
tests/data/tiny-<family>-trained/. A thin shell over the trainers in ``tests/support/synth``,
which hold the settings, the seed and the measurement; the committed folders were made with
their defaults (mlx's CPU BLAS, Linux x86-64; same seed, BLAS and thread count: same weights).

    python scripts/train_tiny_family.py deepseek_v3     # MLA + MoE NextN head      (~5 min)
    python scripts/train_tiny_family.py glm4_moe_lite   # the same trainer at GLM-4.7-Flash's shapes
    python scripts/train_tiny_family.py glm_moe_dsa     # ... and GLM-5's (DeepSeek Sparse Attention's indexer)
    python scripts/train_tiny_family.py deepseek_v32    # ... and DeepSeek-V3.2's
    python scripts/train_tiny_family.py nemotron_h      # Mamba-2/attention/MoE trunk, two-block head
    python scripts/train_tiny_family.py mimo_v2_flash   # sliding-window attention with sinks, three
                                                        # MTP layers (layer 0 fed the pre-norm state)
    python scripts/train_tiny_family.py step3p5         # head-gated attention, MoE trunk, one appended
                                                        # dense sliding-window MTP layer
    python scripts/train_tiny_family.py bailing_moe_v3  # Ling-3: KDA + gated-MLA/MoE trunk, one
                                                        # gated-MLA + MoE MTP block
    python scripts/train_tiny_family.py qwen4_exp       # Qwen3.8-Flash-Next: hyper-connections, DeltaNet
                                                        # and QSA layers; mlx-vlm's model and drafter
                                                        # (run in mlx-vlm's virtualenv, by itself)
    python scripts/train_tiny_family.py hy_v3           # Hy3: qk-normed GQA, sigmoid-routed MoE with
                                                        # a shared expert, one appended MoE MTP layer

GLM-4.5's model has its own settings: scripts/train_tiny_glm.py.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: family -> (trainer module in tests/support/synth, extra keywords of its build_trained)
TRAINERS: dict[str, tuple[str, dict[str, Any]]] = {
    "deepseek_v3": ("train_mla", {"shape": "deepseek_v3"}),
    "glm4_moe_lite": ("train_mla", {"shape": "glm4_moe_lite"}),
    "glm_moe_dsa": ("train_mla", {"shape": "glm_moe_dsa"}),
    "deepseek_v32": ("train_mla", {"shape": "deepseek_v32"}),
    "nemotron_h": ("train_nemotron_h", {}),
    "mimo_v2_flash": ("train_mimo_v2_flash", {}),
    "step3p5": ("train_step3p5", {}),
    "bailing_moe_v3": ("train_bailing_moe_v3", {}),
    "hy_v3": ("train_hy_v3", {}),
    "qwen4_exp": ("train_qwen4_exp", {}),
}

#: families whose trunk only an MLX runtime models: the trainer runs in that runtime's virtualenv
#: (scripts/setup_runtimes.py), which this script re-runs itself in
RUNTIME_OF = {"qwen4_exp": "mlx-vlm"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("family", choices=sorted(TRAINERS))
    p.add_argument("--out", default=str(ROOT / "tests" / "data"), help="folder that receives tiny-<family>-trained/")
    p.add_argument("--backbone-steps", type=int, default=None)
    p.add_argument("--head-steps", type=int, default=None)
    a = p.parse_args(argv)
    runtime = RUNTIME_OF.get(a.family)
    if runtime is not None and importlib.util.find_spec("mlx_vlm") is None:
        import subprocess

        sys.path.insert(0, str(ROOT / "scripts"))
        import setup_runtimes

        if not setup_runtimes.is_ready(runtime):
            raise SystemExit(f"{a.family} trains in {runtime}'s virtualenv: run python scripts/setup_runtimes.py first")
        return subprocess.call([str(setup_runtimes.venv_python(runtime)), __file__, *(sys.argv[1:] if argv is None else argv)])
    module, extra = TRAINERS[a.family]
    trainer = importlib.import_module(f"tests.support.synth.{module}")
    given = {k: v for k, v in (("backbone_steps", a.backbone_steps), ("head_steps", a.head_steps)) if v is not None}
    trainer.build_trained(a.out, trainer.settings(**given), **extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
