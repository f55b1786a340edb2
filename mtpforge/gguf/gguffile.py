"""Read a GGUF file's metadata and tensor table with gguf-py, locally or from the Hub.

Every header is first walked by :func:`header_length` (local files too), each declared count and
length held to a limit and to the file's size, so gguf-py never allocates what a hostile header
declares. Nothing here reads tensor data: a trunk of 20 GB is opened through gguf-py's memory map, of which
only the header pages are touched. A Hub file is read by HTTP range requests into a sparse
temporary file of the file's full size (only the header bytes are written), which gguf-py then
parses as if it were the whole file.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np

from ..errors import CorruptFileError, InputError, RefusedError

#: keys gguf-py's reader invents for the file header; they are not metadata
_PSEUDO_KEYS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")


@dataclass(frozen=True)
class GgufTensor:
    name: str
    type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order (slowest axis first), as gguf-py writes it
    offset: int  # absolute byte offset of the data in the file
    nbytes: int
    #: the part of a split GGUF holding the data (None: the file read)
    path: Path | None = None

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

    def file_of(self, t: GgufTensor) -> Path:
        """The file holding ``t``'s data: its part of a split GGUF, else this file."""
        path = t.path or self.path
        assert path is not None
        return path


#: no GGUF dimension or count mtpforge reads comes near these (as for config.json)
MAX_DIM = 1 << 24
MAX_TENSOR_DIM = 2**31 - 1

_DIM = (f"an integer in 0..{MAX_DIM}", lambda v: _int(v) and 0 <= v <= MAX_DIM)
_DIMS = (f"an integer in 0..{MAX_DIM}, or a list of them",
         lambda v: _DIM[1](v) or (isinstance(v, list) and all(_DIM[1](x) for x in v)))
_STR = ("a string", lambda v: isinstance(v, str))
#: metadata keys mtpforge reads, with what each must be (``{arch}`` is the file's architecture)
META: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "general.architecture": _STR,
    "general.alignment": ("a power of two", lambda v: _int(v) and 0 < v <= 1 << 16 and v & (v - 1) == 0),
    "general.file_type": ("an integer >= 0", lambda v: _int(v) and v >= 0),
    **{f"general.{k}": _STR for k in ("name", "basename", "finetune", "version", "size_label")},
    "{arch}.block_count": _DIM,
    "{arch}.nextn_predict_layers": ("an integer in 0..64", lambda v: _int(v) and 0 <= v <= 64),
    **{f"{{arch}}.{k}": _DIM for k in ("embedding_length", "attention.key_length", "expert_count",
                                         "expert_feed_forward_length", "expert_shared_feed_forward_length",
                                         "expert_shared_count", "attention.q_lora_rank", "attention.kv_lora_rank",
                                         "attention.key_length_mla", "attention.value_length_mla",
                                         "rope.dimension_count")},
    **{f"{{arch}}.{k}": _DIMS for k in ("attention.head_count", "attention.head_count_kv", "feed_forward_length")},
    "{arch}.attention.recurrent_layers": ("a list of true/false", lambda v: isinstance(v, list) and all(isinstance(x, bool) for x in v)),
}


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_metadata(name: str, kv: dict[str, KV]) -> None:
    """Every metadata value mtpforge reads has the type and range it reads it as (the GGUF file's
    edge: a trunk whose ``block_count`` is a string is one line here, not a crash later)."""
    from ..inputs.problems import describe

    arch = kv["general.architecture"].value if "general.architecture" in kv else ""
    arch = arch if isinstance(arch, str) else ""
    for tmpl, (expected, ok) in META.items():
        key = tmpl.format(arch=arch)
        if key in kv and not ok(kv[key].value):
            raise CorruptFileError(f"{name}: metadata {key} is {describe(kv[key].value)}, expected {expected}",
                                   "re-convert the model with llama.cpp's converter (or re-download it)")


