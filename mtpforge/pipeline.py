"""``add-mtp`` and ``remove-mtp``: resolve -> plan -> fetch -> convert -> stage -> validate -> commit.

One code path for the CLI, recipes and the demo. Nothing touches the user's folder until the
staged copy has been written completely and passed ``inspect``; then one atomic swap.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from .families.unhandled import not_handled
from .checkpoint.catalogue import INDEX_FILE, Catalogue, load_catalogue
from .checkpoint.safetensors_header import TensorInfo, read_local_header
from .checkpoint.store import LocalStore, Store
from .convert import scan_head, write_plan
from .errors import InputError, MtpforgeError, RefusedError
from .families.detect import detect_family
from .families import FAMILIES
from .headplan import LARGE_HEAD, Reader, measured_at, mtp_layer_count, precision_note
from .inputs.index import parse_index
from .layouts.detect import HeadLocation, is_raw_hf, locate_head
from .layouts.quant import quant_defaults
from .layouts.spec import Placement
from .layouts.table import LAYOUTS, MANIFEST, VLLM_MLX_MANIFEST, is_drafter_type, loads_in_mlx_lm_glob, placement
from .layouts.write import drafter_config, dump_json, updated_config, updated_index, vllm_mlx_manifest
from .model_card import CARD, write_section
from .manifest import (UntrustedManifest, apply_undo, build_manifest, edit_record, entry, file_sha, head_intact,
                       plan_undo, read_manifest, undo)
from .options import AddOptions
from .passes.quantize import QSpec
from .plan import Plan, build_plan, check_compatible, fetch_list, load_notes, load_problems, resolve_write, source_bytes
from .runtimes import RUNTIMES, OutputFormat
from .source import SourceBytes, open_source, planned_requests, read_source, source_fingerprint
from .progress import Progress
from .results import AddResult, DryRunFacts
from .writer.lock import folder_lock
from .writer.atomic import StagedFolder, check_disk_space, check_writable_parent, cleanup_leftovers
from .writer.safetensors_stream import SafetensorsWriter, TensorSpec

if TYPE_CHECKING:
    from .gguf.addmtp import GgufAddPlan


# ----------------------------------------------------------------------------- resolve

def _open_target(target: str) -> tuple[Path, Catalogue, str]:
    path = Path(target).expanduser()
    if not path.exists():
        raise InputError(f"target {target} does not exist", "pass the MLX model folder to add the head to")
    store = LocalStore(path)
    cat = load_catalogue(store)
    cat.refuse_damage("target")
    family = detect_family(cat.config)
    if family is None:
        raise InputError(*not_handled(str(target), cat.config, "pass a model folder of one of those types"))
    if is_drafter_type(cat.config.get("model_type")):
        raise InputError(f"{target} is an mlx-vlm drafter folder, not a model", "pass the MLX model folder as --target")
    if is_raw_hf(cat):
        # what inspect's HF_SOURCE_CHECKPOINT says: a family written for llama.cpp only has no MLX conversion to make
        fix = (f"put its head into your llama.cpp GGUF: mtpforge add-mtp --source {target} --target <trunk>.gguf"
               if FAMILIES[family].gguf_only else
               f"convert it with the head kept: mtpforge convert --hf-path {target} --mlx-path <new folder> -q; "
               f"or use it as --source for your MLX conversion")
        raise InputError(f"{target} is a raw Hugging Face checkpoint, not an MLX model", fix)
    cat.refuse_invalid()  # add-mtp builds on the config's quantization and rewrites the index
    return path, cat, family


def _default_q(config: dict[str, Any]) -> QSpec | None:
    d = quant_defaults(config)
    return QSpec(d["bits"], d["group_size"], d["mode"]) if d else None


# ----------------------------------------------------------------------------- undo

def _strip_foreign_head(stage: StagedFolder, cat: Catalogue, loc: HeadLocation) -> list[str]:
    """Remove a head that mtpforge did not write (for --force): dedicated files go, shards that
    mix head and backbone tensors are rewritten without the head."""
    notes = []
    head_keys = {loc.stored_keys[k] for k in loc.entries}
    for f in loc.files:
        tensors = cat.file_tensors(f)
        keep = {k: v for k, v in tensors.items() if k not in head_keys}
        if not keep:
            stage.remove(f)
            continue
        data = {k: cat.read_tensor_bytes(v) for k, v in keep.items()}
        dst = stage.new_file(f)
        with SafetensorsWriter(dst, [TensorSpec(k, v.dtype, v.shape) for k, v in keep.items()],
                               cat.headers[f].metadata or {"format": "mlx"}) as w:
            for k, b in data.items():
                w.write(k, b)
        notes.append(f"rewrote {f} without its {len(tensors) - len(keep)} MTP tensors")
    if (stage.stage / VLLM_MLX_MANIFEST).exists():
        stage.remove(VLLM_MLX_MANIFEST)
    idx_path = stage.path(INDEX_FILE)
    if idx_path.is_file():
        idx = json.loads(idx_path.read_text("utf-8"))
        wm = {k: v for k, v in idx.get("weight_map", {}).items() if k not in head_keys}
        if wm != idx.get("weight_map"):
            idx["weight_map"] = wm
            stage.write_bytes(INDEX_FILE, dump_json(idx))
    cfg_path = stage.path("config.json")
    cfg = json.loads(cfg_path.read_text("utf-8"))
    if cfg.pop("mlx_lm_extra_tensors", None) is not None:
        stage.write_bytes("config.json", dump_json(cfg))
    return notes


# ----------------------------------------------------------------------------- plan

@dataclass(frozen=True)
class SourceHead:
    """The source as planning needs it: its config and the head's tensor headers (no data)."""

    name: str  # as recorded: the repo id, or a local folder's name
    config: Mapping[str, Any]
    family: str
    head: HeadLocation
    commit: Optional[str]
    local: bool
    #: file -> size of the files holding the head, for the fingerprint
    sizes: Mapping[str, int]
    #: where the bytes are read from when the plan is executed (None: planned from data only)
    store: Optional[Store] = field(default=None, compare=False, repr=False)
    #: the fingerprint the manifest records (None: from the headers, as for a plan made from data)
    fingerprint: Optional[str] = None


