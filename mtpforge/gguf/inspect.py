"""``inspect`` on a GGUF: where llama.cpp would find the MTP head, and what is wrong with it.

A trunk either carries the MTP layer as its last block(s) (``gguf-tail``: ``block_count``
includes them, ``{arch}.nextn_predict_layers`` counts them), or an MTP-only file sits beside it
(``gguf-mtp``: ``mtp-*.gguf``, given to llama-server with ``-md``), or there is no head. Every
check reads metadata and the tensor table only; with ``--source`` the head's norms (a few KB)
are compared exactly with the source's. A Hub repo is read by range requests, headers only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, MtpforgeError
from ..families import FAMILIES
from ..findings import Finding, finding
from ..inputs.manifest_file import GgufManifestFile, gguf_trunk_files, read_gguf_manifest
from ..layouts.gguf import GGUF_MTP, GGUF_TAIL
from .addmtp import MANIFEST_SUFFIX
from .gguffile import GgufFile, group_parts, join_parts, read_local, read_remote, tensor_array
from .drafter import check_drafter_file, drafter_family, drafter_files
from .tensor_checks import held_against, nonfinite_in
from .names import FIRST_BLOCK_NORM, SHARED_TENSORS, family_of, block_of, expected_block, gguf_dims, handled_archs, norm_sources


def _dims(g: GgufFile) -> dict[str, int]:
    def i(key: str) -> int:
        v = g.get("{arch}." + key, 0)
        if isinstance(v, list):
            v = max(v) if v else 0
        return int(v or 0)

    emb = g.tensors.get("token_embd.weight")
    return gguf_dims(i, emb.shape[0] if emb is not None and emb.shape else 0, FAMILIES[family_of(g)])


def _mtp_blocks(g: GgufFile) -> list[int]:
    return sorted({b for n in g.tensors if ".nextn." in n and (b := block_of(n)) is not None})


def _source_hint(g: GgufFile, source: str | None) -> str:
    if source:
        return source
    for key in ("general.base_model.0.repo_url", "general.source.repo_url", "general.source.url"):
        v = g.get(key)
        if isinstance(v, str) and "huggingface.co/" in v:
            return v.split("huggingface.co/", 1)[1].strip("/")
    return f"<original Hugging Face repo, e.g. {FAMILIES[family_of(g)].example_repo}>"


def check_head_file(head: GgufFile, trunk: GgufFile | None, where: str) -> tuple[list[Finding], dict[str, Any]]:
    """The MTP block of ``head`` (a gguf-tail trunk, or an MTP-only file) against its metadata
    and, for an MTP-only file, against the trunk it is meant for."""
    out: list[Finding] = []
    ref = trunk or head
    n_next = head.nextn_layers
    blocks = _mtp_blocks(head)
    expect_blocks = list(range(head.block_count - n_next, head.block_count)) if n_next else []
    info: dict[str, Any] = {"mtp_blocks": blocks, "nextn_predict_layers": n_next, "block_count": head.block_count}
    if not blocks:
        return out, info
    if n_next == 0:
        out.append(finding("MTP_WEIGHTS_WITHOUT_CONFIG",
                           f"{where} holds NextN tensors (blk.{blocks[0]}.nextn.*) but declares no {head.arch}.nextn_predict_layers",
                           "re-write it with mtpforge add-mtp (it sets the count), or re-convert with llama.cpp's converter"))
    elif blocks != expect_blocks:
        out.append(finding("MTP_UNEXPECTED_TENSORS",
                           f"{where}: block_count {head.block_count} and nextn_predict_layers {n_next} put the MTP layer at "
                           f"blk.{expect_blocks[0]}, but its NextN tensors are at blk.{blocks[0]}",
                           "re-write the head with mtpforge add-mtp --force (block_count = trunk layers + MTP layers)"))
    if trunk is not None and trunk is not head:
        if head.arch != trunk.arch:
            out.append(finding("MTP_SHAPE_MISMATCH", f"{where} is a {head.arch} head, the trunk is {trunk.arch}",
                               "use the MTP file made for this model (mtpforge add-mtp writes one)"))
        elif head.block_count - n_next != trunk.block_count:
            out.append(finding("MTP_UNEXPECTED_TENSORS",
                               f"{where} places its MTP layer after {head.block_count - n_next} layers; the trunk has {trunk.block_count}",
                               "it belongs to another model size: write one for this trunk with mtpforge add-mtp"))
        for n in SHARED_TENSORS:
            a, b = head.tensors.get(n), trunk.tensors.get(n)
            if a is not None and b is not None and a.shape != b.shape:
                out.append(finding("MTP_SHAPE_MISMATCH", f"{where}: {n} is {list(a.shape)}, the trunk's {list(b.shape)}",
                                   "use the MTP file made for this model"))
    want, maybe = expected_block(FAMILIES[family_of(head)], _dims(ref))
    held = {b: {n.split(".", 2)[2]: t for n, t in head.tensors.items() if block_of(n) == b} for b in blocks}
    for b, have in held.items():  # every MTP block that holds NextN tensors (Step-3.5: one per step)
        out += held_against(f"{where}: the MTP block blk.{b}", have, want, maybe)
    if held:
        first = held[blocks[0]]
        info["mtp_tensors"] = sum(len(h) for h in held.values())
        info["mtp_bytes"] = sum(t.nbytes for h in held.values() for t in h.values())
        info["types"] = {k: t.type_name for k, t in sorted(first.items())}
        info["expert_format"] = "stacked" if any(k.endswith("_exps.weight") for k in first) else "none"
    return out, info


def _norm_convention(head: GgufFile, source: str | None, revision: str | None,
                     drafter: str | None = None) -> tuple[str, str, list[Finding]]:
    """Exact comparison of the head's norms with the source's: each must carry what llama.cpp's
    converter adds (+1 on a zero-centred norm, nothing on a raw family's); a norm off by one
    from that is raw, double-shifted or wrongly shifted. ``drafter``: the head is that family's
    drafter file (its stages from ``blk.0``, its own norms outside them)."""
    if source is None or head.path is None:
        return "unknown", "none", []
    from ..headplan import decode
    from .source import open_source_head

    src = open_source_head(source, revision)
    other = _other_family(head, src.family, source) if drafter is None else _other_drafter(drafter, src.family, source)
    if other is not None:
        return "unknown", "none", [other]
    spec = FAMILIES[src.family]
    right = "shifted" if spec.norm_offset else "raw"
    kinds: dict[str, str] = {}
    blocks = list(range(head.block_count)) if drafter else _mtp_blocks(head)
    for name, (bare, want) in norm_sources(spec, blocks[0], len(blocks)).items():
        if name not in head.tensors or bare not in src.entries:
            continue
        info = src.entries[bare]
        s = np.array(decode(info, src.store.read_range(info.file, info.begin, info.end), tuple(info.shape), None, check=False))
        d = float(np.mean(tensor_array(head, head.tensors[name]) - s)) - want
        kinds[name] = right if abs(d) < 0.05 else "off-by-one" if abs(abs(d) - 1) < 0.05 else "other"
        if kinds[name] == "off-by-one":
            kinds[name] = ("raw" if d < 0 else "double-shifted") if spec.norm_offset else "shifted"
    if not kinds:
        return "unknown", "source", []
    conv, out = _judged(kinds, right, spec.name)
    return conv, "source", out


def _judged(kinds: dict[str, str], right: str, family: str) -> tuple[str, list[Finding]]:
    """One convention for the head from per-norm verdicts, and the finding a wrong one gets."""
    found = set(kinds.values())
    out: list[Finding] = []
    if found == {right}:
        return right, out
    fix = "re-write the head with mtpforge add-mtp --force"
    if found == {"raw"}:
        out.append(finding("MTP_NORMS_RAW", "the MTP norms are the raw zero-centred source values; llama.cpp expects them +1", fix))
        return "raw", out
    if found == {"double-shifted"}:
        out.append(finding("MTP_NORMS_DOUBLE_SHIFTED", "the MTP norms are shifted +2 instead of +1 (acceptance halves)", fix))
        return "double-shifted", out
    if found == {"shifted"}:
        out.append(finding("MTP_NORMS_SHIFTED", f"the MTP norms are shifted +1, but {family}'s norms are raw "
                                                "(llama.cpp multiplies by them as stored)", fix))
        return "shifted", out
    bad = sorted(n for n, k in kinds.items() if k != right)
    out.append(finding("MTP_NORMS_MIXED", f"some MTP norms are not as llama.cpp's converter writes them ({right}): "
                                          f"{', '.join(bad[:3])}", fix))
    return "mixed", out


#: a head norm is told by the trunk's norms of its kind only when its mean lies within this of
#: exactly one convention's level (checks/norms.classify_by_backbone, the MLX backbone's rule)
TRUNK_MARGIN = 0.35
#: trunk blocks read per kind (a few show a kind's level)
TRUNK_REFS = 8


def _norms_from_trunk(head: GgufFile, trunk: GgufFile, family: str) -> tuple[str, str, list[Finding]]:
    """Without --source or a record: each head norm whose kind the trunk's own blocks also carry
    (``attn_norm``, ``ffn_norm``, ``attn_q_norm`` ...) against the mean of those, which llama.cpp's
    converter wrote with the same offset; a norm is decided only when one level fits (the head's
    own ``nextn.*`` norms have no kin: they stay undecided). ("unknown", "none") when nothing is
    decided: the table says "undecided", never the family's convention as if measured."""
    spec = FAMILIES[family]
    blocks = _mtp_blocks(head)
    if not blocks or trunk.path is None:
        return "unknown", "none", []
    right = "shifted" if spec.norm_offset else "raw"
    above = "double-shifted" if spec.norm_offset else "shifted"  # one more +1 than llama.cpp writes
    below = "raw" if spec.norm_offset else None
    own = range(trunk.block_count - (trunk.nextn_layers if trunk is head else 0))
    kinds: dict[str, str] = {}
    for name in norm_sources(spec, blocks[0], len(blocks)):
        if name not in head.tensors or ".nextn." in name:
            continue
        kind = name.split(".", 2)[2]
        refs = [t for i in own if (t := trunk.tensors.get(f"blk.{i}.{kind}")) is not None][:TRUNK_REFS]
        if not refs:
            continue
        level = float(np.mean([np.mean(tensor_array(trunk, t)) for t in refs]))
        d = float(np.mean(tensor_array(head, head.tensors[name]))) - level
        fits = [o for o in (-1, 0, 1) if abs(d - o) < TRUNK_MARGIN]
        verdict = {0: right, 1: above, -1: below}.get(fits[0]) if len(fits) == 1 else None
        if verdict is not None:
            kinds[name] = verdict
    if not kinds:
        return "unknown", "none", []
    conv, out = _judged(kinds, right, spec.name)
    return conv, "trunk", out


def _other_family(head: GgufFile, src_family: str, source: str) -> Finding | None:
    """A --source of another family than the head's proves nothing about its norms: an error
    finding (it was exit 0, no findings, ``raw`` "from source"). Families of one architecture
    (GLM-4.7-Flash and DeepSeek-V3 are both deepseek2) are told apart by the file's
    pre-tokenizer, as ``family_of`` does; a file that states none is not judged."""
    mine = family_of(head)
    if mine is None or mine in (src_family, FAMILIES[src_family].gguf_same_as):
        return None
    if FAMILIES[src_family].gguf_arch == head.arch and head.get("tokenizer.ggml.pre") is None:
        return None  # families sharing an architecture (deepseek2) are told apart by the pre-tokenizer only
    return finding("SOURCE_MISMATCH", f"--source {source} is a {src_family} checkpoint, but the head is {mine}'s "
                                      f"({head.arch}): the comparison proves nothing",
                   "pass this model's own original checkpoint as --source", severity="error")


def _other_drafter(drafter: str, src_family: str, source: str) -> Finding | None:
    """A --source that is not the drafter's release (DeepSeek-V4's MTP release beside a DSpark
    file) proves nothing about its norms: an error finding, as for a head."""
    if src_family == drafter:
        return None
    return finding("SOURCE_MISMATCH", f"--source {source} is a {src_family} checkpoint, but the drafter is {drafter}'s: "
                                      "the comparison proves nothing",
                   f"pass the drafter's own release (e.g. {FAMILIES[drafter].example_repo}) as --source", severity="error")


def _manifest(p: Path) -> GgufManifestFile | None:
    """The head's record, validated (a damaged one is no record: the head is judged by itself)."""
    return read_gguf_manifest(p.with_name(p.name + MANIFEST_SUFFIX))[0]


def _nonfinite(g: GgufFile, blocks: list[int]) -> list[Finding]:
    """Every tensor of the MTP blocks, whatever its encoding (F32/F16 under 4 MB only were read:
    a q8_0 or bf16 head holding NaN had no finding)."""
    return nonfinite_in(g, [n for n in g.tensors if block_of(n) in blocks], "")


def _mtp_siblings(p: Path, g: GgufFile) -> tuple[list[dict[str, Any]], list[Finding], GgufFile | None, dict[str, Any]]:
    """The ``mtp-*.gguf`` files beside a trunk: each one's entry, the findings of those meant for
    it, and the first such head with its facts."""
    siblings: list[dict[str, Any]] = []
    findings: list[Finding] = []
    head: GgufFile | None = None
    info: dict[str, Any] = {}
    for sp in sorted(p.parent.glob("mtp-*.gguf")):
        entry: dict[str, Any] = {"file": sp.name}
        sg = _read_sibling(sp, entry, findings)
        if sg is None:
            siblings.append(entry)
            continue
        f, sinfo = check_head_file(sg, g, sp.name)
        entry.update(sinfo)
        if _for_other_trunk(entry, sp, p):
            siblings.append(entry)
            continue  # mtpforge wrote it for another trunk in this folder: not this one's head
        siblings.append(entry)
        findings += f
        if head is None:
            head, info = sg, sinfo
    return siblings, findings, head, info


def _read_sibling(sp: Path, entry: dict[str, Any], findings: list[Finding]) -> GgufFile | None:
    """A head file beside the trunk, or None with its error in ``entry`` and a finding: a
    damaged sibling is a finding, not a crash."""
    try:
        return read_local(sp)
    except Exception as e:  # noqa: BLE001
        msg = getattr(e, "message", str(e))
        findings.append(finding("CORRUPT_FILE", msg, f"re-download or re-write {sp.name}"))
        entry["error"] = msg
        return None


def _for_other_trunk(entry: dict[str, Any], sp: Path, trunk: Path) -> bool:
    """Records who wrote a head file and for which trunks in ``entry``; True when mtpforge wrote
    it for other trunks than ``trunk``."""
    m = _manifest(sp)
    entry["written_by"] = "mtpforge" if m else None
    entry["for_trunk"] = m.trunk.file if m and m.trunk else None
    serves = gguf_trunk_files(m) if m else set()
    if len(serves) > 1:
        entry["for_trunks"] = sorted(serves)
    return bool(serves) and trunk.name not in serves


def _drafter_siblings(p: Path, g: GgufFile, source: str | None = None,
                      revision: str | None = None) -> tuple[list[dict[str, Any]], list[Finding]]:
    """The drafter files beside a trunk (DSpark's ``dspark-*.gguf``): each one's entry and the
    findings of those meant for it; with ``source`` (a trunk without an MTP head of its own, so
    --source is the drafter's release) each one's norms held against it, as for the drafter
    inspected by itself."""
    entries: list[dict[str, Any]] = []
    findings: list[Finding] = []
    for dp, fam in drafter_files(p, g.arch):
        entry: dict[str, Any] = {"file": dp.name}
        d = _read_sibling(dp, entry, findings)
        if d is None:
            entries.append(entry)
            continue
        if drafter_family(d) != fam:
            continue  # a file of that name that is no drafter of this family's
        f, dinfo = check_drafter_file(d, fam, g, dp.name)
        entry.update(dinfo)
        entries.append(entry)
        if not _for_other_trunk(entry, dp, p):
            findings += f + nonfinite_in(d, list(d.tensors), dp.name)
            if source is not None:
                entry["norm_convention"], _, nf = _norm_convention(d, source, revision, drafter=fam)
                findings += nf
    return entries, findings


def inspect_gguf(target: str, *, source: str | None = None, revision: str | None = None, strict: bool = False) -> dict[str, Any]:
    g = read_local(Path(target).expanduser())
    p = g.path or Path(target)  # a split trunk's first part, whichever part was given: the one heads name
    family = family_of(g)
    if family is None and (drafter := drafter_family(g)) is not None:
        return _inspect_drafter(p, g, drafter, target, strict, source, revision)
    if family is None:
        raise InputError(*handled_archs(p.name, g.arch))
    is_mtp_only = FIRST_BLOCK_NORM not in g.tensors and bool(_mtp_blocks(g))
    siblings: list[dict[str, Any]] = []
    drafters: list[dict[str, Any]] = []
    findings: list[Finding] = []
    head: GgufFile | None = None
    layout, info = "none", {}
    if _mtp_blocks(g):
        layout, head = (GGUF_MTP.name if is_mtp_only else GGUF_TAIL.name), g
        findings, info = check_head_file(g, None, p.name)
    else:
        siblings, findings, head, info = _mtp_siblings(p, g)
        layout = GGUF_MTP.name if head is not None else layout
        drafters, df = _drafter_siblings(p, g, source if head is None else None, revision)
        findings += df
    if head is None:
        findings.append(_no_head(p, g, target, _source_hint(g, source), drafters))
    conv, conv_from = "none", "none"
    if head is not None:
        findings += _nonfinite(head, _mtp_blocks(head))
        conv, conv_from, nf = _convention(head, g, family, source, revision)
        findings += nf
    report: dict[str, Any] = {
        "target": target, "format": "gguf", "architecture": g.arch, "family": family, "layout": layout,
        "config_mtp_layers": (head or g).nextn_layers, "block_count": g.block_count,
        "trunk_layers": g.block_count - g.nextn_layers if not is_mtp_only else None,
        "mtp_tensors": info.get("mtp_tensors", 0), "mtp_bytes": info.get("mtp_bytes", 0),
        "norm_convention": conv, "norm_convention_from": conv_from,
        "expert_format": info.get("expert_format", "none"),
        "quantization": {"file_type": g.get("general.file_type"), "mtp_types": info.get("types", {})},
        "mtp_files": siblings, "drafters": drafters,
        "head_file": str(head.path) if head is not None and head.path else None,
        "findings": [f.as_dict() for f in findings],
    }
    report["exit_code"] = _exit_code(findings, strict)
    return report


def _exit_code(findings: list[Finding], strict: bool) -> int:
    return 1 if any(f.severity == "error" or (strict and f.severity == "warning") for f in findings) else 0


def _no_head(p: Path, g: GgufFile, target: str, hint: str, drafters: list[dict[str, Any]]) -> Finding:
    """The finding for a trunk without an MTP head: a count without tensors, a missing head, or
    — with a drafter of its own beside it — only the note that draft-mtp has nothing to run."""
    fix = f"mtpforge add-mtp --source {hint} --target {target}"
    if g.nextn_layers:
        return finding("MTP_CONFIG_WITHOUT_WEIGHTS",
                       f"{p.name} declares {g.arch}.nextn_predict_layers = {g.nextn_layers} but holds no NextN tensors", fix)
    mine = [d for d in drafters if "error" not in d]
    if mine:
        d = mine[0]
        return finding("MTP_HEAD_MISSING", f"{p.name} has no MTP head (no NextN tail, no mtp-*.gguf); the drafter {d['file']} "
                                           f"beside it drafts for it with --spec-type {d['spec_type']}",
                       f"nothing to do for {d['spec_type']}; for draft-mtp as well: {fix}", severity="info")
    return finding("MTP_HEAD_MISSING",
                   f"{p.name} has no MTP head: no NextN tail and no mtp-*.gguf beside it (llama.cpp's draft-mtp has nothing to run)",
                   fix)


def _convention(head: GgufFile, g: GgufFile, family: str, source: str | None,
                revision: str | None) -> tuple[str, str, list[Finding]]:
    """The head's norm convention: against --source, else from mtpforge's record, else from the
    trunk's own norms."""
    if source:
        return _norm_convention(head, source, revision)
    m = _manifest(head.path) if head.path else None
    if m:
        return m.norm_convention or "shifted", "manifest", []
    return _norms_from_trunk(head, g, family)


def _inspect_drafter(p: Path, d: GgufFile, family: str, target: str, strict: bool, source: str | None = None,
                     revision: str | None = None) -> dict[str, Any]:
    """``inspect`` of a drafter file itself: its stages and root tensors, against the trunk its
    record names when that trunk is beside it; its norms against ``source`` (else its record's word)."""
    m = _manifest(p)
    trunk_path = p.with_name(m.trunk.file) if m and m.trunk else None
    trunk = read_local(trunk_path) if trunk_path is not None and trunk_path.is_file() else None
    findings, info = check_drafter_file(d, family, trunk, p.name)
    findings += nonfinite_in(d, list(d.tensors), p.name)
    conv, conv_from = ((m.norm_convention or "raw") if m else "unknown"), ("manifest" if m else "none")
    if source:
        conv, conv_from, nf = _norm_convention(d, source, revision, drafter=family)
        findings += nf
    report: dict[str, Any] = {
        "target": target, "format": "gguf", "architecture": d.arch, "family": family, "layout": GGUF_MTP.name,
        "config_mtp_layers": d.block_count, "block_count": d.block_count, "trunk_layers": None,
        "mtp_tensors": info["mtp_tensors"], "mtp_bytes": info["mtp_bytes"],
        "norm_convention": conv, "norm_convention_from": conv_from,
        "expert_format": info["expert_format"],
        "quantization": {"file_type": d.get("general.file_type"), "mtp_types": info["types"]},
        "mtp_files": [], "drafter": info, "head_file": str(p), "trunk": str(trunk_path) if trunk is not None else None,
        "findings": [f.as_dict() for f in findings],
    }
    report["exit_code"] = _exit_code(findings, strict)
    return report


def inspect_gguf_repo(store: Any, target: str, strict: bool = False) -> dict[str, Any]:
    """A Hub repo of GGUF files: every file's header by range requests, no tensor data."""
    files = [f for f in store.list_files() if f.endswith(".gguf")]
    mtps = [f for f in files if Path(f).name.startswith("mtp-")]
    findings: list[Finding] = []
    read_bytes = 0

    def header(f: str) -> GgufFile:
        nonlocal read_bytes
        g, n = read_remote(f, store.size(f), lambda a, b: store.read_range(f, a, b))
        read_bytes += n
        return g

    parsed = {m: header(m) for m in mtps}
    trunks = []
    for names in group_parts([f for f in files if f not in mtps and "mmproj" not in f]):
        parts = [header(f) for f in names]
        try:  # a split GGUF is one trunk, named by its first part
            parsed[names[0]] = join_parts(parts) if parts[0].get("split.count", 1) != 1 else parts[0]
        except MtpforgeError as e:
            findings.append(finding("CORRUPT_FILE", e.message, "re-upload or re-download every part of the GGUF"))
            continue
        trunks.append(names[0])
    entries = []
    for f in trunks:
        g = parsed[f]
        tail = bool(_mtp_blocks(g))
        fs, info = check_head_file(g, None, f) if tail else ([], {})
        beside = [m for m in mtps if Path(m).parent == Path(f).parent]
        for m in beside:
            fm, _ = check_head_file(parsed[m], g, m)
            fs += fm
        if not tail and not beside:
            fs.append(finding("MTP_HEAD_MISSING", f"{f} has no MTP head: no NextN tail and no mtp-*.gguf beside it",
                              f"download it, then: mtpforge add-mtp --source {_source_hint(g, None)} --target {Path(f).name}"))
        findings += fs
        entries.append({"file": f, "architecture": g.arch, "block_count": g.block_count, "nextn_predict_layers": g.nextn_layers,
                        "layout": GGUF_TAIL.name if tail else (GGUF_MTP.name if beside else "none"), "mtp_files": beside,
                        "file_type": g.get("general.file_type"), **{k: v for k, v in info.items() if k != "types"}})
    first = parsed[trunks[0]] if trunks else (parsed[mtps[0]] if mtps else None)
    report = {
        "target": target, "format": "gguf", "headers_only": True, "header_bytes_read": read_bytes,
        "architecture": first.arch if first else None, "family": family_of(first) if first else None,
        "layout": entries[0]["layout"] if entries else "none", "config_mtp_layers": first.nextn_layers if first else 0,
        "mtp_tensors": entries[0].get("mtp_tensors", 0) if entries else 0, "mtp_bytes": entries[0].get("mtp_bytes", 0) if entries else 0,
        "norm_convention": "unknown", "norm_convention_from": "none", "expert_format": entries[0].get("expert_format", "none") if entries else "none",
        "quantization": {}, "files": entries, "mtp_files": mtps, "findings": [f.as_dict() for f in findings],
    }
    report["exit_code"] = 1 if any(f.severity == "error" or (strict and f.severity == "warning") for f in findings) else 0
    return report




def inspect_gguf_hub_repo(store: Any, target: str, *, strict: bool) -> dict[str, Any] | None:
    """The GGUF report when ``store`` is a Hub repo of GGUF files (no config.json), else None."""
    from ..checkpoint.store import LocalStore

    if not isinstance(store, LocalStore) and not store.exists("config.json") \
            and any(f.endswith(".gguf") for f in store.list_files()):
        return inspect_gguf_repo(store, target, strict=strict)
    return None


__all__ = ["inspect_gguf", "inspect_gguf_repo", "inspect_gguf_hub_repo", "check_head_file"]
