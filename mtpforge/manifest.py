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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .checkpoint.store import Store, safe_relpath
from .errors import MtpforgeError, RefusedError
from .layouts.table import MANIFEST
from .layouts.write import dump_json

if TYPE_CHECKING:
    from .plan import Plan
    from .writer.atomic import StagedFolder

MANIFEST_VERSION = 1


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
    """The manifest add-mtp writes beside the head it staged."""
    return {
        "mtpforge_manifest": MANIFEST_VERSION,
        "mtpforge_version": __version__,
        "family": family,
        "layout": layout,
        "source": source,
        "options": options,
        "norm_convention": "shifted",
        "norm_shift": "+1 on the 7 zero-centred MTP norm kinds (source is raw Hugging Face)",
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
    if not isinstance(m, dict):
        return None
    # remove-mtp deletes and rewrites what the manifest names: a hostile one must not reach
    # outside the folder (``/etc/...``, ``../``)
    added, changed = m.get("added", []), m.get("changed") or {}
    try:
        ok = isinstance(added, list) and isinstance(changed, dict) and all(isinstance(v, dict) for v in changed.values()) \
            and all(isinstance(r, str) and safe_relpath(r) == r for r in [*added, *changed])
    except MtpforgeError:
        ok = False
    if not ok:
        raise RefusedError(f"{p} is malformed or names files outside {folder.name}",
                           f"restore {MANIFEST} from a backup, or delete it and use add-mtp --force")
    return m


def read_manifest_hint(store: Store) -> dict[str, Any] | None:
    """The manifest as inspect reads it: a hint about provenance, never a reason to fail."""
    if not store.exists(MANIFEST):
        return None
    try:
        obj = json.loads(store.read_bytes(MANIFEST))
        return obj if isinstance(obj, dict) else None
    except (ValueError, UnicodeDecodeError):
        return None


def head_intact(folder: Path, manifest: dict[str, Any]) -> bool:
    """Whether the files the manifest hashed still hold the bytes add-mtp wrote."""
    for rel, sha in (manifest.get("file_sha256") or {}).items():
        p = folder / rel
        if not p.is_file() or file_sha(p) != sha:
            return False
    return True


def undo(stage: "StagedFolder", manifest: dict[str, Any]) -> None:
    """Undo what a manifest says add-mtp did, inside a staged folder."""
    for rel in manifest.get("added", []):
        stage.remove(rel)
    for rel, before in (manifest.get("changed") or {}).items():
        kind = before.get("kind")
        if kind == "absent":
            stage.remove(rel)
        elif kind == "symlink":
            stage.restore_link(rel, before["target"])
        else:
            stage.write_bytes(rel, before["text"].encode("utf-8"))


def record_measurement(head_folder: Path, report: dict[str, Any]) -> str | None:
    """Write the measured hidden variant and acceptance into the manifest, atomically.

    A temp file beside the manifest and one ``os.replace``: a reader sees the old manifest or
    the new one, never half; if the manifest is a symlink, the link is replaced by a file and
    whatever it pointed to is left untouched (never write through a symlink).
    Returns the manifest path, or None when there is no manifest.
    """
    path = head_folder / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise RefusedError(f"{path} is not valid JSON, so the measurement was not recorded",
                           "re-add the head with `mtpforge add-mtp --force`, then verify --record again") from None
    manifest["verify"] = {
        "hidden_state": report["hidden"],
        "acceptance": round(report["acceptance"], 4),
        "hidden_variants": {k: round(v, 4) for k, v in report["hidden_variants"].items()},
        "acceptance_by_position": [round(a, 4) for a in report["acceptance_by_position"]],
        "depth": report["depth"], "temp": report["temp"], "max_tokens": report["max_tokens"],
        "prompts": report["prompts"], "identical": report["identical"],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mtpforge_version": __version__,
    }
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
    return str(path)


__all__ = ["MANIFEST", "MANIFEST_VERSION", "build_manifest", "entry", "file_sha", "head_intact", "read_manifest", "read_manifest_hint", "record_measurement", "undo"]
