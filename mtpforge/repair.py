"""``mtpforge repair-norms``: put a third-party head's RMSNorms into MLX's convention, in place.

Only on decisive evidence: an exact comparison with the source (``--source``, else mtpforge's
manifest or the model card's ``base_model``, as inspect finds them), else the head's behaviour
against its own backbone (:mod:`.checks.norm_behaviour`), which names the offset
(-1, 0, +1) each norm group needs. A head whose behaviour cannot tell (untrained, damaged) is
refused. Only the norm bytes change (a few KB): the file holding them is copied into a staged
folder (a copy-on-write clone where the filesystem has one), patched at the norms' byte spans,
read back, and the folder is swapped in one atomic step with a manifest recording what was done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

from .families.unhandled import not_handled
from . import __version__
from .checkpoint.catalogue import load_catalogue
from .checkpoint.store import LocalStore
from .cells import counted
from .checkpoint.tensors import to_bytes
from .checks.norm_behaviour import SHIFT_NAMES, judge_norms, offset_for
from .checks.norm_sources import BEHAVIOUR_LAYOUTS, settle_weak_groups
from .checks.norms import backbone_verdicts, head_norm_keys
from .errors import InputError, RefusedError
from .families import FAMILIES
from .families.detect import detect_family
from .inputs.manifest_file import check_manifest
from .layouts.detect import locate_head, read_entries
from .layouts.table import MANIFEST
from .layouts.write import dump_json
from .model_card import norms_said
from .progress import Progress
from .writer.atomic import StagedFolder, check_writable_parent, cleanup_leftovers

#: the verdicts a norm can be repaired from (the offset that fixes one depends on its family:
#: ``offset_for``, +1 for a raw zero-centred norm, -1 for a raw-norm family's shifted one)
FIX = frozenset(SHIFT_NAMES.values())


def _expect(spec: Any, bare: str) -> int:
    """What MLX applies over the release's values for this norm (1 zero-centred, 0 raw)."""
    return int(spec.offset_of(bare))


def _clone(src: Path, dst: Path) -> str:
    """Copy ``src`` to ``dst`` (a new inode): a clone where the filesystem shares blocks."""
    if sys.platform == "darwin":
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        if hasattr(libc, "clonefile") and libc.clonefile(bytes(src), bytes(dst), 0) == 0:
            return "clone"
    shutil.copyfile(src, dst)  # copy_file_range / sendfile: reflinks on btrfs and XFS
    return "copy"


def _exact_offsets(folder: Path, source: str | None, revision: str | None, stored_keys: dict[str, str],
                   spec: Any) -> tuple[str, str | None, dict[str, int]] | None:
    """(evidence, source used, offset per bare norm key) from inspect's exact evidence: ``source``,
    else mtpforge's manifest or the model card's ``base_model``. None when neither decides."""
    from .inspect import inspect_checkpoint

    r = inspect_checkpoint(str(folder), source=source, source_revision=revision, data_checks=False, behaviour=False)
    how = r.get("norm_convention_from")
    if how not in ("source", "manifest"):
        return None
    bare = {s: b for b, s in stored_keys.items()}
    verdicts = {bare.get(k, k): v for k, v in (r.get("norm_verdicts") or {}).items()}
    if not verdicts or any(v not in FIX for v in verdicts.values()):
        if source is None:
            return None
        raise RefusedError(f"the head's norms do not match {source}'s exactly (one of them is neither raw, shifted "
                           "nor double-shifted): the evidence is not decisive, nothing was changed",
                           "check that --source is the model this folder was converted from")
    offs = {k: offset_for(_expect(spec, k), v) for k, v in verdicts.items()}
    return how, r.get("norm_source"), {k: o for k, o in offs.items() if o}


