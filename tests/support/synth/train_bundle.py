"""Make one bundled tiny model folder end to end: tokenizer, training, export, self-check, card.

``scripts/train_tiny.py`` is the command-line shell of :func:`build_bundled`.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx

from .config import text_config
from .export import export_checkpoint
from .tokenizer import build_tokenizer
from .train import (
    VARIANT_OF,
    TrainSettings,
    draft_acceptance,
    heldout_prompts,
    model_config,
    param_count,
    settings_dict,
    train,
    training_corpus,
)
from .train_check import check_converted, check_reload, mutation_acceptance


def folder_name(name: str) -> str:
    return f"tiny-{name}"


def build_bundled(
    name: str,
    out_root: str | Path,
    settings: TrainSettings,
    *,
    check: bool = True,
    log: Callable[[str], None] | None = print,
) -> dict[str, Any]:
    """Train bundled model ``name`` (``qwen3_5`` | ``qwen3_5_moe``) into ``out_root/tiny-<name>``.
    Returns the training record (also written as ``training.json``)."""
    if name not in VARIANT_OF:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(VARIANT_OF)}")
    from tokenizers import Tokenizer

    folder = Path(out_root) / folder_name(name)
    config = model_config(name)
    with tempfile.TemporaryDirectory(prefix="mtpforge-tiny-tok-") as tokdir:
        build_tokenizer(training_corpus(settings), int(text_config(config)["vocab_size"]), tokdir)
        tok = Tokenizer.from_file(str(Path(tokdir) / "tokenizer.json"))
        result = train(name, tok, settings, log)
        prompts = heldout_prompts(tok, settings)
        trained_acc = {h: draft_acceptance(result.model, result.head, prompts, hidden=h) for h in ("post", "pre")}
        if log:
            log(f"{name}: trained (float32) acceptance post {trained_acc['post']['acceptance']:.3f}, "
                f"pre {trained_acc['pre']['acceptance']:.3f}")
        record: dict[str, Any] = {
            "model": folder_name(name),
            "architecture": config["model_type"],
            "seed": settings.seed,
            "settings": settings_dict(settings),
            "parameters": {"backbone": param_count(result.model), "head": param_count(result.head)},
            "vocab_size_trained": tok.get_vocab_size(),
            "backbone": {"steps": settings.backbone_steps, "seconds": round(result.backbone_seconds, 1),
                         "loss": result.backbone_losses},
            "head": {"steps": settings.head_steps, "seconds": round(result.head_seconds, 1),
                     "loss": result.head_losses, "hidden": settings.head_hidden,
                     "objective": f"{settings.distill_weight} x distillation on the backbone's t+2 distribution + "
                                  f"{settings.ce_weight} x cross-entropy on x[t+2]"},
            "acceptance": {
                "how": (f"greedy, depth 1, {len(prompts)} held-out prompts x up to 48 new tokens; drafts checked "
                        "against plain greedy decoding along its path"),
                "trained_float32": trained_acc,
            },
            # Text like this drafts at the rates above; other text (the model never saw any) will not.
            "example_prompts": [tok.decode(p, skip_special_tokens=False) for p in prompts[:6]],
            "machine": {"platform": platform.platform(), "mlx": mx.__version__,
                        "ld_preload": os.environ.get("LD_PRELOAD", ""),
                        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS", "")},
        }
        export_checkpoint(folder, result.model, result.head, config, tokdir, record, model_card(record))
    if log:
        log(f"{name}: exported to {folder} ({folder_bytes(folder)} bytes)")
    if check:
        if log:
            log(f"{name}: self-check")
        record["mlx_lm_load"] = check_reload(folder, result.model, prompts, log=log)
        write_record(folder, record)
        add_converted_checks(folder, record, prompts, result.head, log)
    return record


def write_record(folder: Path, record: dict[str, Any]) -> None:
    (folder / "training.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (folder / "README.md").write_text(model_card(record), encoding="utf-8")


def add_converted_checks(
    folder: Path, record: dict[str, Any], prompts: list[list[int]], head: Any, log: Callable[[str], None] | None
) -> None:
    checks = check_converted(folder, prompts, trained_head=head, log=log)
    record["acceptance"]["converted_bf16_backbone"] = checks["bf16"]
    record["acceptance"]["converted_4bit_backbone"] = checks["4bit"]
    record["acceptance"]["mutations"] = mutation_acceptance(folder, prompts, log=log)
    record["bytes"] = folder_bytes(folder)
    write_record(folder, record)


def recheck(folder: str | Path, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Re-run the conversion checks on an exported folder (after a change to add-mtp or verify),
    with the held-out prompts its training.json describes; updates training.json and README."""
    from tokenizers import Tokenizer

    folder = Path(folder)
    record = json.loads((folder / "training.json").read_text(encoding="utf-8"))
    settings = TrainSettings(**record["settings"])
    prompts = heldout_prompts(Tokenizer.from_file(str(folder / "tokenizer.json")), settings)
    add_converted_checks(folder, record, prompts, None, log)
    return record


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def _acc(record: dict[str, Any], key: str, hidden: str) -> str:
    a = record["acceptance"].get(key)
    return f"{a[hidden]['acceptance']:.1%}" if a else "not measured"