@dataclass(frozen=True)
class AddPlan:
    """Everything add-mtp will fetch, write and edit, as data; ``execute`` carries it out."""

    options: AddOptions
    target: Path
    target_config: Mapping[str, Any]
    family: str
    placement: Placement
    output: Optional[Path]
    source: SourceHead
    n_layers: int
    head: Plan
    to_fetch: tuple[TensorInfo, ...]
    fingerprint: str
    #: the options as the manifest records them (idempotence compares these)
    recorded_options: Mapping[str, Any]
    notes: tuple[str, ...]

    @property
    def dest(self) -> Path:
        return self.output or self.target

    @property
    def files(self) -> list[str]:
        pl = self.placement
        files = [pl.file, MANIFEST, "config.json"]
        if pl.in_index and not pl.separate_folder:
            files.append(INDEX_FILE)
        if pl.vllm_manifest and not pl.separate_folder:
            files.append(VLLM_MLX_MANIFEST)
        if not pl.separate_folder:
            files.append(CARD)  # the model card's MTP head section (a drafter folder has no card)
        return [str(self.dest / f) for f in files]

    @property
    def precision(self) -> str:
        """The head's precision in ``--precision``'s words, ``match`` resolved: what to pass to
        write the same head again (bf16, float16, or the bits)."""
        chosen, h = str(self.recorded_options["precision"]), self.head
        if chosen != "match":
            return chosen
        return str(h.default_q.bits) if h.default_q is not None else {"bfloat16": "bf16"}.get(h.float_dtype, h.float_dtype)

    def result(self) -> AddResult:
        h = self.head
        return AddResult(str(self.target), str(self.output) if self.output else None, h.layout, self.family,
                         h.expert_format, h.mtp_tensors, h.mtp_bytes, self.source.commit, list(self.notes),
                         str(self.dest / MANIFEST), extra={"precision": self.precision})


