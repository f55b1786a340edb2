"""One shared set of checks for test outputs (the mergekit habit): folder hashes, head tensors
vs the source, mlx-lm loading, and surgical damage to build defective checkpoints."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Callable

import mlx.core as mx



class CliTimeout(Exception):
    """A command run by :func:`cli_in_process` outlived its time."""


def _alarm(signum: int, frame: object) -> None:
    raise CliTimeout()


def cli_in_process(argv: list[str], timeout_s: int) -> tuple[int | None, str, str, BaseException | None]:
    """The CLI run in this process, as ``python -m mtpforge`` runs it (argument parsing,
    run_command, rendering): exit code, stdout, stderr and an exception that escaped. For tests
    that run a command many times: a second interpreter importing MLX costs more than a small
    command's work."""
    import signal

    from typer.testing import CliRunner

    from mtpforge.cli import app

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout_s)
    try:
        r = CliRunner().invoke(app, argv, catch_exceptions=True)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        # a successful command ignores Ctrl-C from then on (its work is committed): not in a test run
        signal.signal(signal.SIGINT, signal.default_int_handler)
    exc = r.exception if r.exception is not None and not isinstance(r.exception, SystemExit) else None
    return r.exit_code, r.stdout, r.stderr, exc


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


def written_state(folder: Path) -> dict[str, str]:
    """``folder_state`` minus what names the source: add-mtp's manifest, and the model card's
    section (the rest of the card must match). For comparing a Hub-sourced run with a local one."""
    from mtpforge import model_card
    from mtpforge.layouts.table import MANIFEST

    state = {k: v for k, v in folder_state(folder).items() if k != MANIFEST}
    card = folder / model_card.CARD
    if card.is_file() and not card.is_symlink():
        state[model_card.CARD] = hashlib.sha256(model_card.take_out(card.read_bytes().decode("utf-8"), "\n").encode()).hexdigest()
    return state


def load_all(folder: Path, pattern: str = "*.safetensors") -> dict[str, mx.array]:
    out: dict[str, mx.array] = {}
    for f in sorted(folder.rglob(pattern)):
        out.update(mx.load(str(f)))
    return out


def source_head(hf: Path) -> dict[str, mx.array]:
    """The source's raw head under bare keys."""
    return {k[4:]: v for k, v in load_all(hf).items() if k.startswith("mtp.")}


#: the zero-centred norms of a Qwen3 MTP head, spelled out here (docs/SPEC.md §4) rather than taken from
#: the family tables, so this oracle shares no code with what it checks
_HEAD_NORMS = ("pre_fc_norm_hidden.weight", "pre_fc_norm_embedding.weight", "norm.weight")
_LAYER_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
                "self_attn.k_norm.weight")
_PER_EXPERT = re.compile(r"^(layers\.\d+\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def _is_norm(bare: str) -> bool:
    parts = bare.split(".", 2)
    return bare in _HEAD_NORMS or (parts[0] == "layers" and len(parts) == 3 and parts[2] in _LAYER_NORMS)


def _stacked(head: dict[str, mx.array]) -> dict[str, mx.array]:
    """Experts as mlx-lm's switch_mlp holds them: [E, out, in] per projection; fused gate_up
    rows are gate first, then up."""
    out: dict[str, mx.array] = {}
    per: dict[tuple[str, str], dict[int, mx.array]] = {}
    for k, v in head.items():
        if m := _PER_EXPERT.match(k):
            per.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = v
        elif k.endswith(".mlp.experts.gate_up_proj"):
            mlp, half = k[: -len(".experts.gate_up_proj")], v.shape[1] // 2
            out[f"{mlp}.switch_mlp.gate_proj.weight"] = v[:, :half, :]
            out[f"{mlp}.switch_mlp.up_proj.weight"] = v[:, half:, :]
        elif k.endswith(".mlp.experts.down_proj"):
            out[f"{k[: -len('.experts.down_proj')]}.switch_mlp.down_proj.weight"] = v
        else:
            out[k] = v
    for (mlp, proj), by_e in per.items():
        out[f"{mlp}.switch_mlp.{proj}.weight"] = mx.stack([by_e[e] for e in range(len(by_e))])
    return out


def expected_bf16_head(hf: Path, expert_format: str) -> dict[str, mx.array]:
    """What a correct bf16 conversion must hold: norms = raw + 1 in float32, rounded once."""
    head = source_head(hf)
    out = {k: (v.astype(mx.float32) + 1.0).astype(v.dtype) if _is_norm(k) else v for k, v in head.items()}
    return _stacked(out) if expert_format == "switch_mlp" else out


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
