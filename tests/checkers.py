"""One shared set of checks for test outputs (the mergekit habit): folder hashes, head tensors
vs the source, mlx-lm loading, and surgical damage to build defective checkpoints."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

import mlx.core as mx

from mtpforge.families.tables import is_norm_key
from mtpforge.passes.experts import to_switch_mlp


def folder_state(root: Path) -> dict[str, str]:
    """Every entry under ``root``: file sha256, or ``-> target`` for symlinks (not followed)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def load_all(folder: Path, pattern: str = "*.safetensors") -> dict[str, mx.array]:
    out: dict[str, mx.array] = {}
    for f in sorted(folder.rglob(pattern)):
        out.update(mx.load(str(f)))
    return out


def source_head(hf: Path) -> dict[str, mx.array]:
    """The source's raw head under bare keys."""
    return {k[4:]: v for k, v in load_all(hf).items() if k.startswith("mtp.")}


def expected_bf16_head(hf: Path, expert_format: str) -> dict[str, mx.array]:
    """What a correct bf16 conversion must hold: norms = raw + 1 in float32, rounded once."""
    head = source_head(hf)
    out = {}
    for k, v in head.items():
        out[k] = (v.astype(mx.float32) + 1.0).astype(v.dtype) if is_norm_key(k) else v
    if expert_format == "switch_mlp":
        out = to_switch_mlp(out)
    return out


def rewrite(file: Path, fn: Callable[[dict[str, mx.array]], dict[str, mx.array]]) -> None:
    """Replace a safetensors file with fn(its tensors), as a new inode (never in place)."""
    tensors = dict(mx.load(str(file)))
    new = fn(tensors)
    tmp = file.with_name(file.name + ".tmp.safetensors")
    mx.save_safetensors(str(tmp), new, metadata={"format": "mlx"})
    os.replace(tmp, file)


def edit_json(file: Path, fn: Callable[[dict], None]) -> None:
    obj = json.loads(file.read_text())
    fn(obj)
    file.write_text(json.dumps(obj, indent=4))


def logits(folder: Path, tokens: list[int] | None = None) -> mx.array:
    import mlx_lm

    model, _ = mlx_lm.load(str(folder))
    x = mx.array([tokens or [1, 5, 9, 13, 2, 7]])
    out = model(x)
    mx.eval(out)
    return out


def codes(report: dict) -> dict[str, str]:
    return {f["code"]: f["severity"] for f in report["findings"]}
