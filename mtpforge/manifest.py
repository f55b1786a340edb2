"""``mtpforge.json``: the record of what add-mtp changed in a folder, and the one place that
reads it, writes it and decides how far it can be trusted.

remove-mtp and ``add-mtp --force`` undo what a manifest says; a manifest travels with the folder
(folders are shared and uploaded whole), so what it says is checked against the files before
anything is undone.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .checkpoint.store import Store, safe_relpath
from .errors import MtpforgeError, RefusedError
from .checkpoint.catalogue import INDEX_FILE
from .inputs.manifest_file import check_manifest
from .inputs.problems import Problem
from .layouts.table import EMBEDDED_FILE, LAYOUTS, MANIFEST, SIDECAR_FILE, VLLM_MLX_MANIFEST, VLLM_MLX_WEIGHTS, is_drafter_type
from .layouts.write import dump_json
from .model_card import CARD, find, refreshed, section_sha, take_out, write_atomic
from .runtimes.config import REWRITTEN_FOR_RUNTIME

if TYPE_CHECKING:
    from .plan import Plan
    from .writer.atomic import StagedFolder

MANIFEST_VERSION = 2


def file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def entry(path: Path) -> dict[str, Any]:
    """How a file looked before add-mtp changed it: content, symlink target, or absent."""
    if path.is_symlink():
        return {"kind": "symlink", "target": os.readlink(path)}
    if path.is_file():
        return {"kind": "file", "text": path.read_bytes().decode("utf-8")}
    return {"kind": "absent"}


def build_manifest(
    *, family: str, layout: str, source: dict[str, Any], options: dict[str, Any], plan: "Plan", n_layers: int,
    tensors: dict[str, Any], file_sha256: dict[str, str], added: list[str], changed: dict[str, Any],
) -> dict[str, Any]:
    """The manifest add-mtp writes beside the head it staged (its norms labelled from the
    family's spec: shifted for a zero-centred family, raw for GLM's and Nemotron-H's)."""
    from .model_card import norms_said

    return {
        "mtpforge_manifest": MANIFEST_VERSION,
        "mtpforge_version": __version__,
        "family": family,
        "layout": layout,
        "source": source,
        "options": options,
        "norm_convention": norms_said(family)[0],
        "norm_shift": norms_said(family)[2],
        "expert_format": plan.expert_format,
        "precision": {
            "float_dtype": plan.float_dtype,
            "default": plan.default_q.as_config() if plan.default_q else None,
            "modules": {m.bare: (m.q.as_config() if m.q else m.float_dtype) for m in plan.modules},
        },
        "mtp_layers": n_layers,
        "tensors": tensors,
        "file_sha256": file_sha256,
        "added": added + [MANIFEST],
        "changed": changed,
    }


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of a local folder for add-mtp / remove-mtp (refuses a damaged one)."""
    p = folder / MANIFEST
    if not p.is_file():
        return None
    try:
        m = json.loads(p.read_text("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise RefusedError(f"{p} is not valid JSON", f"delete {p} only if you know what changed, then re-run with --force") from None
    except OSError as e:
        raise RefusedError(f"cannot read {p}: {e.strerror or e}", f"make {MANIFEST} a readable file") from None
    bad = check_manifest(m, str(p))
    if bad is not None:
        raise RefusedError(f"{p} cannot be trusted: {bad.message}; nothing was changed",
                           f"restore {MANIFEST} from a backup, or delete it and use add-mtp --force")
    # remove-mtp deletes and rewrites what the manifest names: a hostile one must not reach
    # outside the folder (``/etc/...``, ``../``)
    added, changed = m.get("added") or [], m.get("changed") or {}
    try:
        ok = all(safe_relpath(r) == r for r in [*added, *changed])
    except MtpforgeError:
        ok = False
    if not ok:
        raise RefusedError(f"{p} is malformed or names files outside {folder.name}",
                           f"restore {MANIFEST} from a backup, or delete it and use add-mtp --force")
    return m


def read_manifest_hint(store: Store) -> tuple[dict[str, Any] | None, Problem | None]:
    """The manifest as inspect reads it: a hint about provenance, never a reason to fail. A
    record that does not validate is ignored, and what is wrong with it returned."""
    if not store.exists(MANIFEST):
        return None, None
    file = f"{store.name.rstrip('/')}/{MANIFEST}"
    try:
        obj = json.loads(store.read_bytes(MANIFEST))
    except (ValueError, UnicodeDecodeError, RecursionError, OSError, MtpforgeError) as e:
        return None, Problem(file, "(the file)", f"not JSON ({e.__class__.__name__})", "a JSON object")
    bad = check_manifest(obj, file)
    return (obj, None) if bad is None else (None, bad)


def head_intact(folder: Path, manifest: dict[str, Any]) -> bool:
    """Whether the files the manifest hashed still hold the bytes add-mtp wrote (the model card
    aside: it is the user's to edit, and says nothing of the head's bytes)."""
    hashes = manifest.get("file_sha256")
    if not isinstance(hashes, dict) or not hashes:
        return False
    for rel, sha in hashes.items():
        if rel == CARD:
            continue
        p = folder / rel
        if not isinstance(rel, str) or p.is_symlink() or not p.is_file() or file_sha(p) != sha:
            return False
    return True


# ----------------------------------------------------------------------------- what add-mtp may change

#: files add-mtp creates in a model folder (a drafter folder's config and weights come apart)
HEAD_FILES = (EMBEDDED_FILE, SIDECAR_FILE, VLLM_MLX_WEIGHTS)
#: files whose content add-mtp edits; nothing else is ever restored from a manifest
EDITED_FILES = ("config.json", INDEX_FILE)
_COUNT_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")


def _is_mtp_path(key: str, nextn: tuple[str, ...] = ()) -> bool:
    """A head key: an ``mtp`` component (Qwen, Nemotron-H), or one of ``nextn`` — the prefixes of a
    NextN layer appended after the backbone's (GLM's ``model.layers.{N}.``, :func:`nextn_prefixes`)."""
    return "mtp" in key.split(".") or (bool(nextn) and key.startswith(nextn))


def nextn_prefixes(folder: Path) -> tuple[str, ...]:
    """The prefixes of the head's keys of a family whose head is a NextN layer numbered after the
    backbone's, from the folder's own config (its family and layer count, never the manifest's
    word, so a record cannot make a backbone layer count as the head); ``()`` for any other."""
    from .families import FAMILIES
    from .families.detect import detect_family

    try:
        config = json.loads((folder / "config.json").read_text("utf-8"))
        family = detect_family(config) if isinstance(config, dict) else None
        spec = FAMILIES[family] if family else None
        if spec is None or not spec.topology.nextn:
            return ()
        return tuple(p for p in spec.head_prefixes(config) if "mtp" not in p.split("."))
    except (OSError, ValueError, TypeError, AttributeError, KeyError, RecursionError):
        return ()


def allowed_change(rel: str, path: tuple[str, ...], nextn: tuple[str, ...] = ()) -> bool:
    """Whether add-mtp ever changes the JSON value at ``path`` of ``rel``: the head's layer
    count, the sidecar pointer, a key rewritten for ``--runtime``'s mlx-lm, quantization entries of head modules, index entries of head
    tensors and the index's total size. A manifest asking to restore anything else is refused."""
    if rel == "config.json":
        if path in ((k,) for k in _COUNT_KEYS) or path in (("text_config", k) for k in _COUNT_KEYS):
            return True
        if path == ("mlx_lm_extra_tensors",):
            return True
        if path[-1:] and path[-1] in REWRITTEN_FOR_RUNTIME and path[:-1] in ((), ("text_config",)):
            return True  # a tagged float written as --runtime's mlx-lm 0.31 reads it (runtimes/config.py)
        return len(path) == 2 and path[0] in ("quantization", "quantization_config") and _is_mtp_path(path[1], nextn)
    if rel == INDEX_FILE:
        return path == ("metadata", "total_size") or (
            len(path) == 2 and path[0] == "weight_map" and _is_mtp_path(path[1], nextn))
    return False


