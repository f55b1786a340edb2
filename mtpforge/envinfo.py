"""``mtpforge env``: what a bug report needs."""

from __future__ import annotations

import platform
import sys
from importlib import metadata

from . import __version__

PACKAGES = ("mlx", "mlx-lm", "huggingface_hub", "safetensors", "transformers", "numpy")


def env_info() -> dict[str, str]:
    info = {"mtpforge": __version__, "python": sys.version.split()[0]}
    for p in PACKAGES:
        try:
            info[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            info[p] = "not installed"
    info["platform"] = platform.platform()
    info["machine"] = platform.machine()
    return info
