"""``mtpforge inspect``: what a checkpoint holds and every problem of SPEC §6 that applies.

Reads config, index and safetensors headers only; tensor values are read for the head's norms
(a few KB) and, for local folders, for the finite/degenerate scan of the head. Over HTTP no
projection or expert data is ever fetched.
"""

from __future__ import annotations

import hashlib
import json
import re
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

import mlx.core as mx

from .checkpoint.catalogue import INDEX_FILE, Catalogue, head_shards, load_catalogue
from .checkpoint.store import LocalStore, Store
from .checkpoint.tensors import to_mx
from .checks import norms as normchk
from .errors import InputError
from .families.detect import detect_family
from .families import FAMILIES
from .families.tables import declared_mtp_layers, expected_head, expert_format_of, is_moe, is_norm_key
from .findings import ERROR, INFO, WARNING, Finding, finding
from .layouts.detect import HeadLocation, is_raw_hf, locate_head, read_entries
from .layouts.quant import expected_precision, quant_defaults, stored_precision
from .layouts.table import LAYOUTS, MANIFEST, SIDECAR_FILE, loads_in_mlx_lm_glob, runtime_module_path
from .manifest import read_manifest_hint
from .runtimes import RUNTIMES

#: backbone norms of one kind read for the conservative norm-convention comparison
BACKBONE_REFS_PER_KIND = 8


def open_target_store(target: str, revision: str | None = None) -> Store:
    """A local folder when the path exists, else a Hub repo id."""
    p = Path(target)
    if p.exists() or target.startswith((".", "/", "~")) or target.count("/") != 1:
        return LocalStore(p.expanduser())
    from .checkpoint.hub import open_store

    return open_store(target, revision)


def _mlx_lm_version() -> str | None:
    try:
        return metadata.version("mlx-lm")
    except metadata.PackageNotFoundError:
        return None


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def _base_model(store: Store) -> str | None:
    """``base_model`` from a model card's front matter: community conversions name their source."""
    if not store.exists("README.md"):
        return None
    try:
        text = store.read_range("README.md", 0, min(store.size("README.md"), 16384)).decode("utf-8", "replace")
    except Exception:  # a model card is a hint, never a reason to fail
        return None
    m = re.search(r"^base_model:\s*\n?\s*-?\s*([\w.\-]+/[\w.\-]+)", text, re.M)
    return m.group(1) if m else None


def _modules(bare_keys: list[str]) -> list[str]:
    out = set()
    for k in bare_keys:
        for sfx in (".weight", ".scales", ".biases"):
            if k.endswith(sfx):
                out.add(k[: -len(sfx)])
                break
        else:
            out.add(k)
    return sorted(out)


def _in_features(expected: Mapping[str, tuple[int, ...]], module: str) -> int | None:
    shp = expected.get(f"{module}.weight") or expected.get(module)
    return shp[-1] if shp else None


def _check_index(cat: Catalogue) -> list[Finding]:
    out: list[Finding] = []
    if cat.index is None:
        return out
    if cat.unsafe_index:
        k, why = next(iter(sorted(cat.unsafe_index.items())))
        out.append(finding(
            "INDEX_INCONSISTENT",
            f"{INDEX_FILE}: {len(cat.unsafe_index)} entries name files outside the model folder (e.g. {k}: {why})",
            "the index must name files inside the folder: re-download it or regenerate it from the shards",
        ))
    indexed_files = set(cat.index.values())
    missing_files = sorted(f for f in indexed_files if not cat.store.exists(f))
    for f in missing_files:
        out.append(finding(
            "INDEX_INCONSISTENT", f"{INDEX_FILE} names {f}, which is not in the folder",
            f"re-download {f}, or regenerate the index",
        ))
    absent = [k for k, f in cat.index.items() if f in cat.headers and k not in cat.headers[f].tensors]
    if absent:
        out.append(finding(
            "INDEX_INCONSISTENT",
            f"{len(absent)} tensor(s) listed in {INDEX_FILE} are absent from their shard (e.g. {absent[0]})",
            "regenerate the index from the shards, or re-download the model",
        ))
    for f in cat.files:
        if loads_in_mlx_lm_glob(f) and f not in indexed_files:
            out.append(finding(
                "STALE_SHARD", f"{f} is not in {INDEX_FILE}, but mlx-lm loads every model*.safetensors file",
                f"delete {f} if it is left over, or add its tensors to the index",
            ))
    return out


