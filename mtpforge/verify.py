"""``mtpforge verify``: decode with the target's own backbone and head, and prove the head works.

Proof means three numbers a user can act on: the MTP output equals plain greedy decoding token
for token (a decoder or conversion bug that changes output is caught), the acceptance rate (a
head converted wrongly drafts ~0%, a good one most of the time), and the speed of both decoders
measured in this process. Read-only unless ``record`` is set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from .errors import InputError, RefusedError
from .families import FAMILIES
from .families.tables import is_head_key
from .layouts.table import MANIFEST, is_drafter_type
from .manifest import record_measurement
from .cells import counted
from .progress import Progress

#: Plain text (and one chat turn): every model continues plain text, while chat templates differ
#: between models. The bundled tiny model was trained on generated documents of these kinds
#: (sentences, counting, arithmetic, code, chat turns ending in <|im_end|>, its eos), so its
#: acceptance is meaningful on them; each prompt leaves several documents to go before that eos.
DEFAULT_PROMPTS: tuple[str, ...] = (
    "The old man reads the map after the rain.\n",
    "A small boat carries seven stones under the bridge.\nCount: 12, 13,",
    "<|im_start|>user\nWhat does the robot do?<|im_end|>\n<|im_start|>assistant\nThe robot builds a wooden box.<|im_end|>\n",
    "Count: 3, 4, 5, 6, 7, 8.\n25 + 17 =",
)


def verify(
    target: str,
    *,
    generate: bool = False,
    prompts: Sequence[str] | None = None,
    max_tokens: int = 64,
    depth: int = 1,
    hidden: str = "auto",
    temp: float = 0.0,
    seed: int | None = None,
    min_acceptance: float = 0.0,
    record: bool = False,
    progress: bool = True,
    llama_server: str | None = None,
    draft: str | None = None,
) -> dict[str, Any]:
    """Load the head of ``target`` from whatever layout holds it and decode with it.

    Without ``generate`` only checks that the head loads and drafts one step. ``ok`` is false
    (exit 1) when greedy MTP output differs from plain greedy output or acceptance is below
    ``min_acceptance``.
    """
    from .gguf.addmtp import is_gguf_path

    if is_gguf_path(target):  # a llama.cpp GGUF: the real llama-server decodes
        from .gguf.verify import verify_gguf

        return verify_gguf(target, draft=draft, prompts=prompts, max_tokens=max_tokens, llama_server_path=llama_server,
                           min_acceptance=min_acceptance, n_max=depth, progress=progress)
    from .decoder.backbone import HIDDEN_VARIANTS
    from .layouts.read import load_head_weights

    _check_args(hidden, depth, max_tokens, temp)
    folder = _check_target(target)
    prog = Progress(enabled=progress)

    prog.step(f"loading the MTP head of {folder}")
    hw = load_head_weights(folder)
    # what --record will vouch for: the manifest and head as they were when loaded
    loaded_manifest = _manifest_bytes(hw.folder) if record else None
    prog.step("loading the backbone with mlx-lm")
    bb, head = _load(folder, hw)
    report: dict[str, Any] = {
        "target": str(folder), "family": hw.family, "layout": hw.layout, "head_folder": str(hw.folder),
        "mtp_layers": hw.n_layers, "generate": generate, "notes": list(hw.notes), "problems": [],
    }
    texts = list(prompts) if prompts else list(DEFAULT_PROMPTS)
    encoded = [_encode(bb.tokenizer, t) for t in texts]
    if not generate:
        return _draft_check(bb, head, encoded[0], report, prog)

    _finite_draft(bb, head, encoded[0], report["problems"])
    variants = list(HIDDEN_VARIANTS) if hidden == "auto" else [hidden]
    prog.step(f"decoding {counted(len(encoded), 'prompt')}, {max_tokens} tokens each: plain, then MTP at depth {depth} "
              f"with the {' and '.join(variants)}-norm hidden state")
    plain, runs, per_variant = _decode(bb, head, encoded, variants, max_tokens=max_tokens, depth=depth, temp=temp, seed=seed)
    # the better variant; on a tie post-norm, what vLLM, SGLang and llama.cpp feed (docs/SPEC.md §3)
    best = max(variants, key=lambda v: (per_variant[v]["acceptance"], v == "post"))
    chosen = per_variant[best]
    greedy = temp <= 0.0
    divergences = _divergences(bb, encoded, texts, plain, runs, per_variant, report["problems"])
    report.update({k: v for k, v in chosen.items() if k != "differences"})
    report["per_prompt"] = _per_prompt(texts, runs[best], plain)
    report.update(
        identical=(not divergences) if greedy else None,
        divergences=divergences,
        hidden=best,
        hidden_variants={v: per_variant[v]["acceptance"] for v in variants},
        depth=depth, temp=temp, seed=seed, max_tokens=max_tokens, prompts=len(texts),
        baseline_tokens=sum(len(r.tokens) for r in plain),
    )
    _judge(report, min_acceptance)
    if greedy and report["identical"]:
        _advise(report, folder, hw)
    if record:
        _record(report, hw.folder, loaded_manifest)
    (prog.done if report["ok"] else prog.step)(
        f"acceptance {report['acceptance']:.1%} ({best}-norm hidden), identical: {report['identical']}")
    return report


def _advise(report: dict[str, Any], folder: Path, hw: Any) -> None:
    """Name ``mtpforge align`` where the trunk's quantization costs this head more than the
    precision table says (advice, not a failure: the head is what it is on this trunk)."""
    from .checks.trunk_cost import align_note

    note = align_note(folder, hw.family, hw.quant, report["acceptance"])
    if note is not None:
        report["notes"].append(note)
        report["advice"] = "align"


def _judge(report: dict[str, Any], min_acceptance: float) -> None:
    if report["acceptance"] < min_acceptance:
        report["problems"].append(
            f"acceptance {report['acceptance']:.1%} is below --min-acceptance {min_acceptance:.1%}: the head drafts "
            f"badly (a wrong norm convention gives ~0%, a double shift about half)")
    report["ok"] = not report["problems"]
    report["exit_code"] = 0 if report["ok"] else 1


def _load(folder: Path, hw: Any) -> tuple[Any, Any]:
    """The backbone (mlx-lm) and the head built on it; a head of another size is one line."""
    from .decoder.backbone import load_backbone
    from .decoder.head import build_head

    spec = FAMILIES[hw.family]
    if spec.gguf_only:
        raise RefusedError(*spec.gguf_only_refusal(f"and its decoder does not build that head from an MLX folder: "
                                                   f"{folder} cannot be verified here",
                                                   "verify the GGUF: mtpforge verify TRUNK.gguf"))
    bb = load_backbone(folder, hw.family)
    try:
        return bb, build_head(hw.family, bb.args, hw.tensors, hw.quant, compute_dtype=bb.dtype)
    except ValueError as e:
        said = " ".join(str(e).split())  # mlx's load errors list one key a line: the message is one line
        raise RefusedError(f"MTP_SHAPE_MISMATCH: the head in {hw.folder} does not fit this backbone: "
                           f"{said[:300]}{'...' if len(said) > 300 else ''}",
                           f"run `mtpforge inspect {folder}`; re-add the head from this model's own source with --force") from None


def _check_args(hidden: str, depth: int, max_tokens: int, temp: float) -> None:
    from .decoder.backbone import HIDDEN_VARIANTS

    if hidden not in ("auto", *HIDDEN_VARIANTS):
        raise InputError(f"hidden must be auto, pre or post, not {hidden!r}", "use --hidden auto")
    if depth < 1 or max_tokens < 1:
        raise InputError("depth and max_tokens must be at least 1", "pass --depth 1 --max-tokens 64")
    if temp < 0:
        raise InputError(f"temp must be >= 0, not {temp}", "use --temp 0 for greedy decoding")


def _check_target(target: str) -> Path:
    """The folder, its config and the side files mlx-lm's loaders read, validated before mlx-lm
    sees them (mlx-lm trusts every value: a malformed one would be a crash deep inside it)."""
    from .checkpoint.catalogue import load_catalogue
    from .checkpoint.store import LocalStore
    from .inputs.side_files import GENERATION_CONFIG, TOKENIZER_CONFIG, read_side_file

    folder = Path(target).expanduser()
    if not folder.is_dir():
        raise InputError(f"{target} is not a folder", "pass the MLX model folder that holds the head")
    store = LocalStore(folder)
    if not store.exists("config.json"):
        raise InputError(f"{target} has no config.json", "pass an MLX model folder (with config.json and weights)")
    cat = load_catalogue(store)
    if is_drafter_type(cat.config.model_type):
        raise InputError(f"{target} is an mlx-vlm drafter folder, which has no backbone to decode with",
                         "pass the model folder beside it (verify finds <model>-mtp-drafter by itself)")
    cat.refuse_invalid()
    for rel in (GENERATION_CONFIG, TOKENIZER_CONFIG):
        problems = read_side_file(store, rel).problems
        if problems:
            raise problems[0].error()
    _check_layer_count(cat)
    return folder


def _check_layer_count(cat: Any) -> None:
    """The backbone's layer count in config.json is the one its weights hold: mlx-lm builds
    every layer the config names before it looks at a weight (a corrupt count of millions would
    run out of memory instead of failing)."""
    import re

    declared = cat.config.text.num_hidden_layers
    found = {int(m.group(1)) for k in cat.tensors if not is_head_key(k, cat.config)
             and (m := re.search(r"(?:^|\.)model\.layers\.(\d+)\.", k))}
    if declared is not None and found and declared != max(found) + 1:
        raise RefusedError(f"{cat.config.file}: num_hidden_layers is {declared}, but the weights hold {max(found) + 1} layers",
                           "restore config.json from the original model (or re-convert it)")


def _encode(tokenizer: Any, text: str) -> list[int]:
    try:
        ids = list(tokenizer.encode(text))
    except Exception as e:  # noqa: BLE001 - the folder's tokenizer files, as transformers reads them
        raise RefusedError(f"the folder's tokenizer cannot encode a prompt ({e.__class__.__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})",
                           "restore tokenizer.json and tokenizer_config.json from the original model") from None
    if not ids:
        raise InputError(f"prompt {text!r} encodes to no tokens", "pass a non-empty --prompt")
    return [int(i) for i in ids]


def _draft_check(bb: Any, head: Any, prompt: list[int], report: dict[str, Any], prog: Progress) -> dict[str, Any]:
    import mlx.core as mx

    from .decoder.loop import draft_once

    prog.step("running one draft step")
    token, logits = draft_once(bb, head, prompt)
    finite = bool(mx.all(mx.isfinite(logits)).item())
    if not finite:
        report["problems"].append("the head's draft logits are not finite (NaN/Inf): its weights are damaged")
    report.update(draft_token=token, draft_logits_finite=finite, ok=finite, exit_code=0 if finite else 1)
    prog.done("the head loads and drafts" if finite else "the head does not draft")
    return report


def _manifest_bytes(folder: Path) -> bytes | None:
    try:
        return (folder / MANIFEST).read_bytes()
    except OSError:
        return None


def _decode(bb: Any, head: Any, encoded: list[list[int]], variants: list[str], *, max_tokens: int, depth: int,
            temp: float, seed: int | None) -> tuple[list[Any], dict[str, list[Any]], dict[str, dict[str, Any]]]:
    """Plain and MTP decoding of every prompt, and the statistics per hidden variant."""
    from .decoder.loop import HeadDrafter, mtp_decode, plain_decode
    from .decoder.sampling import Chooser
    from .decoder.stats import first_difference, summarize

    plain_decode(bb, encoded[0], max_tokens=min(8, max_tokens), chooser=Chooser(temp, seed))  # warm-up
    # prompt by prompt, plain and MTP back to back: on a shared machine, load drifts between
    # runs, and interleaving keeps the speed comparison fair
    plain: list[Any] = []
    runs: dict[str, list[Any]] = {v: [] for v in variants}
    choosers = {v: Chooser(temp, seed) for v in variants}
    plain_chooser = Chooser(temp, seed)
    for p in encoded:
        plain.append(plain_decode(bb, p, max_tokens=max_tokens, chooser=plain_chooser))
        for v in variants:
            runs[v].append(mtp_decode(bb, HeadDrafter(bb, head), p, max_tokens=max_tokens, depth=depth, hidden=v,
                                      chooser=choosers[v]))
    per_variant: dict[str, dict[str, Any]] = {}
    for v in variants:
        stats = summarize(runs[v], plain)
        diffs = [(i, first_difference(r.tokens, b.tokens)) for i, (r, b) in enumerate(zip(runs[v], plain))]
        stats["differences"] = [(i, d) for i, d in diffs if d is not None] if temp <= 0.0 else []
        per_variant[v] = stats
    return plain, runs, per_variant


#: the figures verify reports for each prompt (``per_prompt``; verify --report plots them)
PER_PROMPT_KEYS = ("tokens", "drafted", "accepted", "acceptance", "acceptance_by_position", "speedup")


def _per_prompt(texts: list[str], runs: list[Any], plain: list[Any]) -> list[dict[str, Any]]:
    """The chosen variant's figures prompt by prompt: where the head drafts well and where not."""
    from .decoder.stats import summarize

    return [{"prompt": t, **{k: v for k, v in summarize([r], [b]).items() if k in PER_PROMPT_KEYS}}
            for t, r, b in zip(texts, runs, plain)]


