"""Released mlx-lm driver (mtpforge's own environment: mlx-lm >= 0.32): ``mlx_lm.load`` and
``mlx_lm.generate.generate_step`` greedy. It reads no MTP head; what is measured is that the
folder still loads and its backbone decodes exactly like the folder without a head."""

from __future__ import annotations

from typing import Any

import standins
from common import main, stage


def _decode(model: Any, ids: list[int], n: int) -> list[int]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    out = []
    for tok, _ in generate_step(mx.array(ids), model, max_tokens=n, sampler=lambda lp: mx.argmax(lp, axis=-1)):
        out.append(int(tok))
    return out


def _load(folder: str) -> Any:
    from mlx_lm import load

    model, _ = load(folder)
    standins.float32_expert_stacks(model)
    return model


def cell(spec: dict[str, Any], entry: dict[str, Any], out: dict[str, Any]) -> None:
    out["standins"] = standins.APPLIED
    model = stage("load", lambda: _load(entry["folder"]))
    out["mtp_enabled"] = False  # released mlx-lm has no MTP decode: it drops (or rejects) the head
    out["plain"] = stage("plain decode", lambda: [_decode(model, ids, spec["max_tokens"]) for ids in spec["prompts"]])


def bare(spec: dict[str, Any], out: dict[str, Any]) -> None:
    model = stage("load without head", lambda: _load(spec["bare"]))
    out["tokens"] = stage("bare decode", lambda: [_decode(model, ids, spec["max_tokens"]) for ids in spec["prompts"]])


if __name__ == "__main__":
    main(cell, bare)
