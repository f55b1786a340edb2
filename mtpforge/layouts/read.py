"""Read a head from any layout into one canonical form for the decoder.

Canonical = bare keys (``fc.weight``, ``layers.0.…``), MLX norm convention, experts stacked as
``switch_mlp``, quantized modules as triplets with their bits/group inferred from shapes. The
decoder then needs one loader, whatever runtime the folder was written for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..families.unhandled import not_handled
from ..checkpoint.catalogue import load_catalogue
from ..checkpoint.store import LocalStore
from ..errors import InputError, RefusedError
from ..families.detect import detect_family
from ..families import FAMILIES
from ..families.spec import STACKED
from ..families.tables import declared_mtp_layers, expected_head, expert_format_of, is_moe, mtp_layers_of, text_config
from ..passes.experts import to_switch_mlp
from ..passes.norms import shift_norms
from .detect import locate_head, read_entries


@dataclass
class HeadWeights:
    tensors: dict[str, mx.array]
    quant: dict[str, dict[str, Any]]  # bare module -> {bits, group_size, mode}
    text_config: dict[str, Any]
    family: str
    layout: str
    folder: Path
    notes: list[str] = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return 1 + max(mtp_layers_of(self.tensors, self.family), default=0)


def drafter_folder(target: Path) -> Path:
    return target.parent / f"{target.name}-mtp-drafter"


def load_head_weights(target: str | Path) -> HeadWeights:
    """The head of ``target`` (or of its ``<target>-mtp-drafter`` sibling), canonical."""
    folder = Path(target)
    cat = load_catalogue(LocalStore(folder))
    cat.refuse_damage("model")
    family = detect_family(cat.config)
    if family is None:
        raise InputError(*not_handled(str(folder), cat.config, "pass a model folder of one of those types"))
    spec = FAMILIES[family]
    loc = locate_head(cat, family)
    if loc.layout == "none" and drafter_folder(folder).is_dir():
        return load_head_weights(drafter_folder(folder))
    if loc.layout == "none":
        declared = declared_mtp_layers(cat.config, family)
        what = (f"MTP_CONFIG_WITHOUT_WEIGHTS: config declares {declared} MTP layer(s) but no MTP weights are stored"
                if declared else "MTP_HEAD_MISSING: the folder has no MTP head")
        raise RefusedError(what, spec.mlx_fix(f"<original Hugging Face repo, e.g. {spec.example_repo}>", str(folder)),
                           code="MTP_CONFIG_WITHOUT_WEIGHTS" if declared else "MTP_HEAD_MISSING")
    cat.refuse_invalid()
    tensors = read_entries(cat, loc.entries)
    notes = []
    if loc.layout == "hf":
        tensors = shift_norms(tensors, spec.norm_offset, spec)  # mlx-lm shifts a raw checkpoint's norms on load; so do we
        notes.append("raw Hugging Face head: norms shifted on load")
    fmt = expert_format_of(tensors, cat.config) if is_moe(cat.config) else "none"
    n_layers = declared_mtp_layers(cat.config, family) or 1
    expected = expected_head(cat.config, n_layers, STACKED if fmt != "none" else None, present=tensors)
    if fmt not in ("none", STACKED):
        tensors = to_switch_mlp(tensors, spec)
    _check_fits(folder, tensors, expected)
    quant: dict[str, dict[str, Any]] = {}
    for k in list(tensors):
        if k.endswith(".scales"):
            mod = k[: -len(".scales")]
            n = expected[mod + ".weight"][-1]
            w, sc = tensors[mod + ".weight"], tensors[k]
            group = n // sc.shape[-1]
            mode = "affine" if mod + ".biases" in tensors else {16: "nvfp4"}.get(group, "mxfp8" if w.shape[-1] * 32 // n == 8 else "mxfp4")
            quant[mod] = {"bits": w.shape[-1] * 32 // n, "group_size": group, "mode": mode}
    return HeadWeights(tensors, quant, text_config(cat.config), family, loc.layout, folder, notes)


def _check_fits(folder: Path, tensors: dict[str, mx.array], expected: dict[str, tuple[int, ...]]) -> None:
    """The head's modules and shapes are the ones this model's config implies (a head of
    another model — an MoE head beside a dense backbone, another size — is one line, not a
    KeyError in the decoder)."""
    from ..checks.structure import modules, weighted_modules

    fix = f"run `mtpforge inspect {folder}`; re-add the head from this model's own source with `mtpforge add-mtp --force`"
    stored, wanted = set(weighted_modules(list(tensors))), set(modules(list(expected)))
    if stored != wanted:
        extra, missing = sorted(stored - wanted), sorted(wanted - stored)
        what = f"it has {extra[0]}, which the config does not imply" if extra else f"it lacks {missing[0]}"
        raise RefusedError(f"MTP_UNEXPECTED_TENSORS: the MTP head in {folder} does not fit this model's config ({what}): "
                           "a head of another model?", fix, code="MTP_UNEXPECTED_TENSORS")
    for mod in sorted(wanted):
        want = expected.get(f"{mod}.weight") or expected[mod]
        w = tensors.get(f"{mod}.weight") if f"{mod}.weight" in tensors else tensors[mod]
        sc = tensors.get(f"{mod}.scales")
        if sc is None:
            ok = tuple(w.shape) == tuple(want)
        else:
            n, groups = want[-1], sc.shape[-1] if sc.ndim else 0
            ok = (tuple(w.shape[:-1]) == tuple(want[:-1]) and tuple(sc.shape[:-1]) == tuple(want[:-1]) and n > 0
                  and groups > 0 and n % groups == 0 and (w.shape[-1] * 32) % n == 0 and w.shape[-1] * 32 // n in range(1, 9))
        if not ok:
            raise RefusedError(f"MTP_SHAPE_MISMATCH: the MTP head in {folder} does not fit this model's config: {mod} is "
                               f"{list(w.shape)}, the config implies {list(want)} (a head of another model size?)",
                               fix, code="MTP_SHAPE_MISMATCH")
