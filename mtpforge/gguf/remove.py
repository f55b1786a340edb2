"""``remove-mtp`` for GGUF: take back what add-mtp wrote beside a trunk, byte for byte.

add-mtp never modifies a trunk; it writes a head file (an ``mtp-*.gguf`` sibling, or a
``gguf-tail`` output), its record ``<head>.mtpforge.json`` and a section of the folder's model
card. Undoing it removes the head and its record and gives the card back as it was — but only
what the record proves: the head's bytes must hash to the recorded sha256, the card's section to
one recorded, and the card without it to the bytes it had (else the user's later edits are kept).
Anything else is refused in one line with nothing changed.

Order: the card first, then the head, the record last — a run killed half-way leaves a record
that a second run finishes from (a head already gone, a card without its section, are fine).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

from ..errors import RefusedError
from ..layouts.gguf import GGUF_LAYOUTS
from ..inputs.manifest_file import GgufManifestFile, gguf_trunk_files, read_gguf_manifest
from ..manifest import UntrustedManifest, _link_allowed
from ..model_card import CARD, find, section_sha, take_out, write_atomic
from ..writer.lock import folder_lock
from .commit import sweep_leftovers
from .gguffile import first_part
from .write import file_sha256

MANIFEST_SUFFIX = ".mtpforge.json"


def _untrusted(record: Path, why: str) -> UntrustedManifest:
    return UntrustedManifest(f"{record} cannot be trusted: {why}; nothing was changed",
                             "remove-mtp undoes only what add-mtp provably wrote; delete the head and its record by hand")


def heads_of(target: Path) -> list[Path]:
    """The head files add-mtp recorded for ``target``: the file itself when it is a head (its
    record beside it); the heads whose record names it when it is a trunk; every recorded head
    of a folder."""
    if target.is_dir():
        folder, trunk = target, None
    else:
        if Path(str(target) + MANIFEST_SUFFIX).is_file():
            return [target]
        folder, trunk = target.parent, first_part(target).name  # any part of a split trunk: its first
    out = []
    for rec in sorted(folder.glob(f"*.gguf{MANIFEST_SUFFIX}")):
        if rec.is_symlink():
            continue
        head = rec.with_name(rec.name[: -len(MANIFEST_SUFFIX)])
        if trunk is None:
            out.append(head)
            continue
        m, _ = read_gguf_manifest(rec)
        # a trunk's heads are its gguf-mtp siblings; a gguf-tail output is a model of its own,
        # removed when named (or with its folder)
        row = GGUF_LAYOUTS.get(str(getattr(m, "layout", "")))
        if m is not None and row is not None and row.beside_trunk and trunk in gguf_trunk_files(m):
            out.append(head)
    return out


def _checked(head: Path) -> GgufManifestFile:
    """The head's record, validated, with the head's bytes proved (absent: already removed)."""
    rec = Path(str(head) + MANIFEST_SUFFIX)
    m, bad = read_gguf_manifest(rec)
    if m is None:
        raise _untrusted(rec, bad.message if bad is not None else "it is not a file")
    if m.file_sha256 is None:
        raise _untrusted(rec, "it records no hash of the head")
    if os.path.lexists(head):
        if head.is_symlink() or not head.is_file():
            raise _untrusted(rec, f"{head.name} is not the regular file add-mtp wrote")
        if file_sha256(head) != m.file_sha256:
            raise _untrusted(rec, f"{head.name} is not the file add-mtp wrote (its bytes changed since)")
        if not _holds_mtp_block(head):  # a record beside a trunk, hashing the trunk, removes nothing
            raise _untrusted(rec, f"{head.name} holds no MTP block, and add-mtp writes only files that do")
    return m


def _holds_mtp_block(head: Path) -> bool:
    """Whether ``head`` is a GGUF with NextN tensors (what add-mtp writes: an MTP-only file or a
    trunk with its tail) or a drafter of a family's own architecture (DSpark's ``dflash``), read
    by the bounded header walk."""
    from ..errors import MtpforgeError
    from ..families import FAMILIES
    from .gguffile import read_local

    drafters = {s.gguf_drafter.arch for s in FAMILIES.values() if s.gguf_drafter}
    try:
        g = read_local(head)
        return g.arch in drafters or any(".nextn." in n for n in g.tensors)
    except MtpforgeError:
        return False


def _card_undo(folder: Path, m: GgufManifestFile, rec: Path) -> tuple[str, bytes | str | None]:
    """What to do with the card: ('keep', None), ('remove', None), ('write', bytes), ('edited',
    bytes: the user's later edits kept) or ('link', target). Nothing the record holds is written
    into the card: only the card's own bytes without the section, checked against the recorded
    hash."""
    cr = m.model_card
    if cr is None or cr.file != CARD:
        return "keep", None
    p = folder / CARD
    if not os.path.lexists(p):
        return "keep", None  # deleted since: the user's choice stands
    if p.is_symlink() or not p.is_file():
        raise _untrusted(rec, f"{CARD} is not the file add-mtp wrote")
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "keep", None
    if find(text) is None:
        return "keep", None  # the section was taken out by hand
    if section_sha(text) not in cr.section_sha256:
        raise UntrustedManifest(
            f"{CARD}'s MTP head section was edited after add-mtp, so removing the head would discard that edit; "
            "nothing was changed",
            "undo the edit inside the section (between the mtpforge:mtp-head comments), or delete the section by hand")
    rest = take_out(text, cr.separator).encode("utf-8")
    before = cr.before
    kind = before.kind
    unchanged = hashlib.sha256(data).hexdigest() == cr.after_sha256
    if kind == "absent":
        return ("remove", None) if unchanged or not rest.strip() else ("edited", rest)
    if not unchanged:
        return "edited", rest  # edited after add-mtp: the edits stay, the section goes
    if hashlib.sha256(rest).hexdigest() != before.sha256:
        raise _untrusted(rec, f"its record of {CARD} does not match the card add-mtp left")
    if kind == "symlink":
        dest = _link_allowed(folder, before.target) if before.target else None
        if dest is not None and hashlib.sha256(dest.read_bytes()).hexdigest() == before.sha256:
            return "link", before.target
    return "write", rest


def _relink(p: Path, target: str) -> None:
    tmp = p.with_name(f".{p.name}.mtpforge-link-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, p)


def remove_mtp_gguf(target: str, *, progress: bool = True) -> dict[str, Any]:
    """Remove every head add-mtp recorded for ``target`` (a trunk, a head, or their folder)."""
    from ..progress import Progress

    path = Path(target).expanduser()
    folder = path if path.is_dir() else path.parent
    with folder_lock(folder):
        sweep_leftovers(folder)  # a killed add-mtp's records rolled forward first: they are undone too
        heads = heads_of(path)
        if not heads:
            raise RefusedError(f"{target} has no head recorded by mtpforge (no *.gguf{MANIFEST_SUFFIX} names it)",
                               "remove-mtp only undoes mtpforge's own changes; delete a head another tool wrote by hand")
        checked = [(h, _checked(h)) for h in heads]  # every proof before anything changes
        # one card, one section: the first record that vouches for it says how it was
        card = next((c for c in (_card_undo(folder, m, Path(str(h) + MANIFEST_SUFFIX)) for h, m in checked)
                     if c[0] != "keep"), ("keep", None))
        prog = Progress(enabled=progress)
        removed: list[str] = []
        restored: list[str] = []
        kept: list[str] = []
        _apply_card(folder / CARD, card, removed, restored, kept)
        for h, _ in checked:
            prog.step(f"removing {h.name}")
            if os.path.lexists(h):
                h.unlink()
            removed.append(h.name)
            Path(str(h) + MANIFEST_SUFFIX).unlink()
            removed.append(h.name + MANIFEST_SUFFIX)
        prog.done(f"removed the MTP head from {folder}")
    return {"target": str(path), "status": "removed", "removed": removed, "restored": restored, "kept_edits": kept}


def _apply_card(p: Path, card: tuple[str, bytes | str | None], removed: list[str], restored: list[str],
                kept: list[str]) -> None:
    """Carry out :func:`_card_undo`'s answer (one rename, never through a link)."""
    what, arg = card
    if what == "remove":
        p.unlink()
        removed.append(CARD)
    elif what in ("write", "edited"):
        assert isinstance(arg, bytes)
        write_atomic(p, arg)
        (restored if what == "write" else kept).append(CARD)
    elif what == "link":
        assert isinstance(arg, str)
        _relink(p, arg)
        restored.append(CARD)


__all__ = ["heads_of", "remove_mtp_gguf"]