def _norm_convention(
    cat: Catalogue, loc: HeadLocation, source: str | None, source_revision: str | None,
    manifest: dict[str, Any] | None,
) -> tuple[str, str, dict[str, str], list[Finding]]:
    """(convention, how it was decided, per-tensor verdicts, findings)."""
    found: list[Finding] = []
    norm_entries = {k: v for k, v in loc.entries.items() if is_norm_key(k)}
    if not norm_entries:
        return "none", "none", {}, found
    values = read_entries(cat, norm_entries)
    if source:
        src_store = open_target_store(source, source_revision)
        src_cat = load_catalogue(src_store, all_safetensors=False,
                                 index_files=None if isinstance(src_store, LocalStore) else head_shards)
        src_loc = locate_head(src_cat, detect_family(src_cat.config))
        wanted = {k: src_loc.entries[k] for k in norm_entries if k in src_loc.entries}
        src_vals = read_entries(src_cat, wanted)
        src_raw = is_raw_hf(src_cat)
        verdicts: dict[str, str] = {}
        for k, v in values.items():
            if k not in src_vals:
                verdicts[k] = "unknown"
                continue
            ref = src_vals[k] if src_raw else (src_vals[k].astype(mx.float32) - 1.0)
            verdicts[k] = normchk.classify_exact(v, ref)
        return normchk.aggregate(verdicts), "source", verdicts, found
    if manifest and isinstance(manifest.get("tensors"), dict) and manifest.get("norm_convention"):
        recorded = manifest["tensors"]
        ok = True
        for bare, info in norm_entries.items():
            rec = recorded.get(loc.stored_keys.get(bare, bare))
            digest = hashlib.sha256(cat.read_tensor_bytes(info)).hexdigest()
            if not isinstance(rec, dict) or rec.get("sha256") != digest:
                ok = False
                break
        if ok:
            conv = str(manifest["norm_convention"])
            return conv, "manifest", {k: conv for k in norm_entries}, found
        found.append(finding(
            "MANIFEST_STALE", f"{MANIFEST} does not match the head's norm tensors (changed after mtpforge wrote it)",
            "re-run `mtpforge add-mtp --force`, or pass --source to compare with the original",
        ))
    # conservative: compare with the backbone's norms of the same kind
    backbone_shifted = not is_raw_hf(cat)
    by_kind: dict[str, list[Any]] = {}
    for name, info in cat.tensors.items():
        if ".mtp." in name or name.startswith("mtp."):
            continue
        for sfx in set(filter(None, (normchk.backbone_kind(k) for k in norm_entries))):
            # a few layers show a kind's level; every layer of a 94-layer model over HTTP would
            # be hundreds of range requests for the same answer
            if name.endswith(sfx) and len(info.shape) == 1 and len(by_kind.get(sfx, ())) < BACKBONE_REFS_PER_KIND:
                by_kind.setdefault(sfx, []).append(info)
    verdicts = {}
    for k, v in values.items():
        kind = normchk.backbone_kind(k)
        if kind is None:
            continue
        refs = [to_mx(i, cat.read_tensor_bytes(i)) for i in by_kind.get(kind, [])]
        verdicts[k] = normchk.classify_by_backbone(v, refs, backbone_shifted)
    conv = normchk.aggregate(verdicts)
    if conv == "none":
        conv = "unknown"
    return conv, "backbone", verdicts, found


def data_findings(nonfinite: list[str], degenerate: list[str]) -> list[Finding]:
    """NONFINITE_WEIGHTS / DEGENERATE_TENSOR from a scan's lists (inspect's and add-mtp's)."""
    fix = "re-create the head with `mtpforge add-mtp --force` from the original source"
    out = []
    if nonfinite:
        out.append(finding("NONFINITE_WEIGHTS", f"NaN or Inf in {len(nonfinite)} head tensor(s): {', '.join(sorted(nonfinite)[:3])}", fix))
    if degenerate:
        out.append(finding("DEGENERATE_TENSOR", f"{len(degenerate)} head tensor(s) are all zeros: {', '.join(sorted(degenerate)[:3])}", fix))
    return out