def repair_norms(
    target: str, *, source: str | None = None, revision: str | None = None, dry_run: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Fix a wrong norm convention in ``target``'s head; refuse unless the evidence is decisive."""
    folder = Path(target).expanduser()
    if not folder.is_dir():
        raise InputError(f"{target} is not a folder", "pass the MLX model folder whose head has wrong norms")
    if not dry_run:
        cleanup_leftovers(folder)
    cat = load_catalogue(LocalStore(folder))
    family = detect_family(cat.config)
    if family is None:
        raise InputError(*not_handled(str(target), cat.config, "pass a model folder of one of those types"))
    cat.refuse_invalid()  # the head is judged (and decoded) from the config's values
    spec = FAMILIES[family]
    if spec.gguf_only:
        raise RefusedError(*spec.gguf_only_refusal(f"so repair-norms has no MLX norm convention to repair {target}'s "
                                                   "head towards; nothing was changed"))
    loc = locate_head(cat, family)
    if loc.layout not in BEHAVIOUR_LAYOUTS:
        what = {"none": "has no MTP head", "hf": "is a raw Hugging Face checkpoint (mlx-lm shifts its norms on load)"}.get(
            loc.layout, f"holds a {loc.layout} head")
        raise RefusedError(f"{target} {what}; repair-norms fixes a head inside an MLX model folder "
                           f"({', '.join(BEHAVIOUR_LAYOUTS)} layouts)",
                           f"run `mtpforge inspect {target}` to see what the folder needs")
    _read_old_manifest(folder)  # a record that cannot be kept is refused before any work
    prog = Progress(enabled=progress)
    norms = {k: loc.entries[k] for k in head_norm_keys(spec, loc.entries)}
    report: dict[str, Any] = {"target": str(folder), "layout": loc.layout, "family": family, "dry_run": dry_run}
    per_key = _offsets(folder, cat, source, revision, loc.stored_keys, norms, report, prog, spec)
    if not per_key:
        report.update(status="nothing-to-repair", changed_norms={}, files_written=[], bytes_rewritten=0)
        return report
    report["changed_norms"] = {loc.stored_keys.get(k, k): f"{o:+d}" for k, o in sorted(per_key.items())}
    patches = _patches(cat, norms, per_key, report, source, revision, spec)
    report["bytes_rewritten"] = sum(len(d) for ps in patches.values() for _, d, _ in ps)
    report["files_written"] = sorted(patches) + [MANIFEST]
    if dry_run:
        report.update(status="planned")
        return report

    check_writable_parent(folder)
    prog.step(f"patching {counted(len(per_key), 'norm tensor')} ({report['bytes_rewritten']:,} bytes) in {', '.join(sorted(patches))}")
    with StagedFolder(folder) as stage:
        copies = {rel: _patch_file(folder, stage, rel, ps) for rel, ps in patches.items()}
        stage.write_bytes(MANIFEST, dump_json(_manifest(stage.stage, folder, loc.stored_keys, report, family, sorted(patches))))
        prog.step("committing")
        stage.commit()
    report.update(status="repaired", copy=copies)
    return report


def _offsets(folder: Path, cat: Any, source: str | None, revision: str | None, stored_keys: dict[str, str],
             norms: dict[str, Any], report: dict[str, Any], prog: Progress, spec: Any) -> dict[str, int]:
    """The offset to add to each norm, from exact evidence first, else the head's behaviour;
    refuses when neither is decisive."""
    prog.step(f"comparing the head's norms with {source}" if source else "looking for exact evidence (manifest, model card)")
    exact = _exact_offsets(folder, source, revision, stored_keys, spec)
    if exact is not None:
        how, used, per_key = exact
        report.update(evidence=how, source=used)
        return per_key
    prog.step("running the head against its own backbone")
    res = judge_norms(folder)
    report.update(evidence="behaviour", behaviour=res.as_dict())
    if res.convention == "unknown":
        why = res.notes[0] if res.notes else (
            f"no convention explains the backbone decisively better than another (margin {res.evidence:.1f} nats)")
        raise RefusedError(f"the evidence is not decisive, nothing was changed: {why}",
                           "pass --source <original Hugging Face repo> to compare exactly, or re-create the head "
                           "with `mtpforge add-mtp --force`")
    by_group = res.repair_offsets()
    per_key = {k: by_group[g] for k in norms if (g := res.group(k)) in by_group}
    # a group the drafts barely depend on takes the backbone comparison's verdict, as inspect does
    notes: list[str] = []
    verdicts, evidence, _, _ = settle_weak_groups(res, read_entries(cat, norms), lambda v: backbone_verdicts(cat, v), notes)
    for k, how in evidence.items():
        if how == "backbone" and verdicts[k] in FIX:
            per_key.pop(k, None)
            if o := offset_for(_expect(spec, k), verdicts[k]):
                per_key[k] = o
    if notes:
        report["notes"] = notes
    return per_key


def _patches(cat: Any, norms: dict[str, Any], per_key: dict[str, int], report: dict[str, Any],
             source: str | None, revision: str | None, spec: Any) -> dict[str, list[tuple[int, bytes, str]]]:
    """file -> (offset, new bytes, key) of every norm to rewrite."""
    values = read_entries(cat, {k: norms[k] for k in per_key})
    if report["evidence"] == "source":
        # the source's raw norm + what MLX adds (1 zero-centred, 0 raw), rounded once: exactly
        # what add-mtp writes (undoing a +2 in bf16 would round twice)
        from .checks.norms import source_norms

        exact_vals = source_norms(report["source"], revision if report["source"] == source else None, list(per_key))
    else:
        exact_vals = {}
    patches: dict[str, list[tuple[int, bytes, str]]] = {}
    for k, o in per_key.items():
        info = norms[k]
        if k in exact_vals:
            new = (exact_vals[k].astype(mx.float32) + spec.offset_of(k)).astype(values[k].dtype)
        else:
            new = (values[k].astype(mx.float32) + o).astype(values[k].dtype)
        data = to_bytes(new)
        assert len(data) == info.nbytes
        patches.setdefault(info.file, []).append((info.begin, data, k))
    return patches


def _patch_file(folder: Path, stage: StagedFolder, rel: str, ps: list[tuple[int, bytes, str]]) -> str:
    """A staged copy of ``rel`` with the new norm bytes, read back; returns how it was copied."""
    dst = stage.new_file(rel)
    how = _clone(folder / rel, dst)
    with open(dst, "r+b") as f:
        for begin, data, _ in ps:
            f.seek(begin)
            f.write(data)
        f.flush()
    with open(dst, "rb") as f:  # read back what a loader will read
        for begin, data, k in ps:
            f.seek(begin)
            if f.read(len(data)) != data:
                raise RefusedError(f"{rel}: the patched bytes of {k} did not read back; nothing was changed",
                                   "check the disk, then run repair-norms again")
    return how


def _read_old_manifest(folder: Path) -> dict[str, Any]:
    """The folder's manifest, validated: one that cannot be trusted is refused, not replaced
    (it is what remove-mtp undoes add-mtp by)."""
    old = folder / MANIFEST
    if not old.is_file():
        return {}
    try:
        manifest = json.loads(old.read_text("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise RefusedError(f"{old} is not valid JSON, so the repair could not be recorded in it; nothing was changed",
                           f"restore {MANIFEST} from a backup (or delete it if mtpforge did not write the head)") from None
    bad = check_manifest(manifest, str(old))
    if bad is not None:
        raise RefusedError(f"{old} cannot be trusted: {bad.message}; nothing was changed",
                           f"restore {MANIFEST} from a backup (or delete it if mtpforge did not write the head)")
    return manifest


def _rehash(manifest: dict[str, Any], folder: Path, stage: Path, patched: list[str]) -> None:
    """Keep the proof chain (remove-mtp removes only files whose bytes it can prove): a patched
    file add-mtp wrote keeps a hash when the repair provably produced it — its bytes are add-mtp's
    again, or they were add-mtp's before the repair (only the norm spans changed, by mtpforge).
    A file someone else changed loses its hash. The other files' hashes stay as they were."""
    from .manifest import file_sha

    hashes = manifest.get("file_sha256")
    if not isinstance(hashes, dict):
        return
    for rel in patched:
        if rel not in hashes:
            continue
        new = file_sha(stage / rel)
        if new != hashes[rel] and file_sha(folder / rel) != hashes[rel]:
            del hashes[rel]
        else:
            hashes[rel] = new


def _manifest(stage: Path, folder: Path, stored_keys: dict[str, str], report: dict[str, Any], family: str,
              patched: list[str]) -> dict[str, Any]:
    """The folder's manifest after the repair: mtpforge's own one updated, or a new one that
    records the repair and the norms' hashes (so the next inspect decides exactly)."""
    manifest = _read_old_manifest(folder)
    if "mtpforge_manifest" not in manifest:
        from .manifest import MANIFEST_VERSION

        manifest = {"mtpforge_manifest": MANIFEST_VERSION, "family": family, "layout": report["layout"],
                    "head_written_by": "another tool", "added": [MANIFEST], "changed": {}}
    cat = load_catalogue(LocalStore(stage))
    loc = locate_head(cat, family)
    tensors = manifest["tensors"] = dict(manifest.get("tensors") or {})
    for bare in head_norm_keys(FAMILIES[family], loc.entries):
        info = loc.entries[bare]
        raw = cat.read_tensor_bytes(info)
        tensors[loc.stored_keys.get(bare, bare)] = {
            "sha256": hashlib.sha256(raw).hexdigest(), "dtype": info.dtype, "shape": list(info.shape)}
    _rehash(manifest, folder, stage, patched)
    manifest["norm_convention"] = norms_said(family)[0]  # what the repaired tensors are, by the family
    manifest["repairs"] = list(manifest.get("repairs") or [])
    manifest["repairs"].append({
        "what": "norm convention", "evidence": report["evidence"], "source": report.get("source"),
        "offsets": report["changed_norms"], "mtpforge_version": __version__,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    return manifest


__all__ = ["repair_norms"]
