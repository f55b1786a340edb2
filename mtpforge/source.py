"""The source side of every output format: open the original checkpoint, refuse what cannot be
a head's origin, fingerprint its head and read its bytes (fetched once, cached).

``add-mtp`` writes an MLX folder (``pipeline.py``) or a GGUF file (``gguf/``) from the same
source: both call these, so a source is judged, identified and read the same way whatever is
written from it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Mapping

from .families.unhandled import not_handled
from .checkpoint.catalogue import INDEX_FILE, Catalogue, head_shards, load_catalogue
from .checkpoint.direct_read import read_span
from .checkpoint.safetensors_header import TensorInfo
from .checkpoint.store import LocalStore, Store
from .errors import InputError, RefusedError
from .families.detect import detect_family
from .layouts.detect import is_raw_hf
from .progress import Progress


def open_source(source: str, revision: str | None) -> Store:
    """A local folder, else a Hugging Face repo id (at ``revision``)."""
    p = Path(source).expanduser()
    if p.exists():
        return LocalStore(p)
    from .localpath import looks_local, no_such_path

    if looks_local(source):
        raise InputError(no_such_path(source, "source"), "pass the source's folder, or a repo id such as Qwen/Qwen3.5-27B")
    from .checkpoint.hub import open_store

    return open_store(source, revision)


def read_source(source: str, revision: str | None, model: str) -> tuple[Store, Catalogue, str]:
    """Open a source and refuse what cannot be a head's origin: another family, damaged headers,
    shards the index names but a local copy lacks, a converted (not raw) checkpoint. Shared by
    every output format, so a source is judged the same way whatever is written from it."""
    store = open_source(source, revision)
    local = isinstance(store, LocalStore)
    cat = load_catalogue(store, all_safetensors=local, index_files=None if local else head_shards)
    family = detect_family(cat.config)
    if family is None:
        raise RefusedError(*not_handled(f"source {source}", cat.config, f"pass the original Hugging Face checkpoint of the {model}"))
    cat.refuse_damage("source")
    gone = sorted({f for f in (cat.index or {}).values() if not store.exists(f)}) if local else []
    if gone:
        raise RefusedError(f"the source's {INDEX_FILE} names {gone[0]}, which is not in {source}",
                           f"re-download {gone[0]} (or the whole source); an incomplete download cannot be trusted")
    if not is_raw_hf(cat):
        raise RefusedError(f"source {source} is not a raw Hugging Face checkpoint (it looks converted)",
                           "pass the original Hugging Face repo (e.g. Qwen/Qwen3.5-27B) as --source")
    _fill_header_dims(cat, family)
    return store, cat, family


def _fill_header_dims(cat: Catalogue, family: str) -> None:
    """Widths the config leaves out and the family reads from a head tensor's header
    (``FamilySpec.header_dims``) go into the config as read, so that every later step — shapes,
    the trunk check, metadata — sees one config. A tensor that is not there leaves the key unset,
    and the head is refused naming it."""
    from .families import FAMILIES
    from .inputs.model_config import ModelConfig

    spec = FAMILIES[family]
    tensors = cat.tensors if spec.header_dims else {}
    found = {key: tensors[spec.head_prefix(cat.config) + bare].shape[axis]
             for key, (bare, axis) in spec.header_dims.items()
             if key not in cat.config.text_raw and spec.head_prefix(cat.config) + bare in tensors}
    if not found:
        return
    raw = dict(cat.config)
    if cat.config.nested:
        raw["text_config"] = {**raw["text_config"], **found}
    else:
        raw.update(found)
    cat.config = ModelConfig(raw, file=cat.config.file)



def source_fingerprint(sizes: Mapping[str, int], entries: Mapping[str, TensorInfo], commit: str | None,
                       store: Store | None) -> str:
    """Identifies the source head: the commit for a Hub repo (immutable); for a local folder the
    head's bytes themselves — names, shapes and sizes stay the same when a tensor's values are
    edited in place, and "already present" must not keep a head converted from other values."""
    h = hashlib.sha256()
    h.update((commit or "").encode())
    by_bytes = commit is None and isinstance(store, LocalStore)
    for k in sorted(entries):
        i = entries[k]
        h.update(f"{k}|{i.file}|{i.dtype}|{i.shape}|{i.begin}|{i.end}|{sizes[i.file]}\n".encode())
        if by_bytes:
            assert store is not None
            for a in range(i.begin, i.end, 1 << 24):
                h.update(store.read_range(i.file, a, min(a + (1 << 24), i.end)))
    return "sha256-bytes:" + h.hexdigest() if by_bytes else h.hexdigest()


# ----------------------------------------------------------------------------- fetch

class SourceBytes:
    """The source tensors' bytes for a conversion: read in place from a local folder, or from
    a Hub repo as they arrive (``checkpoint.fetch.BackgroundFetch``: the conversion starts with
    the first run downloaded). ``finish`` gives what the fetch did once every read is done;
    ``close`` stops a fetch the conversion no longer waits for (its error, Ctrl-C). The download's
    bar joins the command's ``progress`` display, beside the conversion's; ``beside`` (the output's
    folder and size) counts in the download's room where the two share a disk."""

    def __init__(self, store: Store, infos: list[TensorInfo], mode: str, progress: Progress | None = None,
                 beside: tuple[Path, int] | None = None) -> None:
        self._store = store
        self._fetch = None
        self._stream = None
        if mode == "auto" and not isinstance(store, LocalStore) and _no_room_to_cache(store, infos, beside):
            mode = "stream"
            if progress is not None:
                progress.step("no room to cache the download beside the head: streaming it instead (nothing is cached)")
        if mode == "stream" and not isinstance(store, LocalStore):
            from .checkpoint.hub import HubStore
            from .checkpoint.stream_fetch import StreamFetch

            if not isinstance(store, HubStore):
                raise InputError(f"{store.name} is not a Hub repo", "local sources are read in place")
            self._stream = StreamFetch(store, infos, progress)
        elif not isinstance(store, LocalStore):
            from .checkpoint.fetch import BackgroundFetch

            self._fetch = BackgroundFetch(store, infos, mode, progress, beside)

    def read(self, info: TensorInfo, a: int, b: int) -> "bytes | memoryview":
        if self._stream is not None:
            return self._stream.read(info, a, b)
        if self._fetch is None:
            return self._store.read_range(info.file, info.begin + a, info.begin + b)
        path, off, n = self._fetch.locate(info.name)
        data = read_span(path, off + a, b - a)  # the download was written past the page cache too
        if len(data) != b - a:
            raise RefusedError(f"cached bytes of {info.name} are truncated", "re-run; the cache entry will be fetched again")
        return data

    def finish(self) -> tuple[int, str]:
        """(bytes downloaded, how: ``local``, ``cached``, ``ranges``, ``stream``, ``shards``, ``ranges+shards``)."""
        if self._stream is not None:
            res = self._stream.result()
            return res.fetched_bytes, res.mode
        if self._fetch is None:
            return 0, "local"
        res = self._fetch.result()
        return res.fetched_bytes, res.mode

    def close(self) -> None:
        if self._fetch is not None:
            self._fetch.close()
        if self._stream is not None:
            self._stream.close()


def _no_room_to_cache(store: Store, infos: list[TensorInfo], beside: tuple[Path, int] | None) -> bool:
    from .checkpoint.fetch import no_room_to_cache
    from .checkpoint.hub import HubStore

    return isinstance(store, HubStore) and not store.offline and no_room_to_cache(store, infos, beside)


def planned_requests(infos: list[TensorInfo], mode: str = "auto") -> int:
    """How many Range requests ``--fetch ranges`` (neighbours coalesced) or ``--fetch stream``
    (one a tensor, with the neighbours read right after it) will make."""
    if mode == "stream":
        from .checkpoint.stream_fetch import planned_stream_requests

        return planned_stream_requests(infos)
    from .checkpoint.fetch import plan_runs

    return len(plan_runs(infos))
