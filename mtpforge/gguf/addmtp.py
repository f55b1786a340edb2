"""``add-mtp`` for a GGUF trunk: resolve -> plan -> fetch -> convert -> write -> validate -> commit.

Two outputs (docs/SPEC.md §5.1):

- ``gguf-mtp`` (default): an MTP-only GGUF beside the trunk, named as llama.cpp's converter names
  one (``mtp-<name>-<TYPE>.gguf``: llama.cpp's sibling discovery finds it), holding the MTP block
  and what the draft model needs — ``token_embd``, ``output_norm`` and ``output`` copied byte for
  byte from the user's trunk (already quantized as the user chose; nothing downloaded for them).
  Run with ``llama-server -m TRUNK -md MTP --spec-type draft-mtp``.
- ``gguf-tail``: one new GGUF (``--output``) whose blocks end with the MTP layer, the trunk's
  tensors streamed across unchanged.

The trunk is only ever read. The head's tensors come from the source by range requests (only
their bytes), cached like every other mtpforge fetch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..cells import human_bytes
from ..errors import InputError, MtpforgeError, RefusedError
from ..families import FAMILIES
from ..families.tables import dims
from ..inputs.manifest_file import GgufManifestFile, gguf_trunk_files, read_gguf_manifest
from ..layouts.gguf import GGUF_LAYOUTS, GGUF_MTP, GgufLayout
from ..model_card import CARD, card_beside, write_atomic
from ..headplan import LARGE_HEAD, fetch_list, peak_memory_estimate, step_bytes
from ..options import AddOptions
from ..progress import Progress
from ..results import AddResult, DryRunFacts
from .gguffile import GgufFile, read_local
from .head import FILE_TYPES, HeadTensor, Q, Reader, is_quantized, parse_precision, plan_head, tensor_chunks
from .meta import drafter_kv, mtp_file_name, mtp_meta, mtp_only_kv, with_mtp_layers
from .names import FIRST_BLOCK_NORM, SHARED_TENSORS, family_of, handled_archs
from .source import SourceHead, check_trunk_matches, open_source_head
from ..writer.atomic import check_disk_space
from ..writer.lock import folder_lock
from .commit import stage_json, sweep_leftovers
from .write import OutTensor, copy_chunks, file_sha256, write_gguf

MANIFEST_SUFFIX = ".mtpforge.json"
MANIFEST_VERSION = 1


def is_gguf_path(path: str) -> bool:
    """A GGUF target: named ``*.gguf``, or a file starting with the GGUF magic."""
    p = Path(path).expanduser()
    if path.lower().endswith(".gguf"):
        return True
    try:
        if p.is_file() and not p.is_symlink():
            with open(p, "rb") as f:
                return f.read(4) == b"GGUF"
    except OSError:
        pass
    return False


def manifest_path(gguf_path: Path) -> Path:
    return gguf_path.with_name(gguf_path.name + MANIFEST_SUFFIX)


def trunk_fingerprint(g: GgufFile) -> dict[str, Any]:
    """Identifies the trunk without hashing gigabytes: size plus a hash of its header and of the
    tensors the MTP file copies."""
    assert g.path is not None
    h = hashlib.sha256()
    with open(g.path, "rb") as f:
        h.update(f.read(g.data_offset))
    for n in SHARED_TENSORS:
        t = g.tensors.get(n)
        if t is not None:
            for b in copy_chunks(g, t)():
                h.update(b)
    return {"file": g.path.name, "size": g.size, "header_and_shared_sha256": h.hexdigest()}


def _open_trunk(target: str) -> tuple[GgufFile, str]:
    p = Path(target).expanduser()
    if not p.exists():
        raise InputError(f"target {target} does not exist", "pass the .gguf file to add the head to")
    if p.is_dir():
        raise InputError(f"{target} is a folder, not a GGUF file", "pass the trunk's .gguf file")
    g = read_local(p)
    family = family_of(g)
    if family is None:
        raise InputError(*handled_archs(p.name, g.arch))
    if FIRST_BLOCK_NORM not in g.tensors and g.nextn_layers:
        raise InputError(f"{p.name} is an MTP-only GGUF, not a model", "pass the trunk GGUF (the one given to llama-server -m)")
    # the tensors decide, as inspect's do: a declaration without NextN tensors is a trunk whose
    # head is missing (inspect says to add it), not one that carries it
    if any(".nextn." in t for t in g.tensors):
        raise RefusedError(f"{p.name} already carries an MTP block ({g.arch}.nextn_predict_layers = {g.nextn_layers})",
                           "use it as is: llama-server -m it --spec-type draft-mtp")
    return g, family


def _existing(g: "GgufAddPlan", force: bool) -> str | None:
    """'same' when dest holds exactly what this run would write, or the head this run would write
    for another quantization of the same model (the head does not depend on the trunk's type);
    'serves-recorded' when that trunk was just added to the head's record; raises on a foreign
    file."""
    dest = g.dest
    if not dest.exists() and not dest.is_symlink():
        return None
    m, bad = read_gguf_manifest(manifest_path(dest))
    intact = m is not None and dest.is_file() and not dest.is_symlink() and file_sha256(dest) == m.file_sha256
    if intact and m is not None and m.fingerprint == g.fingerprint:
        return "same"
    if intact and m is not None and _serves(m, g, dest):
        if g.trunk.path is not None and g.trunk.path.name not in gguf_trunk_files(m):
            _record_trunk(manifest_path(dest), g)
            return "serves-recorded"
        return "same"
    if force:
        return None
    what = (f"has a manifest that cannot be trusted ({bad.message})" if bad is not None
            else "was written by mtpforge from another source, trunk or options" if m else "was not written by mtpforge")
    raise RefusedError(f"{dest} exists and {what}", "pass --force to replace it, or --output another path")


def _serves(m: GgufManifestFile, g: "GgufAddPlan", dest: Path) -> bool:
    """The head in ``dest`` is this run's for another trunk of the same model: same source and
    options, and every tensor it shares with the trunk has this trunk's shape."""
    from .inspect import check_head_file

    fp = m.fingerprint or {}
    if fp.get("source") != g.fingerprint["source"] or fp.get("options") != g.fingerprint["options"]:
        return False
    try:
        head = read_local(dest)
    except MtpforgeError:
        return False
    found, _ = check_head_file(head, g.trunk, dest.name)
    return not any(f.severity == "error" for f in found)


def _record_trunk(mp: Path, g: "GgufAddPlan") -> None:
    """Add this trunk to the head's record (what inspect and verify pair the head with)."""
    obj = json.loads(mp.read_text("utf-8"))
    first = obj.get("trunk")
    trunks = list(obj.get("trunks") or ([first] if isinstance(first, dict) else []))
    trunks.append(trunk_fingerprint(g.trunk))
    obj["trunks"] = trunks
    _write_json(mp, obj)


def add_mtp_gguf(options: AddOptions | None = None, /, *, progress: bool = True, **kw: Any) -> AddResult:
    """Add the source's MTP head for llama.cpp (plan, then execute); see the module docstring.
    ``kw``: the fields of ``AddOptions``, as for ``pipeline.add_mtp``."""
    return execute_gguf(plan_gguf(options or AddOptions.parse(**kw), progress=progress), progress=progress)


def plan_gguf(options: AddOptions, *, progress: bool = True) -> "GgufAddPlan":
    """Read the trunk's header and the source's index and headers (no tensor data) and plan: the
    GGUF output format's half of ``pipeline.plan_add_mtp``. Every option is taken or refused in
    one line; none is dropped."""
    if options.experts != "auto":
        raise InputError(f"--experts {options.experts} chooses an MLX folder's expert format; a GGUF head's experts are "
                         "stacked as llama.cpp loads them (ffn_*_exps)", "leave --experts out for a .gguf target")
    row = GGUF_LAYOUTS.get(options.layout or GGUF_MTP.name)
    if row is None:
        raise InputError(f"the {options.layout} layout does not apply to a GGUF target",
                         f"use --layout {' or '.join(GGUF_LAYOUTS)}")
    # match: the head's own default (a GGUF trunk's type says nothing about the head's)
    prec = parse_precision(None if options.precision in (None, "match") else str(options.precision))
    g = _plan(options.source, options.target, row, prec, options.revision, options.output,
              options.keep_fc_full_precision, Progress(enabled=progress))
    g.source_name, g.fetch, g.dry_run, g.force = options.source, options.fetch, options.dry_run, options.force
    if options.precision in (None, "match"):
        g.report["notes"] += _large_head_note(g.plan, prec)
    return g


def _large_head_note(plan: list[HeadTensor], prec: str) -> list[str]:
    """A note when the default precision makes a large head: what q8_0 would write instead, and
    why that costs no drafts (llama-server accepted within 0.3 points of f16 at q8_0 on every head
    shape measured; docs/PRECISION.md)."""
    size = sum(t.nbytes for t in plan)
    if size <= LARGE_HEAD or is_quantized(prec):
        return []
    # only the tensors the precision makes half floats change (norms stay F32; a type of the
    # family's own, DeepSeek-V4's MXFP4 experts and Q8_0 fc, stays what it is)
    q8 = sum(math.prod(t.shape) // 32 * 34 if t.type in (Q.F16, Q.BF16) and not t.shape[-1] % 32 else t.nbytes
             for t in plan)
    if q8 >= size:
        return []
    return [f"the head is {human_bytes(size)} at {prec}; --precision q8_0 writes it in about {human_bytes(q8)}, and "
            "llama-server accepted as many drafts at q8_0 as at f16 on every head shape measured (within 0.3 points: "
            "docs/PRECISION.md)"]


def execute_gguf(g: "GgufAddPlan", *, progress: bool = True) -> AddResult:
    """Carry a plan out (or, for a dry run, report it): the GGUF output format's half of
    ``pipeline.execute``. Returns the docs/CONTRACT.md report, as the MLX half does."""
    from ..source import planned_requests

    if g.dry_run:
        g.report.update(dry_run=True, status="planned",
                        files_to_write=[str(g.dest), str(manifest_path(g.dest)), str(g.dest.parent / CARD)],
                        fetch_bytes=sum(i.nbytes for i in g.to_fetch), fetch_tensors=len(g.to_fetch),
                        fetch_files=sorted({i.file for i in g.to_fetch}), files_written=[],
                        fetch_requests=None if g.src.local else planned_requests(g.to_fetch, g.fetch),
                        peak_memory_estimate=peak_memory_estimate(
                            (step_bytes(s, g.src.entries[s.src], t.row_unit) for t in g.plan for s in t.slices), 8 << 20),
                        tensors={t.name: {"type": t.type.name, "shape": list(reversed(t.shape))} for t in g.plan})
        return _result(g.report)
    with folder_lock(g.dest.parent):  # one run per target folder: the head, its record and the card
        sweep_leftovers(g.dest.parent)
        return _execute_locked(g, progress)


def _execute_locked(g: "GgufAddPlan", progress: bool) -> AddResult:
    """execute_gguf's work, with the target folder held and a killed run's leftovers swept."""
    existing = _existing(g, g.force)
    if existing == "same":
        g.report.update(status="already-present", files_written=_finish_card(g))
        return _result(g.report)
    if existing == "serves-recorded":
        g.report.update(status="already-present", files_written=[str(manifest_path(g.dest))])
        g.report["notes"].append(f"{g.dest.name} already holds this head (written for another quantization of the model; "
                                 f"the head does not depend on the trunk's type): its record now names {g.trunk.name} too")
        return _result(g.report)
    _write(g, g.source_name, g.fetch, Progress(enabled=progress))
    return _result(g.report)


#: the report's keys AddResult holds as fields (the rest are the GGUF format's own)
_COMMON = ("target", "output", "layout", "family", "expert_format", "mtp_tensors", "mtp_bytes", "revision", "notes",
           "manifest", "status", "fetched_bytes", "fetch_mode", "files_written")
_DRY_RUN = ("files_to_write", "fetch_bytes", "fetch_tensors", "fetch_files", "fetch_requests", "peak_memory_estimate")


def _result(report: dict[str, Any]) -> AddResult:
    """The run's report as the result type both output formats return (docs/CONTRACT.md)."""
    common = {k: report[k] for k in _COMMON if k in report}
    dry = DryRunFacts(*(report[k] for k in _DRY_RUN)) if report.get("dry_run") else None
    extra = {k: v for k, v in report.items() if k not in _COMMON and k not in _DRY_RUN and k != "dry_run"}
    return AddResult(**common, dry_run=dry, extra=extra)


@dataclass
class GgufAddPlan:
    """What one GGUF add-mtp will fetch and write, as data (the report is filled in as it goes);
    ``execute_gguf`` carries it out."""

    row: GgufLayout
    trunk: GgufFile
    family: str
    src: SourceHead
    plan: list[HeadTensor]
    carried: list[Any]
    dest: Path
    to_fetch: list[Any]
    fingerprint: dict[str, Any]
    report: dict[str, Any]
    #: how to run it: the source as the user named it, the fetch mode, the run's switches
    source_name: str = ""
    fetch: str = "auto"
    dry_run: bool = False
    force: bool = False


def _plan(source: str, target: str, row: GgufLayout, prec: str, revision: str | None, output: str | None,
          keep_fc: bool, prog: Progress) -> GgufAddPlan:
    from ..source import source_fingerprint

    trunk, _ = _open_trunk(target)
    tpath = trunk.path
    assert tpath is not None
    prog.step(f"reading the source {source}")
    src: SourceHead = open_source_head(source, revision)
    n_trunk = trunk.block_count
    check_trunk_matches(trunk, src, n_trunk)
    # the source's config names the model; the trunk's architecture may be several families'
    family = src.family
    if not row.beside_trunk and FAMILIES[family].gguf_root_names:
        raise RefusedError(f"a {family} head cannot be appended to its trunk: llama.cpp keeps one "
                           f"{', '.join(FAMILIES[family].gguf_root_names.values())} per file, the trunk's, and the head has its own",
                           "write the MTP-only file beside the trunk (the default --layout), as llama.cpp's converter does")
    drafter = FAMILIES[family].gguf_drafter
    # a drafter of its own numbers its blocks from 0; an MTP block follows the trunk's
    plan = plan_head(src.entries, src.config, 0 if drafter else n_trunk, prec, src.expert_format, keep_fc)
    if "token_embd.weight" not in trunk.tensors:
        raise RefusedError(f"{tpath.name} has no token_embd.weight", "re-convert the trunk with llama.cpp's converter")
    dest, carried = _destination(trunk, tpath, row, prec, output, drafter.file_prefix if drafter else "mtp-")
    if drafter:  # it reads the trunk's embeddings and output through llama.cpp, never a copy
        carried = []
    # it changes the head only where the family's converter does not fix the fc's type itself
    # (DeepSeek-V4's and DSpark's fc is Q8_0 from FP8 at every precision)
    fixed_fc = keep_fc and is_quantized(prec) and plan == plan_head(src.entries, src.config, 0 if drafter else n_trunk, prec,
                                                                     src.expert_format, False)
    full_fc = keep_fc and is_quantized(prec) and not fixed_fc
    sizes = {f: src.store.size(f) for f in {i.file for i in src.entries.values()}}
    fingerprint = {
        "source": source_fingerprint(sizes, src.entries, src.commit, src.store),
        "trunk": trunk_fingerprint(trunk),
        # keep_fc is recorded only where it changes the head (earlier records stay equal)
        "options": {"layout": row.name, "precision": prec, **({"keep_fc_full_precision": True} if full_fc else {})},
    }
    report: dict[str, Any] = {
        "target": str(tpath), "output": str(dest), "layout": row.name, "family": family, "architecture": trunk.arch,
        "precision": prec, "expert_format": src.expert_format if src.expert_format != "none" else "none",
        "mtp_tensors": len(plan), "mtp_bytes": sum(t.nbytes for t in plan),
        "copied_from_trunk": [t.name for t in carried] if row.beside_trunk else f"{len(carried)} tensors",
        "copied_bytes": sum(t.nbytes for t in carried),
        "revision": src.commit, "fetched_bytes": 0, "manifest": str(manifest_path(dest)), "notes": [],
        "run": (f"llama-server -m {tpath} -md {dest} --spec-type {_spec_type(family)}" if row.beside_trunk
                else f"llama-server -m {dest} --spec-type draft-mtp"),
    }
    if fixed_fc:
        report["notes"].append(f"--keep-fc-full-precision has no effect on {family}: llama.cpp's converter writes its fc in "
                               "a type of its own whatever the precision, and so does mtpforge")
    elif keep_fc and not full_fc:
        report["notes"].append(f"--keep-fc-full-precision has no effect with precision {prec} (nothing is quantized)")
    return GgufAddPlan(row, trunk, family, src, plan, carried, dest, fetch_list((s for t in plan for s in t.slices), src.entries),
                       fingerprint, report)


def _spec_type(family: str) -> str:
    """The ``--spec-type`` llama-server loads the family's head with."""
    d = FAMILIES[family].gguf_drafter
    return d.spec_type if d else "draft-mtp"


def _destination(trunk: GgufFile, tpath: Path, row: GgufLayout, prec: str, output: str | None,
                 prefix: str = "mtp-") -> tuple[Path, list[Any]]:
    """The file written and the trunk tensors it carries (the shared ones, or all of them)."""
    if row.beside_trunk:
        dest = Path(output).expanduser() if output else tpath.parent / mtp_file_name(trunk.kv, prec, tpath.stem, prefix)
        carried = [trunk.tensors[n] for n in SHARED_TENSORS if n in trunk.tensors]
    else:
        if not output:
            raise InputError(f"--layout {row.name} writes a new GGUF: it needs --output NEW.gguf",
                             "pass --output PATH.gguf (the trunk itself is never modified)")
        dest = Path(output).expanduser()
        carried = list(trunk.tensors.values())
    if dest.resolve() == tpath.resolve():
        raise InputError("--output is the trunk itself; mtpforge never modifies the trunk", "pass another --output path")
    if dest.is_dir():
        raise InputError(f"--output {dest} is a folder", "pass a file path ending in .gguf")
    return dest, carried


def _write(g: GgufAddPlan, source: str, fetch: str, prog: Progress) -> None:
    from ..source import SourceBytes

    # the file's room first: a giant head's tens of GB would otherwise fail at the disk's end, minutes in
    room = g.trunk.data_offset + sum(t.nbytes for t in g.carried) + sum(t.nbytes for t in g.plan) + (1 << 20)
    check_disk_space(g.dest, room, "pass --output a .gguf path on another disk")
    verb = "reading" if g.src.local else "fetching"  # a local source is read in place, as for MLX
    prog.step(f"{verb} {len(g.to_fetch)} MTP tensors ({human_bytes(sum(i.nbytes for i in g.to_fetch))}) from the source")
    source_bytes = SourceBytes(g.src.store, g.to_fetch, fetch, prog, (g.dest, room))
    try:
        _write_from(g, source, source_bytes.read, prog)
        fetched, mode = source_bytes.finish()
    finally:
        source_bytes.close()
    g.report.update(fetched_bytes=fetched, fetch_mode=mode)


def _write_from(g: GgufAddPlan, source: str, read: Reader, prog: Progress) -> None:
    trunk, src, dest, n_trunk, n_mtp = g.trunk, g.src, g.dest, g.trunk.block_count, g.src.n_layers
    out = [OutTensor(t.name, t.type, t.shape, t.nbytes, copy_chunks(trunk, t)) for t in g.carried]
    out += [OutTensor(t.name, t.type, t.shape, t.nbytes, tensor_chunks(t, src.entries, read)) for t in g.plan]
    prec = g.report["precision"]
    meta = mtp_meta(FAMILIES[g.family], dims(src.config))
    drafter = FAMILIES[g.family].gguf_drafter
    if drafter:
        kv = drafter_kv(trunk.kv, trunk.arch, FAMILIES[g.family], n_mtp, dims(src.config), src.config,
                        [(t.name, t.shape) for t in out], int(trunk.get("{arch}.expert_count", 0) or 0))
    elif g.row.beside_trunk:
        own = FAMILIES[g.family].gguf_file_type
        kv = mtp_only_kv(trunk.kv, trunk.arch, n_trunk, n_mtp, FILE_TYPES[prec] if own is None else own,
                         [(t.name, t.shape) for t in out],
                         int(trunk.get("{arch}.expert_count", 0) or 0), meta)
    else:
        kv = with_mtp_layers(trunk.kv, trunk.arch, n_trunk, n_mtp, meta)
    manifest = _manifest(g, source)
    card, card_record, note = _card(g, manifest)
    staged: list[Path] = []

    def commit(sha: str, tmp: Path) -> None:
        check = read_local(tmp)
        want = {t.name: (t.type, t.shape) for t in out}
        got = {n: (t.type, t.shape) for n, t in check.tensors.items()}
        blocks, nextn = (n_mtp, 0) if drafter else (n_trunk + n_mtp, n_mtp)
        if want != got or check.block_count != blocks or check.nextn_layers != nextn:
            raise RefusedError("the written GGUF does not read back as planned; nothing was changed",
                               "report this with `mtpforge env` output")
        manifest["file_sha256"] = sha
        if card_record is not None:
            manifest["model_card"] = card_record
        # the record is staged complete now and renamed in only after the head (commit.py)
        staged.append(stage_json(manifest_path(dest), manifest))

    prog.step(f"writing {dest.name} ({g.row.name})")
    try:
        with prog.bytes_bar("writing", sum(t.nbytes for t in out)) as advance:
            write_gguf(dest, drafter.arch if drafter else trunk.arch, kv, out, on_bytes=advance, before_commit=commit)
        # head first (renamed in by write_gguf), then the record that describes it, then the card
        os.replace(staged[0], manifest_path(dest))
    finally:
        for tmp in staged:
            tmp.unlink(missing_ok=True)
    if card is not None and not _card_written(dest.parent / CARD, card):
        card, note = None, (f"the head and its record are written, but {CARD} could not be (the disk is full): "
                            f"run the same add-mtp again once there is room to add its section")
    g.report.update(status="written", files_written=[str(dest), str(manifest_path(dest))]
                    + ([str(dest.parent / CARD)] if card is not None else []))
    g.report["notes"] += [note] if note else []
    prog.done(f"wrote {dest} — run: {g.report['run']}")


def _card_written(p: Path, card: bytes) -> bool:
    """Write the card; False when the disk is full (the head and its record are in place by then:
    the card is the one part left, and a re-run finishes it, see :func:`_finish_card`)."""
    import errno

    try:
        write_atomic(p, card)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            raise
        return False
    return True


def _finish_card(g: GgufAddPlan) -> list[str]:
    """The card of a run killed after its head and record were in place (the record rolled
    forward by the sweep): written now, only when it is still as the record says it was before
    and this run's card hashes to what the record says it became. Returns what was written."""
    rec, _ = read_gguf_manifest(manifest_path(g.dest))
    cr = rec.model_card if rec is not None else None
    p = g.dest.parent / CARD
    if cr is None or (p.is_file() and not p.is_symlink() and file_sha256(p) == cr.after_sha256):
        return []
    card, record, _ = _card(g, _manifest(g, g.source_name))
    if card is None or record is None or hashlib.sha256(card).hexdigest() != cr.after_sha256 \
            or record["before"] != cr.before.model_dump(exclude_none=True):
        return []
    write_atomic(p, card)
    return [str(p)]


def _card(g: GgufAddPlan, manifest: dict[str, Any]) -> tuple[bytes | None, dict[str, Any] | None, str | None]:
    """The model card of the head's folder (a GGUF repo's README is its card), with the record
    that proves it; the section of the head this run replaces is rewritten in place."""
    old, _ = read_gguf_manifest(manifest_path(g.dest))
    recorded = old.model_card.model_dump(exclude_unset=True) if old is not None and old.model_card is not None else None
    view = {**manifest, "expert_format": manifest["expert_format"]["written"]}
    run = (f"llama-server -m {g.trunk.name} -md {g.dest.name}" if g.row.beside_trunk else f"llama-server -m {g.dest.name}")
    closing = f"Run it with `{run} --spec-type {_spec_type(g.family)}`; check it with `mtpforge inspect <trunk>.gguf`."
    return card_beside(g.dest.parent, view, (_norms_said(g.family)[1], closing), recorded)


def _manifest(g: GgufAddPlan, source: str) -> dict[str, Any]:
    src, trunk = g.src, g.trunk
    return {
        "mtpforge_manifest": MANIFEST_VERSION, "mtpforge_version": __version__, "family": g.family,
        "architecture": trunk.arch, "layout": g.row.name,
        "source": {"repo": source if not src.local else Path(source).name, "revision": src.commit, "local": src.local},
        "trunk": g.fingerprint["trunk"], "fingerprint": g.fingerprint, "precision": g.report["precision"],
        "norm_convention": _norms_said(g.family)[0], "norm_shift": _norms_said(g.family)[2],
        "expert_format": {"source": src.expert_format, "written": "stacked (ffn_*_exps)" if src.expert_format != "none" else "none"},
        "mtp_layers": src.n_layers, "block_count": trunk.block_count + src.n_layers,
        "tensors": {t.name: {"type": t.type.name, "shape": list(reversed(t.shape)), "from": "source"} for t in g.plan},
        "copied": {t.name: {"type": t.type.name, "from": "trunk"} for t in g.carried} if g.row.beside_trunk else len(g.carried),
    }


def _norms_said(family: str) -> tuple[str, str, str]:
    """(convention, the card's words, the record's words) for the head's norms: +1 on a
    zero-centred family's, as llama.cpp's converter writes them; a raw family's as stored."""
    spec = FAMILIES[family]
    if spec.norm_offset:
        return ("shifted", f"shifted (+{spec.norm_offset:g}, as llama.cpp's converter writes them)",
                f"+{spec.norm_offset:g} on the {len(spec.norm_roles)} zero-centred MTP norm kinds, as llama.cpp's converter")
    return "raw", "raw (as stored in the source, as llama.cpp's converter writes them)", "none: the family's norms are raw"


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    tmp = stage_json(path, obj)
    try:
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


__all__ = ["GgufAddPlan", "add_mtp_gguf", "execute_gguf", "is_gguf_path", "manifest_path", "plan_gguf"]
