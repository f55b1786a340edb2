"""A source head holding NaN or Inf is refused in both output formats, for every family: one line,
``SOURCE_NONFINITE``, exit 1 (docs/CONTRACT.md), and nothing written — the one finiteness check
of ``headplan.decode`` runs on every tensor either emitter writes, whatever its encoding (a bf16
tensor copied unchanged into an MLX folder, an f16, bf16 or q8_0 GGUF tensor alike)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import mlx.core as mx
import pytest

from mtpforge.families import FAMILIES, Role
from mtpforge.families.detect import detect_family
from tests.checkers import rewrite
from tests.crash_harness import run_cli
from tests.test_hostile import tree_state
from tests.test_reliability import one_line


def _qwen(variant: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        from tests.support.synth import build_hf_variant

        return build_hf_variant(variant, folder)

    return build


def _builder(module: str, name: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        import importlib

        return getattr(importlib.import_module(f"tests.support.synth.{module}"), name)(folder)

    return build


#: a tiny source of every family (the Qwen3.5 MoE family twice: per-expert and fused experts)
SOURCES: dict[str, Callable[[Path], Path]] = {
    "qwen3_5": _qwen("qwen3_5"), "qwen3_5_moe": _qwen("qwen3_5_moe"), "qwen3_6_moe": _qwen("qwen3_6_moe"),
    "qwen3_next": _qwen("qwen3_next"), "glm4_moe": _builder("glm4_moe", "build_glm4_moe"),
    "glm4_moe_lite": _builder("glm4_moe_lite", "build_glm4_moe_lite"),
    "nemotron_h": _builder("nemotron_h", "build_nemotron_h"), "step3p5": _builder("step3p5", "build_step3p5"),
    "deepseek_v3": _builder("deepseek_v3", "build_deepseek_v3"),
    "deepseek_v32": _builder("deepseek_v32", "build_deepseek_v32"),
    "glm_moe_dsa": _builder("glm_moe_dsa", "build_glm_moe_dsa"),
    "hy_v3": _builder("hy_v3", "build_hy_v3"),
    "mimo_v2_flash": _builder("mimo_v2_flash", "build_mimo_v2_flash"),
    "deepseek_v4": _builder("deepseek_v4", "build_deepseek_v4_bf16"),
}


def _headless_deepseek_v3(folder: Path) -> Path:
    from tests.support.synth.deepseek_v3 import build_deepseek_v3

    return build_deepseek_v3(folder, head=False)


#: sources whose MLX target mlx_lm.convert makes from a head-less build (its ``deepseek_v3``
#: sanitize drops the NextN layer only at the release's index, 61)
MLX_FROM: dict[str, Callable[[Path], Path]] = {"deepseek_v3": _headless_deepseek_v3}

#: where the bad value goes: the head's input projection (a matrix, quantized or copied as is) and
#: its embedding-side norm (offset added before encoding)
POISONS = {"nan-in-fc": (Role.FC, float("nan")), "inf-in-norm": (Role.PRE_FC_NORM_EMBEDDING, float("inf"))}


#: the family of each source
FAMILY_OF = {**{s: s for s in SOURCES}, "qwen3_6_moe": "qwen3_5_moe"}


def test_every_family_is_covered() -> None:
    """A family added to the registry gets a source here (else its refusal goes untested)."""
    assert set(FAMILIES) <= set(FAMILY_OF.values())


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, bool], Path]:
    """A family's clean source (``mlx``: its 4-bit MLX conversion), built once per module."""
    from tests.support.synth import convert_to_mlx

    root, built = tmp_path_factory.mktemp("clean"), {}

    def get(name: str, mlx: bool = False) -> Path:
        if name not in built:
            built[name] = SOURCES[name](root / name)
        if mlx and (name, mlx) not in built:
            base = MLX_FROM[name](root / f"{name}-trunk") if name in MLX_FROM else built[name]
            built[name, mlx] = convert_to_mlx(base, root / f"{name}-mlx", q_bits=4, q_group_size=32)
        return built[name, mlx] if mlx else built[name]

    return get


def _poisoned(src: Path, dst: Path, role: Role, value: float) -> str:
    """A copy of ``src`` whose head tensor of ``role`` (MTP layer 0) starts with ``value``;
    returns that tensor's key."""
    import shutil

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    spec = FAMILIES[detect_family(config) or ""]
    weight_map = json.loads((dst / "model.safetensors.index.json").read_text())["weight_map"]
    # a head stored in parts that llama.cpp reads fused (DeepSeek-V4's fc: e_proj | h_proj): its first part
    role = next((parts[0] for whole, parts in spec.gguf_fused.items() if whole == role and not any(
        r.role == role for r in spec.rows())), role)
    key = next(k for k in sorted(weight_map) if (bare := spec.strip_prefix(k, config)) is not None
               and spec.role_of(bare) == role)
    shard = dst / weight_map[key]

    def poison(t: dict[str, mx.array]) -> dict[str, mx.array]:
        w = t[key].reshape(-1)
        w = mx.concatenate([mx.array([value], dtype=w.dtype), w[1:]])
        return dict(t, **{key: w.reshape(t[key].shape)})

    rewrite(shard, poison)
    return key


def _refused(args: list[str], root: Path, key: str) -> None:
    before = tree_state(root)
    r = run_cli(["add-mtp", *args, "--json"])
    line = one_line(r, 1, "NaN or Inf")
    assert key.split(".")[-2] in line, line  # names the damaged tensor
    assert json.loads(r.stdout)["error"]["code"] == "SOURCE_NONFINITE"
    assert tree_state(root) == before  # nothing written, nothing left behind


#: every family with each poison; every GGUF precision on the first
GGUF_CASES = [(f, p, "q8_0" if p.startswith("nan") else "bf16") for f in SOURCES for p in POISONS] + \
    [("qwen3_5", p, "f16") for p in POISONS]


@pytest.mark.parametrize(("family", "poison", "precision"), GGUF_CASES)
def test_gguf_head_from_a_nonfinite_source_is_refused(family: str, precision: str, poison: str, clean, tmp_path: Path) -> None:
    from tests.support.synth.gguf_trunk import synthetic_trunk

    src = tmp_path / "src"
    key = _poisoned(clean(family), src, *POISONS[poison])
    trunk = synthetic_trunk(src, tmp_path / "gguf" / "Tiny-F32.gguf", name="Tiny")
    _refused(["--source", str(src), "--target", str(trunk), "--precision", precision], tmp_path / "gguf", key)


#: the families mtpforge writes into MLX folders (the others are refused before any read), each
#: poison copied as is (bf16) and quantized (match: the target's 4 bits)
MLX_CASES = [(f, p, "bf16" if p.startswith("nan") else "match") for f in SOURCES if not FAMILIES[FAMILY_OF[f]].gguf_only
             for p in POISONS] + [("qwen3_5", p, "match" if p.startswith("nan") else "bf16") for p in POISONS]


@pytest.mark.parametrize(("family", "poison", "precision"), MLX_CASES)
def test_mlx_head_from_a_nonfinite_source_is_refused(family: str, poison: str, precision: str, clean,
                                                     tmp_path: Path) -> None:
    import shutil

    src = tmp_path / "src"
    key = _poisoned(clean(family), src, *POISONS[poison])
    target = Path(shutil.copytree(clean(family, True), tmp_path / "mlx"))
    _refused(["--source", str(src), "--target", str(target), "--precision", precision], target, key)