_MISSING = object()


def json_diff(before: Any, after: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any, Any]]:
    """Leaf differences between two JSON values, as (path, before, after); dicts are walked,
    anything else compared whole. A key present on one side only shows ``_MISSING`` on the other."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for k in list(before) + [k for k in after if k not in before]:
            b, a = before.get(k, _MISSING), after.get(k, _MISSING)
            if isinstance(b, dict) and isinstance(a, dict):
                out += json_diff(b, a, path + (k,))
            elif a is _MISSING and isinstance(b, dict) and path == () and k in ("quantization", "quantization_config"):
                out += [(path + (k, kk), v, _MISSING) for kk, v in b.items()]
            elif b is _MISSING and isinstance(a, dict) and path == () and k in ("quantization", "quantization_config"):
                out += [(path + (k, kk), _MISSING, v) for kk, v in a.items()]
            elif b is _MISSING or a is _MISSING or b != a or type(b) is not type(a):
                out.append((path + (k,), b, a))
        return out
    return [] if before == after and type(before) is type(after) else [(path, before, after)]


def patch_of(rel: str, before: Any, after: Any) -> list[dict[str, Any]]:
    """What add-mtp changed in ``rel``, as the manifest records it (``before`` absent = the key
    was added)."""
    out = []
    for path, b, a in json_diff(before, after):
        e: dict[str, Any] = {"path": list(path)}
        if b is not _MISSING:
            e["before"] = b
        if a is not _MISSING:
            e["after"] = a
        out.append(e)
    return out


def edit_record(rel: str, before: dict[str, Any], before_bytes: bytes | None, after_bytes: bytes) -> dict[str, Any]:
    """The ``changed`` entry of ``rel``: how it looked, the hashes of those bytes and of the bytes
    add-mtp produced, and the key-level patch (so a later edit of other keys survives undo)."""
    rec = dict(before)
    if before_bytes is not None:
        rec["sha256"] = hashlib.sha256(before_bytes).hexdigest()
    rec["after_sha256"] = hashlib.sha256(after_bytes).hexdigest()
    old = json.loads(before_bytes) if before_bytes is not None else None
    rec["patch"] = patch_of(rel, old, json.loads(after_bytes)) if isinstance(old, dict) else None
    return rec


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_card(manifest: dict[str, Any], *, before: bytes | None, link: str | None, after: bytes, separator: str,
                section_text: str) -> None:
    """Record the model card add-mtp wrote (``model_card.write_section``) with the same proof as
    every file it writes: created -> listed as added and hashed; edited -> an edit record
    (how it was: a file or a link, hashes before and after). ``model_card`` holds the separator
    put before the section and the hashes of the sections mtpforge wrote (verify --record adds
    the refreshed one), so undo takes out a section only when it is one of them."""
    if before is None:
        manifest["added"].insert(len(manifest["added"]) - 1, CARD)  # before the manifest itself
        manifest["file_sha256"][CARD] = _sha(after)
    else:
        rec: dict[str, Any] = {"kind": "symlink", "target": link} if link is not None else {"kind": "file"}
        manifest["changed"][CARD] = {**rec, "sha256": _sha(before), "after_sha256": _sha(after)}
    manifest["model_card"] = {"file": CARD, "separator": separator,
                              "section_sha256": [_sha(section_text.encode("utf-8"))]}


# ----------------------------------------------------------------------------- undo, checked

class UntrustedManifest(RefusedError):
    """The manifest asks for something add-mtp provably did not do; nothing was changed."""

    code = "MANIFEST_UNTRUSTED"


@dataclass
class UndoPlan:
    """What undoing a manifest does, decided (and checked) before anything is staged."""

    remove: list[str] = field(default_factory=list)
    write: dict[str, bytes] = field(default_factory=dict)
    link: dict[str, str] = field(default_factory=dict)
    kept_edits: list[str] = field(default_factory=list)


def _refuse(folder: Path, why: str) -> UntrustedManifest:
    return UntrustedManifest(
        f"{folder / MANIFEST} cannot be trusted: {why}; nothing was changed",
        f"remove-mtp undoes only what add-mtp provably wrote; restore the files by hand (or from a backup) and delete {MANIFEST}")


def _read_json_file(p: Path) -> Any:
    try:
        return json.loads(p.read_bytes())
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return _MISSING


def _link_allowed(folder: Path, link: str) -> Path | None:
    """Where a symlink add-mtp replaced may point when restored: inside the folder, or, for a
    Hugging Face cache snapshot (``snapshots/<rev>/``), into that repo's ``blobs/`` — never an
    absolute path, never anywhere else. Returns the file it resolves to."""
    if not isinstance(link, str) or not link or os.path.isabs(link) or "\0" in link:
        return None
    real = Path(os.path.realpath(folder))
    dest = Path(os.path.realpath(real / link))
    roots = [real]
    if real.parent.name == "snapshots":
        roots.append(real.parent.parent / "blobs")
    if not any(dest == r or r in dest.parents for r in roots) or not dest.is_file():
        return None
    return dest


def _get(obj: Any, path: list[str]) -> Any:
    for k in path:
        if not isinstance(obj, dict) or k not in obj:
            return _MISSING
        obj = obj[k]
    return obj


def _put(obj: dict[str, Any], path: list[str], value: Any) -> None:
    for k in path[:-1]:
        nxt = obj.get(k)
        if not isinstance(nxt, dict):
            nxt = obj[k] = {}
        obj = nxt
    if value is _MISSING:
        obj.pop(path[-1], None)
    else:
        obj[path[-1]] = value


def plan_undo(folder: Path, manifest: dict[str, Any]) -> UndoPlan:
    """Check a manifest against the folder and decide how to undo it; refuse (one line) unless
    every step undoes something add-mtp provably did.

    Files are removed only when add-mtp creates files of that name and their bytes are the ones
    it hashed; config.json and the index are restored only where they differ from what add-mtp
    produced in keys add-mtp writes; a symlink is restored only inside the folder (or into the
    Hub cache blob store of a snapshot) and only to the bytes recorded."""
    plan = UndoPlan()
    added, changed = manifest.get("added", []), manifest.get("changed") or {}
    hashes = manifest.get("file_sha256") or {}
    if not isinstance(hashes, dict):
        raise _refuse(folder, "its file hashes are malformed")
    layout = manifest.get("layout")
    drafter = isinstance(layout, str) and layout in LAYOUTS and LAYOUTS[layout].separate_folder
    if not isinstance(added, list) or not isinstance(changed, dict):
        raise _refuse(folder, "it is malformed")
    if not hashes or any(rel not in added for rel in hashes):
        raise _refuse(folder, "it does not record the files add-mtp wrote with their hashes")
    if not drafter and "config.json" not in changed:
        raise _refuse(folder, "it does not record how config.json looked before add-mtp")
    nextn = nextn_prefixes(folder)
    for rel in added:
        if rel not in (MANIFEST, CARD) and _added_file_removable(folder, rel, hashes, drafter, nextn):
            plan.remove.append(rel)
    plan.remove.append(MANIFEST)
    _plan_card(folder, manifest, plan)
    for rel, before in changed.items():
        if rel == CARD:
            continue  # planned above
        if rel not in EDITED_FILES or (drafter and rel in added):
            raise _refuse(folder, f"it asks to restore {rel}, a file add-mtp never edits")
        _plan_restore(folder, rel, before, plan, nextn)
    _check_index_after(folder, plan)
    return plan


def _card_record(folder: Path, manifest: dict[str, Any]) -> tuple[str, list[Any], str | None, dict[str, Any] | None]:
    """The card's record, checked for shape: separator, section hashes, the hash of the card
    add-mtp left, and the edit record (None: add-mtp created the card)."""
    added, changed, hashes = manifest.get("added") or [], manifest.get("changed") or {}, manifest.get("file_sha256") or {}
    rec, edited = manifest.get("model_card"), changed.get(CARD)
    if CARD in added and edited is not None:
        raise _refuse(folder, f"it records {CARD} as both added and edited")
    if not isinstance(rec, dict) or rec.get("separator") not in ("", "\n", "\n\n") \
            or not isinstance(rec.get("section_sha256"), list) or not rec["section_sha256"]:
        raise _refuse(folder, f"its record of {CARD} is malformed")
    after = hashes.get(CARD) if edited is None else edited.get("after_sha256")
    if edited is not None and (edited.get("kind") not in ("file", "symlink") or not isinstance(edited.get("sha256"), str)):
        raise _refuse(folder, f"its record of {CARD} is malformed")
    return rec["separator"], rec["section_sha256"], after if isinstance(after, str) else None, edited


def _plan_card(folder: Path, manifest: dict[str, Any], plan: UndoPlan) -> None:
    """Take the card's section out, only when it is one mtpforge wrote (its hash is recorded).
    The card is then: removed, when add-mtp created it and nothing else was written into it;
    the bytes it had (or the link it was), when it is still exactly as add-mtp left it; else the
    current card without the section (the user's later edits kept). Nothing recorded in the
    manifest is ever written back, so a hostile record cannot put text into the card."""
    if CARD not in (manifest.get("added") or []) and CARD not in (manifest.get("changed") or {}):
        return  # add-mtp did not touch the card (or left it alone)
    sep, sections, after_sha, edited = _card_record(folder, manifest)
    p = folder / CARD
    if not os.path.lexists(p):
        plan.kept_edits.append(CARD)  # deleted since: the user's choice stands
        return
    if p.is_symlink() or not p.is_file():
        raise _refuse(folder, f"{CARD} is not the file add-mtp wrote")
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    if find(text) is None:
        plan.kept_edits.append(CARD)  # the section was taken out by hand: nothing of mtpforge's is left
        return
    if section_sha(text) not in sections:
        raise UntrustedManifest(
            f"{CARD}'s MTP head section was edited after add-mtp, so removing the head would discard that edit; nothing was changed",
            "undo the edit inside the section (between the mtpforge:mtp-head comments), or delete the section by hand")
    rest = take_out(text, sep).encode("utf-8")
    unchanged = after_sha == _sha(data)
    if edited is None:
        if unchanged or not rest.strip():
            plan.remove.append(CARD)
        else:
            plan.write[CARD] = rest
            plan.kept_edits.append(CARD)
    elif not unchanged:
        plan.write[CARD] = rest
        plan.kept_edits.append(CARD)
    elif _sha(rest) != edited["sha256"]:
        raise _refuse(folder, f"its record of {CARD} does not match the card add-mtp left")
    elif edited["kind"] == "symlink":
        dest = _link_allowed(folder, edited.get("target"))  # type: ignore[arg-type]
        if dest is None or _sha(dest.read_bytes()) != edited["sha256"]:
            raise _refuse(folder, f"it asks to make {CARD} a link to {str(edited.get('target'))[:80]!r}, which is not the card it was")
        plan.link[CARD] = edited["target"]
    else:
        plan.write[CARD] = rest


def _added_file_removable(folder: Path, rel: str, hashes: dict[str, Any], drafter: bool,
                          nextn: tuple[str, ...] = ()) -> bool:
    """Whether a file the manifest lists as added is there to remove (False: already gone);
    refuses a file add-mtp never writes or whose bytes are not the ones it wrote."""
    from .checkpoint.safetensors_header import read_local_header

    p = folder / rel
    allowed = rel in HEAD_FILES or rel == VLLM_MLX_MANIFEST or (drafter and rel in ("model.safetensors", "config.json"))
    if not allowed:
        raise _refuse(folder, f"it lists {rel} as added, and add-mtp never adds a file of that name")
    if not os.path.lexists(p):
        return False
    if p.is_symlink() or not p.is_file():
        raise _refuse(folder, f"{rel} is not the regular file add-mtp wrote")
    sha = hashes.get(rel)
    if sha is not None:
        if not isinstance(sha, str) or file_sha(p) != sha:
            raise _refuse(folder, f"{rel} is not the file add-mtp wrote (its bytes changed since)")
    elif rel == VLLM_MLX_MANIFEST:
        if _get(_read_json_file(p), ["producer"]) != "mtpforge":
            raise _refuse(folder, f"{rel} was not written by mtpforge")
    elif rel == "config.json":
        if not is_drafter_type(_get(_read_json_file(p), ["model_type"])):
            raise _refuse(folder, f"{rel} is not an mlx-vlm drafter config")
    else:
        raise _refuse(folder, f"it records no hash for {rel}")
    if rel.endswith(".safetensors") and not drafter:
        try:
            keys = list(read_local_header(p, rel).tensors)
        except MtpforgeError:
            raise _refuse(folder, f"{rel} is not a safetensors file") from None
        if any(not _is_mtp_path(k, nextn) for k in keys):
            raise _refuse(folder, f"{rel} holds tensors that are not the MTP head")
    return True


def _recorded_before(folder: Path, rel: str, before: dict[str, Any]) -> tuple[bytes | None, Any]:
    """The bytes (None: absent) and parsed JSON of ``rel`` before add-mtp, as the record says."""
    kind = before.get("kind")
    before_bytes: bytes | None
    if kind == "file":
        text = before.get("text")
        if not isinstance(text, str):
            raise _refuse(folder, f"its record of {rel} is malformed")
        before_bytes = text.encode("utf-8")
    elif kind == "symlink":
        dest = _link_allowed(folder, before.get("target"))  # type: ignore[arg-type]
        if dest is None:
            raise _refuse(folder, f"it asks to make {rel} a link to {str(before.get('target'))[:80]!r}, which leaves the folder")
        before_bytes = dest.read_bytes()
    elif kind == "absent":
        before_bytes = None
        if rel != INDEX_FILE:
            raise _refuse(folder, f"it says {rel} did not exist before")
    else:
        raise _refuse(folder, f"its record of {rel} is malformed")
    sha, after_sha = before.get("sha256"), before.get("after_sha256")
    if after_sha is not None and (not isinstance(after_sha, str) or (before_bytes is not None and not isinstance(sha, str))):
        raise _refuse(folder, f"its record of {rel} is malformed")
    if before_bytes is not None and sha is not None and hashlib.sha256(before_bytes).hexdigest() != sha:
        raise _refuse(folder, f"its record of {rel} does not match its own hash")
    old: Any = None
    if before_bytes is not None:
        try:
            old = json.loads(before_bytes)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise _refuse(folder, f"its record of {rel} is not JSON") from None
        if not isinstance(old, dict):
            raise _refuse(folder, f"its record of {rel} is not a JSON object")
    return before_bytes, old


def _plan_restore(folder: Path, rel: str, before: dict[str, Any], plan: UndoPlan, nextn: tuple[str, ...] = ()) -> None:
    """How to give back config.json or the index: the old bytes, a patch that keeps the user's
    later edits, or removal of an index add-mtp created."""
    p = folder / rel
    if p.is_symlink() or not p.is_file():
        raise _refuse(folder, f"{rel} is not the file add-mtp wrote")
    current_bytes = p.read_bytes()
    current = _read_json_file(p)
    if not isinstance(current, dict):
        raise _refuse(folder, f"{rel} is not a JSON object")
    before_bytes, old = _recorded_before(folder, rel, before)
    after_sha = before.get("after_sha256")
    exact = after_sha == hashlib.sha256(current_bytes).hexdigest() if after_sha is not None else None
    if before_bytes is None:
        # add-mtp created the index: it goes only as add-mtp wrote it (no metadata, exactly
        # the tensors of the folder's shards), and a record that also holds "how it looked"
        # contradicts itself
        if not exact:
            raise _refuse(folder, f"{rel} was created by add-mtp and changed since")
        if "text" in before or "sha256" in before or "target" in before or not _generated_index(folder, current):
            raise _refuse(folder, f"it says {rel} did not exist before, but that index is not one add-mtp creates")
        plan.remove.append(rel)
        return
    bad = [pth for pth, _, _ in json_diff(old, current) if not allowed_change(rel, pth, nextn)]
    patch = before.get("patch")
    if exact is False and isinstance(patch, list):
        _plan_patch(folder, rel, patch, old, current, current_bytes, before_bytes, plan, nextn)
    elif not bad:
        # only keys add-mtp writes differ: the bytes as they were
        if before.get("kind") == "symlink":
            plan.link[rel] = before["target"]
        else:
            plan.write[rel] = before_bytes
    else:
        raise _refuse(folder, f"restoring {rel} from it would change {'.'.join(bad[0])}, which add-mtp never writes" +
                      (" (the file was edited after add-mtp)" if exact is False or exact is None else ""))


def _plan_patch(folder: Path, rel: str, patch: list[Any], old: Any, current: Any, current_bytes: bytes,
                before_bytes: bytes, plan: UndoPlan, nextn: tuple[str, ...] = ()) -> None:
    """Edited after add-mtp: take back add-mtp's keys, keep the user's edits."""
    new = json.loads(current_bytes)
    for e in patch:
        pth = e.get("path") if isinstance(e, dict) else None
        if not isinstance(pth, list) or not pth or not all(isinstance(k, str) for k in pth) \
                or not allowed_change(rel, tuple(pth), nextn):
            raise _refuse(folder, f"its record of {rel} changes keys add-mtp never writes")
        b, a = e.get("before", _MISSING), e.get("after", _MISSING)
        if _get(old, pth) != b:
            raise _refuse(folder, f"its record of {rel} contradicts itself")
        if _get(current, pth) != a:
            raise UntrustedManifest(
                f"{rel} key {'.'.join(pth)} was changed after add-mtp, so removing the head would discard that edit; nothing was changed",
                f"set {'.'.join(pth)} back to {json.dumps(a)[:60]} (what add-mtp wrote), or edit {rel} by hand and delete {MANIFEST}")
        _put(new, pth, b)
    for k in ("quantization", "quantization_config"):
        if isinstance(new.get(k), dict) and not new[k] and k not in old:
            del new[k]
    if new == old:
        plan.write[rel] = before_bytes  # nothing else was edited after all: the bytes as they were
    else:
        plan.write[rel] = dump_json(new)
        plan.kept_edits.append(rel)


def _generated_index(folder: Path, idx: dict[str, Any]) -> bool:
    """Whether ``idx`` is what add-mtp writes when a folder has no index: empty metadata and
    every tensor of the folder's weight files, nothing else."""
    from .checkpoint.safetensors_header import read_local_header

    wm = idx.get("weight_map")
    if idx.get("metadata") not in ({}, None) or not isinstance(wm, dict) or set(idx) - {"metadata", "weight_map"}:
        return False
    want: dict[str, str] = {}
    for f in sorted({v for v in wm.values() if isinstance(v, str)}):
        p = folder / f
        if "/" in f or p.is_symlink() and not p.exists() or not p.is_file():
            return False
        try:
            want.update({k: f for k in read_local_header(p, f).tensors})
        except (MtpforgeError, OSError):
            return False
    return want == wm


def _check_index_after(folder: Path, plan: UndoPlan) -> None:
    """The index left behind must not name a file the undo removes (mlx-lm would fail to load)."""
    if INDEX_FILE in plan.remove or INDEX_FILE in plan.link:
        return
    raw = plan.write.get(INDEX_FILE)
    idx = json.loads(raw) if raw is not None else _read_json_file(folder / INDEX_FILE)
    wm = idx.get("weight_map") if isinstance(idx, dict) else None
    if isinstance(wm, dict) and any(v in plan.remove for v in wm.values()):
        raise _refuse(folder, f"{INDEX_FILE} would still name a file it removes")


def apply_undo(stage: "StagedFolder", plan: UndoPlan) -> None:
    """Carry out a checked undo inside a staged folder."""
    for rel in plan.remove:
        stage.remove(rel)
    for rel, data in plan.write.items():
        stage.write_bytes(rel, data)
    for rel, target in plan.link.items():
        stage.restore_link(rel, target)


def undo(stage: "StagedFolder", manifest: dict[str, Any], folder: Path | None = None) -> UndoPlan:
    """Check ``manifest`` against ``folder`` (the folder the stage mirrors) and undo it."""
    plan = plan_undo(folder if folder is not None else stage.target, manifest)
    apply_undo(stage, plan)
    return plan


def record_measurement(head_folder: Path, report: dict[str, Any], expect: bytes | None = None) -> str | None:
    """Write the measured hidden variant and acceptance into the manifest, atomically.

    A temp file beside the manifest and one ``os.replace``: a reader sees the old manifest or
    the new one, never half; if the manifest is a symlink, the link is replaced by a file and
    whatever it pointed to is left untouched (never write through a symlink).
    Returns the manifest path, or None when there is no manifest.
    """
    from .writer.lock import folder_lock

    with folder_lock(head_folder):  # add-mtp / remove-mtp cannot swap the folder meanwhile
        return _write_measurement(head_folder, report, expect)


def _write_measurement(head_folder: Path, report: dict[str, Any], expect: bytes | None) -> str | None:
    path = head_folder / MANIFEST
    if not path.is_file():
        return None
    try:
        raw = path.read_bytes()
        manifest = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise RefusedError(f"{path} is not valid JSON, so the measurement was not recorded",
                           "re-add the head with `mtpforge add-mtp --force`, then verify --record again") from None
    if check_manifest(manifest, str(path)) is not None or (expect is not None and raw != expect) \
            or not head_intact(head_folder, manifest):
        raise RefusedError(f"the MTP head in {head_folder} changed while verify ran (or no longer matches {MANIFEST}), "
                           "so this measurement was not recorded",
                           "run `mtpforge verify --generate --record` again on the head as it is now")
    manifest["verify"] = {
        "hidden_state": report["hidden"],
        "acceptance": round(report["acceptance"], 4),
        "hidden_variants": {k: round(v, 4) for k, v in report["hidden_variants"].items()},
        "acceptance_by_position": [round(a, 4) for a in report["acceptance_by_position"]],
        "depth": report["depth"], "temp": report["temp"], "max_tokens": report["max_tokens"],
        "prompts": report["prompts"], "identical": report["identical"],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mtpforge_version": __version__,
    }
    card = _refresh_card(head_folder, manifest)
    # the manifest first: it then vouches for the old section and the new one, so a crash
    # between the two renames leaves a card remove-mtp can still prove
    fd, tmp = tempfile.mkstemp(prefix=".mtpforge-", suffix=".json.tmp", dir=head_folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(dump_json(manifest))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if card is not None:
        write_atomic(head_folder / CARD, card)
    return str(path)


def _refresh_card(folder: Path, manifest: dict[str, Any]) -> bytes | None:
    """The card with its section showing the recorded figures (None: no section mtpforge can
    vouch for), and the manifest's card record updated to match: the new section's hash added,
    the card's hash moved on only when the card was exactly as add-mtp left it (else the
    user's edits elsewhere stay "edits" for remove-mtp)."""
    p = folder / CARD
    if p.is_symlink() or not p.is_file():
        return None
    try:
        data = p.read_bytes()
        new = refreshed(data.decode("utf-8"), manifest)
    except (OSError, UnicodeDecodeError):
        return None
    if new is None:
        return None
    out = new.encode("utf-8")
    rec = manifest["model_card"]
    rec["section_sha256"] = list(dict.fromkeys([*rec["section_sha256"], section_sha(new)]))
    hashes, edited = manifest.get("file_sha256") or {}, (manifest.get("changed") or {}).get(CARD)
    if isinstance(edited, dict) and edited.get("after_sha256") == _sha(data):
        edited["after_sha256"] = _sha(out)
    elif edited is None and hashes.get(CARD) == _sha(data):
        hashes[CARD] = _sha(out)
    return out


__all__ = ["MANIFEST", "MANIFEST_VERSION", "build_manifest", "entry", "file_sha", "head_intact", "read_manifest", "read_manifest_hint", "record_measurement", "undo", "plan_undo", "apply_undo", "UndoPlan", "UntrustedManifest", "edit_record", "record_card"]
