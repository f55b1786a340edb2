"""Make an MLX target the way community conversions are made: with the real ``mlx_lm.convert``,
which drops every ``mtp.*`` tensor while the config keeps declaring the head. The demo starts
from such a target; tests and benchmarks build theirs with the same function."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path


def convert_to_mlx(
    hf_folder: str | Path,
    mlx_folder: str | Path,
    *,
    q_bits: int | None = 4,
    q_group_size: int = 64,
    dtype: str = "bfloat16",
) -> Path:
    """``mlx_lm.convert.convert`` on a local HF folder; ``q_bits=None`` converts without
    quantizing. ``mlx_folder`` must not exist (an empty folder is replaced), as convert requires.
    """
    from mlx_lm.convert import convert

    out = Path(mlx_folder)
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    # convert prints progress on stdout; the callers (tests, benchmarks, --json) own stdout.
    with contextlib.redirect_stdout(io.StringIO()):
        convert(
            hf_path=str(hf_folder),
            mlx_path=str(out),
            quantize=q_bits is not None,
            q_bits=q_bits,
            q_group_size=q_group_size if q_bits is not None else None,
            dtype=dtype,
        )
    return out