def _verify_line(record: dict[str, Any]) -> str:
    parts = []
    for label, key in (("bf16", "converted_bf16_backbone"), ("4-bit", "converted_4bit_backbone")):
        v = (record["acceptance"].get(key) or {}).get("verify") or {}
        if isinstance(v.get("acceptance"), (int, float)):
            parts.append(f"{v['acceptance']:.1%} on the {label} target (output identical to greedy: {v.get('identical')})")
    if not parts:
        return ""
    return ("\n`mtpforge verify --generate` (the speculative loop itself, with its default prompts): "
            + "; ".join(parts) + ".\n")


def model_card(record: dict[str, Any]) -> str:
    """A short README.md: what this is, how it was made, what it measures."""
    s = record["settings"]
    moe = record["architecture"] == "qwen3_5_moe"
    muts = record["acceptance"].get("mutations") or {}
    mut_line = ("\nThe same head with a known conversion bug put in on purpose (float32 reference on the source): "
                + ", ".join(f"{k.replace('_', ' ')} {v:.1%}" for k, v in muts.items()) + ".\n") if muts else ""
    rows = "\n".join(
        f"| {label} | {_acc(record, key, 'post')} | {_acc(record, key, 'pre')} |"
        for label, key in (("trained model, float32", "trained_float32"),
                           ("mlx_lm.convert bf16 + add-mtp bf16", "converted_bf16_backbone"),
                           ("mlx_lm.convert 4-bit g64 + add-mtp bf16", "converted_4bit_backbone"))
    )
    return f"""# {record['model']}

A tiny {'MoE ' if moe else ''}Qwen3.5-architecture model (`{record['architecture']}`) with its multi-token-prediction
head, trained from scratch by `scripts/train_tiny.py` on a generated templated corpus (no third-party
text), bundled with mtpforge as the source for `mtpforge demo` and the tests. It knows nothing useful;
it exists so that MTP acceptance rates mean something offline.

- Hugging Face layout exactly as the Qwen releases: `model.language_model.*` + `lm_head`, zero-centred
  RMSNorms (stored `w - 1`), conv1d `[C, 1, K]`, {'fused experts (`experts.gate_up_proj`, gate rows first) in the backbone and the head (Qwen3.6 style), ' if moe else ''}the
  head under top-level `mtp.` spread over the last two shards, bf16 (`A_log` float32),
  `mtp_num_hidden_layers: 1`.
- {record['parameters']['backbone']:,} backbone and {record['parameters']['head']:,} head parameters; 4 layers (Gated DeltaNet,
  attention, Gated DeltaNet, attention), hidden 64; byte-level BPE, {record['vocab_size_trained']} tokens.
- Backbone: {s['backbone_steps']} steps of next-token cross-entropy ({record['backbone']['seconds']} s). Head: {s['head_steps']} steps
  with the backbone frozen ({record['head']['seconds']} s): {record['head']['objective']};
  trained on post- and pre-norm hidden states alternately (`{s['head_hidden']}`), so both variants draft.
  The head's MLP input norm starts at gain {s.get('head_mlp_gain', 1.0)} so its SwiGLU works in the nonlinear regime
  of released heads: a conversion that swaps gate/up halves or scrambles experts then shows in acceptance.
- Seed {record['seed']}; `training.json` has the settings, loss curves and measurements.

Greedy acceptance at depth 1 on held-out prompts (post-norm / pre-norm hidden state):

| backbone | post | pre |
|---|---|---|
{rows}
{_verify_line(record)}{mut_line}"""
