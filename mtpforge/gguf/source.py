"""The source side of a GGUF graft: the original checkpoint's head, read from its index and
headers only, and checked against the trunk GGUF it is meant for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..checkpoint.safetensors_header import TensorInfo
from ..checkpoint.store import LocalStore, Store
from ..errors import RefusedError
from ..families import FAMILIES
from ..families.tables import dims
from ..headplan import mtp_layer_count, refuse_misfit
from ..inputs.model_config import as_config
from ..layouts.detect import locate_head
from ..plan import validate_source_head
from .gguffile import GgufFile
from .names import ARCH, dim_keys


@dataclass
class SourceHead:
    store: Store
    config: dict[str, Any]
    family: str
    entries: dict[str, TensorInfo]  # bare key -> tensor
    n_layers: int
    expert_format: str  # none | per-expert | fused
    commit: str | None

    @property
    def local(self) -> bool:
        return isinstance(self.store, LocalStore)


def open_source_head(source: str, revision: str | None) -> SourceHead:
    from ..source import read_source

    store, cat, family = read_source(source, revision, "trunk's model")
    loc = locate_head(cat, family)
    if loc.layout != "hf" or not loc.entries:
        raise RefusedError(f"source {source} has no MTP tensors ({FAMILIES[family].head_prefix(cat.config)}*)",
                           "pass the original checkpoint, which ships the head")
    n = mtp_layer_count(cat.config, family, loc.entries)
    fmt = validate_source_head(cat.config, loc.entries, n)
    return SourceHead(store, cat.config, family, dict(loc.entries), n, fmt, getattr(store, "commit", None))

#: the widths a trunk states per kind of layer (a dense layer's feed-forward, an expert's), which
#: need not be the head's: not compared
PER_LAYER_KIND = ("I", "IM")


def check_trunk_matches(trunk: GgufFile, src: SourceHead, n_trunk: int) -> None:
    """Refuse a head from another model (family or size) before anything is downloaded."""
    if ARCH[src.family] != trunk.arch:
        raise RefusedError(f"source is {src.family} (llama.cpp {ARCH[src.family]}) but the trunk is {trunk.arch}",
                           "pass the original checkpoint of the trunk's model as --source")
    src_dims = {sym: v or None for sym, v in dims(src.config).items()}
    src_dims["layers"] = as_config(src.config).text.num_hidden_layers
    emb = trunk.tensors.get("token_embd.weight")
    stated = {sym: _stated(trunk.get("{arch}." + key)) for sym, key in dim_keys(FAMILIES[src.family]).items()
              if sym not in PER_LAYER_KIND}
    refuse_misfit(src_dims, {**stated, "layers": n_trunk, "V": emb.shape[0] if emb is not None else None}, "trunk")


def _stated(have: object) -> int | None:
    """A metadata value as one number: a per-layer array (hybrid trunks: 0 on the layers
    without that part) as the value the layers that have it take."""
    if isinstance(have, list):
        return max(have) if have else None
    return None if have is None else int(have)  # type: ignore[call-overload]