def make_plan(options: AddOptions, *, target: Path, target_config: Mapping[str, Any], family: str,
              source: SourceHead) -> AddPlan:
    """The pure part of planning: from configs and tensor headers to what will be written."""
    choice = resolve_write(options.runtime, options.layout, options.precision, family)
    layout = choice.layout
    out_path = Path(options.output).expanduser() if options.output else None
    pl = placement(layout, family, target_config)
    if pl.separate_folder and out_path is None:
        out_path = target.parent / f"{target.name}-mtp-drafter"
        _check_drafter_dest(out_path, options.force)
    check_compatible(source.config, target_config, source.family, family)
    entries = source.head.entries
    if not source.head.raw or not entries:
        raise RefusedError(f"source {options.source} has no MTP tensors ({FAMILIES[source.family].head_prefix(source.config)}*)",
                           "pass the original Hugging Face checkpoint, which ships the head")
    n_layers = mtp_layer_count(source.config, source.family, entries)
    head = build_plan(family=family, src_config=source.config, tgt_config=target_config, entries=entries,
                      n_layers=n_layers, choice=choice, keep_fc=options.keep_fc_full_precision, experts=options.experts,
                      default_q=_default_q(target_config))
    notes = list(head.notes)
    notes += load_notes(head, choice.reader, target_config, explicit=options.runtime is None)
    # the plain default only: a runtime's or layout's own template is what that runtime loads
    plain = options.runtime is None and options.layout is None
    matched = head.default_q.bits if plain and choice.precision == "match" and head.default_q is not None else None
    if (low := precision_note(family, choice.precision if options.precision is not None else None, matched)) is not None:
        notes.append(low)
    if plain and options.precision is None and choice.precision in ("bf16", "float16"):
        notes += _large_head_note(head, lambda: build_plan(
            family=family, src_config=source.config, tgt_config=target_config, entries=entries, n_layers=n_layers,
            choice=replace(choice, precision="match"), keep_fc=options.keep_fc_full_precision, experts=options.experts,
            default_q=head.default_q), lambda plan: load_problems(plan, choice.reader, target_config))
    recorded: dict[str, Any] = {"layout": layout, "precision": str(choice.precision),
                                "keep_fc_full_precision": options.keep_fc_full_precision, "experts": head.expert_format}
    if options.runtime is not None:
        recorded["runtime"] = options.runtime
    return AddPlan(options, target, target_config, family, pl, out_path, source, n_layers, head,
                   tuple(fetch_list(head, entries)),
                   source.fingerprint or source_fingerprint(source.sizes, entries, source.commit, None), recorded,
                   tuple(notes))


def _large_head_note(head: Plan, matched: Callable[[], Plan],
                     problems: Callable[[Plan], list[tuple[str, bool, str]]]) -> list[str]:
    """A note when a default float head is large beside a quantized target: it is held in memory
    beside the model, and at the target's bits (``matched``: the same plan at ``match``) it is a
    fraction of the size, at the cost in drafts measured on the trained tiny heads (the MLA
    shape of the DeepSeek giants lost none at 4 bits: docs/PRECISION.md). Where a runtime the
    plain head is meant for would not load that form (``problems``: MTPLX and exo take a Qwen MoE
    head at the model's bits only in their own templates), the note names ``--runtime`` for it."""
    if head.default_q is None or head.mtp_bytes <= LARGE_HEAD:
        return []
    from .render import human_bytes

    small = matched()
    bits, refused = head.default_q.bits, sorted({name for name, meant, _ in problems(small) if meant})
    measured = measured_at(head.family, bits)
    how = ("--precision match writes it" if not refused else
           " or ".join(f"--runtime {r}" for r in refused) + " writes it, in the form that runtime loads,")
    return [f"the head is {human_bytes(head.mtp_bytes)} as {head.float_dtype}, held in memory beside the model; "
            f"{how} at the target's {bits} bits in about {human_bytes(small.mtp_bytes)}"
            + (f" ({measured}: docs/PRECISION.md)" if measured else "")]


def plan_add_mtp(options: AddOptions, *, progress: bool = True) -> "AddPlan | GgufAddPlan":
    """Read the target and the source's index and headers (no tensor data) and plan, for the
    target's output format: an MLX folder (this module) or a llama.cpp GGUF trunk
    (``gguf/addmtp.py``, which shares the source side, ``source.py``, and the family rows)."""
    from .gguf.addmtp import is_gguf_path, plan_gguf

    if is_gguf_path(options.target):
        if options.runtime is not None and RUNTIMES[options.runtime].output_format != OutputFormat.GGUF:
            raise InputError(f"--runtime {options.runtime} loads an MLX folder, but --target is a GGUF file",
                             "pass the MLX model folder as --target (or leave --runtime out for llama.cpp)")
        return plan_gguf(options, progress=progress)
    if not options.dry_run:
        cleanup_leftovers(Path(options.target).expanduser())  # a killed run's leftovers, before reading
    tpath, tcat, family = _open_target(options.target)
    resolve_write(options.runtime, options.layout, options.precision, family)
    out = Path(options.output).expanduser() if options.output else None
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"--output {options.output} exists and is not empty", "pass a new or empty folder")
    if out is not None:
        ro, rt = os.path.realpath(out), os.path.realpath(tpath)
        if ro == rt or ro.startswith(rt.rstrip(os.sep) + os.sep):
            raise InputError(f"--output {options.output} is inside the target {options.target}",
                             "pass a folder outside the target (the new folder is a copy of it)")
    Progress(enabled=progress).step(f"reading the source {options.source}")
    return make_plan(options, target=tpath, target_config=tcat.config, family=family,
                     source=_read_source(options.source, options.revision))