def _divergences(bb: Any, encoded: list[list[int]], texts: list[str], plain: list[Any], runs: dict[str, list[Any]],
                 per_variant: dict[str, dict[str, Any]], problems: list[str]) -> list[dict[str, Any]]:
    """Where greedy MTP output parts from plain greedy output, and whether on a numerical tie."""
    from .decoder.stats import tie_margin

    divergences = []
    for v, s in per_variant.items():
        for i, d in s["differences"]:
            mine, ref = runs[v][i].tokens, plain[i].tokens
            margin, tol = (tie_margin(bb, encoded[i], ref[:d], ref[d], mine[d]) if d < min(len(mine), len(ref))
                           else (float("inf"), 0.0))
            tie = margin <= tol
            divergences.append({"hidden": v, "prompt": i + 1, "token": d, "logit_margin": margin, "tolerance": tol,
                                "numerical_tie": tie})
            # docs/CONTRACT.md: greedy output must equal plain decoding token for token, so even a near-tie
            # fails; the message says which kind it was so a user on a bf16 GPU path can judge
            if tie:
                problems.append(
                    f"{v}-norm MTP output parts from plain greedy at token {d} of prompt {i + 1} on a numerical tie "
                    f"(the two tokens' logits differ by {margin:.2g}, within rounding {tol:.2g}): likely compute-dtype "
                    "rounding between the batched verify pass and single steps, not a conversion bug")
            else:
                problems.append(
                    f"greedy MTP output ({v}-norm hidden) differs from plain greedy decoding at token {d} of prompt "
                    f"{i + 1} ({texts[i][:40]!r}; logit margin {margin:.3g}): the decoder or the backbone's caches are wrong")
    return divergences


def _record(report: dict[str, Any], head_folder: Path, loaded_manifest: bytes | None) -> None:
    if not report["ok"]:
        report["recorded"] = None
        report["notes"].append("the check failed: nothing recorded")
        return
    report["recorded"] = record_measurement(head_folder, report, expect=loaded_manifest)
    if report["recorded"] is None:
        report["notes"].append(f"no {MANIFEST} in {head_folder} (head not written by mtpforge): nothing recorded")


def _finite_draft(bb: Any, head: Any, prompt: list[int], problems: list[str]) -> None:
    """NaN logits still argmax to some token, and acceptance then measures nothing."""
    import mlx.core as mx

    from .decoder.loop import draft_once

    _, logits = draft_once(bb, head, prompt)
    if not bool(mx.all(mx.isfinite(logits)).item()):
        problems.append("the head's draft logits are not finite (NaN/Inf): its weights are damaged")
