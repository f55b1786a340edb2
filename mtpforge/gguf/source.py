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
from .names import ARCH


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
    checks = [
        ("embedding_length", "{arch}.embedding_length", d["H"]),
        ("layer count", None, tc.num_hidden_layers),
        ("attention heads", "{arch}.attention.head_count", tc.num_attention_heads),
        ("kv heads", "{arch}.attention.head_count_kv", tc.num_key_value_heads),
        ("head dim", "{arch}.attention.key_length", d["D"]),
        ("expert count", "{arch}.expert_count", d["E"] or None),
    ]
    for label, key, want in checks:
        have = n_trunk if key is None else trunk.get(key)
        if want is None or have is None:
            continue
        if isinstance(have, list):
            have = have[0] if have else None
        if int(have) != int(want):
            raise RefusedError(f"trunk and source differ in {label} ({have} vs {want}): the head would not fit",
                               "pass the original checkpoint of the same model size as --source")
    emb = trunk.tensors.get("token_embd.weight")
    if emb is not None and d["V"] and emb.shape[0] != d["V"]:
        raise RefusedError(f"trunk vocabulary has {emb.shape[0]} tokens, the source {d['V']}",
                           "pass the original checkpoint of the trunk's model as --source")