def _read_source(source: str, revision: str | None) -> SourceHead:
    sstore, scat, sfamily = read_source(source, revision, "target model")
    local = isinstance(sstore, LocalStore)
    head = locate_head(scat, sfamily)
    sizes = {f: sstore.size(f) for f in {i.file for i in head.entries.values()}}
    commit = getattr(sstore, "commit", None)
    return SourceHead(Path(source).name if local else source, scat.config, sfamily, head, commit, local, sizes, sstore,
                      source_fingerprint(sizes, head.entries, commit, sstore))


def _check_drafter_dest(dest: Path, force: bool) -> None:
    """``<target>-mtp-drafter`` is replaced whole: only when it is a drafter mtpforge wrote
    (or, with --force, another tool's drafter) — never a file, a link or a folder of other files."""
    if not os.path.lexists(dest):
        return
    if dest.is_symlink() or not dest.is_dir():
        raise RefusedError(f"{dest} exists and is not a folder; mtpforge writes the drafter there",
                           "move it away, or pass --output DIR for the drafter")
    names = {p.name for p in dest.iterdir()}
    if not names:
        return
    try:
        cfg = json.loads((dest / "config.json").read_bytes())
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        cfg = None
    if not (isinstance(cfg, dict) and is_drafter_type(cfg.get("model_type"))):
        raise RefusedError(f"{dest} holds files that are not an mlx-vlm drafter; mtpforge will not replace them",
                           "move that folder away, or pass --output DIR for the drafter")
    if MANIFEST not in names and not force:
        raise RefusedError(f"{dest} is an mlx-vlm drafter that mtpforge did not write",
                           "pass --force to replace it, or --output DIR for a new drafter")


# ----------------------------------------------------------------------------- execute

def add(options: AddOptions, *, progress: bool = True) -> AddResult:
    """Plan and execute: one path and one result type for every output format. An MLX folder is
    held under its lock from the first read."""
    from .gguf.addmtp import is_gguf_path

    if options.dry_run or is_gguf_path(options.target):  # a GGUF trunk is only ever read
        return execute(plan_add_mtp(options, progress=progress), progress=progress)
    # held from the first read of the target to the commit: a run that read the folder before
    # another run's swap must not stage from it (the shared lock lets --output runs read together)
    with folder_lock(Path(options.target).expanduser(), shared=options.output is not None and not _separate(options)):
        return execute(plan_add_mtp(options, progress=progress), progress=progress)


def _separate(options: AddOptions) -> bool:
    """The head goes into a folder of its own (the target is only read)."""
    name = options.layout
    row = RUNTIMES[options.runtime] if options.runtime else None
    if name is None and row is not None and row.write is not None:
        name = row.write.layout
    return name in LAYOUTS and LAYOUTS[name].separate_folder


def add_mtp(options: AddOptions | None = None, /, *, progress: bool = True, **kw: Any) -> dict[str, Any]:
    """Add the source's MTP head to ``target`` (or to a new folder ``output``): the report as
    docs/CONTRACT.md's JSON. Pass an :class:`AddOptions`, or its fields as keywords."""
    return add(options if options is not None else AddOptions.parse(**kw), progress=progress).as_dict()


@dataclass
class _Existing:
    """The head already in the folder the staged copy starts from, if any."""

    root: Optional[Path]
    manifest: Optional[dict[str, Any]]
    cat: Optional[Catalogue]
    loc: Optional[HeadLocation]

    @property
    def has_head(self) -> bool:
        return bool(self.manifest) or (self.loc is not None and self.loc.found)


def _existing(plan: AddPlan) -> _Existing:
    """The head that counts is the one in the folder the staged copy starts from: the target
    (in place, or mirrored into --output), or an existing drafter folder (an empty one holds
    no head)."""
    dest, tpath = plan.dest, plan.target
    if plan.placement.separate_folder:
        root = dest if dest.is_dir() and any(dest.iterdir()) else None
    else:
        root = tpath
    manifest = read_manifest(root) if root else None
    cat = load_catalogue(LocalStore(root)) if root else None
    loc = locate_head(cat, plan.family) if cat is not None and not is_drafter_type(cat.config.get("model_type")) else None
    return _Existing(root, manifest, cat, loc)