def _data_checks(store: LocalStore, loc: HeadLocation) -> list[Finding]:
    """NaN/Inf and all-zero projections or scales, chunk by chunk (a 512-expert stack is ~800 MB):
    the same scan add-mtp runs on what it writes."""
    from .convert import scan_head

    nonfinite: list[str] = []
    degenerate: list[str] = []
    for file in loc.files:
        scan = scan_head(store.path(file), {k: i for k, i in loc.entries.items() if i.file == file}, whole_file=False)
        nonfinite += scan.nonfinite
        degenerate += scan.degenerate
    return data_findings(nonfinite, degenerate)


def inspect_checkpoint(
    target: str,
    *,
    source: str | None = None,
    runtime: str | None = None,
    strict: bool = False,
    revision: str | None = None,
    source_revision: str | None = None,
    mlx_lm_version: str | None = None,
    data_checks: bool = True,
    use_manifest: bool = True,
) -> dict[str, Any]:
    """Inspect TARGET (folder or repo id) and return the CONTRACT.md report.

    ``report["exit_code"]`` is 1 when a finding is an error (or a warning with ``strict``).
    """
    if runtime is not None and runtime not in RUNTIMES:
        raise InputError(f"unknown runtime {runtime!r}", f"use one of: {', '.join(RUNTIMES)}")
    store = open_target_store(target, revision)
    cat = load_catalogue(store)
    findings: list[Finding] = []
    for f, why in sorted(cat.corrupt.items()):
        findings.append(finding("CORRUPT_FILE", why, f"re-download {f} (it is damaged or truncated)"))
    findings += _check_index(cat)

    family = detect_family(cat.config)
    if family is None:
        raise InputError(
            f"{store.name} is not a Qwen3.5, Qwen3.6 or Qwen3-Next checkpoint (model_type {cat.config.get('model_type')!r})",
            "mtpforge handles the model types qwen3_5, qwen3_5_moe and qwen3_next",
        )
    fam = FAMILIES[family]
    declared = declared_mtp_layers(cat.config, family)
    loc = locate_head(cat, family)
    manifest = read_manifest_hint(store) if use_manifest else None
    src_hint = (
        source
        or ((manifest or {}).get("source") or {}).get("repo")
        or _base_model(store)
        or "<original Hugging Face repo, e.g. Qwen/Qwen3.5-27B>"
    )
    add_fix = f"mtpforge add-mtp --source {src_hint} --target {target}"
    report: dict[str, Any] = {
        "target": target,
        "family": family,
        "layout": loc.layout,
        "config_mtp_layers": declared,
        "mtp_tensors": len(loc.entries),
        "mtp_bytes": loc.nbytes,
        "norm_convention": "none",
        "norm_convention_from": "none",
        "expert_format": "none",
        "quantization": {"default": quant_defaults(cat.config), "mtp_modules": {}},
        "files": loc.files,
        "manifest": MANIFEST if manifest else None,
        "raw_hf": is_raw_hf(cat),
    }
    if loc.also_found:
        findings.append(finding("MTP_UNEXPECTED_TENSORS",
                                f"heads in several layouts at once: {loc.layout} and {', '.join(loc.also_found)}",
                                "keep one: `mtpforge remove-mtp` then `mtpforge add-mtp --layout …`"))

    if loc.layout == "none":
        if declared > 0:
            findings.append(finding(
                "MTP_CONFIG_WITHOUT_WEIGHTS",
                f"config declares {declared} MTP layer(s) but the folder holds no MTP tensors "
                "(mlx_lm.convert drops them)",
                add_fix,
            ))
        elif fam.ships_head_undeclared:
            findings.append(finding(
                "MTP_HEAD_MISSING", f"no MTP head; {family} releases ship one, so speculative decoding with it is unavailable",
                add_fix,
            ))
        return _finish(report, findings, strict)

    if declared == 0 and not (loc.layout == "hf" and fam.ships_head_undeclared):
        # a raw Qwen3-Next release ships its head with no count in the config (vLLM defaults
        # it to 1): that is the source as published, not a defect
        findings.append(finding(
            "MTP_WEIGHTS_WITHOUT_CONFIG",
            f"{len(loc.entries)} MTP tensors are stored but the config declares no MTP layers ({' / '.join(fam.count_keys)})",
            f"set {fam.count_keys[0]} to the number of MTP layers in config.json, or re-run `mtpforge add-mtp --force`",
        ))
    bare_keys = list(loc.entries)
    fmt = expert_format_of(bare_keys) if is_moe(cat.config) else "none"
    report["expert_format"] = fmt
    found_layers = {int(k.split(".")[1]) for k in bare_keys if k.startswith("layers.") and k.split(".")[1].isdigit()}
    n_layers = declared or (max(found_layers) + 1 if found_layers else 1)
    expected = expected_head(cat.config, n_layers, fmt if fmt != "none" else None)
    modules = _modules(bare_keys)
    stored_weights = {m for m in modules}
    exp_modules = set(_modules(list(expected)))
    missing = sorted(exp_modules - stored_weights)
    unexpected = sorted(stored_weights - exp_modules)
    if missing:
        findings.append(finding(
            "MTP_MISSING_TENSORS", f"{len(missing)} MTP tensor(s) the config implies are missing (e.g. {missing[0]})",
            f"re-create the head: {add_fix} --force",
        ))
    if unexpected:
        findings.append(finding(
            "MTP_UNEXPECTED_TENSORS",
            f"{len(unexpected)} MTP tensor(s) the config does not imply (e.g. {unexpected[0]})",
            f"remove the stray tensors or re-create the head: {add_fix} --force",
        ))

    # shapes and precision
    bad_shapes: list[str] = []
    qmismatch: list[str] = []
    precisions: dict[str, Any] = {}
    for m in sorted(exp_modules & stored_weights):
        want = expected.get(f"{m}.weight") or expected.get(m)
        info = loc.entries.get(f"{m}.weight") or loc.entries.get(m)
        assert want is not None and info is not None
        prec = stored_precision(loc.entries, m, want[-1])
        precisions[m] = prec
        if prec.get("quantized"):
            ok = info.shape[:-1] == tuple(want[:-1]) and isinstance(prec.get("bits"), int) and prec.get("group_size")
        else:
            ok = tuple(info.shape) == tuple(want)
        if not ok:
            bad_shapes.append(f"{m} {list(info.shape)} (expected {list(want)})")
            continue
        if loc.layout in ("hf",):
            continue
        rpath = runtime_module_path(m, loc.layout, family)
        exp_q = expected_precision(cat.config, rpath, f"{m}.scales" in loc.entries)
        if prec.get("quantized"):
            if exp_q is None or exp_q.get("bits") != prec.get("bits") or exp_q.get("group_size") != prec.get("group_size"):
                qmismatch.append(f"{m}: stored {prec.get('bits')}-bit/{prec.get('group_size')}, config builds "
                                 + (f"{exp_q.get('bits')}-bit/{exp_q.get('group_size')}" if exp_q else "unquantized"))
        elif exp_q is not None:
            qmismatch.append(f"{m}: stored unquantized, config builds {exp_q.get('bits')}-bit")
    report["quantization"]["mtp_modules"] = precisions
    if bad_shapes:
        findings.append(finding(
            "MTP_SHAPE_MISMATCH",
            f"{len(bad_shapes)} MTP tensor(s) do not fit this model's config (head from another model size?): {bad_shapes[0]}",
            f"re-create the head from this model's own source: {add_fix} --force",
        ))
    if qmismatch:
        findings.append(finding(
            "QUANT_CONFIG_MISMATCH",
            f"{len(qmismatch)} MTP module(s) are stored at another precision than the config makes the loader build: {qmismatch[0]}",
            "add per-module entries under \"quantization\" and \"quantization_config\" in config.json, or re-run `mtpforge add-mtp --force`",
        ))

    # norms
    conv, how, verdicts, nf = _norm_convention(cat, loc, source, source_revision, manifest)
    findings += nf
    report["norm_convention"] = conv
    report["norm_convention_from"] = how
    expected_conv = "raw" if loc.layout == "hf" else "shifted"
    if conv == "raw" and expected_conv == "shifted":
        findings.append(finding(
            "MTP_NORMS_RAW", f"the head's RMSNorm weights are zero-centred (raw Hugging Face convention) in the {loc.layout} layout, whose runtime applies them as-is: ≈0% acceptance",
            f"re-create the head with the +1 shift: {add_fix} --force",
        ))
    elif conv == "shifted" and expected_conv == "raw":
        findings.append(finding(
            "MTP_NORMS_DOUBLE_SHIFTED", "the head's norms are already shifted in a raw Hugging Face checkpoint; mlx-lm will add +1 again",
            "restore the original zero-centred norms (re-download the source)",
        ))
    elif conv == "mixed":
        bad = sorted(k for k, v in verdicts.items() if v != expected_conv)
        findings.append(finding(
            "MTP_NORMS_MIXED", f"some head norms are shifted and others are not (e.g. {bad[0] if bad else '?'})",
            f"re-create the head: {add_fix} --force",
        ))
    elif conv == "double-shifted":
        findings.append(finding(
            "MTP_NORMS_DOUBLE_SHIFTED", "the head's norms carry +2 instead of +1 (shifted twice): acceptance halves",
            f"re-create the head: {add_fix} --force",
        ))
    elif conv == "unknown":
        findings.append(finding(
            "NORM_CONVENTION_UNKNOWN", "the head's norm convention could not be decided without the source tensors",
            f"pass --source {src_hint} to compare exactly (fetches a few KB)",
        ))

    # references and runtime compatibility
    if store.exists(SIDECAR_FILE):
        extra = cat.config.get("mlx_lm_extra_tensors")
        if not (isinstance(extra, dict) and extra.get("mtp_file") == SIDECAR_FILE):
            findings.append(finding(
                "SIDECAR_UNREFERENCED", f"{SIDECAR_FILE} is present but config.json does not reference it (mlx_lm_extra_tensors.mtp_file)",
                'add "mlx_lm_extra_tensors": {"mtp_file": "mtp.safetensors", "mtp_tensor_count": N} to config.json, or re-run `mtpforge add-mtp --layout sidecar --force`',
            ))
    in_glob = [f for f in loc.files if loads_in_mlx_lm_glob(f)]
    if in_glob and loc.layout != "hf":
        mlx_lm = RUNTIMES["mlx-lm"]
        if family in mlx_lm.rejects_head_in_glob:
            findings.append(finding(
                "MLX_LM_LOAD_BREAKS",
                f"MTP keys in {in_glob[0]}: released mlx-lm loads Qwen3-Next strictly and fails (\"parameters not in model\")",
                "use the sidecar layout for mlx-lm users: `mtpforge add-mtp --layout sidecar --force`",
                severity=ERROR if runtime == "mlx-lm" else WARNING,
            ))
        v = mlx_lm_version or _mlx_lm_version()
        legacy = mlx_lm.double_shift_versions
        if v and legacy and legacy[0] <= _version_tuple(v) <= legacy[1]:
            findings.append(finding(
                "LEGACY_LOADER_DOUBLE_SHIFT",
                f"mlx-lm {v} adds +1 to every backbone norm when mtp. keys reach sanitize: this folder's backbone would be corrupted",
                "upgrade mlx-lm to 0.32 or newer (pip install -U mlx-lm), or use the sidecar layout",
            ))
    if fmt != "none":
        check_rt = runtime or (LAYOUTS[loc.layout].runtime if loc.layout in LAYOUTS else None)
        row = RUNTIMES[check_rt] if check_rt else None
        allowed = row.experts_for(family) if row else None
        quant_experts = any(p.get("quantized") for m, p in precisions.items() if ".experts." in m)
        bad = row is not None and allowed is not None and (fmt not in allowed or (not row.quantized_experts and quant_experts))
        if bad:
            findings.append(finding(
                "EXPERT_LAYOUT_INCOMPATIBLE",
                f"MoE experts stored as {fmt}{' (quantized)' if quant_experts else ''}; {check_rt} loads {' or '.join(allowed or ())}",
                f"re-write the head for it: mtpforge add-mtp --experts {'source' if 'switch_mlp' not in (allowed or ()) else 'switch_mlp'} --force",
                severity=ERROR if runtime else WARNING,
            ))
    reads = RUNTIMES[runtime].layouts if runtime else ()
    if reads and loc.layout not in reads and loc.layout != "hf":
        findings.append(finding(
            "LAYOUT_NOT_READ_BY_RUNTIME", f"{runtime} reads the {' / '.join(reads)} layout; this head is {loc.layout}",
            f"mtpforge add-mtp --layout {reads[0]} --force",
        ))
    if data_checks and isinstance(store, LocalStore):
        findings += _data_checks(store, loc)
    return _finish(report, findings, strict)


def _finish(report: dict[str, Any], findings: list[Finding], strict: bool) -> dict[str, Any]:
    report["findings"] = [f.as_dict() for f in findings]
    bad = {ERROR, WARNING} if strict else {ERROR}
    report["exit_code"] = 1 if any(f.severity in bad for f in findings) else 0
    report["ok"] = report["exit_code"] == 0
    return report


__all__ = ["inspect_checkpoint", "INFO", "WARNING", "ERROR"]
