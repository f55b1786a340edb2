"""``add-mtp`` and ``remove-mtp``: resolve -> plan -> fetch -> convert -> stage -> validate -> commit.

One code path for the CLI, recipes and the demo. Nothing touches the user's folder until the
staged copy has been written completely and passed ``inspect``; then one atomic swap.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .checkpoint.catalogue import INDEX_FILE, Catalogue, head_shards, load_catalogue
from .checkpoint.safetensors_header import TensorInfo, read_local_header
from .checkpoint.store import LocalStore, Store
from .convert import Reader, scan_head, write_plan
from .errors import InputError, RefusedError
from .families.detect import detect_family
from .families.tables import declared_mtp_layers
from .layouts.detect import HeadLocation, is_raw_hf, locate_head
from .layouts.quant import quant_defaults
from .layouts.table import DRAFTER_MODEL_TYPE, MANIFEST, VLLM_MLX_MANIFEST, loads_in_mlx_lm_glob, placement
from .options import AddOptions
from .layouts.write import drafter_config, dump_json, updated_config, updated_index, vllm_mlx_manifest
from .manifest import build_manifest, entry, head_intact, read_manifest, undo
from .passes.quantize import QSpec
from .plan import Plan, build_plan, check_compatible, fetch_list, parse_precision, resolve_layout, source_bytes
from .progress import Progress
from .writer.atomic import StagedFolder, check_disk_space, check_writable_parent, cleanup_leftovers
from .writer.safetensors_stream import SafetensorsWriter, TensorSpec

# ----------------------------------------------------------------------------- resolve

def _open_source(source: str, revision: str | None) -> Store:
    p = Path(source).expanduser()
    if p.exists():
        return LocalStore(p)
    if source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise InputError(f"source {source} is neither an existing folder nor a Hugging Face repo id",
                         "pass a local folder or a repo id such as Qwen/Qwen3.5-27B")
    from .checkpoint.hub import open_store

    return open_store(source, revision)


def _open_target(target: str) -> tuple[Path, Catalogue, str]:
    path = Path(target).expanduser()
    if not path.exists():
        raise InputError(f"target {target} does not exist", "pass the MLX model folder to add the head to")
    store = LocalStore(path)
    cat = load_catalogue(store)
    cat.refuse_damage("target")
    family = detect_family(cat.config)
    if family is None:
        raise InputError(f"{target} is not a Qwen3.5, Qwen3.6 or Qwen3-Next model (model_type {cat.config.get('model_type')!r})",
                         "mtpforge adds MTP heads to qwen3_5, qwen3_5_moe and qwen3_next models")
    if cat.config.get("model_type") == DRAFTER_MODEL_TYPE:
        raise InputError(f"{target} is an mlx-vlm drafter folder, not a model", "pass the MLX model folder as --target")
    if is_raw_hf(cat):
        raise InputError(f"{target} is a raw Hugging Face checkpoint, not an MLX model",
                         f"convert it first (mlx_lm.convert --hf-path {target}), or use it as --source")
    return path, cat, family


def _default_q(config: dict[str, Any]) -> QSpec | None:
    d = quant_defaults(config)
    return QSpec(d["bits"], d["group_size"], d["mode"]) if d else None


def _source_fingerprint(store: Store, entries: dict[str, TensorInfo], commit: str | None) -> str:
    """Identifies the source head: the commit for a Hub repo; names, dtypes, shapes and byte
    spans for a local folder (cheap, and changes when the files do)."""
    h = hashlib.sha256()
    h.update((commit or "").encode())
    for k in sorted(entries):
        i = entries[k]
        h.update(f"{k}|{i.file}|{i.dtype}|{i.shape}|{i.begin}|{i.end}|{store.size(i.file)}\n".encode())
    return h.hexdigest()


# ----------------------------------------------------------------------------- fetch

def _reader(store: Store, infos: list[TensorInfo], mode: str, progress: bool) -> tuple[Reader, int, str]:
    """A reader over the source tensors, fetching remote bytes first (once, cached)."""
    if isinstance(store, LocalStore):
        return (lambda info, a, b: store.read_range(info.file, info.begin + a, info.begin + b)), 0, "local"
    from .checkpoint.fetch import fetch_tensors

    res = fetch_tensors(store, infos, mode=mode, progress=progress)

    def read(info: TensorInfo, a: int, b: int) -> bytes:
        path, off, n = res.locate(info.name)
        with open(path, "rb") as f:
            f.seek(off + a)
            data = f.read(b - a)
        if len(data) != b - a:
            raise RefusedError(f"cached bytes of {info.name} are truncated", "re-run; the cache entry will be fetched again")
        return data

    return read, res.fetched_bytes, res.mode


def _planned_requests(infos: list[TensorInfo]) -> int:
    """How many Range requests ``--fetch ranges`` will make (neighbours coalesced)."""
    from .checkpoint.fetch import plan_runs

    return len(plan_runs(infos))


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


# ----------------------------------------------------------------------------- add

def add_mtp(options: AddOptions | None = None, /, *, progress: bool = True, **kw: Any) -> dict[str, Any]:
    """Add the source's MTP head to ``target`` (or to a new folder ``output``).

    Pass an :class:`AddOptions`, or its fields as keywords (``source=..., target=...``).
    """
    opts = options if options is not None else AddOptions.parse(**kw)
    source, target, layout, precision = opts.source, opts.target, opts.layout, opts.precision
    keep_fc_full_precision, experts, fetch, revision = opts.keep_fc_full_precision, opts.experts, opts.fetch, opts.revision
    output, dry_run, force = opts.output, opts.dry_run, opts.force
    if not dry_run:
        cleanup_leftovers(Path(target).expanduser())  # a killed run's leftovers, before reading
    tpath, tcat, family = _open_target(target)
    layout = resolve_layout(layout, family)
    out_path: Path | None = Path(output).expanduser() if output else None
    if out_path is not None and out_path.exists() and (not out_path.is_dir() or any(out_path.iterdir())):
        raise InputError(f"--output {output} exists and is not empty", "pass a new or empty folder")
    pl = placement(layout, family)
    if pl.separate_folder and out_path is None:
        out_path = tpath.parent / f"{tpath.name}-mtp-drafter"
    dest = out_path or tpath
    prog = Progress(enabled=progress)

    # the source: index and headers only
    prog.step(f"reading the source {source}")
    sstore = _open_source(source, revision)
    local_source = isinstance(sstore, LocalStore)
    scat = load_catalogue(sstore, all_safetensors=local_source, index_files=None if local_source else head_shards)
    sfamily = detect_family(scat.config)
    if sfamily is None:
        raise RefusedError(f"source {source} is not a Qwen3.5, Qwen3.6 or Qwen3-Next checkpoint",
                           "pass the original Hugging Face checkpoint of the target model")
    scat.refuse_damage("source")
    gone = sorted({f for f in (scat.index or {}).values() if not sstore.exists(f)}) if isinstance(sstore, LocalStore) else []
    if gone:
        raise RefusedError(f"the source's {INDEX_FILE} names {gone[0]}, which is not in {source}",
                           f"re-download {gone[0]} (or the whole source); an incomplete download cannot be trusted")
    if not is_raw_hf(scat):
        raise RefusedError(f"source {source} is not a raw Hugging Face checkpoint (it looks converted)",
                           "pass the original Hugging Face repo (e.g. Qwen/Qwen3.5-27B) as --source")
    check_compatible(scat.config, tcat.config, sfamily, family)
    sloc = locate_head(scat, sfamily)
    if sloc.layout != "hf" or not sloc.entries:
        raise RefusedError(f"source {source} has no MTP tensors (mtp.*)",
                           "pass the original Hugging Face checkpoint, which ships the head")
    n_layers = declared_mtp_layers(scat.config, sfamily) or (
        1 + max(int(k.split(".")[1]) for k in sloc.entries if k.startswith("layers.")))
    commit = getattr(sstore, "commit", None)
    default_q = _default_q(tcat.config)
    plan = build_plan(family=family, src_config=scat.config, tgt_config=tcat.config, entries=sloc.entries,
                      n_layers=n_layers, layout=layout, precision=precision, keep_fc=keep_fc_full_precision,
                      experts=experts, default_q=default_q)
    to_fetch = fetch_list(plan, sloc.entries)
    fingerprint = _source_fingerprint(sstore, sloc.entries, commit)
    options = {
        "layout": layout, "precision": str(parse_precision(precision)), "keep_fc_full_precision": keep_fc_full_precision,
        "experts": plan.expert_format,
    }
    files = _files_for(plan, dest)
    report: dict[str, Any] = {
        "target": str(tpath), "output": str(out_path) if out_path else None, "layout": layout, "family": family,
        "expert_format": plan.expert_format, "mtp_tensors": plan.mtp_tensors, "mtp_bytes": plan.mtp_bytes,
        "revision": commit, "notes": list(plan.notes), "fetched_bytes": 0,
        "manifest": str(dest / MANIFEST),
    }
    if pl.breaks_mlx_lm:
        report["notes"].append("released mlx-lm cannot load this folder with mtp.* keys in model-mtp.safetensors (vllm-mlx loads it); use --layout sidecar for mlx-lm users")
    if dry_run:
        report.update(dry_run=True, status="planned", files_to_write=files, fetch_bytes=source_bytes(to_fetch),
                      fetch_tensors=len(to_fetch), fetch_files=sorted({i.file for i in to_fetch}),
                      fetch_requests=None if local_source else _planned_requests(to_fetch),
                      peak_memory_estimate=plan.peak_memory_estimate(), files_written=[])
        return report

    # an existing head: identical -> nothing to do; other -> refuse unless --force. The head that
    # counts is the one in the folder the staged copy starts from: the target (in place, or
    # mirrored into --output), or an existing drafter folder (an empty one holds no head)
    drafter = pl.separate_folder
    existing_root = (dest if dest.is_dir() and any(dest.iterdir()) else None) if drafter else tpath
    manifest = read_manifest(existing_root) if existing_root else None
    dcat = tcat if existing_root == tpath else (load_catalogue(LocalStore(existing_root)) if existing_root else None)
    dloc = locate_head(dcat, family) if dcat is not None and dcat.config.get("model_type") != DRAFTER_MODEL_TYPE else None
    has_head = bool(manifest) or (dloc is not None and dloc.layout != "none")
    same = bool(manifest) and manifest.get("source", {}).get("fingerprint") == fingerprint \
        and manifest.get("options") == options
    if same and (out_path is None or drafter) and head_intact(existing_root, manifest) and not force:
        report.update(status="already-present", files_written=[])
        return report
    if has_head and not force and not same:
        what = f"a head written by mtpforge from {manifest.get('source', {}).get('repo')} with other options" if manifest \
            else f"an MTP head ({dloc.layout if dloc else 'unknown'} layout) not written by mtpforge"
        raise RefusedError(f"{existing_root} already has {what}", "pass --force to replace it, or `mtpforge remove-mtp` first")
    check_writable_parent(dest)
    check_disk_space(dest, plan.mtp_bytes + (1 << 20))

    prog.step(f"fetching {len(to_fetch)} MTP tensors ({source_bytes(to_fetch):,} bytes)")
    read, fetched, fetch_mode = _reader(sstore, to_fetch, fetch, progress)
    report["fetched_bytes"] = fetched
    report["fetch_mode"] = fetch_mode

    if drafter:
        stage = StagedFolder(dest, empty=True) if dest.exists() else StagedFolder(tpath, output=dest, empty=True)
    else:
        stage = StagedFolder(tpath, output=out_path)
    with stage:
        notes: list[str] = []
        if has_head and manifest:
            undo(stage, manifest)
        elif has_head and dloc is not None and dcat is not None:
            notes += _strip_foreign_head(stage, dcat, dloc)
        base_cfg = json.loads(stage.path("config.json").read_text("utf-8")) if not drafter else dict(tcat.config)
        before = {rel: entry(stage.path(rel)) for rel in ("config.json", INDEX_FILE)} if not drafter else {}

        prog.step(f"converting to the {layout} layout")
        head_file = stage.new_file(plan.file)
        with prog.bytes_bar("converting", source_bytes(to_fetch)) as advance:
            write_plan(plan, head_file, sloc.entries, read, on_progress=advance)
        head_infos = read_local_header(head_file, plan.file).tensors
        scan = scan_head(head_file, head_infos)  # digests + data checks in one bounded pass
        digests = scan.digests
        quant_entries = plan.quant_entries()
        added = [plan.file]
        if drafter:
            dq = dict(quant_defaults(tcat.config) or {}) or None
            if dq is not None or quant_entries:
                dq = {**({k: dq[k] for k in ("group_size", "bits", "mode")} if dq else {}), **quant_entries}
            stage.write_bytes("config.json", dump_json(drafter_config(tcat.config, n_layers, dq)))
            added.append("config.json")
        else:
            cfg = updated_config(base_cfg, pl, n_layers=n_layers,
                                 mtp_tensors=plan.mtp_tensors, quant_entries=quant_entries)
            stage.write_bytes("config.json", dump_json(cfg))
            if pl.in_index:
                idx_path = stage.path(INDEX_FILE)
                idx = json.loads(idx_path.read_text("utf-8")) if idx_path.is_file() else None
                if idx is None:
                    # no index: mlx-lm globs anyway; create one so exo's index probe finds the head
                    shards = load_catalogue(LocalStore(stage.stage)).headers
                    idx = {"metadata": {}, "weight_map": {k: f for f, h in shards.items() if loads_in_mlx_lm_glob(f)
                                                         and f != plan.file for k in h.tensors}}
                stage.write_bytes(INDEX_FILE, dump_json(updated_index(idx, plan.file, list(head_infos), plan.mtp_bytes)))
            if pl.vllm_manifest:
                src_name = source if not isinstance(sstore, LocalStore) else Path(source).name
                stage.write_bytes(VLLM_MLX_MANIFEST, dump_json(vllm_mlx_manifest(
                    family=family, n_layers=n_layers, mtp_tensors=plan.mtp_tensors, expert_format=plan.expert_format,
                    source=src_name, revision=commit)))
                added.append(VLLM_MLX_MANIFEST)
        manifest_obj = build_manifest(
            family=family, layout=layout,
            source={"repo": source if not isinstance(sstore, LocalStore) else str(Path(source).name),
                    "revision": commit, "local": isinstance(sstore, LocalStore), "fingerprint": fingerprint},
            options=options, plan=plan, n_layers=n_layers,
            tensors={k: {"sha256": digests[k], "dtype": i.dtype, "shape": list(i.shape)} for k, i in head_infos.items()},
            file_sha256={plan.file: scan.file_sha256}, added=added, changed=before,
        )
        stage.write_bytes(MANIFEST, dump_json(manifest_obj))

        prog.step("validating the staged folder")
        from .checks.data import data_findings
        from .inspect import inspect_checkpoint

        # the data checks ran on the written bytes in scan_head, chunk by chunk; inspect's own
        # read whole tensors (a 512-expert stack is ~800 MB)
        check = inspect_checkpoint(str(stage.stage), use_manifest=False, data_checks=False)
        check["findings"] += [f.as_dict() for f in data_findings(scan.nonfinite, scan.degenerate)]
        errors = [f for f in check["findings"] if f["severity"] == "error"]
        if errors:
            e = errors[0]
            raise RefusedError(f"the converted head failed validation, nothing was changed: {e['code']}: {e['message']}",
                               "report this with `mtpforge env` output; the target is untouched")
        prog.step("committing")
        stage.commit()
    report.update(
        status="written",
        files_written=[str(dest / f) for f in sorted(set(added + [MANIFEST, "config.json"]) | ({INDEX_FILE} if pl.in_index else set()))],
        notes=report["notes"] + notes,
        # the staged check cannot see provenance (it ignores the manifest on purpose, to judge
        # the files alone), so "convention unknown" there only restates what add-mtp decided
        inspect={"findings": [f for f in check["findings"] if f["code"] != "NORM_CONVENTION_UNKNOWN"],
                 "norm_convention": "shifted"},
    )
    prog.done(f"added the MTP head to {dest} ({layout} layout)")
    return report


def _files_for(plan: Plan, dest: Path) -> list[str]:
    pl = plan.placement
    files = [plan.file, MANIFEST, "config.json"]
    if pl.in_index and not pl.separate_folder:
        files.append(INDEX_FILE)
    if pl.vllm_manifest and not pl.separate_folder:
        files.append(VLLM_MLX_MANIFEST)
    return [str(dest / f) for f in files]


# ----------------------------------------------------------------------------- remove

def remove_mtp(target: str, *, progress: bool = True) -> dict[str, Any]:
    """Restore the folder to its state before add-mtp, byte for byte."""
    path = Path(target).expanduser()
    if path.parent.is_dir():
        cleanup_leftovers(path)  # a killed run's leftovers (and a half-done fallback swap) first
    if not path.is_dir():
        raise InputError(f"{target} is not a folder", "pass the model folder that add-mtp changed")
    manifest = read_manifest(path)
    if manifest is None:
        raise RefusedError(f"{target} has no {MANIFEST}: its head (if any) was not added by mtpforge",
                           "remove-mtp only undoes mtpforge's own changes; use add-mtp --force to replace a foreign head")
    prog = Progress(enabled=progress)
    prog.step("staging the restored folder")
    with StagedFolder(path) as stage:
        undo(stage, manifest)
        prog.step("committing")
        stage.commit()
    prog.done(f"removed the MTP head from {path}")
    return {"target": str(path), "status": "removed", "removed": manifest.get("added", []),
            "restored": sorted((manifest.get("changed") or {}).keys())}


__all__ = ["add_mtp", "remove_mtp", "read_manifest"]