def execute(plan: "AddPlan | GgufAddPlan", *, progress: bool = True) -> AddResult:
    """Carry out a plan: a dry run reports it; else fetch, convert, stage, validate, commit."""
    from .gguf.addmtp import GgufAddPlan, execute_gguf

    if isinstance(plan, GgufAddPlan):
        return execute_gguf(plan, progress=progress)
    result = plan.result()
    if plan.options.dry_run:
        to_fetch = list(plan.to_fetch)
        result.dry_run = DryRunFacts(plan.files, source_bytes(to_fetch), len(to_fetch),
                                     sorted({i.file for i in to_fetch}),
                                     None if plan.source.local else planned_requests(to_fetch, plan.options.fetch),
                                     plan.head.peak_memory_estimate(plan.source.head.entries))
        return result
    ex = _existing(plan)
    m = ex.manifest
    same = bool(m) and isinstance(m.get("source"), dict) and m["source"].get("fingerprint") == plan.fingerprint \
        and m.get("options") == plan.recorded_options
    if same and (plan.options.output is None or plan.placement.separate_folder) and head_intact(ex.root, m) \
            and not plan.options.force:
        result.status = "already-present"
        return result
    if ex.has_head and not plan.options.force and not same:
        raise RefusedError(f"{ex.root} already has {_what_head(plan, ex)}",
                           "pass --force to replace it, or `mtpforge remove-mtp` first")
    check_writable_parent(plan.dest)
    room = plan.head.mtp_bytes + (1 << 20)
    check_disk_space(plan.dest, room)
    prog = Progress(enabled=progress)
    from .render import human_bytes

    verb = "reading" if plan.source.local else "fetching"  # a local source is read in place
    prog.step(f"{verb} {len(plan.to_fetch)} MTP tensors ({human_bytes(source_bytes(list(plan.to_fetch)))}) from the source")
    store = plan.source.store or open_source(plan.options.source, plan.options.revision)
    src = SourceBytes(store, list(plan.to_fetch), plan.options.fetch, prog, (plan.dest, room))
    try:
        _write(plan, ex, src.read, result, prog)
        result.fetched_bytes, result.fetch_mode = src.finish()
    finally:
        src.close()
    prog.done(f"added the MTP head to {plan.dest} ({plan.head.layout} layout)")
    return result


def _what_head(plan: AddPlan, ex: _Existing) -> str:
    m = ex.manifest
    src = m.get("source", {}) if m else {}
    if m and m.get("options") == plan.recorded_options and isinstance(src, dict):
        return f"a head written by mtpforge from other source bytes ({src.get('repo')} changed since, or another revision)"
    if m:
        return f"a head written by mtpforge from {src.get('repo') if isinstance(src, dict) else '?'} with other options"
    return f"an MTP head ({ex.loc.layout if ex.loc else 'unknown'} layout) not written by mtpforge"


def _stage(plan: AddPlan) -> StagedFolder:
    dest, tpath = plan.dest, plan.target
    if plan.placement.separate_folder:
        return StagedFolder(dest, empty=True) if dest.exists() else StagedFolder(tpath, output=dest, empty=True)
    return StagedFolder(tpath, output=plan.output)


