"""Which RMSNorm convention a head's norms are stored in.

Three sources of truth, best first: mtpforge's manifest (checked against the tensors' hashes);
an exact comparison with the source's raw norms; a conservative comparison with the backbone's
norms of the same kind, which answers ``unknown`` rather than guess. Never a value threshold
(docs/SPEC.md §4).
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

import mlx.core as mx

from ..families.unhandled import not_handled
from ..checkpoint.catalogue import head_shards, load_catalogue
from ..checkpoint.safetensors_header import TensorInfo
from ..checkpoint.store import LocalStore
from ..checkpoint.tensors import to_mx
from ..errors import InputError, MtpforgeError
from ..families.detect import detect_family
from ..families.spec import NORM_ROLES, FamilySpec
from ..families.tables import family_spec, is_head_key
from ..findings import Finding, finding
from ..layouts.detect import is_raw_hf, locate_head, read_entries
from ..layouts.table import MANIFEST
from .basis import basis
from .context import InspectContext, open_target_store

OFFSET_NAMES = {0: "raw", 1: "shifted", 2: "double-shifted"}
def head_norm_keys(spec: FamilySpec, keys: Any) -> list[str]:
    """The bare keys of every RMSNorm of the head (zero-centred in the release or not): the
    tensors whose convention a wrong tool gets wrong, GLM's and Nemotron-H's raw ones included."""
    return [k for k in keys if spec.role_of(k) in NORM_ROLES]


def classify_exact(target: mx.array, source: mx.array) -> str:
    """raw / shifted / double-shifted / unknown for one norm, against the raw source tensor.

    The target was rounded once (to bf16, or kept in float32) after adding the offset, so we
    allow one rounding step of bf16 at the target's magnitude.
    """
    if target.shape != source.shape:
        return "unknown"
    t = target.astype(mx.float32)
    s = source.astype(mx.float32)
    for off, name in OFFSET_NAMES.items():
        want = s + off
        tol = mx.maximum(mx.abs(want), 1.0) * (2.0**-7)
        if mx.all(mx.abs(t - want) <= tol).item():
            return name
    return "unknown"


def aggregate(per_tensor: Mapping[str, str]) -> str:
    """One convention for the head: all agree -> that one; shifted and raw together -> mixed."""
    kinds = set(per_tensor.values())
    if not kinds:
        return "none"
    if kinds == {"shifted"}:
        return "shifted"
    if kinds == {"raw"}:
        return "raw"
    if kinds == {"double-shifted"}:
        return "double-shifted"
    if "unknown" in kinds and len(kinds - {"unknown"}) <= 1:
        return "unknown"
    return "mixed"


def backbone_kind(bare: str, spec: FamilySpec) -> str | None:
    """The backbone key suffix of the same norm kind: an MTP layer is a backbone decoder layer,
    so each per-layer norm row (``…{i}.<suffix>``) has the backbone's ``.<suffix>`` as its kin;
    the head-level norms have none."""
    hit = spec.match(bare)
    if hit is None or hit[0] not in spec.layer_rows or hit[0].role not in NORM_ROLES:
        return None
    return "." + hit[0].key.split("{i}.")[-1]


def classify_by_backbone(
    target: mx.array, backbone: list[mx.array], backbone_shifted: bool, margin: float = 0.35
) -> str:
    """Compare a head norm's mean with the mean of the backbone's norms of the same kind.

    Trained norms of one kind sit at similar values across layers, and the backbone's
    convention is known from provenance (converted MLX -> shifted). The head is classified only
    when its mean is within ``margin`` of exactly one hypothesis (offset -1, 0, +1 relative to
    the backbone) — else ``unknown``.
    """
    if not backbone:
        return "unknown"
    mb = float(mx.mean(mx.concatenate([b.astype(mx.float32).reshape(-1) for b in backbone])).item())
    mt = float(mx.mean(target.astype(mx.float32)).item())
    base = 1 if backbone_shifted else 0
    close = [base + o for o in (-1, 0, 1) if abs(mt - (mb + o)) < margin]
    if len(close) != 1 or close[0] not in OFFSET_NAMES:
        return "unknown"
    return OFFSET_NAMES[close[0]]


# ----------------------------------------------------------------------------- the inspect check

#: backbone norms of one kind read for the conservative norm-convention comparison
BACKBONE_REFS_PER_KIND = 8


def source_norms(source: str, revision: str | None, keys: list[str],
                 target_config: Mapping[str, Any] | None = None) -> dict[str, mx.array]:
    """The source's head norms under bare ``keys``, zero-centred (a few KB; over HTTP only these).
    With ``target_config`` (a --source the user named) a source of another family or size is
    one clear error, not a silent "unknown"."""
    src_cat, src_family = _source_catalogue(source, revision)
    if target_config is not None:
        _check_is_original(source, src_cat.config, src_family, target_config)
    src_loc = locate_head(src_cat, src_family)
    vals = read_entries(src_cat, {k: src_loc.entries[k] for k in keys if k in src_loc.entries})
    if is_raw_hf(src_cat):
        return vals
    spec = family_spec(src_cat.config)  # an MLX source: undo what MLX added (nothing for a raw-norm family)
    return {k: v.astype(mx.float32) - spec.offset_of(k) for k, v in vals.items()}


def _source_catalogue(source: str, revision: str | None) -> tuple[Any, str | None]:
    """The source's catalogue (config, index, the head's shard headers) and its family."""
    src_store = open_target_store(source, revision)
    src_cat = load_catalogue(src_store, all_safetensors=False,
                             index_files=None if isinstance(src_store, LocalStore) else head_shards)
    return src_cat, detect_family(src_cat.config)


def _check_is_original(source: str, src_config: Any, src_family: str | None, target_config: Mapping[str, Any]) -> None:
    """Refuse (InputError) a --source of another family or size than the target's model."""
    from ..plan import check_compatible

    if src_family is None:
        raise InputError(*not_handled(f"--source {source}", src_config,
                                      "pass the original Hugging Face checkpoint of this model as --source"))
    try:
        check_compatible(src_config, target_config, src_family, detect_family(target_config) or src_family)
    except MtpforgeError as e:
        raise InputError(f"--source {source} is not this model's original: {e.message}",
                         "pass the original Hugging Face checkpoint of this model as --source") from None


