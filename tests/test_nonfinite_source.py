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
from tests.support.families import GGUF_LAYOUTS, MLX_LAYOUTS, mlx_trunk, tiny_source


def _variant(variant: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        from tests.support.synth import build_hf_variant

        return build_hf_variant(variant, folder)

    return build


#: a tiny source of every registered family (the Qwen3.5 MoE family twice: per-expert and fused
#: experts), from the registry: a family added later is covered without editing this list
SOURCES: dict[str, Callable[[Path], Path]] = {
    **{f: (lambda folder, f=f: tiny_source(f, folder)) for f in FAMILIES}, "qwen3_6_moe": _variant("qwen3_6_moe"),
    # DeepSeek-V4 with bf16 dense weights: a value planted in an FP8 or E8M0 tensor would be a byte
    # pattern, and MLX rewrites the poisoned shard without those dtypes
    "deepseek_v4": lambda folder: tiny_source("deepseek_v4", folder, dense="bf16"),
    "deepseek_v4_dspark": lambda folder: tiny_source("deepseek_v4_dspark", folder, dense="bf16")}

#: where the bad value goes: the head's input projection (a matrix, quantized or copied as is), its
#: embedding-side norm (offset added before encoding), and any tensor of the head (``None``: one
#: drawn per family and format from every tensor the head is written from)
POISONS: dict[str, tuple[Role | None, float]] = {
    "nan-in-fc": (Role.FC, float("nan")), "inf-in-norm": (Role.PRE_FC_NORM_EMBEDDING, float("inf")),
    "nan-anywhere": (None, float("nan")), "inf-anywhere": (None, float("-inf"))}


#: the family of each source
FAMILY_OF = {**{s: s for s in SOURCES}, "qwen3_6_moe": "qwen3_5_moe"}


def test_every_family_is_covered() -> None:
    """A family added to the registry gets a source here (else its refusal goes untested)."""
    assert set(FAMILIES) <= set(FAMILY_OF.values())


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, bool], Path]:
    """A family's clean source (``mlx``: its 4-bit MLX conversion), built once per module."""
    root, built = tmp_path_factory.mktemp("clean"), {}

    def get(name: str, mlx: bool = False) -> Path:
        if name not in built:
            built[name] = SOURCES[name](root / name)
        if mlx and (name, mlx) not in built:
            built[name, mlx] = mlx_trunk(FAMILY_OF[name], built[name], root / f"{name}-mlx")
        return built[name, mlx] if mlx else built[name]

    return get


def _poisoned(src: Path, dst: Path, role: Role | None, value: float, draw: str = "", mlx: bool = False) -> str:
    """A copy of ``src`` whose head tensor of ``role`` (MTP layer 0; ``None``: one drawn with the
    seed ``draw`` from every tensor the head is written from — in an MLX folder, not the ones the
    runtimes take from the trunk, ``FamilySpec.unread_in_mlx``) holds ``value`` at a drawn
    position; returns that tensor's key."""
    import random
    import shutil

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    spec = FAMILIES[detect_family(config) or ""]
    weight_map = json.loads((dst / "model.safetensors.index.json").read_text())["weight_map"]
    # a head stored in parts that llama.cpp reads fused (DeepSeek-V4's fc: e_proj | h_proj): its first part
    if role is not None:
        role = next((parts[0] for whole, parts in spec.gguf_fused.items() if whole == role and not any(
            r.role == role for r in spec.rows())), role)
    # a drafter with no embedding-side norm (DeepSeek-V4's DSpark): the norm after its input projection
    if role == Role.PRE_FC_NORM_EMBEDDING and not any(r.role == role for r in spec.rows()):
        role = Role.MAIN_NORM
    head = [k for k in sorted(weight_map) if (bare := spec.strip_prefix(k, config)) is not None
            and spec.role_of(bare) is not None and not k.endswith("_scale_inv") and not _packed(dst, weight_map[k], k)
            and not (mlx and spec.role_of(bare) in spec.unread_in_mlx)]
    rng = random.Random(draw)
    key = rng.choice(head) if role is None else next(k for k in head if spec.role_of(spec.strip_prefix(k, config) or "") == role)
    shard = dst / weight_map[key]

    def poison(t: dict[str, mx.array]) -> dict[str, mx.array]:
        w = t[key].reshape(-1)
        at = rng.randrange(w.size) if role is None else 0
        w = mx.concatenate([w[:at], mx.array([value], dtype=w.dtype), w[at + 1:]])
        return dict(t, **{key: w.reshape(t[key].shape)})

    rewrite(shard, poison)
    return key