def _write(plan: AddPlan, ex: _Existing, read: Reader, result: AddResult, prog: Progress) -> None:
    pl, head = plan.placement, plan.head
    with _stage(plan) as stage:
        notes = _remove_old_head(plan, ex, stage)
        before = {} if pl.separate_folder else {rel: entry(stage.path(rel)) for rel in ("config.json", INDEX_FILE)}
        before_bytes = {rel: stage.path(rel).read_bytes() if stage.path(rel).is_file() else None for rel in before}
        prog.step(f"converting to the {head.layout} layout")
        head_file = stage.new_file(head.file)
        with prog.bytes_bar("converting", source_bytes(list(plan.to_fetch))) as advance:
            scanned = write_plan(head, head_file, plan.source.head.entries, read, on_progress=advance)
        head_infos = read_local_header(head_file, head.file).tensors
        # digests + data checks: taken as the bytes were written, else in one bounded pass
        scan = scanned if scanned is not None else scan_head(head_file, head_infos)
        side, written = _edit_side_files(plan, stage, head_infos)
        added = [head.file] + side
        changed = {rel: edit_record(rel, e, before_bytes[rel], stage.path(rel).read_bytes())
                   for rel, e in before.items() if rel in written}
        file_sha256 = {head.file: scan.file_sha256, **{rel: file_sha(stage.path(rel)) for rel in side}}
        manifest = _manifest(plan, head_infos, scan, added, changed, file_sha256)
        notes += _record_config_for_runtime(plan, manifest, before_bytes.get("config.json"))
        card_note = None if pl.separate_folder else write_section(stage, manifest)  # README.md, recorded in it
        notes += [card_note] if card_note else []
        stage.write_bytes(MANIFEST, dump_json(manifest))
        prog.step("validating the staged folder")
        check = _validate(stage, scan, plan.target)
        prog.step("committing")
        stage.commit()
    result.status = "written"
    result.files_written = [str(plan.dest / f) for f in sorted(set(added + [MANIFEST, "config.json"])
                                                              | ({INDEX_FILE} if pl.in_index else set())
                                                              | ({CARD} if "model_card" in manifest else set()))]
    result.notes += notes
    # the staged check cannot see provenance (it ignores the manifest on purpose, to judge the
    # files alone), so "convention unknown" there only restates what add-mtp decided
    result.inspect = {"findings": [f for f in check["findings"] if f["code"] != "NORM_CONVENTION_UNKNOWN"],
                      "norm_convention": manifest["norm_convention"]}


def _remove_old_head(plan: AddPlan, ex: _Existing, stage: StagedFolder) -> list[str]:
    """Undo what the manifest proves add-mtp wrote; a head it cannot vouch for (damaged, or a
    foreign one) is removed by its tensors — on a re-run or with --force only."""
    if not ex.has_head:
        return []
    untrusted = False
    if ex.manifest:
        try:
            undo(stage, ex.manifest, ex.root)
        except UntrustedManifest:
            if ex.loc is None:
                raise
            untrusted = True  # reached only when the head is the same or --force (see execute)
    if (untrusted or not ex.manifest) and ex.loc is not None and ex.cat is not None and ex.loc.found:
        return _strip_foreign_head(stage, ex.cat, ex.loc)
    return []


def _edit_side_files(plan: AddPlan, stage: StagedFolder,
                     head_infos: Mapping[str, TensorInfo]) -> tuple[list[str], set[str]]:
    """config.json, the index and the vllm-mlx manifest as the placement asks; returns the
    files added (besides the head file) and the existing ones rewritten."""
    pl, head, n = plan.placement, plan.head, plan.n_layers
    quant_entries = head.quant_entries()
    if pl.separate_folder:
        dq = dict(quant_defaults(plan.target_config) or {}) or None
        if dq is not None or quant_entries:
            dq = {**({k: dq[k] for k in ("group_size", "bits", "mode")} if dq else {}), **quant_entries}
        stage.write_bytes("config.json", dump_json(drafter_config(FAMILIES[plan.family], plan.target_config, n, dq)))
        return ["config.json"], set()
    base_cfg = json.loads(stage.path("config.json").read_text("utf-8"))
    cfg = updated_config(base_cfg, pl, n_layers=n, mtp_tensors=head.mtp_tensors, quant_entries=quant_entries)
    cfg, _ = _for_runtime_loader(plan, cfg)
    stage.write_bytes("config.json", dump_json(cfg))
    written = {"config.json"}
    if pl.in_index:
        idx_path = stage.path(INDEX_FILE)
        idx = json.loads(idx_path.read_text("utf-8")) if idx_path.is_file() else None
        total = parse_index(idx, file=INDEX_FILE).total_size if idx is not None else None
        if idx is None:
            # no index: mlx-lm globs anyway; create one so exo's index probe finds the head
            shards = load_catalogue(LocalStore(stage.stage)).headers
            idx = {"metadata": {}, "weight_map": {k: f for f, h in shards.items() if loads_in_mlx_lm_glob(f)
                                                 and f != head.file for k in h.tensors}}
        stage.write_bytes(INDEX_FILE, dump_json(updated_index(idx, head.file, list(head_infos), head.mtp_bytes, total)))
        written.add(INDEX_FILE)
    if pl.vllm_manifest:
        stage.write_bytes(VLLM_MLX_MANIFEST, dump_json(vllm_mlx_manifest(
            family=plan.family, n_layers=n, mtp_tensors=head.mtp_tensors, expert_format=head.expert_format,
            source=plan.source.name, revision=plan.source.commit)))
        return [VLLM_MLX_MANIFEST], written
    return [], written


