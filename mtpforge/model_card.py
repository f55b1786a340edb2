"""The model card (README.md) section that says a folder's MTP head was put back.

On the Hub, a model card is where users look for what a folder holds; a conversion with its head
restored should say so — from which source and revision, in which layout and precision, and
how well it drafts once ``verify --record`` measured it. The section sits between two HTML
comments (invisible when rendered), so it is found again exactly: ``remove-mtp`` (and
``add-mtp --force`` before it writes the new one) takes it out and leaves the rest of the card
byte for byte as it was, edits a user made elsewhere in the card included.

The card is one of the files add-mtp writes, so the manifest proves it like the others
(``manifest.record_card``, ``manifest.plan_undo``): a card add-mtp created is hashed and listed
as added; an existing card gets an edit record (hashes before and after, the link it was); the
section's own hash says which section is mtpforge's. Nothing is stored that undo would write
back: the restored card is the current one without the proven section.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .layouts.table import MANIFEST

if TYPE_CHECKING:
    from .families.spec import FamilySpec
    from .writer.atomic import StagedFolder

CARD = "README.md"
BEGIN = "<!-- mtpforge:mtp-head -->"
END = "<!-- /mtpforge:mtp-head -->"


#: the card's closing line for an MLX folder: how to undo or check the head
MLX_CLOSING = "Remove it with `mtpforge remove-mtp <folder>`; check it with `mtpforge inspect <folder>`."
#: what the card says of a zero-centred family's head norms and how to undo or check it (Qwen)
MLX_TEXT = ("shifted (+1, as mlx-lm's loaders expect)", MLX_CLOSING)


def norms_said(family: "str | FamilySpec | None") -> tuple[str, str, str]:
    """(convention, the card's words, the manifest's ``norm_shift`` words) for the norms of an
    MLX head add-mtp writes for ``family``, from its spec: a family whose release stores zero-
    centred norms (``norm_roles``) gets ``norm_offset`` added, as mlx-lm's loaders expect; a raw-
    norm family's (GLM, Nemotron-H) are written as stored, and saying "shifted" there would send
    a reader (or another tool) to shift them. An unknown family (a damaged record) reads as
    Qwen's, the convention every manifest said before families without a shift existed."""
    from .families.tables import spec_named

    try:
        spec = spec_named(family) if family is not None else None
    except KeyError:
        spec = None
    if spec is not None and not (spec.norm_offset and spec.norm_roles):
        return ("raw", "raw (as stored in the source: the family's norms are not zero-centred, and mlx-lm applies them as-is)",
                "none: the family's norms are not zero-centred; written as stored in the source")
    off, kinds = (spec.norm_offset, len(spec.norm_roles)) if spec is not None else (1.0, 7)
    return ("shifted", f"shifted (+{off:g}, as mlx-lm's loaders expect)",
            f"+{off:g} on the {kinds} zero-centred MTP norm kinds (source is raw Hugging Face)")


def _precision(m: dict[str, Any]) -> str:
    p = m.get("precision") or {}
    if isinstance(p, str):  # a GGUF head: one ggml type for its matrices (norms stay F32)
        return f"{p} (ggml; norms F32)"
    d = p.get("default")
    mods = p.get("modules") or {}
    quantized = [v for v in mods.values() if isinstance(v, dict)]
    if not quantized:
        return f"{p.get('float_dtype', 'bfloat16')} (not quantized)"
    bits = sorted({q.get("bits") for q in quantized})
    q = quantized[0]
    text = f"{'/'.join(map(str, bits))}-bit, group {q.get('group_size')}, {q.get('mode', 'affine')}"
    return text + ("" if d else " (backbone not quantized)")


