"""What every inspect check reads: the target opened once, its family, its head, its manifest.

``build_context`` does the reading; the checks (``checks/index.py``, ``structure.py``,
``quant.py``, ``norms.py``, ``runtime.py``, ``data.py``) only look and add findings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..families.unhandled import not_handled
from ..checkpoint.catalogue import Catalogue, load_catalogue
from ..checkpoint.store import LocalStore, Store
from ..errors import InputError
from ..families import FAMILIES
from ..families.detect import detect_family
from ..families.spec import FamilySpec, Role
from ..families.tables import declared_mtp_layers
from ..layouts.detect import HeadLocation, is_raw_hf, locate_head
from ..layouts.table import MANIFEST
from ..inputs.problems import Problem
from ..manifest import read_manifest_hint


def open_target_store(target: str, revision: str | None = None) -> Store:
    """A local folder when the path exists, else a Hub repo id."""
    from ..localpath import looks_local, no_such_path

    p = Path(target)
    if p.exists() or looks_local(target):
        if not p.expanduser().exists():
            from ..errors import InputError

            raise InputError(no_such_path(target, "target"), "pass the path of a model folder, or a Hub repo id (owner/name)")
        return LocalStore(p.expanduser())
    from ..checkpoint.hub import open_store

    return open_store(target, revision)


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


def _recorded_source(manifest: Optional[dict[str, Any]]) -> str | None:
    """The source the manifest names, as a fix can pass it: a repo id as is; a local folder is
    recorded by its name only, which is no path, so the hint asks for that folder's path."""
    src = (manifest or {}).get("source")
    if not isinstance(src, dict) or not isinstance(src.get("repo"), str) or not src["repo"]:
        return None
    return f"<path to {src['repo']}>" if src.get("local") else src["repo"]


@dataclass
class InspectContext:
    """The target as read once, the caller's options, and the report the checks fill in."""

    target: str
    store: Store
    cat: Catalogue
    family: str
    spec: FamilySpec
    declared: int
    loc: HeadLocation
    manifest: Optional[dict[str, Any]]
    source: Optional[str]
    source_revision: Optional[str]
    runtime: Optional[str]
    mlx_lm_version: Optional[str]
    data_checks: bool
    src_hint: str
    #: the norm check may decode with the head when nothing else decides its norms
    behaviour: bool = True
    #: what is wrong with mtpforge.json when it does not validate (then ``manifest`` is None)
    manifest_problem: Optional[Problem] = None
    report: dict[str, Any] = field(default_factory=dict)
    #: bare keys -> unquantized shapes the config implies (set by the structure check)
    expected: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: module -> stored precision (set by the quant check)
    precisions: dict[str, Any] = field(default_factory=dict)
    #: bare norm key -> mean of its stored values (set by the norms check; runtimes that decide
    #: the convention from values read these)
    norm_means: dict[str, float] = field(default_factory=dict)

    @property
    def has_head(self) -> bool:
        return self.loc.found

    @property
    def raw(self) -> bool:
        """The head sits in a raw Hugging Face checkpoint (a source, not an MLX folder)."""
        return self.loc.raw

    @property
    def holds_backbone(self) -> bool:
        """The folder holds the backbone its head drafts for (a drafter folder does not)."""
        from ..layouts.table import LAYOUTS

        return self.loc.layout not in LAYOUTS or LAYOUTS[self.loc.layout].has_backbone

    @property
    def stored_parts(self) -> dict[Role, str]:
        """The tensors the head's layout stores split (``Placement.parts``): part role -> module."""
        from ..layouts.table import LAYOUTS

        try:
            return dict(LAYOUTS[self.loc.layout].place(self.spec).parts) if self.loc.layout in LAYOUTS else {}
        except ValueError:
            return {}

    @property
    def add_fix(self) -> str:
        return self.spec.mlx_fix(self.src_hint, self.target)


def build_context(
    target: str, store: Store | None = None, *, revision: str | None, source: str | None, source_revision: str | None,
    runtime: str | None, mlx_lm_version: str | None, data_checks: bool, use_manifest: bool, behaviour: bool = True,
) -> InspectContext:
    store = store if store is not None else open_target_store(target, revision)
    cat = load_catalogue(store)
    family = detect_family(cat.config)
    if family is None:
        raise InputError(*not_handled(store.name, cat.config, "pass a model folder of one of those types"))
    loc = locate_head(cat, family)
    manifest, manifest_problem = read_manifest_hint(store) if use_manifest else (None, None)
    src_hint = (
        source
        or _recorded_source(manifest)
        or _base_model(store)
        or f"<original Hugging Face repo, e.g. {FAMILIES[family].example_repo}>"
    )
    ctx = InspectContext(target, store, cat, family, FAMILIES[family], declared_mtp_layers(cat.config, family), loc,
                         manifest, source, source_revision, runtime, mlx_lm_version, data_checks, src_hint, behaviour,
                         manifest_problem=manifest_problem)
    ctx.report = _report(ctx)
    return ctx


def _report(ctx: InspectContext) -> dict[str, Any]:
    from ..layouts.quant import quant_defaults

    from ..families.tables import is_head_key

    default = quant_defaults(ctx.cat.config)
    if default and not any(k.endswith(".scales") and not is_head_key(k, ctx.cat.config) for k in ctx.cat.tensors):
        default = None  # only the head is quantized: the top-level values are there for mlx-lm's loader
    return {
        "target": ctx.target,
        "family": ctx.family,
        "layout": ctx.loc.layout,
        "config_mtp_layers": ctx.declared,
        "mtp_tensors": len(ctx.loc.entries),
        "mtp_bytes": ctx.loc.nbytes,
        "norm_convention": "none",
        "norm_convention_from": "none",
        "expert_format": "none",
        "quantization": {"default": default, "mtp_modules": {}},
        "files": ctx.loc.files,
        "manifest": MANIFEST if ctx.manifest else None,
        "raw_hf": is_raw_hf(ctx.cat),
    }