def _packed(folder: Path, shard: str, key: str) -> bool:
    """An FP4 expert's codes (integers, two a byte): no value there is NaN or Inf (E8M0's NaN
    exponent has its own test, tests/test_deepseek_v4_gguf.py)."""
    from mtpforge.checkpoint.safetensors_header import read_local_header

    return read_local_header(folder / shard, shard).tensors[key].dtype in ("I8", "U8")


def _refused(args: list[str], root: Path, key: str) -> None:
    before = tree_state(root)
    r = run_cli(["add-mtp", *args, "--json"])
    line = one_line(r, 1, "NaN or Inf")
    assert key.split(".")[-2] in line, line  # names the damaged tensor
    assert json.loads(r.stdout)["error"]["code"] == "SOURCE_NONFINITE"
    assert tree_state(root) == before  # nothing written, nothing left behind


#: each GGUF output of every family meets one poison: the sibling at each precision and the tail
GGUF_FORMATS = {"nan-in-fc": "q8_0", "inf-in-norm": "bf16", "nan-anywhere": "f16", "inf-anywhere": "tail"}
GGUF_CASES = [(f, p, GGUF_FORMATS[p]) for f in SOURCES for p in POISONS
              if FAMILY_OF[f] in GGUF_LAYOUTS and (GGUF_FORMATS[p] != "tail" or "gguf-tail" in GGUF_LAYOUTS[FAMILY_OF[f]])]
#: the README's test command runs these families' cases (a Qwen and a NextN head, every format);
#: the full run (CI) every family's: each case is a CLI run of seconds (tests/conftest.py, LONG)
QUICK = ("qwen3_5", "glm4_moe")


@pytest.mark.parametrize(("family", "poison", "precision"), [c for c in GGUF_CASES if c[0] in QUICK])
def test_gguf_head_from_a_nonfinite_source_is_refused(family: str, precision: str, poison: str, clean, tmp_path: Path) -> None:
    _gguf_case(family, precision, poison, clean, tmp_path)


@pytest.mark.parametrize(("family", "poison", "precision"), [c for c in GGUF_CASES if c[0] not in QUICK])
def test_every_family_gguf_head_from_a_nonfinite_source_is_refused(family: str, precision: str, poison: str, clean,
                                                                   tmp_path: Path) -> None:
    _gguf_case(family, precision, poison, clean, tmp_path)


def _gguf_case(family: str, precision: str, poison: str, clean, tmp_path: Path) -> None:
    from tests.support.synth.gguf_trunk import synthetic_trunk

    src = tmp_path / "src"
    key = _poisoned(clean(family), src, *POISONS[poison], draw=f"{family}-{poison}-{precision}")
    trunk = synthetic_trunk(src, tmp_path / "gguf" / "Tiny-F32.gguf", name="Tiny")
    how = ["--layout", "gguf-tail", "--output", str(tmp_path / "gguf" / "tail.gguf")] if precision == "tail" \
        else ["--precision", precision]
    _refused(["--source", str(src), "--target", str(trunk), *how], tmp_path / "gguf", key)


#: the families mtpforge writes into MLX folders (the others are refused before any read), each
#: poison copied as is (bf16) or quantized (match: the target's 4 bits)
MLX_PRECISION = {"nan-in-fc": "bf16", "inf-in-norm": "match", "nan-anywhere": "match", "inf-anywhere": "bf16"}
MLX_CASES = [(f, p, MLX_PRECISION[p]) for f in SOURCES if FAMILY_OF[f] in MLX_LAYOUTS for p in POISONS]


@pytest.mark.parametrize(("family", "poison", "precision"), [c for c in MLX_CASES if c[0] in QUICK])
def test_mlx_head_from_a_nonfinite_source_is_refused(family: str, poison: str, precision: str, clean,
                                                     tmp_path: Path) -> None:
    _mlx_case(family, poison, precision, clean, tmp_path)


@pytest.mark.parametrize(("family", "poison", "precision"), [c for c in MLX_CASES if c[0] not in QUICK])
def test_every_family_mlx_head_from_a_nonfinite_source_is_refused(family: str, poison: str, precision: str, clean,
                                                                  tmp_path: Path) -> None:
    _mlx_case(family, poison, precision, clean, tmp_path)


def _mlx_case(family: str, poison: str, precision: str, clean, tmp_path: Path) -> None:
    import shutil

    src = tmp_path / "src"
    key = _poisoned(clean(family), src, *POISONS[poison], draw=f"{family}-{poison}-{precision}", mlx=True)
    target = Path(shutil.copytree(clean(family, True), tmp_path / "mlx"))
    _refused(["--source", str(src), "--target", str(target), "--precision", precision], target, key)