def _foreign_source(ctx: InspectContext) -> Finding | None:
    """SOURCE_MISMATCH (an error) when ``--source`` is not this model's original: another family,
    or sizes that differ (what :func:`source_norms` checks for a zero-centred family's head)."""
    assert ctx.source is not None
    src_cat, src_family = _source_catalogue(ctx.source, ctx.source_revision)
    try:
        _check_is_original(ctx.source, src_cat.config, src_family, ctx.cat.config)
    except InputError as e:
        return finding("SOURCE_MISMATCH", e.message, e.fix or "pass this model's own original checkpoint as --source",
                       severity="error")
    return None


def _manifest_matches(ctx: InspectContext, norm_entries: Mapping[str, TensorInfo]) -> bool:
    recorded = ctx.manifest["tensors"] if ctx.manifest else {}
    for bare, info in norm_entries.items():
        rec = recorded.get(ctx.loc.stored_keys.get(bare, bare))
        if not isinstance(rec, dict) or rec.get("sha256") != hashlib.sha256(ctx.cat.read_tensor_bytes(info)).hexdigest():
            return False
    return True


def backbone_verdicts(cat: Any, values: dict[str, mx.array]) -> dict[str, str]:
    """Per head norm of a kind the backbone also has: its convention against the backbone's
    norms of that kind (``unknown`` unless exactly one offset fits; see classify_by_backbone).
    The backbone is shifted where MLX shifts that kind: a zero-centred kind in a converted folder."""
    raw = is_raw_hf(cat)
    spec = family_spec(cat.config)
    kinds = set(filter(None, (backbone_kind(k, spec) for k in values)))
    by_kind: dict[str, list[TensorInfo]] = {}
    for name, info in cat.tensors.items():
        if is_head_key(name, cat.config):
            continue
        for sfx in kinds:
            # a few layers show a kind's level; every layer of a 94-layer model over HTTP would
            # be hundreds of range requests for the same answer
            if name.endswith(sfx) and len(info.shape) == 1 and len(by_kind.get(sfx, ())) < BACKBONE_REFS_PER_KIND:
                by_kind.setdefault(sfx, []).append(info)
    verdicts = {}
    for k, v in values.items():
        kind = backbone_kind(k, spec)
        if kind is None:
            continue
        refs = [to_mx(i, cat.read_tensor_bytes(i)) for i in by_kind.get(kind, [])]
        verdicts[k] = classify_by_backbone(v, refs, not raw and spec.offset_of(k) > 0)
    return verdicts