def section(manifest: dict[str, Any], text: tuple[str, str] | None = None) -> str:
    """The section's text, from the manifest alone (what add-mtp wrote and verify recorded);
    ``text``: the norms' wording and the closing line of the output format (default: an MLX
    folder's, the norms' words from the manifest's family). The words are used only for the
    convention they describe; any other recorded convention is shown by its name."""
    if text is None:
        text = (norms_said(manifest.get("family"))[1], MLX_CLOSING)
    conv = str(manifest.get("norm_convention"))
    src = manifest.get("source") or {}
    repo = str(src.get("repo") or "the original checkpoint")
    rev = src.get("revision")
    where = f"[`{repo}`](https://huggingface.co/{repo})" if not src.get("local") else f"`{repo}` (a local folder)"
    at = f" at revision `{rev[:12]}`" if rev else ""
    rows = [
        ("source", f"{where}{at}"),
        ("layout", f"{manifest.get('layout')}"),
        ("MTP layers", str(manifest.get("mtp_layers"))),
        ("precision", _precision(manifest)),
        ("norms", text[0] if text[0].split(" ", 1)[0] == conv else conv),
    ]
    if manifest.get("expert_format") not in (None, "none"):
        rows.append(("experts", str(manifest["expert_format"])))
    v = manifest.get("verify")
    if isinstance(v, dict):
        by_pos = " · ".join(f"{a:.0%}" for a in v.get("acceptance_by_position") or [])
        rows.append(("verify", f"acceptance {v.get('acceptance', 0):.1%} at depth {v.get('depth')} "
                               f"(by position: {by_pos}; {v.get('hidden_state')}-norm hidden state), "
                               f"output identical to plain greedy: {v.get('identical')}, measured {v.get('measured_at')}"))
    al = manifest.get("aligned")
    if isinstance(al, list) and al and isinstance(al[-1], dict):
        a = al[-1]
        rows.append(("aligned", f"re-fitted to this folder's own trunk by `mtpforge align` ({a.get('steps')} steps): "
                                f"acceptance {a.get('acceptance_before', 0):.1%} -> {a.get('acceptance_after', 0):.1%}, "
                                f"{a.get('at')}"))
    lines = [BEGIN, "## MTP head", "",
             f"This folder carries the multi-token-prediction (MTP) head of {where}{at}, put back with "
             f"mtpforge {manifest.get('mtpforge_version', '')} after conversion dropped it.".replace("  ", " "), "",
             "| | |", "|---|---|"]
    lines += [f"| {k} | {v_.replace('|', '/')} |" for k, v_ in rows]
    lines += ["", text[1], END]
    # a source folder whose name is not UTF-8 (surrogate escapes) is shown escaped: a card is text
    return ("\n".join(lines) + "\n").encode("utf-8", "backslashreplace").decode("utf-8")


def find(text: str) -> tuple[int, int] | None:
    """Start and end (past END and its newline) of the section, or None."""
    a = text.find(BEGIN)
    if a < 0:
        return None
    b = text.find(END, a)
    if b < 0:
        return None
    b += len(END)
    if text.startswith("\n", b):
        b += 1
    return a, b


def separator(text: str) -> str:
    """What goes between the card and the section: a blank line, whatever the card ends with."""
    if not text:
        return ""
    return "\n" if text.endswith("\n") else "\n\n"


def put(text: str | None, sec: str, sep: str | None = None) -> tuple[str, str]:
    """The card with ``sec`` in place of an existing section, or appended. Returns the new text
    and the separator used (recorded so that ``take_out`` restores the old bytes exactly)."""
    old = text or ""
    span = find(old)
    if span is not None:
        return old[: span[0]] + sec + old[span[1]:], sep if sep is not None else ""
    s = separator(old)
    return old + s + sec, s


def take_out(text: str, sep: str) -> str:
    """The card without the section and the separator ``put`` added."""
    span = find(text)
    if span is None:
        return text
    a, b = span
    if sep and text[:a].endswith(sep) and b == len(text):
        a -= len(sep)
    return text[:a] + text[b:]


def section_sha(text: str) -> str | None:
    """sha256 of the section as it stands in ``text`` (None: no section): what the manifest
    records, so remove-mtp takes out only a section mtpforge wrote."""
    span = find(text)
    return None if span is None else hashlib.sha256(text[span[0]:span[1]].encode("utf-8")).hexdigest()


