"""``verify`` on a GGUF: the real llama.cpp decodes greedily with and without its MTP drafter.

Proof is llama.cpp's own: the token ids with ``--spec-type draft-mtp`` must equal plain greedy
decoding, and acceptance is its ``draft_n_accepted / draft_n``. The head is the trunk's own NextN
tail, or an MTP-only file (``--draft``, else the ``mtp-*.gguf`` beside the trunk that mtpforge
wrote for it, else the only one there).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..cells import counted
from ..errors import InputError, RefusedError
from ..findings import DEAD_AGREEMENT
from ..inputs.manifest_file import gguf_trunk_files, read_gguf_manifest
from ..progress import Progress
from .addmtp import MANIFEST_SUFFIX
from ..families import FAMILIES
from .drafter import drafter_family, drafter_files
from .finite import nonfinite_tensors
from .gguffile import GgufFile, read_local
from .names import block_of, family_of
from .server import decode_all, llama_server, require_llama_server


def find_mtp_file(trunk: Path, arch: str | None = None) -> Path | None:
    """The head file llama.cpp would pair with ``trunk``: an MTP-only GGUF or, for a trunk of
    ``arch``, a drafter of its own (``gguf/drafter.py``) — mtpforge's (its manifest names the
    trunk), else the only one in the folder."""
    cands = sorted(p for p in trunk.parent.glob("mtp-*.gguf") if p.is_file())
    cands += [p for p, _ in drafter_files(trunk, arch)] if arch else []
    for p in cands:
        m, _ = read_gguf_manifest(p.with_name(p.name + MANIFEST_SUFFIX))
        if m is not None and trunk.name in gguf_trunk_files(m):
            return p
    return cands[0] if len(cands) == 1 else None


@dataclass(frozen=True)
class _Head:
    """What verify drafts with: the file (None: the trunk's own NextN tail), the GGUF that holds
    the head, how llama-server loads it, and how many tokens it drafts a step."""

    file: Path | None
    gguf: GgufFile
    spec_type: str
    n_max: int
    hidden: str
    note: str


def _head(tpath: Path, trunk: GgufFile, draft: str | None, n_max: int) -> _Head:
    """The trunk's own tail, else ``--draft``, else the head file beside it. A drafter (DSpark)
    drafts a block at a time: unless ``--depth`` says more, the block less its anchor, as
    llama.cpp's own DSpark example runs it."""
    fam = FAMILIES.get(family_of(trunk) or "")
    hidden = fam.gguf_mtp_hidden if fam is not None else "post"
    if trunk.nextn_layers > 0 and any(".nextn." in n for n in trunk.tensors):
        return _Head(None, trunk, "draft-mtp", n_max, hidden, _fed(hidden))
    mtp_file = Path(draft).expanduser() if draft else find_mtp_file(tpath, trunk.arch)
    if mtp_file is None:
        raise RefusedError(f"{tpath.name} has no MTP head: no NextN tail and no mtp-*.gguf beside it",
                           f"mtpforge add-mtp --source <original Hugging Face repo> --target {tpath}")
    if not mtp_file.is_file():
        raise InputError(f"--draft {draft} does not exist", "pass the MTP-only .gguf file")
    head = read_local(mtp_file)
    drafter = drafter_family(head)
    d = FAMILIES[drafter].gguf_drafter if drafter else None
    if d is None:
        return _Head(mtp_file, head, "draft-mtp", n_max, hidden, _fed(hidden))
    block = int(head.get("{arch}.block_size", 0) or 0)
    return _Head(mtp_file, head, d.spec_type, n_max if n_max > 1 or block < 2 else block - 1, hidden,
                 f"llama.cpp's {d.spec_type} drafter reads the hidden states of the trunk's layers "
                 f"{head.get('{arch}.target_layers')} and drafts {block - 1} tokens a step")


def _fed(hidden: str) -> str:
    return f"llama.cpp feeds its MTP head the {hidden}-norm hidden state"


def _refuse_nonfinite(head: GgufFile, drafter: bool) -> None:
    """A head holding NaN or Inf is a failed check before any decoding: llama.cpp drafts with it,
    the target rejects every draft, and the output stays identical to plain decoding, so the run
    passed (exit 0) with a damaged head. A drafter file is all head."""
    blocks = {block_of(n) for n in head.tensors if ".nextn." in n}
    bad = nonfinite_tensors(head, [n for n in head.tensors if drafter or block_of(n) in blocks])
    if bad:
        raise RefusedError(f"{head.name}: NaN or Inf in {len(bad)} MTP head tensor(s) ({', '.join(bad[:3])}), "
                           "so its drafts mean nothing; nothing was decoded",
                           "re-write the head with mtpforge add-mtp --force from the original source",
                           code="NONFINITE_WEIGHTS")


def verify_gguf(
    target: str, *, draft: str | None = None, prompts: Sequence[str] | None = None, max_tokens: int = 64,
    llama_server_path: str | None = None, min_acceptance: float = 0.0, n_max: int = 1, progress: bool = True,
) -> dict[str, Any]:
    from ..verify import DEFAULT_PROMPTS

    trunk = read_local(Path(target).expanduser())  # a file that is not a GGUF is said before a missing llama-server
    tpath = trunk.path  # a split trunk's first part, whichever part was given: what llama-server loads
    assert tpath is not None
    h = _head(tpath, trunk, draft, n_max)
    mtp_file, head, own_tail, n_max = h.file, h.gguf, h.file is None, h.n_max
    _refuse_nonfinite(head, h.spec_type != "draft-mtp")
    binary = require_llama_server(llama_server_path)
    texts = list(prompts) if prompts else list(DEFAULT_PROMPTS)
    prog = Progress(enabled=progress)
    prog.step(f"plain greedy decoding with {binary.name} ({counted(len(texts), 'prompt')}, {max_tokens} tokens each)")
    t0 = time.monotonic()
    with llama_server(binary, tpath) as srv:
        plain = decode_all(srv, texts, max_tokens)
    t_plain = time.monotonic() - t0
    prog.step(f"greedy decoding with --spec-type {h.spec_type} ({'NextN tail' if own_tail else mtp_file.name})")  # type: ignore[union-attr]
    t0 = time.monotonic()
    with llama_server(binary, tpath, draft=mtp_file, mtp=True, n_max=n_max, spec_type=h.spec_type) as srv:
        spec = decode_all(srv, texts, max_tokens)
    t_spec = time.monotonic() - t0
    identical = all(a.tokens == b.tokens for a, b in zip(plain, spec))
    drafted = sum(c.drafted for c in spec)
    accepted = sum(c.accepted for c in spec)
    tokens = sum(len(c.tokens) for c in spec)
    acc = accepted / drafted if drafted else 0.0
    problems, notes, cpu_identical = _identity(binary, tpath, h, texts, plain, spec, max_tokens, prog)
    if drafted == 0:
        problems.append("llama.cpp drafted nothing: the MTP head was not used")
    if acc < min_acceptance:
        problems.append(f"acceptance {acc:.1%} is below --min-acceptance {min_acceptance:.1%}")
    hidden = h.hidden
    first = trunk.block_count - trunk.nextn_layers if own_tail else 0 if h.spec_type != "draft-mtp" else trunk.block_count
    dead = _dead_head(acc, drafted, head, first, hidden)
    base = [c.tok_s for c in plain if c.tok_s]
    mtp = [c.tok_s for c in spec if c.tok_s]
    b_tps = sum(base) / len(base) if base else None
    m_tps = sum(mtp) / len(mtp) if mtp else None
    result = {
        "target": str(tpath), "format": "gguf", "runtime": "llama.cpp", "llama_server": str(binary),
        "draft": str(mtp_file) if mtp_file else "nextn-tail", "draft_max": n_max,
        "identical": identical, "identical_on_cpu": cpu_identical, "tokens": tokens, "drafted": drafted, "accepted": accepted, "acceptance": acc,
        "acceptance_by_position": [acc] if n_max == 1 else None, "hidden": hidden,
        "accepted_per_verify": accepted / max(1, tokens - accepted) if tokens else 0.0,
        "baseline_tok_s": b_tps, "mtp_tok_s": m_tps,
        "speedup": (m_tps / b_tps) if b_tps and m_tps else None,
        "wall_s": {"plain": round(t_plain, 2), "mtp": round(t_spec, 2)},
        "per_prompt": [{"prompt": t, "tokens": len(c.tokens), "drafted": c.drafted, "accepted": c.accepted,
                        "acceptance": c.accepted / c.drafted if c.drafted else 0.0} for t, c in zip(texts, spec)],
        "problems": problems, "ok": not problems, "exit_code": 1 if problems else 0,
        "spec_type": h.spec_type,
        "notes": [h.note, *notes],
        "dead_head": dead,
    }
    if dead is not None:
        prog.step(f"[yellow]{dead['message']}[/yellow]")
    if problems:
        prog.step("[red]" + "; ".join(problems) + "[/red]")
    else:
        prog.done(f"acceptance {acc:.1%} ({accepted}/{drafted}), identical: {identical}")
    return result


def _identity(binary: Path, trunk: Path, h: _Head, texts: list[str], plain: list[Any], spec: list[Any],
              max_tokens: int, prog: Progress) -> tuple[list[str], list[str], bool | None]:
    """(problems, notes, identical on the CPU backend) of the drafted output against plain
    decoding: a difference is a failure only when the CPU backend keeps it (``_identical_on_cpu``)."""
    bad = [i for i, (a, b) in enumerate(zip(plain, spec)) if a.tokens != b.tokens]
    if not bad:
        return [], [], None
    prog.step(f"output differs on {counted(len(bad), 'prompt')}: decoding {'it' if len(bad) == 1 else 'them'} "
              "again on the CPU backend (-ngl 0)")
    if not _identical_on_cpu(binary, trunk, h, [texts[i] for i in bad], max_tokens):
        return [f"output with draft-mtp differs from plain greedy decoding on prompt(s) {bad}"], [], False
    return [], [f"on this llama-server's accelerator the output with draft-mtp differs from plain decoding on prompt(s) "
                f"{bad}, and on its CPU backend it is identical: llama.cpp's GPU kernels verify a batch of drafted tokens "
                "with other arithmetic than one token at a time (the converter's own MTP file differs the same way), "
                "so near-ties flip; the head is not at fault"], True


#: the GGUF types at or above which a head drafts as well as at f16 (docs/PRECISION.md)
FULL_TYPES = frozenset({"F32", "F16", "BF16", "Q8_0"})
#: types a head holds as its release stores them whatever --precision says (DeepSeek-V4's FP4
#: experts are repacked, not rounded): never the precision advice's cause
AS_RELEASED = frozenset({"MXFP4"})


def _dead_head(acc: float, drafted: int, head_file: GgufFile, first_mtp_block: int, hidden: str) -> dict[str, Any] | None:
    """A head that llama.cpp measured accepting almost nothing, with the likely causes in the
    order MLX's inspect gives them (precision, norms, hidden state). Why here: for a GGUF there is
    no offline check, and users have published ``-mtp`` files at 0.0% acceptance that loaded
    without a word; acceptance this low makes drafting slower than plain decoding."""
    if drafted == 0 or acc >= DEAD_AGREEMENT:
        return None
    types = sorted({t.type_name for n, t in head_file.tensors.items()
                    if n.startswith("blk.") and int(n.split(".")[1]) >= first_mtp_block and len(t.shape) >= 2})
    low = [t for t in types if t.upper() not in FULL_TYPES | AS_RELEASED]
    kept = [t for t in types if t.upper() in AS_RELEASED]
    why = [f"precision: the head's matrices are {'/'.join(types)}"
           + (f" ({'/'.join(kept)}: the release's own FP4 experts, moved without rounding at every --precision)" if kept else "")
           + (" — heads collapse in low types; re-create it with mtpforge add-mtp --precision f16 (or q8_0)" if low
              else ", full enough, so its values themselves are off (a damaged or untrained head)"),
           "norms: a head whose norms carry the other convention (+1 where the release stores raw values, or raw where "
           "llama.cpp expects +1) drafts like this; mtpforge inspect FILE --source REPO compares them with the release",
           f"hidden state: llama.cpp feeds this family's head the {hidden}-norm hidden state; a head trained on other "
           "hidden states, or on another model, drafts like this"]
    msg = (f"the head accepted {acc:.1%} of {drafted} drafts: drafting is slower than plain decoding at this rate. "
           "Likely causes, in order: " + "; ".join(f"({i}) {c}" for i, c in enumerate(why, 1)))
    return {"acceptance": acc, "drafted": drafted, "head_types": types, "causes": why, "message": msg}


def _identical_on_cpu(binary: Path, trunk: Path, h: _Head, texts: list[str], max_tokens: int) -> bool:
    """Plain and drafted decoding of ``texts`` again with every layer on the CPU backend. Why:
    with layers offloaded to a GPU, llama.cpp's CUDA backend verifies a batch of drafted tokens
    with other kernels than it decodes one token with, and greedy output then differs from plain
    decoding on near-ties for any MTP file, the converter's own included (measured on an H200:
    14 of 16 model x trunk cases differed on 1-8 of 24 prompts, the converter's file giving
    exactly our tokens in all 8 cases it drafts in; on the CPU backend all 16 were identical). A difference that the CPU backend reproduces
    is the head's (or the trunk's); one it does not is the accelerator's arithmetic."""
    cpu = ["-ngl", "0"]
    with llama_server(binary, trunk, extra=cpu) as srv:
        plain = decode_all(srv, texts, max_tokens)
    with llama_server(binary, trunk, draft=h.file, mtp=True, n_max=h.n_max, extra=cpu, spec_type=h.spec_type) as srv:
        spec = decode_all(srv, texts, max_tokens)
    return all(a.tokens == b.tokens for a, b in zip(plain, spec))


__all__ = ["verify_gguf", "find_mtp_file"]
