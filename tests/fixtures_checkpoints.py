"""Tiny synthetic checkpoints for tests: the four HF variants and their real mlx_lm conversions.

Each distinct checkpoint is built once per session, on first use, into a session directory;
tests get fresh copies (``make_hf`` / ``make_target``) that they may change at will. Read-only
tests can use the shared originals through ``synth`` (never write into those).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.support.synth import VARIANTS, build_hf_variant, convert_to_mlx

QWEN35_VARIANTS: tuple[str, ...] = ("qwen3_5", "qwen3_5_moe", "qwen3_6_moe")
MOE_VARIANTS: tuple[str, ...] = ("qwen3_5_moe", "qwen3_6_moe", "qwen3_next")

#: ``@all_variants`` on a test that takes a ``variant`` argument runs it for each variant.
all_variants = pytest.mark.parametrize("variant", VARIANTS)
qwen35_variants = pytest.mark.parametrize("variant", QWEN35_VARIANTS)
moe_variants = pytest.mark.parametrize("variant", MOE_VARIANTS)


def _key(variant: str, kw: dict[str, Any]) -> str:
    """A folder name that is unique per build recipe and readable in failure output."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    extra = "-".join(f"{k}={kw[k]}" for k in sorted(kw))
    return variant + (f"-{extra}" if extra else "")


class SynthCheckpoints:
    """Lazy, per-session cache of built checkpoints. Paths it returns are shared: do not modify."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._hf: dict[str, Path] = {}
        self._mlx: dict[str, Path] = {}

    def hf(self, variant: str, **build_kw: Any) -> Path:
        """The HF source of ``variant``; ``build_kw`` go to ``build_hf_variant`` (seed,
        n_shards, mtp_shards, config overrides)."""
        key = _key(variant, build_kw)
        if key not in self._hf:
            self._hf[key] = build_hf_variant(variant, self.root / "hf" / key, **build_kw)
        return self._hf[key]

    def target(
        self,
        variant: str,
        *,
        q_bits: int | None = 4,
        q_group_size: int = 64,
        dtype: str = "bfloat16",
        **build_kw: Any,
    ) -> Path:
        """``mlx_lm.convert`` of ``hf(variant, **build_kw)``: an MLX folder without its head."""
        key = _key(variant, build_kw) + f"-q{q_bits}g{q_group_size}-{dtype}"
        if key not in self._mlx:
            src = self.hf(variant, **build_kw)
            self._mlx[key] = convert_to_mlx(
                src, self.root / "mlx" / key, q_bits=q_bits, q_group_size=q_group_size, dtype=dtype
            )
        return self._mlx[key]


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> SynthCheckpoints:
    """The session's shared checkpoints (read-only use)."""
    return SynthCheckpoints(tmp_path_factory.mktemp("synth"))


def _copier(tmp_path: Path, kind: str, build: Callable[..., Path]) -> Callable[..., Path]:
    count = 0

    def make(variant: str, **kw: Any) -> Path:
        nonlocal count
        count += 1
        dst = tmp_path / f"{kind}-{variant}-{count}"
        shutil.copytree(build(variant, **kw), dst, symlinks=True)
        return dst

    return make


@pytest.fixture
def make_hf(synth: SynthCheckpoints, tmp_path: Path) -> Callable[..., Path]:
    """``make_hf(variant, **build_kw) -> Path``: a fresh copy of a tiny HF source checkpoint
    (config, 3 shards + index with the MTP head in the last two, tokenizer)."""
    return _copier(tmp_path, "hf", synth.hf)


@pytest.fixture
def make_target(synth: SynthCheckpoints, tmp_path: Path) -> Callable[..., Path]:
    """``make_target(variant, q_bits=4, q_group_size=64, dtype="bfloat16", **build_kw) -> Path``:
    a fresh copy of the real mlx_lm conversion of the matching HF source (no ``mtp.*`` tensors,
    config still declaring the head for Qwen3.5/3.6)."""
    return _copier(tmp_path, "mlx", synth.target)