def write_section(stage: "StagedFolder", manifest: dict[str, Any]) -> str | None:
    """Put the section into the staged card (a new card when there is none) and record it in
    ``manifest`` (``manifest.record_card``: hashed when added, an edit record when changed).
    A card that is a symlink (a Hub cache snapshot's) is replaced by a file, the link recorded.
    Returns a note when the card is left alone: not a regular UTF-8 file, or already holding a
    section mtpforge did not record."""
    from .manifest import record_card

    p = stage.path(CARD)
    link = os.readlink(p) if p.is_symlink() else None
    old: str | None = None
    if os.path.lexists(p):
        try:
            old = p.read_bytes().decode("utf-8") if p.is_file() else None  # bytes: CRLF stays CRLF
        except (OSError, UnicodeDecodeError):
            old = None
        if old is None:
            return f"left {CARD} alone: it is not a readable UTF-8 text file, so the card says nothing of the head"
        if find(old) is not None:
            return f"left {CARD} alone: it already has an MTP head section that this folder's {MANIFEST} does not record"
    sec = section(manifest)
    new, sep = put(old, sec)
    before = None if old is None else old.encode("utf-8")
    after = new.encode("utf-8")
    stage.write_bytes(CARD, after)
    record_card(manifest, before=before, link=link, after=after, separator=sep, section_text=sec)
    return None


def card_beside(folder: Path, manifest: dict[str, Any], text: tuple[str, str],
                recorded: dict[str, Any] | None) -> tuple[bytes | None, dict[str, Any] | None, str | None]:
    """The card of a folder that is not staged (a GGUF head's folder: its README is the repo's
    card), under the same proof as ``write_section``: the new bytes, the record (how the card
    was before — absent, a file, a link — with its hash, the separator, the section's hash and
    the card's hash after), or a note when the card is left alone. ``recorded``: the record of
    the head this run replaces, whose section may be rewritten in place."""
    p = folder / CARD
    link = os.readlink(p) if p.is_symlink() else None
    old: str | None = None
    if os.path.lexists(p):
        try:
            old = p.read_bytes().decode("utf-8") if p.is_file() else None
        except (OSError, UnicodeDecodeError):
            old = None
        if old is None:
            return None, None, f"left {CARD} alone: it is not a readable UTF-8 text file, so the card says nothing of the head"
        if find(old) is not None and (recorded is None or section_sha(old) not in recorded["section_sha256"]):
            return None, None, f"left {CARD} alone: it already has an MTP head section that this head's record does not vouch for"
    sec = section(manifest, text)
    if recorded is not None and old is not None and find(old) is not None:
        new, sep, before = put(old, sec, recorded["separator"])[0], recorded["separator"], recorded["before"]
    else:
        new, sep = put(old, sec)
        before = {"kind": "absent"} if old is None else {
            **({"kind": "symlink", "target": link} if link is not None else {"kind": "file"}),
            "sha256": hashlib.sha256(old.encode("utf-8")).hexdigest()}
    data = new.encode("utf-8")
    record = {"file": CARD, "separator": sep, "section_sha256": [hashlib.sha256(sec.encode("utf-8")).hexdigest()],
              "before": before, "after_sha256": hashlib.sha256(data).hexdigest()}
    return data, record, None


def refreshed(text: str, manifest: dict[str, Any]) -> str | None:
    """The card with its section rewritten from ``manifest`` (after ``verify --record``), or
    None when there is nothing to rewrite: no section, or one the manifest does not vouch for
    (edited by hand: left as the user made it)."""
    rec = manifest.get("model_card")
    if not isinstance(rec, dict) or section_sha(text) not in (rec.get("section_sha256") or []):
        return None
    span = find(text)
    assert span is not None
    new = text[: span[0]] + section(manifest) + text[span[1]:]
    return None if new == text else new


def write_atomic(path: Path, data: bytes) -> None:
    """A temp file beside ``path``, one rename (never through a symlink: the link is replaced)."""
    fd, tmp = tempfile.mkstemp(prefix=".mtpforge-", suffix=".md.tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if path.is_file() and not path.is_symlink():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        else:  # a new card gets a new file's mode (mkstemp's is 0600: the repo's card unreadable to others)
            mask = os.umask(0o022)
            os.umask(mask)
            os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


__all__ = ["CARD", "BEGIN", "END", "MLX_CLOSING", "MLX_TEXT", "norms_said", "card_beside", "section", "put", "take_out", "find", "section_sha",
           "write_section", "refreshed", "write_atomic"]