def _from_backbone(ctx: InspectContext, values: dict[str, mx.array]) -> tuple[str, str, dict[str, str]]:
    """Conservative: compare with the backbone's norms of the same kind."""
    verdicts = backbone_verdicts(ctx.cat, values)
    conv = aggregate(verdicts)
    return ("unknown" if conv == "none" else conv), "backbone", verdicts


def _exact(ctx: InspectContext, src: str, values: dict[str, mx.array]) -> dict[str, str]:
    """Per-norm verdicts against ``src``'s norms; the user's --source must be this model's."""
    mine = src == ctx.source
    refs = source_norms(src, ctx.source_revision if mine else None, list(values),
                        target_config=ctx.cat.config if mine else None)
    return {k: classify_exact(v, refs[k]) if k in refs else "unknown" for k, v in values.items()}


def _answered(ctx: InspectContext, how: str, verdicts: dict[str, str],
              evidence: dict[str, str] | None = None) -> None:
    """Record which evidence decided each norm (``norm_evidence``) and its verdict."""
    ev = evidence or {k: (how if v != "unknown" else "unknown") for k, v in verdicts.items()}
    ctx.report["norm_evidence"] = {ctx.loc.stored_keys.get(k, k): e for k, e in sorted(ev.items())}
    ctx.report["norm_verdicts"] = {ctx.loc.stored_keys.get(k, k): v for k, v in sorted(verdicts.items())}


def _third_party(ctx: InspectContext, values: dict[str, mx.array]) -> Any:
    """The model card's source, then the head's behaviour on its backbone; None: undecided."""
    from .context import _base_model
    from .norm_sources import from_behaviour, from_model_card

    notes: list[str] = ctx.report.setdefault("norm_notes", [])
    card = from_model_card(_base_model(ctx.store), values, lambda src: _exact(ctx, src, values), notes)
    for ans in (card, from_behaviour(getattr(ctx.store, "root", None), ctx.loc.layout, values, notes,
                                     lambda vals: backbone_verdicts(ctx.cat, vals))
                if ctx.behaviour and (card is None or card.convention == "unknown") and isinstance(ctx.store, LocalStore) else None):
        if ans is not None:
            ctx.report.update(ans.report)
            if ans.convention != "unknown":
                return ans
    return None


def convention(ctx: InspectContext) -> tuple[str, str, dict[str, str], list[Finding]]:
    """(convention, how it was decided, per-tensor verdicts, findings): the source's tensors,
    else mtpforge's manifest checked against the tensors' hashes, else the model card's source,
    else the head's behaviour, else the backbone."""
    # every RMSNorm of the head, a raw-norm family's too: its convention is measured like Qwen's
    # (a tool that shifts every head's norms +1 gets GLM's wrong), never assumed from the family
    norm_entries = {k: ctx.loc.entries[k] for k in head_norm_keys(ctx.spec, ctx.loc.entries)}
    if not norm_entries:
        return "none", "none", {}, []
    values = read_entries(ctx.cat, norm_entries)
    ctx.norm_means = {k: float(mx.mean(v.astype(mx.float32)).item()) for k, v in values.items()}
    found: list[Finding] = []
    if ctx.source:
        # a raw-norm family's head: another family's or size's source proves nothing, a finding
        # (a zero-centred family's comparison refuses such a source in one line: source_norms)
        bad = _foreign_source(ctx) if not ctx.spec.norm_roles else None
        if bad is not None:
            return "unknown", "unknown", {}, [*found, bad]
        verdicts = _exact(ctx, ctx.source, values)
        ctx.report["norm_source"] = ctx.source
        if verdicts and set(verdicts.values()) == {"unknown"}:
            found.append(finding(
                "SOURCE_MISMATCH", f"the head's norms match neither the raw nor the shifted values of {ctx.source}: "
                "it is another model's source (same sizes), or the head was changed",
                "pass this model's own original checkpoint as --source, or re-create the head from it with add-mtp --force"))
        _answered(ctx, "source", verdicts)
        return aggregate(verdicts), "source", verdicts, found
    m = ctx.manifest
    if m and isinstance(m.get("tensors"), dict) and m.get("norm_convention"):
        if _manifest_matches(ctx, norm_entries):
            conv = str(m["norm_convention"])
            if conv == "shifted" and not ctx.spec.norm_roles and not m.get("repairs"):
                # mtpforge writes a raw-norm family's norms as stored; its manifests said
                # "shifted" for every family before the label came from the family
                conv = "raw"
            verdicts = {k: conv for k in norm_entries}
            _answered(ctx, "manifest", verdicts)
            return conv, "manifest", verdicts, found
        found.append(finding(
            "MANIFEST_STALE", f"{MANIFEST} does not match the head's norm tensors (changed after mtpforge wrote it)",
            "re-run `mtpforge add-mtp --force`, or pass --source to compare with the original",
        ))
    ans = _third_party(ctx, values)
    if ans is not None:
        _answered(ctx, ans.how, ans.verdicts, ans.evidence)
        return ans.convention, ans.how, ans.verdicts, found
    conv, how, verdicts = _from_backbone(ctx, values)
    verdicts.update({k: "unknown" for k in values if k not in verdicts})
    how = how if conv != "unknown" else "unknown"
    _answered(ctx, how, verdicts)
    return conv, how, verdicts, found


