"""A catalogue of every tensor a checkpoint holds, with its exact file byte range.

Built from the config, the index (when there is one) and the safetensors headers — nothing else
is read, so building one for a Hub repo costs a few small range requests. Defects inside a
readable folder (a corrupt shard, an index naming a missing file) are recorded, not raised:
``inspect`` reports them as findings.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Callable

from ..errors import CorruptFileError, InputError, RefusedError
from ..inputs.index import INDEX_FILE, IndexFile, parse_index
from ..inputs.model_config import ModelConfig, parse_config
from ..inputs.problems import Problem
from .safetensors_header import Header, TensorInfo, read_header
from .store import Store, read_json


@dataclass
class Catalogue:
    store: Store
    config: ModelConfig
    index: dict[str, str] | None  # tensor name -> file, from model.safetensors.index.json
    headers: dict[str, Header] = field(default_factory=dict)  # file -> parsed header
    corrupt: dict[str, str] = field(default_factory=dict)  # file -> what is wrong
    files: list[str] = field(default_factory=list)
    #: index entries whose file name points outside the folder (tensor -> what is wrong); kept
    #: out of ``index`` so nothing ever opens them, and reported by inspect as a finding
    unsafe_index: dict[str, str] = field(default_factory=dict)
    #: the index as parsed (None: the folder has none)
    index_file: IndexFile | None = None

    @property
    def problems(self) -> tuple[Problem, ...]:
        """Values of config.json and the index that do not validate (inspect: findings)."""
        return self.config.problems + (self.index_file.problems if self.index_file else ())

    def refuse_invalid(self) -> None:
        """For a command that relies on every value of the folder's config and index: exit 2."""
        if self.problems:
            raise self.problems[0].error()

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        """Every tensor in every readable safetensors file (later files never shadow earlier)."""
        out: dict[str, TensorInfo] = {}
        for h in self.headers.values():
            for k, v in h.tensors.items():
                out.setdefault(k, v)
        return out

    def glob(self, pattern: str) -> list[str]:
        return [f for f in self.files if fnmatch.fnmatchcase(f, pattern)]

    def file_tensors(self, file: str) -> dict[str, TensorInfo]:
        h = self.headers.get(file)
        return dict(h.tensors) if h else {}

    def refuse_damage(self, role: str) -> None:
        """add-mtp changes only intact checkpoints: the first defect (that inspect would report
        as a finding) becomes a refusal naming it."""
        if self.corrupt:
            f, why = next(iter(sorted(self.corrupt.items())))
            raise RefusedError(f"{role} file is damaged: {why}", f"re-download {f}; `mtpforge inspect` lists every defect")
        if self.unsafe_index:
            k, why = next(iter(sorted(self.unsafe_index.items())))
            raise RefusedError(f"the {role}'s {INDEX_FILE}, entry {k}: {why}",
                               f"re-download or regenerate {INDEX_FILE}: it must name files inside the folder")

    def read_tensor_bytes(self, info: TensorInfo) -> bytes:
        return self.store.read_range(info.file, info.begin, info.end)


def _named(store: Store, rel: str) -> str:
    """A file of a store as messages name it (``/path/to/model/config.json``, ``org/repo@sha/...``)."""
    return f"{store.name.rstrip('/')}/{rel}"


def head_shards(index: dict[str, str], config: ModelConfig) -> set[str]:
    """The shards a remote source is read from: those holding the head's tensors (the config's
    family's spelling; every family's for an unknown config, refused later), plus one whose
    header tells a raw HF checkpoint from a converted one (the family's ``raw_marker_suffixes``).
    A 94-shard repo then costs 4-6 header reads, not 188."""
    from ..families.tables import head_specs, is_head_key

    files = {f for k, f in index.items() if is_head_key(k, config)}
    markers = tuple(m for s in head_specs(config) for m in s.raw_marker_suffixes)
    marker = next((f for k, f in sorted(index.items()) if markers and k.endswith(markers)), None)
    return files | ({marker} if marker else set())


def load_catalogue(
    store: Store, *, all_safetensors: bool = True,
    index_files: Callable[[dict[str, str], ModelConfig], set[str]] | None = None,
) -> Catalogue:
    """Read config, index and headers. ``all_safetensors`` also reads files outside the index
    (sidecars, stale shards); for a remote source only indexed files are needed, and
    ``index_files`` narrows those further (e.g. ``head_shards``)."""
    if not store.exists("config.json"):
        raise InputError(
            f"{store.name} has no config.json",
            "pass a Hugging Face or MLX model folder (or repo id) that contains config.json",
        )
    config = parse_config(read_json(store, "config.json"), file=_named(store, "config.json"))
    files = store.list_files()
    idx: IndexFile | None = None
    if store.exists(INDEX_FILE):
        idx = parse_index(read_json(store, INDEX_FILE), file=_named(store, INDEX_FILE))
    index = idx.weight_map if idx is not None else None
    cat = Catalogue(store=store, config=config, index=index, files=files, index_file=idx)
    if idx is not None:
        cat.unsafe_index = dict(idx.unsafe)
    wanted: list[str] = []
    # without an index (single-file releases) the weight files themselves are the only listing
    if all_safetensors or index is None:
        wanted = [f for f in files if f.endswith(".safetensors")]
    if index is not None:
        listed = set(index.values()) if index_files is None else index_files(index, config)
        wanted += [f for f in sorted(listed) if f not in wanted and store.exists(f)]
    for f in wanted:
        try:
            size = store.size(f)
            cat.headers[f] = read_header(f, size, lambda a, b, f=f: store.read_range(f, a, b))
        except CorruptFileError as e:
            cat.corrupt[f] = e.message
    return cat
