"""The source side of a GGUF graft: the original checkpoint's head, read from its index and
headers only, and checked against the trunk GGUF it is meant for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..checkpoint.safetensors_header import TensorInfo
from ..checkpoint.store import LocalStore, Store
from ..errors import RefusedError
from ..families import FAMILIES
from ..families.tables import declared_mtp_layers, dims, mtp_layers_of
from ..inputs.model_config import as_config
from ..layouts.detect import locate_head
from ..plan import validate_source_head
from .gguffile import GgufFile
from .names import ARCH, dim_keys

#: the dimensions a trunk and a source must agree on (where the family's GGUF states them), and
#: how a refusal names each
CHECKED_DIMS: dict[str, str] = {
    "H": "embedding_length", "NH": "attention heads", "KV": "kv heads", "D": "head dim", "E": "expert count",
    "RQ": "query rank", "RKV": "key/value rank", "ROPE": "rope dimensions", "QKD": "query/key head dim",
    "VD": "value head dim", "L": "latent size", "IN": "indexer heads", "ID": "indexer head dim",
}


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
    n = declared_mtp_layers(cat.config, family) or (1 + max(mtp_layers_of(loc.entries, family), default=0))
    fmt = validate_source_head(cat.config, loc.entries, n)
    return SourceHead(store, cat.config, family, dict(loc.entries), n, fmt, getattr(store, "commit", None))


def check_trunk_matches(trunk: GgufFile, src: SourceHead, n_trunk: int) -> None:
    """Refuse a head from another model (family or size) before anything is downloaded."""
    if ARCH[src.family] != trunk.arch:
        raise RefusedError(f"source is {src.family} (llama.cpp {ARCH[src.family]}) but the trunk is {trunk.arch}",
                           "pass the original checkpoint of the trunk's model as --source")
    tc, d = as_config(src.config).text, dims(src.config)
    checks = [("layer count", None, tc.num_hidden_layers)] + [
        (label, "{arch}." + key, d.get(sym) or None)
        for sym, key in dim_keys(FAMILIES[src.family]).items() if (label := CHECKED_DIMS.get(sym))]
    for label, key, want in checks:
        have = n_trunk if key is None else trunk.get(key)
        if want is None or have is None:
            continue
        if isinstance(have, list):
            # a per-layer array (hybrid trunks: 0 on the layers without that part): the value
            # the layers that have it take
            have = max(have) if have else None
        if int(have) != int(want):
            raise RefusedError(f"trunk and source differ in {label} ({have} vs {want}): the head would not fit",
                               "pass the original checkpoint of the same model size as --source")
    emb = trunk.tensors.get("token_embd.weight")
    if emb is not None and d["V"] and emb.shape[0] != d["V"]:
        raise RefusedError(f"trunk vocabulary has {emb.shape[0]} tokens, the source {d['V']}",
                           "pass the original checkpoint of the trunk's model as --source")
