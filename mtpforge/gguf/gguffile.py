"""Read a GGUF file's metadata and tensor table with gguf-py, locally or from the Hub.

Nothing here reads tensor data: a trunk of 20 GB is opened through gguf-py's memory map, of which
only the header pages are touched. A Hub file is read by HTTP range requests into a sparse
temporary file of the file's full size (only the header bytes are written), which gguf-py then
parses as if it were the whole file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np

from ..errors import CorruptFileError, InputError

#: keys gguf-py's reader invents for the file header; they are not metadata
_PSEUDO_KEYS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")


@dataclass(frozen=True)
class GgufTensor:
    name: str
    type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order (slowest axis first), as gguf-py writes it
    offset: int  # absolute byte offset of the data in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return self.type.name


@dataclass
class KV:
    value: Any
    type: gguf.GGUFValueType
    sub_type: gguf.GGUFValueType | None = None


@dataclass
class GgufFile:
    name: str
    size: int
    kv: dict[str, KV]
    tensors: dict[str, GgufTensor]
    data_offset: int
    alignment: int
    path: Path | None = None  # None for a Hub file (headers only)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def arch(self) -> str:
        v = self.kv.get("general.architecture")
        return str(v.value) if v is not None else ""

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value; ``{arch}`` in ``key`` is replaced by the architecture."""
        v = self.kv.get(key.format(arch=self.arch))
        return default if v is None else v.value

    @property
    def block_count(self) -> int:
        return int(self.get("{arch}.block_count", 0) or 0)

    @property
    def nextn_layers(self) -> int:
        return int(self.get("{arch}.nextn_predict_layers", 0) or 0)

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def _parse(path: Path, name: str, size: int) -> GgufFile:
    try:
        r = gguf.GGUFReader(path, "r")
    except (ValueError, KeyError, IndexError, OSError, AssertionError, UnicodeDecodeError) as e:
        raise CorruptFileError(f"{name} is not a readable GGUF file ({e.__class__.__name__}: {e})",
                               "re-download or re-convert it") from None
    kv: dict[str, KV] = {}
    for k, f in r.fields.items():
        if k in _PSEUDO_KEYS or not f.types:
            continue
        try:
            val = f.contents()
        except UnicodeDecodeError:
            val = None
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        kv[k] = KV(val, f.types[0], sub)
    tensors = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        tensors[t.name] = GgufTensor(t.name, gguf.GGMLQuantizationType(int(t.tensor_type)), shape,
                                     int(t.data_offset), int(t.n_bytes))
    align = int(kv["general.alignment"].value) if "general.alignment" in kv else gguf.GGUF_DEFAULT_ALIGNMENT
    return GgufFile(name, size, kv, tensors, int(r.data_offset), align)


def read_local(path: str | os.PathLike[str]) -> GgufFile:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p} does not exist", "pass the path of a .gguf file")
    g = _parse(p, p.name, p.stat().st_size)
    g.path = p
    for t in g.tensors.values():
        if t.offset + t.nbytes > g.size:
            raise CorruptFileError(f"{p.name} is truncated: tensor {t.name} ends at byte {t.offset + t.nbytes:,} "
                                   f"of a {g.size:,}-byte file", "re-download it")
    return g


def read_remote(name: str, size: int, read_range: Callable[[int, int], bytes], first: int = 1 << 20) -> tuple[GgufFile, int]:
    """Parse a Hub file's header from range reads; returns it and the bytes read. Reads the first
    MiB, and more (doubling) while the header turns out longer."""
    want = min(first, size)
    got = b""
    with tempfile.TemporaryDirectory(prefix="mtpforge-gguf-") as d:
        p = Path(d) / "header.gguf"
        while True:
            got += read_range(len(got), want)
            with open(p, "wb") as f:
                f.truncate(size)  # sparse: tensor data is never fetched
                f.write(got)
            try:
                g = _parse(p, name, size)
            except CorruptFileError:
                if want >= size:
                    raise
                g = None
            if g is not None and g.data_offset <= len(got):
                g.path = None
                return g, len(got)
            want = min(size, max(want * 2, g.data_offset if g else 0))


def tensor_array(g: GgufFile, t: GgufTensor) -> np.ndarray:
    """A tensor dequantized to float32 (small tensors only: norms, and tests)."""
    assert g.path is not None
    with open(g.path, "rb") as f:
        f.seek(t.offset)
        raw = np.frombuffer(f.read(t.nbytes), dtype=np.uint8)
    if t.type == gguf.GGMLQuantizationType.F32:
        return raw.view(np.float32).reshape(t.shape).copy()
    if t.type == gguf.GGMLQuantizationType.F16:
        return raw.view(np.float16).reshape(t.shape).astype(np.float32)
    bs, ts = gguf.GGML_QUANT_SIZES[t.type]
    rows = raw.reshape(*t.shape[:-1], t.shape[-1] // bs * ts)
    return gguf.quants.dequantize(rows, t.type).astype(np.float32)


@contextlib.contextmanager
def open_data(g: GgufFile):
    assert g.path is not None
    with open(g.path, "rb") as f:
        yield f


__all__ = ["GgufFile", "GgufTensor", "KV", "read_local", "read_remote", "tensor_array"]
