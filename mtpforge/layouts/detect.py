"""Recognise where (and whether) a folder holds an MTP head, in any layout of docs/SPEC.md §5."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import mlx.core as mx

from ..checkpoint.catalogue import Catalogue
from ..checkpoint.safetensors_header import TensorInfo
from ..checkpoint.tensors import to_mx
from ..families import FAMILIES
from ..families.tables import head_specs
from . import mlx_vlm_drafter
from .table import SIDECAR_FILE, VLLM_MLX_WEIGHTS, is_drafter_type, loads_in_mlx_lm_glob


@dataclass
class HeadLocation:
    """The head as found: its layout and every stored tensor under its bare key."""

    layout: str  # embedded | sidecar | vllm-mlx | mlx-vlm-drafter | hf | none
    entries: dict[str, TensorInfo] = field(default_factory=dict)
    #: the stored (full) key of every bare key, for messages
    stored_keys: dict[str, str] = field(default_factory=dict)
    also_found: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return self.layout != "none"

    @property
    def raw(self) -> bool:
        """Found in a raw Hugging Face checkpoint (a source), not in an MLX layout."""
        return self.layout == "hf"

    @property
    def files(self) -> list[str]:
        return sorted({i.file for i in self.entries.values()})

    @property
    def nbytes(self) -> int:
        return sum(i.nbytes for i in self.entries.values())


def is_raw_hf(cat: Catalogue) -> bool:
    """A raw Hugging Face checkpoint, told the way mlx-lm tells it (the family's
    ``is_raw_tensor``: Qwen's unsanitized conv1d [C, 1, K], or per-expert backbone experts),
    from the backbone's tensors only: a head may keep a tensor as the source stores it (the
    GLM-4.7-Flash sidecar's whole ``kv_b_proj``, which MTPLX splits on load) in a converted folder."""
    specs = head_specs(cat.config)
    tests = [s.is_raw_tensor for s in specs if s.is_raw_tensor is not None]
    head = tuple(p for s in specs for p in s.head_prefixes(cat.config))
    return any(t(k, tuple(info.shape)) for k, info in cat.tensors.items() if not k.startswith(head) for t in tests)


#: key prefixes that put a head in the embedded layout (the nested families' MLX spelling)
_EMBEDDED_PREFIXES = tuple(p for f in FAMILIES.values() if f.nested_text_config for p in f.mlx_head_prefixes)


def _flat_prefixes(cat: Catalogue, family: str | None) -> tuple[str, ...]:
    """Prefixes of a head stored outside the language model's namespace: the head-only files'
    spelling and the raw release's (every family's while the family is unknown)."""
    specs = (FAMILIES[family],) if family in FAMILIES else tuple(FAMILIES.values())
    return tuple(dict.fromkeys(p for s in specs for p in (s.file_prefix(cat.config), s.head_prefix(cat.config))))


def _mtp_layout(file: str, raw: bool, family: str | None) -> str:
    """The layout of a head key outside the language model's namespace, by the file that
    holds it."""
    if file == SIDECAR_FILE:
        return "sidecar"
    if file == VLLM_MLX_WEIGHTS:
        return "vllm-mlx"
    if raw:
        return "hf"
    # a family without an embedded layout keeps its head in model*.safetensors only for vllm-mlx
    if family in FAMILIES and "embedded" not in FAMILIES[family].layouts and loads_in_mlx_lm_glob(file):
        return "vllm-mlx"
    return "embedded"


def _flat_bare(key: str, flat: tuple[str, ...], cat: Catalogue, family: str | None) -> str | None:
    """The bare key of a head key stored outside the language model's namespace (a family whose
    steps are appended layers strips each layer's index itself), None for any other key."""
    spec = FAMILIES.get(family or "")
    if spec is not None and spec.topology.appended_steps:
        return spec.strip_prefix(key, cat.config)
    prefix = next((p for p in flat if key.startswith(p)), None)
    return None if prefix is None else key[len(prefix):]


def _candidates(cat: Catalogue, family: str | None) -> dict[str, dict[str, TensorInfo]]:
    found: dict[str, dict[str, TensorInfo]] = {}
    raw = is_raw_hf(cat)
    flat = _flat_prefixes(cat, family)
    for h in cat.headers.values():
        for key, info in h.tensors.items():
            prefix = next((p for p in _EMBEDDED_PREFIXES if key.startswith(p)), None)
            if prefix is not None:
                found.setdefault("embedded", {})[key[len(prefix):]] = info
            elif (bare := _flat_bare(key, flat, cat, family)) is not None:
                found.setdefault(_mtp_layout(info.file, raw, family), {})[bare] = info
    return found


def locate_head(cat: Catalogue, family: str | None) -> HeadLocation:
    """Find the head. When several layouts are present (a folder patched twice), the first in
    exo's probe order wins and the rest are listed in ``also_found``."""
    if is_drafter_type(cat.config.get("model_type")):
        return _drafter_head(cat, family)
    found = _candidates(cat, family)
    order = ["sidecar", "embedded", "vllm-mlx", "hf"]
    present = [l for l in order if found.get(l)]
    if not present:
        return HeadLocation("none")
    first = present[0]
    entries = found[first]
    stored = {}
    for bare, info in entries.items():
        stored[bare] = info.name
    return HeadLocation(first, entries, stored, also_found=present[1:])


def _drafter_head(cat: Catalogue, family: str | None) -> HeadLocation:
    """Every tensor of a drafter folder, by the bare key its family's drafter spelling stores
    it under (``mlx_vlm_drafter.place``); a key outside that spelling keeps its stored name."""
    pl = mlx_vlm_drafter.place(FAMILIES[family]) if family in FAMILIES else None
    stored = {k: (pl.bare_of(k) if pl is not None else None) or k for h in cat.headers.values() for k in h.tensors}
    entries = {stored[k]: info for h in cat.headers.values() for k, info in h.tensors.items()}
    return HeadLocation("mlx-vlm-drafter", entries, {bare: k for k, bare in stored.items()})


def read_entries(cat: Catalogue, entries: Mapping[str, TensorInfo]) -> dict[str, mx.array]:
    """Read the named tensors' bytes (a few KB for norms) and decode them."""
    return {k: to_mx(info, cat.read_tensor_bytes(info)) for k, info in entries.items()}
