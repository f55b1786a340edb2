"""The source side of a GGUF graft: the original checkpoint's head, read from its index and
headers only, and checked against the trunk GGUF it is meant for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..checkpoint.catalogue import INDEX_FILE, head_shards, load_catalogue
from ..checkpoint.safetensors_header import TensorInfo
from ..checkpoint.store import LocalStore, Store
from ..errors import RefusedError
from ..families.detect import detect_family
from ..families.tables import declared_mtp_layers, dims, text_config
from ..layouts.detect import is_raw_hf, locate_head
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
    from ..pipeline import _open_source

    store = _open_source(source, revision)
    local = isinstance(store, LocalStore)
    cat = load_catalogue(store, all_safetensors=local, index_files=None if local else head_shards)
    family = detect_family(cat.config, cat.tensors)
    if family is None:
        raise RefusedError(f"source {source} is not a Qwen3.5, Qwen3.6 or Qwen3-Next checkpoint",
                           "pass the original Hugging Face checkpoint of the trunk's model")
    cat.refuse_damage("source")
    if local:
        gone = sorted({f for f in (cat.index or {}).values() if not store.exists(f)})
        if gone:
            raise RefusedError(f"the source's {INDEX_FILE} names {gone[0]}, which is not in {source}",
                               f"re-download {gone[0]} (or the whole source)")
    if not is_raw_hf(cat):
        raise RefusedError(f"source {source} is not a raw Hugging Face checkpoint (it looks converted)",
                           "pass the original Hugging Face repo (e.g. Qwen/Qwen3.5-27B) as --source")
    loc = locate_head(cat, family)
    if loc.layout != "hf" or not loc.entries:
        raise RefusedError(f"source {source} has no MTP tensors (mtp.*)", "pass the original checkpoint, which ships the head")
    n = declared_mtp_layers(cat.config, family) or (1 + max(int(k.split(".")[1]) for k in loc.entries if k.startswith("layers.")))
    fmt = validate_source_head(cat.config, loc.entries, n)
    return SourceHead(store, cat.config, family, dict(loc.entries), n, fmt, getattr(store, "commit", None))


def check_trunk_matches(trunk: GgufFile, src: SourceHead, n_trunk: int) -> None:
    """Refuse a head from another model (family or size) before anything is downloaded."""
    if ARCH[src.family] != trunk.arch:
        raise RefusedError(f"source is {src.family} (llama.cpp {ARCH[src.family]}) but the trunk is {trunk.arch}",
                           "pass the original checkpoint of the trunk's model as --source")
    tc, d = text_config(src.config), dims(src.config)
    checks = [
        ("embedding_length", "{arch}.embedding_length", d["H"]),
        ("layer count", None, int(tc.get("num_hidden_layers", -1))),
        ("attention heads", "{arch}.attention.head_count", int(tc.get("num_attention_heads", -1))),
        ("kv heads", "{arch}.attention.head_count_kv", int(tc.get("num_key_value_heads", -1))),
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
