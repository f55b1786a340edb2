"""Strict parsing of safetensors headers.

We parse headers ourselves (rather than through ``safetensors.safe_open``) because we need the
exact byte range of every tensor in the *file* — that is what an HTTP range request fetches and
what a streaming writer copies — and because a header arriving over the network or from a
hostile file must be validated before anything trusts it.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from math import prod
from typing import Callable

from ..errors import CorruptFileError

#: bytes per element; F8/F4 formats are what FP8 / NVFP4 releases use (refused or dequantized later).
DTYPE_SIZES: dict[str, float] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
    "F4": 0.5,
}

#: The largest dimension a tensor may have: what MLX (int32 shapes) can hold. A header may
#: describe a shape no framework can make (``[0, 2**63]`` spans zero bytes, so it passes the
#: span check) — refused here, where the header is read, not as an overflow later.
MAX_TENSOR_DIM = 2**31 - 1

#: Real headers are a few MB at most (a 1,553-tensor MoE shard is ~200 KB); refuse absurd ones
#: before allocating.
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: file, dtype, shape and its absolute byte span [begin, end)."""

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    file: str
    file_size: int
    data_start: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]


def _bad(file: str, what: str) -> CorruptFileError:
    return CorruptFileError(
        f"{file}: invalid safetensors file ({what})",
        f"re-download or regenerate {file}; it is damaged or not a safetensors file",
    )


def header_length(file: str, prefix: bytes, file_size: int) -> int:
    """The JSON header's length from the first 8 bytes, checked against the file size."""
    if len(prefix) < 8 or file_size < 8:
        raise _bad(file, f"file is {file_size} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_BYTES:
        raise _bad(file, f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte cap")
    if 8 + n > file_size:
        raise _bad(file, f"header length {n} runs past the end of the {file_size}-byte file")
    return n


def parse_header(file: str, header_json: bytes, file_size: int) -> Header:
    """Validate a header completely: JSON, dtypes, shapes vs spans, bounds, order, overlap."""
    data_start = 8 + len(header_json)
    try:
        obj = json.loads(header_json.decode("utf-8"))
    except UnicodeDecodeError:
        raise _bad(file, "header is not UTF-8") from None
    except json.JSONDecodeError as e:
        raise _bad(file, f"header is not JSON: {e.msg}") from None
    if not isinstance(obj, dict):
        raise _bad(file, "header is not a JSON object")
    metadata: dict[str, str] = {}
    spans: list[tuple[int, int, str]] = []
    tensors: dict[str, TensorInfo] = {}
    data_len = file_size - data_start
    for name, spec in obj.items():
        if name == "__metadata__":
            if not isinstance(spec, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in spec.items()
            ):
                raise _bad(file, "__metadata__ must map strings to strings")
            metadata = dict(spec)
            continue
        if not isinstance(spec, dict):
            raise _bad(file, f"entry {name!r} is not an object")
        dtype, shape, offs = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
            raise _bad(file, f"tensor {name!r} has unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise _bad(file, f"tensor {name!r} has an invalid shape {shape!r}")
        if any(d > MAX_TENSOR_DIM for d in shape):
            raise _bad(file, f"tensor {name!r} has an invalid shape {shape!r} (expected dimensions of at most {MAX_TENSOR_DIM})")
        if (
            not isinstance(offs, list)
            or len(offs) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
        ):
            raise _bad(file, f"tensor {name!r} has invalid data_offsets {offs!r}")
        b, e = offs
        if not 0 <= b <= e <= data_len:
            raise _bad(file, f"tensor {name!r} data_offsets {offs} lie outside the {data_len}-byte data area")
        want = prod(shape) * DTYPE_SIZES[dtype]
        if want != e - b:
            raise _bad(file, f"tensor {name!r}: shape {shape} x {dtype} needs {want:g} bytes, span holds {e - b}")
        spans.append((b, e, name))
        tensors[name] = TensorInfo(name, file, dtype, tuple(shape), data_start + b, data_start + e)
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise _bad(file, f"tensors {n0!r} and {n1!r} overlap")
    return Header(file, file_size, data_start, tensors, metadata)


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def parse_header_strict(file: str, header_json: bytes, file_size: int) -> Header:
    """As :func:`parse_header`, also refusing duplicate tensor names (JSON allows them silently)."""
    try:
        json.loads(header_json.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError:
        raise _bad(file, "header is not UTF-8") from None
    except ValueError as e:
        raise _bad(file, str(e) if "duplicate" in str(e) else f"header is not JSON: {e}") from None
    except RecursionError:
        raise _bad(file, "header nests too deeply") from None
    return parse_header(file, header_json, file_size)


def read_header(file: str, file_size: int, read: Callable[[int, int], bytes]) -> Header:
    """Read and validate a header with two reads (length, then JSON) — over HTTP that is two
    small range requests, never tensor data."""
    n = header_length(file, read(0, 8), file_size)
    return parse_header_strict(file, read(8, 8 + n), file_size)


def read_local_header(path: "os.PathLike[str] | str", name: str) -> Header:
    """The validated header of a local file, named ``name`` in messages and TensorInfos."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size

        def read(a: int, b: int) -> bytes:
            f.seek(a)
            return f.read(b - a)

        return read_header(name, size, read)
