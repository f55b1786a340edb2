"""Write a GGUF file tensor by tensor, chunk by chunk, atomically.

gguf-py's writer serialises the header, metadata and tensor table; the data of each tensor then
streams in as chunks (a trunk tensor is copied in 8 MiB reads, a converted MTP tensor arrives
whole — it is small), so memory stays flat whatever the trunk's size. The file is written to a
temporary name in the destination folder and renamed into place only once complete and synced:
a kill leaves the old file (or nothing) under the final name, never a torn one.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

import gguf
import numpy as np

from ..errors import InputError, RefusedError
from ..writer.ahead import EarlySync, run_ahead, side_thread
from ..writer.uncached import UncachedAppender
from .gguffile import KV, GgufFile, GgufTensor

COPY_CHUNK = 8 << 20
TMP_MARK = ".mtpforge-tmp-"


@dataclass
class OutTensor:
    name: str
    type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order
    nbytes: int
    chunks: Callable[[], Iterable[bytes]]


def copy_chunks(src: GgufFile, t: GgufTensor) -> Callable[[], Iterator[bytes]]:
    """A trunk tensor's bytes, read from its file in bounded chunks (no memory map: mapped pages
    would count against the process as the copy walks a 20 GB file), from its part of a split
    GGUF where it lies in one."""
    path = src.file_of(t)

    def gen() -> Iterator[bytes]:
        with open(path, "rb") as f:
            f.seek(t.offset)
            left = t.nbytes
            while left:
                b = f.read(min(COPY_CHUNK, left))
                if not b:
                    raise RefusedError(f"{src.name} ended inside tensor {t.name}", "re-download the GGUF")
                left -= len(b)
                yield b

    return gen


def array_chunks(a: np.ndarray) -> Callable[[], Iterator[bytes]]:
    return lambda: iter([np.ascontiguousarray(a).tobytes()])


def tmp_path_for(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")


def cleanup_tmp(folder: Path, name: str) -> None:
    """Temp files of earlier killed runs for ``name``."""
    with contextlib.suppress(OSError):
        for p in folder.iterdir():
            if p.name.startswith(f".{name}{TMP_MARK}"):
                with contextlib.suppress(OSError):
                    p.unlink()


def check_dest(dest: Path) -> None:
    if dest.is_symlink():
        raise RefusedError(f"{dest} is a symbolic link; mtpforge never writes through links",
                           "remove the link or pass another --output")
    if not dest.parent.is_dir():
        raise InputError(f"folder {dest.parent} does not exist", "create it or pass another --output")
    if not os.access(dest.parent, os.W_OK):
        raise InputError(f"folder {dest.parent} is not writable", "pass a writable --output location")


def write_gguf(dest: Path, arch: str, kv: dict[str, KV], tensors: list[OutTensor],
               on_bytes: Callable[[int], None] | None = None,
               before_commit: Callable[[str, Path], None] | None = None, alignment: int | None = None) -> str:
    """Write ``dest`` atomically; returns the sha256 of the written file. ``before_commit(sha,
    tmp)`` runs on the complete temporary file before the rename (a check that raises leaves
    ``dest`` as it was). ``alignment`` lays the data out at another alignment than the one
    ``general.alignment`` declares (only a damaged file does; the input tests make them)."""
    check_dest(dest)
    cleanup_tmp(dest.parent, dest.name)
    tmp = tmp_path_for(dest)
    try:
        return _write_tmp(dest, tmp, arch, kv, tensors, on_bytes, before_commit, alignment)
    except OSError as e:
        from ..writer.atomic import _no_space

        full = _no_space(e, dest)
        if full is None:
            raise
        raise full from None


def _write_tmp(dest: Path, tmp: Path, arch: str, kv: dict[str, KV], tensors: list[OutTensor],
               on_bytes: Callable[[int], None] | None, before_commit: Callable[[str, Path], None] | None,
               alignment: int | None) -> str:
    """:func:`write_gguf`'s work: the temporary file is removed on every way out, a full disk's
    failing close included (it raised before the unlink and left the file behind)."""
    logging.getLogger("gguf.gguf_writer").setLevel(logging.WARNING)
    w = gguf.GGUFWriter(None, arch)
    try:
        for k, v in kv.items():
            if k == "general.architecture":
                continue
            if v.value is None:
                raise RefusedError(f"metadata {k} of the trunk could not be decoded", "re-convert the trunk GGUF")
            w.add_key_value(k, v.value, v.type, v.sub_type)
        if alignment is not None:
            w.data_alignment = alignment
        elif "general.alignment" in kv:
            w.data_alignment = int(kv["general.alignment"].value)
        for t in tensors:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.type)
        w.write_header_to_file(tmp)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None
        fout = _HashingFile(w.fout[0], tmp)
        try:
            _write_data(w, fout, tensors, on_bytes)
            fout.flush()
        finally:
            fout.close()
        os.fsync(fout.fileno())
        w.close()
        sha = fout.hexdigest()
        if before_commit is not None:
            before_commit(sha, tmp)
        os.replace(tmp, dest)
        with contextlib.suppress(OSError):
            dfd = os.open(dest.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return sha
    finally:
        try:
            with contextlib.suppress(OSError):
                w.close()  # a full disk fails the flush again: the temporary file goes all the same
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


#: chunks from this size on are hashed beside their write (below it a thread hand-off costs more)
_HASH_APART = 1 << 16


class _HashingFile:
    """The temporary file's tensor data, hashed as it is written (the header read back once,
    every later byte as it passes): a second read of GBs only to hash them cost as much as
    writing them. The data goes past the page cache where the platform allows
    (``writer.uncached``: the kernel's copy into its cache was most of a giant head's CPU)."""

    def __init__(self, f: BinaryIO, path: Path) -> None:
        f.flush()
        self._f, self._h = f, hashlib.sha256()
        with open(path, "rb") as r:
            head = r.read(f.tell())
        self._h.update(head)
        self._out = UncachedAppender.open(path, f.fileno(), len(head), head)
        self._sync = EarlySync(f.fileno(), f.flush)

    def write(self, b: "bytes | memoryview") -> int:
        put = self._out.write if self._out is not None else self._f.write
        if len(b) < _HASH_APART:
            self._h.update(b)
            return put(b)
        # hashlib and the file write both let go of the GIL on large buffers: the chunk is hashed
        # in a second thread while it is written, and both are done before the caller reuses it
        hashed = side_thread().submit(self._h.update, b)
        try:
            n = put(b)
        finally:
            hashed.result()
        self._sync.wrote(n)
        return n

    def tell(self) -> int:
        return self._out.position if self._out is not None else self._f.tell()

    def flush(self) -> None:
        """Every byte written onto the file (not yet synced)."""
        self._sync.wait()
        if self._out is not None:
            self._out.finish()
        self._f.flush()

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def fileno(self) -> int:
        return self._f.fileno()

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _write_data(w: gguf.GGUFWriter, fout: _HashingFile, tensors: list[OutTensor],
                on_bytes: Callable[[int], None] | None) -> None:
    """Every tensor's bytes in order, each padded to the alignment; the chunks are converted in
    a worker thread while earlier ones are written (``writer.ahead.run_ahead``)."""

    def stream() -> Iterator[tuple[int, "bytes | memoryview"]]:
        for i, t in enumerate(tensors):
            yield i, b""  # the tensor starts: its padding comes first, even when it has no chunk
            for b in t.chunks():
                yield i, b

    cur, n = -1, 0
    for i, b in run_ahead(stream()):
        if i != cur:
            _finish(w, fout, tensors, cur, n)
            w.write_padding(fout, fout.tell())  # type: ignore[arg-type]
            cur, n = i, 0
        if len(b):
            fout.write(b)
            n += len(b)
            if on_bytes:
                on_bytes(len(b))
    _finish(w, fout, tensors, cur, n)


def _finish(w: gguf.GGUFWriter, fout: _HashingFile, tensors: list[OutTensor], i: int, n: int) -> None:
    """Tensor ``i`` is complete: its byte count checked, its data padded to the alignment."""
    if i < 0:
        return
    if n != tensors[i].nbytes:
        raise RefusedError(f"tensor {tensors[i].name}: wrote {n} bytes, expected {tensors[i].nbytes}", "report this as a bug")
    w.write_padding(fout, n)  # type: ignore[arg-type]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(COPY_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


__all__ = ["OutTensor", "write_gguf", "copy_chunks", "array_chunks", "file_sha256", "cleanup_tmp"]