def _for_runtime_loader(plan: AddPlan, cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """config.json as ``--runtime``'s pinned mlx-lm reads it (runtimes/config.py: a tagged
    non-finite float, which mlx-lm 0.31 cannot decode), and what was changed, per key."""
    from .runtimes.config import untagged_config

    row = RUNTIMES.get(plan.options.runtime) if plan.options.runtime else None
    if row is None or row.reads_tagged_floats:
        return cfg, {}
    return untagged_config(cfg, plan.family)


def _record_config_for_runtime(plan: AddPlan, manifest: dict[str, Any], before: bytes | None) -> list[str]:
    """Say in the manifest (and a note) which config.json keys were rewritten for ``--runtime``'s
    loader; remove-mtp restores them with the rest of config.json, from its ``changed`` record."""
    if before is None or plan.placement.separate_folder:
        return []
    untagged = _for_runtime_loader(plan, json.loads(before))[1]
    if not untagged:
        return []
    manifest["config_for_runtime"] = {
        "runtime": plan.options.runtime, "keys": untagged,
        "why": "its pinned mlx-lm (0.31.x) reads no tagged float ({\"__float__\": ...}); its first decode step fails on one"}
    said = ", ".join(f"{k} {how}" for k, how in untagged.items())
    return [f"config.json for {plan.options.runtime}'s mlx-lm 0.31, which cannot read a tagged float "
            f"({{\"__float__\": ...}}, as mlx-lm 0.32 writes them): {said}; remove-mtp restores it"]


def _manifest(plan: AddPlan, head_infos: Mapping[str, TensorInfo], scan: Any, added: list[str],
              changed: dict[str, Any], file_sha256: dict[str, str]) -> dict[str, Any]:
    src = plan.source
    return build_manifest(
        family=plan.family, layout=plan.head.layout,
        source={"repo": src.name, "revision": src.commit, "local": src.local, "fingerprint": plan.fingerprint},
        options=dict(plan.recorded_options), plan=plan.head, n_layers=plan.n_layers,
        tensors={k: {"sha256": scan.digests[k], "dtype": i.dtype, "shape": list(i.shape)} for k, i in head_infos.items()},
        file_sha256=file_sha256, added=added, changed=changed,
    )


def _validate(stage: StagedFolder, scan: Any, target: Path) -> dict[str, Any]:
    """inspect on the staged folder; the data checks ran on the written bytes in scan_head,
    chunk by chunk (inspect's own would read whole tensors: a 512-expert stack is ~800 MB)."""
    from .inspect import inspect_checkpoint

    check = inspect_checkpoint(str(stage.stage), use_manifest=False, data_checks=False, behaviour=False)
    if scan.nonfinite or scan.degenerate:
        # bytes copied unchanged from the source (a converted tensor with NaN was refused
        # before it was written): the source is damaged, not the conversion
        what = "NaN or Inf values" if scan.nonfinite else "all-zero tensors"
        raise RefusedError(f"the source's MTP head holds {what} ({', '.join(sorted(scan.nonfinite or scan.degenerate)[:3])}), "
                           "so the source checkpoint is damaged; nothing was changed",
                           "re-download the source checkpoint (or pass an undamaged copy as --source)", code="SOURCE_NONFINITE")
    errors = [f for f in check["findings"] if f["severity"] == "error"]
    if errors:
        _refuse_validation(errors, target)
    # the findings speak of the staged copy; the user's folder is what a fix must name
    staged = str(stage.stage)
    check["findings"] = [{k: v.replace(staged, str(target)) if isinstance(v, str) else v for k, v in f.items()}
                         for f in check["findings"]]
    return check


def _refuse_validation(errors: list[dict[str, Any]], tpath: Path) -> None:
    """Say whose defect stopped the run: the target's own (it was there before mtpforge touched
    anything; the user can fix it) or the conversion's (a bug to report)."""
    from .inspect import inspect_checkpoint

    try:
        own = {f["code"]: f for f in inspect_checkpoint(str(tpath), use_manifest=False, data_checks=False, behaviour=False)["findings"]
               if f["severity"] == "error"}
    except MtpforgeError:
        own = {}
    for e in errors:
        if e["code"] in own:
            f = own[e["code"]]
            raise RefusedError(f"the target {tpath.name} has a defect of its own, so no head was added: {f['code']}: {f['message']}",
                               f.get("fix") or "repair or re-convert the target, then run add-mtp again", code="TARGET_DEFECT")
    e = errors[0]
    raise RefusedError(f"the converted head failed validation, nothing was changed: {e['code']}: {e['message']}",
                       "report this with `mtpforge env` output; the target is untouched")


# ----------------------------------------------------------------------------- remove

def _refuse_head_left(stage: StagedFolder, path: Path) -> None:
    """A manifest that does not name the whole head would leave part of it behind: refused."""
    if not stage.path("config.json").is_file():
        return  # a drafter folder: undone whole
    cat = load_catalogue(LocalStore(stage.stage))
    family = detect_family(cat.config)
    if family is not None and locate_head(cat, family).found:
        raise UntrustedManifest(f"{path / MANIFEST} does not account for the whole MTP head in {path.name}; nothing was changed",
                                f"remove-mtp undoes only what add-mtp provably wrote; use add-mtp --force to replace the head, or delete {MANIFEST}")


def remove_mtp(target: str, *, progress: bool = True) -> dict[str, Any]:
    """Restore the folder to its state before add-mtp, byte for byte."""
    path = Path(target).expanduser()
    if _gguf_undo(path):
        from .gguf.remove import remove_mtp_gguf

        return remove_mtp_gguf(target, progress=progress)
    if path.parent.is_dir():
        cleanup_leftovers(path)  # a killed run's leftovers (and a half-done fallback swap) first
    if not path.is_dir():
        raise InputError(f"{target} is not a folder", "pass the model folder that add-mtp changed")
    from .layouts.read import drafter_folder

    beside = drafter_folder(path)
    if read_manifest(path) is None and beside.is_dir() and read_manifest(beside) is not None:
        path, target = beside, str(beside)  # mlx-vlm's layout: the head add-mtp wrote is the sibling folder
    with folder_lock(path):
        result = _remove_mtp(path, target, progress)
    if result["removed"] and not any(path.iterdir()):  # a drafter folder add-mtp made holds nothing now
        path.rmdir()
        result["folder_removed"] = True
    return result


def _refuse_without_manifest(path: Path, target: str) -> None:
    """No manifest: say which of three things the folder is, each with its own exit code —
    not a model folder (2), a model with no head at all (a second remove-mtp: 1), or a head
    another tool wrote (1)."""
    from .layouts.read import drafter_folder

    if not (path / "config.json").is_file():
        raise InputError(f"{target} is not a model folder (no config.json)", "pass the MLX model folder that add-mtp changed")
    try:
        cat = load_catalogue(LocalStore(path))
        family = detect_family(cat.config)
        headless = family is not None and locate_head(cat, family).layout == "none" and not drafter_folder(path).is_dir()
    except MtpforgeError:
        headless = False
    if headless:
        raise RefusedError(f"{target} holds no MTP head and no {MANIFEST}: there is nothing to remove",
                           f"nothing to undo; `mtpforge inspect {target}` shows what the folder holds")
    raise RefusedError(f"{target} has no {MANIFEST}: its head was not added by mtpforge",
                       "remove-mtp only undoes mtpforge's own changes; use add-mtp --force to replace a foreign head")


def _gguf_undo(path: Path) -> bool:
    """A GGUF file (trunk or head), or a folder that holds a GGUF head's record and no MLX
    manifest: remove-mtp undoes a GGUF add-mtp there."""
    from .gguf.addmtp import is_gguf_path

    if path.is_file():
        return is_gguf_path(str(path))
    if path.is_dir() and not (path / MANIFEST).exists():
        return any(path.glob("*.gguf.mtpforge.json"))
    return False


def _remove_mtp(path: Path, target: str, progress: bool) -> dict[str, Any]:
    manifest = read_manifest(path)
    if manifest is None:
        _refuse_without_manifest(path, target)
    undo_plan = plan_undo(path, manifest)  # checked before anything is staged
    prog = Progress(enabled=progress)
    prog.step("staging the restored folder")
    with StagedFolder(path) as stage:
        apply_undo(stage, undo_plan)
        _refuse_head_left(stage, path)
        prog.step("committing")
        stage.commit()  # the rendered result says it once: "✓ removed the MTP head from ..."
    return {"target": str(path), "status": "removed", "removed": undo_plan.remove,
            "restored": sorted([*undo_plan.write, *undo_plan.link]), "kept_edits": undo_plan.kept_edits}


__all__ = ["add", "add_mtp", "execute", "plan_add_mtp", "read_source", "remove_mtp", "read_manifest"]