def check(ctx: InspectContext) -> list[Finding]:
    """MTP_NORMS_RAW / _DOUBLE_SHIFTED / _MIXED, NORM_CONVENTION_UNKNOWN, MANIFEST_STALE."""
    if not ctx.has_head:
        return []
    conv, how, verdicts, out = convention(ctx)
    if conv == "unknown" and ctx.raw:
        # a Hugging Face checkpoint keeps the family's zero-centred norms by provenance: that is
        # its convention, not an open question (only evidence of a shift would say otherwise)
        conv, how = "raw", "source layout"
    ctx.report["norm_convention"] = conv
    ctx.report["norm_convention_from"] = how
    ctx.report["norm_convention_basis"] = basis(how, conv)
    if ctx.spec.gguf_only and not ctx.raw:  # (MTPLX, which drafts Step-3.5's, takes raw norms by its value rule)
        return out
    # a family without zero-centred norms stores them raw in every layout
    expected_conv = "raw" if ctx.raw or not ctx.spec.norm_roles else "shifted"
    from .norm_sources import BEHAVIOUR_LAYOUTS

    repair = f"fix it in place: mtpforge repair-norms {ctx.target}; or " if ctx.loc.layout in BEHAVIOUR_LAYOUTS else ""
    fix = f"{repair}re-create the head: {ctx.add_fix} --force"
    if conv == "raw" and expected_conv == "shifted":
        out.append(finding(
            "MTP_NORMS_RAW", f"the head's RMSNorm weights are zero-centred (raw Hugging Face convention) in the {ctx.loc.layout} layout, whose runtime applies them as-is: ≈0% acceptance",
            f"{repair}re-create the head with the +1 shift: {ctx.add_fix} --force",
        ))
    elif conv == "shifted" and expected_conv == "raw" and not ctx.raw:
        out.append(finding(
            "MTP_NORMS_SHIFTED", f"the head's norms carry +1, but {ctx.spec.name}'s norms are raw (not zero-centred; "
            "mlx-lm applies them as stored): the Qwen shift applied to a family without it, which costs acceptance",
            fix))
    elif conv == "shifted" and expected_conv == "raw":
        out.append(finding(
            "MTP_NORMS_DOUBLE_SHIFTED", "the head's norms are already shifted in a raw Hugging Face checkpoint; mlx-lm will add +1 again",
            "restore the original zero-centred norms (re-download the source)",
        ))
    elif conv == "mixed":
        bad = sorted(k for k, v in verdicts.items() if v not in (expected_conv, "unknown"))
        out.append(finding(
            "MTP_NORMS_MIXED", f"some head norms are shifted and others are not (e.g. {bad[0] if bad else '?'})", fix,
        ))
    elif conv == "double-shifted":
        want = "instead of +1 (shifted twice)" if expected_conv == "shifted" else f"where {ctx.spec.name}'s are raw"
        out.append(finding(
            "MTP_NORMS_DOUBLE_SHIFTED", f"the head's norms carry +2 {want}: acceptance halves", fix,
        ))
    if conv not in ("unknown", "none") and ctx.report.get("norm_undecided_groups"):
        groups = ", ".join(ctx.report["norm_undecided_groups"])
        out.append(finding(
            "NORM_CONVENTION_PARTIAL", f"the convention of {groups} could not be decided (the drafts do not depend on it "
            f"measurably, and the backbone does not tell its level); the rest of the head is {conv}",
            f"pass --source {ctx.src_hint} to check every norm exactly (fetches a few KB)",
        ))
    if conv == "unknown":
        out.append(finding(
            "NORM_CONVENTION_UNKNOWN", "the head's norm convention could not be decided without the source tensors",
            f"pass --source {ctx.src_hint} to compare exactly (fetches a few KB)",
        ))
    return out