def _parse(path: Path, name: str, size: int) -> GgufFile:
    try:
        r = gguf.GGUFReader(path, "r")
    except (MemoryError, RecursionError):
        raise CorruptFileError(f"{name} is not a readable GGUF file (its header asks for more than it holds)",
                               "re-download or re-convert it") from None
    except Exception as e:  # noqa: BLE001 - gguf-py parsing an untrusted file: whatever it raises, the file is damaged
        raise CorruptFileError(f"{name} is not a readable GGUF file ({e.__class__.__name__}: {str(e)[:160]})",
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
    check_metadata(name, kv)
    tensors = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if any(d > MAX_TENSOR_DIM for d in shape):
            raise CorruptFileError(f"{name}: tensor {t.name} has shape {list(shape)}, expected dimensions of at most "
                                   f"{MAX_TENSOR_DIM}", "re-download or re-convert it")
        tensors[t.name] = GgufTensor(t.name, gguf.GGMLQuantizationType(int(t.tensor_type)), shape,
                                     int(t.data_offset), int(t.n_bytes))
    align = int(kv["general.alignment"].value) if "general.alignment" in kv else gguf.GGUF_DEFAULT_ALIGNMENT
    return GgufFile(name, size, kv, tensors, int(r.data_offset), align)


def _walk_local(p: Path, size: int) -> None:
    """The bounded header walk :func:`read_remote` does, on a local file: every count and length
    is held to the limits above and to the file's size before gguf-py (which allocates what a
    header declares) reads it."""
    with open(p, "rb") as f:
        def read_range(a: int, b: int) -> bytes:
            f.seek(a)
            return f.read(b - a)

        try:
            header_length(read_range, size)
        except CorruptFileError as e:
            raise CorruptFileError(f"{p.name} is not a readable GGUF file: {e.message}", e.fix) from None


def _not_a_file(p: Path) -> tuple[str, str]:
    """What a path that is not a regular file is, truly (a FIFO or a folder named ``x.gguf`` was
    said not to exist)."""
    import stat

    try:
        mode = p.stat().st_mode
    except OSError:
        return f"{p} does not exist", "pass the path of a .gguf file"
    if stat.S_ISDIR(mode):
        return f"{p} is a folder, not a GGUF file", "pass the .gguf file itself"
    kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    return f"{p} is {kind}, not a regular file; mtpforge reads GGUF files only from regular files", \
        "copy the GGUF into a regular file and pass that"


def read_local(path: str | os.PathLike[str]) -> GgufFile:
    """A local GGUF's metadata and tensor table; a split one (gguf-split's parts, the converter's
    ``--split-max-size``: how every GGUF of a 300 GB+ model is published) as one file: every
    part's tensors, each knowing its part, and the first part's metadata without the ``split.*``
    keys, so that nothing written from it (an MTP-only file, a new trunk) claims to be a part."""
    g = _read_one(Path(path))
    count = g.get("split.count", 0)
    if _int(count) and int(count) > 1:
        return _join_parts(g, int(count))
    g.kv = {k: v for k, v in g.kv.items() if k not in SPLIT_KEYS}  # a "split" in one part is a file
    return g


def _read_one(p: Path) -> GgufFile:
    if not p.is_file():
        raise InputError(*_not_a_file(p))
    size = p.stat().st_size
    _walk_local(p, size)
    g = _parse(p, p.name, size)
    g.path = p
    for t in g.tensors.values():
        if t.offset + t.nbytes > g.size:
            raise CorruptFileError(f"{p.name} is truncated: tensor {t.name} ends at byte {t.offset + t.nbytes:,} "
                                   f"of a {g.size:,}-byte file", "re-download it")
    return g


#: llama.cpp's name of part ``no`` (from 1) of a split GGUF: ``<prefix>-00001-of-00003.gguf``
_PART_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
#: the metadata that makes a GGUF one part of several
SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")


def first_part(path: Path) -> Path:
    """The first part of the split GGUF whose part ``path`` names (by name alone), else ``path``:
    the name llama-server loads a split model by, and records and heads name a trunk by."""
    m = _PART_NAME.match(path.name)
    return path.with_name(f"{m['prefix']}-00001-of-{m['count']}.gguf") if m else path


def _join_parts(given: GgufFile, count: int) -> GgufFile:
    """Every part of the split GGUF ``given`` belongs to, read and joined (see ``read_local``)."""
    assert given.path is not None
    m = _PART_NAME.match(given.path.name)
    if m is None or int(m["count"]) != count:
        raise InputError(f"{given.name} is part of a GGUF split in {count} parts, but its name is not llama.cpp's "
                         f"'<name>-00001-of-{count:05d}.gguf'", "keep the parts' names as gguf-split wrote them")
    paths = [given.path.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    gone = [p.name for p in paths if not p.is_file()]
    if gone:
        raise InputError(f"{given.name} is part of a GGUF split in {count} parts and {gone[0]} is not beside it",
                         "download every part of the GGUF into one folder")
    return join_parts([given if p == given.path else _read_one(p) for p in paths])


def join_parts(parts: list[GgufFile]) -> GgufFile:
    """The parts of one split GGUF, in order, as one file: every part's tensors (each knowing
    its part's path, where it has one) and the first part's metadata without ``SPLIT_KEYS``;
    parts that do not say they are these parts, in this order, are refused."""
    tensors: dict[str, GgufTensor] = {}
    count = len(parts)
    if parts[0].get("split.count") != count:
        raise InputError(f"{parts[0].name} is part of a GGUF split in {parts[0].get('split.count')} parts, and "
                         f"{count} of them are here", "download every part of the GGUF")
    for i, part in enumerate(parts):
        if part.get("split.no") != i or part.get("split.count") != count:
            raise CorruptFileError(f"{part.name} says it is part {part.get('split.no')} of {part.get('split.count')}, "
                                   f"not part {i} of {count}", "re-download the GGUF's parts")
        for n, t in part.tensors.items():
            if n in tensors:
                raise CorruptFileError(f"tensor {n} is in two parts of {parts[0].name}", "re-download the GGUF's parts")
            tensors[n] = dataclasses.replace(t, path=part.path) if part.path is not None else t
    first = parts[0]
    declared = first.get("split.tensors.count")
    if declared != len(tensors):
        raise CorruptFileError(f"{first.name}'s parts hold {len(tensors)} tensors, not the {declared} it declares",
                               "re-download the GGUF's parts")
    kv = {k: v for k, v in first.kv.items() if k not in SPLIT_KEYS}
    return GgufFile(first.name, first.size, kv, tensors, first.data_offset, first.alignment, first.path,
                    {"parts": [p.path or p.name for p in parts]})


def group_parts(names: list[str]) -> list[list[str]]:
    """File names grouped as GGUFs: a split GGUF's parts together, in order (a set lacking a part
    stays together, short, for the join to refuse); any other file alone."""
    sets: dict[tuple[str, str, str], dict[int, str]] = {}
    out: list[list[str]] = []
    for n in names:
        m = _PART_NAME.match(Path(n).name)
        if m is None:
            out.append([n])
        else:
            sets.setdefault((str(Path(n).parent), m["prefix"], m["count"]), {})[int(m["no"])] = n
    out += [[found[i] for i in sorted(found)] for found in sets.values()]
    return sorted(out)


_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUFValueType -> bytes
_STRING, _ARRAY = 8, 9

#: the most one header value may declare, far above any real GGUF (a 256k-token vocabulary, a chat
#: template of a few hundred KB, a few thousand tensors of at most four dimensions) and far below
#: what would exhaust memory: a count or length past these is refused before anything is allocated
MAX_STRING = 1 << 24
MAX_ARRAY = 1 << 24
MAX_KV = 1 << 16
MAX_TENSORS = 1 << 20
MAX_DIMS = 4  # GGML_MAX_DIMS
#: the largest Hub file whose header is parsed (its header is laid into a sparse file of that size,
#: which a filesystem refuses past its own limit: ext4's 16 TiB gave ``OSError: File too large``)
MAX_REMOTE_SIZE = 1 << 42


def _limit(what: str, n: int, most: int) -> None:
    if n > most:
        raise CorruptFileError(f"the GGUF header declares {what} of {n:,} (at most {most:,} is read)",
                               "re-download or re-convert it with llama.cpp's converter")


class _RangeBuf:
    """Bytes of a remote file's start, fetched only as the header walk needs them: every request
    asks for a lower bound of what is still to come, so no request reaches past the header."""

    def __init__(self, read_range: Callable[[int, int], bytes], size: int) -> None:
        self.read_range, self.size, self.buf, self.pos, self.requests = read_range, size, bytearray(), 0, 0

    def need(self, n: int, hint: int = 0) -> None:
        short = self.pos + n - len(self.buf)
        if short > 0:
            end = min(self.size, self.pos + max(n, hint))  # hint: bytes known to follow pos
            if end < self.pos + n:
                raise CorruptFileError("the GGUF header runs past the end of the file", "re-upload or re-convert it")
            self.buf += self.read_range(len(self.buf), end)
            self.requests += 1

    def take(self, n: int, hint: int = 0) -> bytes:
        self.need(n, hint)
        b = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return b

    def u32(self, hint: int = 0) -> int:
        return int.from_bytes(self.take(4, hint), "little")

    def u64(self, hint: int = 0) -> int:
        return int.from_bytes(self.take(8, hint), "little")

    def string(self, rest: int = 0) -> bytes:
        """A GGUF string, when at least ``rest`` more bytes follow it."""
        n = self.u64(8 + rest)
        _limit("a string length", n, MAX_STRING)
        return self.take(n, n + rest)

    def fits(self, n: int) -> None:
        """At least ``n`` more bytes must exist: refuse a count the file cannot hold, before the walk."""
        if self.pos + n > self.size:
            raise CorruptFileError("the GGUF header runs past the end of the file", "re-upload or re-convert it")


def header_length(read_range: Callable[[int, int], bytes], size: int) -> tuple[int, bytes, int]:
    """Walk a GGUF header by range reads: (data offset, header bytes, requests made)."""
    r = _RangeBuf(read_range, size)
    if r.take(4, 24) != b"GGUF":  # magic, version, tensor count, metadata count
        raise CorruptFileError("not a GGUF file (bad magic)", "check the file name")
    r.u32()
    n_tensors, n_kv = r.u64(), r.u64()
    _limit("a tensor count", n_tensors, MAX_TENSORS)
    _limit("a metadata count", n_kv, MAX_KV)
    r.fits(14 * n_kv + 33 * n_tensors)
    alignment = gguf.GGUF_DEFAULT_ALIGNMENT
    for i in range(n_kv):
        rest = 14 * (n_kv - i - 1) + 33 * n_tensors  # the smallest the rest of the header can be
        key = r.string(5 + rest)
        vt = r.u32(1 + rest)
        if vt == _STRING:
            val: bytes | int = r.string(rest)
        elif vt == _ARRAY:
            et, count = r.u32(12 + rest), r.u64(rest)
            _limit(f"an array length ({key[:60].decode('utf-8', 'replace')!r})", count, MAX_ARRAY)
            r.fits(count * (8 if et == _STRING else _SCALAR.get(et, 1)) + rest)
            if et == _STRING:
                for j in range(count):
                    r.string(8 * (count - j - 1) + rest)
            elif et in _SCALAR:
                r.take(_SCALAR[et] * count)
            else:
                raise CorruptFileError(f"GGUF metadata {key!r} has an unsupported array type {et}", "re-convert it")
            val = 0
        elif vt in _SCALAR:
            raw = r.take(_SCALAR[vt])
            val = int.from_bytes(raw, "little")
        else:
            raise CorruptFileError(f"GGUF metadata {key!r} has an unknown type {vt}", "re-convert it")
        if key == b"general.alignment" and isinstance(val, int) and val > 0:
            alignment = val
    for i in range(n_tensors):
        rest = 33 * (n_tensors - i - 1)  # a tensor entry is at least 33 bytes
        r.string(25 + rest)
        nd = r.u32(24 + rest)
        _limit("a tensor's number of dimensions", nd, MAX_DIMS)
        r.take(8 * nd + 12, 8 * nd + 12 + rest)
    off = r.pos + (-r.pos % alignment)
    return off, bytes(r.buf), r.requests


def _sparse_refused(e: OSError, name: str, size: int, folder: str) -> RefusedError:
    """The header is parsed in a sparse file of the Hub file's size; a temporary folder whose
    filesystem (or ``ulimit -f``) caps a file below that size is the user's situation, not a bug
    (a 128 GiB GGUF under a 1 GiB limit was `internal error: OSError: [Errno 27]`)."""
    if e.errno not in (errno.EFBIG, errno.ENOSPC, errno.EDQUOT):
        raise e
    return RefusedError(f"{name}: its header is read in a sparse temporary file of {size:,} bytes, which "
                        f"{Path(folder).parent} cannot hold ({errno.errorcode.get(e.errno or 0, e.errno)}); nothing was written",
                        "set TMPDIR to a folder on a filesystem without that file-size limit (and check ulimit -f)",
                        code="NO_SPACE")


def read_remote(name: str, size: int, read_range: Callable[[int, int], bytes]) -> tuple[GgufFile, int]:
    """Parse a Hub file's header from range reads, never touching tensor data; returns it and
    the bytes read."""
    if size > MAX_REMOTE_SIZE:
        raise CorruptFileError(f"{name}: the Hub reports {size:,} bytes, more than any GGUF file holds "
                               f"(at most {MAX_REMOTE_SIZE:,} is read)", "check the repo; re-upload the file")
    data_offset, head, _ = header_length(lambda a, b: read_range(a, b), size)
    with tempfile.TemporaryDirectory(prefix="mtpforge-gguf-") as d:
        p = Path(d) / "header.gguf"
        with open(p, "wb") as f:
            try:
                f.truncate(size)  # sparse: tensor data is never fetched
            except OSError as e:
                raise _sparse_refused(e, name, size, d) from None
            f.write(head)
        g = _parse(p, name, size)
    if g.data_offset != data_offset:
        raise CorruptFileError(f"{name}: header length {data_offset} disagrees with gguf-py's {g.data_offset}", "re-convert it")
    return g, len(head)


def tensor_array(g: GgufFile, t: GgufTensor) -> np.ndarray:
    """A tensor dequantized to float32 (small tensors only: norms, and tests)."""
    with open(g.file_of(t), "rb") as f:
        f.seek(t.offset)
        raw = np.frombuffer(f.read(t.nbytes), dtype=np.uint8)
    if t.type == gguf.GGMLQuantizationType.F32:
        return raw.view(np.float32).reshape(t.shape).copy()
    if t.type == gguf.GGMLQuantizationType.F16:
        return raw.view(np.float16).reshape(t.shape).astype(np.float32)
    bs, ts = gguf.GGML_QUANT_SIZES[t.type]
    rows = raw.reshape(*t.shape[:-1], t.shape[-1] // bs * ts)
    return gguf.quants.dequantize(rows, t.type).astype(np.float32)


__all__ = ["GgufFile", "GgufTensor", "KV", "first_part", "group_parts", "join_parts", "read_local", "read_remote",
           "tensor_array"]
