"""Write a checkpoint folder in Hugging Face layout, sharded the way Qwen releases are.

The releases put the MTP tensors in the last few shards, between backbone tensors, so reading
only the MTP tensors means reading the index and range-requesting inside shared files. The
writer reproduces that, deterministically: same inputs, byte-identical files.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Sequence

import mlx.core as mx

from .config import EOS_ID, PAD_ID, VARIANT_KEY, text_config
from .tensors import mtp_tensor_names
from .tokenizer import build_tokenizer

_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "vocab.json", "merges.txt", "added_tokens.json",
)


def natural_key(name: str) -> list[Any]:
    """Sort layers numerically (layers.2 before layers.10), as a model's state dict does."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def shard_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def plan_shards(
    tensors: dict[str, mx.array], n_shards: int, mtp_shards: int, mtp_in: Sequence[int] | None = None
) -> list[list[str]]:
    """Names per shard: backbone tensors in state-dict order split into ``n_shards`` runs of
    about equal bytes, and MTP tensors split into runs appended to the last ``mtp_shards``
    shards (or the 1-based shard numbers ``mtp_in``), so each of those mixes both kinds."""
    mtp = sorted(mtp_tensor_names(tensors), key=natural_key)
    backbone = sorted((k for k in tensors if not k.startswith("mtp.")), key=natural_key)
    if n_shards < 1:
        raise ValueError("n_shards must be >= 1")
    if mtp_in is not None:
        targets = sorted({int(i) - 1 for i in mtp_in})
        if not targets or targets[0] < 0 or targets[-1] >= n_shards:
            raise ValueError(f"mtp_in {list(mtp_in)} must name shards 1..{n_shards}")
    else:
        if mtp and not 1 <= mtp_shards <= n_shards:
            raise ValueError(f"mtp_shards must be between 1 and n_shards ({n_shards}), got {mtp_shards}")
        targets = list(range(n_shards - mtp_shards, n_shards))
    if len(backbone) < n_shards:
        raise ValueError(f"{len(backbone)} backbone tensors cannot fill {n_shards} shards")
    if mtp and len(mtp) < len(targets):
        raise ValueError(f"{len(mtp)} MTP tensors cannot be spread over {len(targets)} shards")
    shards = _split_by_bytes(backbone, tensors, n_shards)
    if mtp:
        for t, names in zip(targets, _split_by_bytes(mtp, tensors, len(targets))):
            shards[t] = sorted(shards[t] + names, key=natural_key)
    return shards


def _split_by_bytes(names: list[str], tensors: dict[str, mx.array], n: int) -> list[list[str]]:
    """Contiguous runs of about total/n bytes each, every run non-empty (needs len(names) >= n)."""
    total = sum(tensors[k].nbytes for k in names)
    out: list[list[str]] = []
    cur: list[str] = []
    acc = 0
    for idx, k in enumerate(names):
        cur.append(k)
        acc += tensors[k].nbytes
        names_left, runs_left = len(names) - idx - 1, n - len(out) - 1
        if runs_left and (acc * n >= total * (len(out) + 1) or names_left == runs_left):
            out.append(cur)
            cur = []
    out.append(cur)
    return out


def write_hf_checkpoint(
    folder: str | Path,
    config: dict[str, Any],
    tensors: dict[str, mx.array],
    *,
    n_shards: int = 3,
    mtp_shards: int = 2,
    tokenizer_dir: str | Path | None = None,
    mtp_in: Sequence[int] | None = None,
) -> Path:
    """Write config.json, generation_config.json, the shards (+ index), and a tokenizer.

    ``n_shards=1`` writes a single ``model.safetensors`` without index, as small releases do.
    ``tokenizer_dir`` copies an existing tokenizer instead of training the default one.
    Weight files and index left in ``folder`` by an earlier write are removed first: loaders
    glob ``model*.safetensors``, so a stale shard would silently join the checkpoint.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in [*folder.glob("model*.safetensors"), folder / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)
    tc = text_config(config)
    if n_shards == 1:
        _save(folder / "model.safetensors", tensors, sorted(tensors))
    else:
        shards = plan_shards(tensors, n_shards, mtp_shards, mtp_in)
        weight_map: dict[str, str] = {}
        for i, names in enumerate(shards):
            _save(folder / shard_name(i, n_shards), tensors, names)
            weight_map.update({k: shard_name(i, n_shards) for k in names})
        index = {
            "metadata": {"total_size": int(sum(v.nbytes for v in tensors.values()))},
            "weight_map": dict(sorted(weight_map.items())),
        }
        _write_json(folder / "model.safetensors.index.json", index)
    _write_json(folder / "config.json", {k: v for k, v in config.items() if k != VARIANT_KEY})
    _write_json(folder / "generation_config.json", {
        "do_sample": False,
        "eos_token_id": [tc.get("eos_token_id", EOS_ID), PAD_ID],
        "pad_token_id": PAD_ID,
        "transformers_version": config.get("transformers_version", "4.57.0.dev0"),
    })
    if tokenizer_dir is not None:
        src = Path(tokenizer_dir)
        for name in _TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, folder / name)
    else:
        build_tokenizer(None, int(tc["vocab_size"]), folder)
    return folder


def _save(path: Path, tensors: dict[str, mx.array], names: list[str]) -> None:
    mx.save_safetensors(str(path), {k: tensors[k] for k in sorted(names)}, metadata={"format": "pt"})


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
