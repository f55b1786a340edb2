"""Execute a plan: stream source slices through the passes into one safetensors file.

Per slice: decode -> float32 -> (FP8 dequantize) -> (+1 on the seven norm kinds: the source is
raw Hugging Face, decided by provenance) -> quantize or cast -> bytes at their planned offset.
A few row blocks are alive at a time (one per core converting, plus the one being written).
"""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Iterator, Mapping

import mlx.core as mx
import numpy as np

from .checkpoint.safetensors_header import TensorInfo
from .checkpoint.tensors import to_bytes
from .headplan import Reader, block_scale, decode, read_scale, row_blocks
from .passes.floatbits import FLOAT_BITS, largest_magnitude
from .passes.norms import add_offset
from .passes.quantize import cast_float32, quantize
from .plan import OutModule, Plan
from .writer.ahead import in_order, named_pool
from .writer.safetensors_stream import SafetensorsWriter

#: output float dtype -> the safetensors dtype whose bytes pass through unchanged
_ST_FLOAT = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}



#: MLX evaluates on one thread at a time; the numpy work around it runs on every core
_MLX = threading.Lock()


def transform_slice(
    m: OutModule, raw: bytes, info: TensorInfo, shape: tuple[int, ...], scale: np.ndarray | None
) -> dict[str, bytes]:
    """The pure part: one slice's source bytes -> output bytes per suffix (decoded, and refused
    when not finite, by ``headplan.decode``, as the GGUF emitter's are)."""
    if m.transform is None and m.q is None and not m.norm:
        if info.dtype == _ST_FLOAT.get(m.float_dtype):
            decode(info, raw, shape, scale)  # refused when not finite; the cast back is the identity
            return {"": raw}
        # a cast value by value: decoded straight into it (one lookup a value for block-FP8)
        w = decode(info, raw, shape, scale, encode=partial(cast_float32, float_dtype=m.float_dtype))
        return {"": memoryview(np.ascontiguousarray(w).reshape(-1).view(np.uint8))}
    w32 = decode(info, raw, shape, scale)
    if m.transform is not None:
        w32 = m.transform(w32)
    if m.norm:
        w32 = np.asarray(add_offset(w32, m.offset))
    if m.q is None:
        return {"": memoryview(cast_float32(w32, m.float_dtype).reshape(-1).view(np.uint8))}
    with _MLX:
        return {sfx: to_bytes(a) for sfx, a in quantize(mx.array(w32), m.q, m.float_dtype).items()}


#: one row block's writes: (tensor key, bytes, slice index, slice count), and the source bytes
#: it completes for the progress bar
Converted = tuple[list[tuple[str, bytes, int, int]], int]


def _slice_jobs(plan: Plan, entries: Mapping[str, TensorInfo], read: Reader) -> Iterator[Callable[[], Converted]]:
    """One job per row block of every slice, in the plan's order; the job reads its block and
    converts it, so the reads run on every core too (a download read back past the page cache,
    ``checkpoint.direct_read``, has no read-ahead of the kernel's to hide a read's wait). A slice
    read again (for a second part of a tensor stored split) completes no source bytes for the
    progress bar a second time."""
    counted: set[tuple[str, int, int]] = set()
    for m in plan.modules:
        names = {s.key[len(plan.placement.key(m.bare)):] or "": s.key for s in m.specs(plan.placement)}
        n = len(m.slices)
        for e, sl in enumerate(m.slices):
            info = entries[sl.src]
            scale = read_scale(sl.src, entries, read)
            k = 1 if m.transform is not None else row_blocks(sl, info)
            once = (sl.src, sl.start, sl.end) not in counted
            counted.add((sl.src, sl.start, sl.end))
            step = (sl.end - sl.start) // k
            shape = (sl.shape[0] // k,) + tuple(sl.shape[1:]) if k > 1 else sl.shape
            for j in range(k):
                yield partial(_convert, m, names, read, info, sl.start + j * step, sl.start + (j + 1) * step, shape,
                              block_scale(scale, j, k, sl.shape), e * k + j, n * k,
                              sl.end - sl.start if j == k - 1 and once else 0)


def _convert(m: OutModule, names: Mapping[str, str], read: Reader, info: TensorInfo, a: int, b: int,
             shape: tuple[int, ...], scale: np.ndarray | None, index: int, count: int, done: int) -> Converted:
    out = transform_slice(m, read(info, a, b), info, shape, scale)
    writes = []
    for sfx, data in out.items():
        key = names[sfx] if sfx else names.get(".weight", names.get("", next(iter(names.values()))))
        writes.append((key, data, index, count))
    return writes, done


def write_plan(
    plan: Plan, path: Path, entries: Mapping[str, TensorInfo], read: Reader,
    metadata: dict[str, str] | None = None, on_progress: Callable[[int], None] | None = None,
) -> "HeadScan | None":
    """Write the plan's head into a new file at ``path``, one row block of one slice at a time,
    the row blocks read and converted on every core (``writer.ahead.in_order``) while this
    thread writes. The file's :class:`HeadScan`, taken as its bytes were written where they
    came in the file's order (None where they did not: ``scan_head`` then reads it back)."""
    with SafetensorsWriter(path, plan.specs(), metadata or {"format": "mlx"}) as w:
        scan = HeadScanner(w.tensors())
        w.watch(scan.feed)
        for writes, done in in_order(_slice_jobs(plan, entries, read)):
            for key, data, index, count in writes:
                w.write(key, data, index, count)
            if on_progress and done:
                on_progress(done)
    return scan.result() if w.in_order else None


@dataclass
class HeadScan:
    """One sequential pass over a written head file: what the manifest records (per-tensor and
    whole-file sha256) and what validation checks (NaN/Inf, all-zero projections or scales),
    without ever holding more than one chunk — ``inspect``'s own data check reads whole tensors,
    i.e. a whole expert stack (hundreds of MB at 512 experts)."""

    digests: dict[str, str] = field(default_factory=dict)
    file_sha256: str = ""
    nonfinite: list[str] = field(default_factory=list)
    degenerate: list[str] = field(default_factory=list)


_CHUNK = 1 << 22


class HeadScanner:
    """A :class:`HeadScan` of a file's bytes fed in order, from wherever they come: read back
    (``scan_head``), or as the writer writes them (``write_plan``: a second pass over a giant
    head's GBs took as long as converting them). The two sha256 streams each run in a thread of
    their own (hashlib lets go of the GIL on large buffers), one chunk in flight each."""

    def __init__(self, keys: Mapping[str, TensorInfo], *, whole_file: bool = True) -> None:
        self._infos = sorted(keys.items(), key=lambda kv: kv[1].begin)
        self._whole = hashlib.sha256() if whole_file else None
        self._pending: dict[str, Future[None]] = {}
        self._k, self.pos = 0, 0
        self._h = hashlib.sha256()
        self._largest, self._nonzero, self._carry = 0, False, b""
        self.out = HeadScan()
        self._finish_reached()

    def feed(self, chunk: "bytes | memoryview") -> None:
        """The file's next bytes (any length; a tensor's bytes may span several calls)."""
        view = memoryview(chunk).cast("B")
        if self._whole is not None:
            self._hash("file", self._whole, view)
        while len(view):
            if self._k >= len(self._infos) or self.pos < self._infos[self._k][1].begin:
                # bytes outside every tensor: the header, or what follows the last one
                end = self._infos[self._k][1].begin if self._k < len(self._infos) else self.pos + len(view)
                take = min(len(view), end - self.pos)
            else:
                k, info = self._infos[self._k]
                take = min(len(view), info.end - self.pos)
                part = view[:take]
                self._hash("tensor", self._h, part)
                if info.dtype in FLOAT_BITS:
                    self._largest = max(self._largest, largest_magnitude(self._whole_values(part, info.dtype), info.dtype))
                elif not self._nonzero and np.frombuffer(part, np.uint8).any():
                    self._nonzero = True
            self.pos += take
            view = view[take:]
            self._finish_reached()

    def _whole_values(self, part: memoryview, dtype: str) -> "bytes | memoryview":
        """``part``'s whole values: a value split between two feeds waits for its second half
        (the writer's and the reader's chunks end between values; a caller's need not)."""
        size = np.dtype(FLOAT_BITS[dtype][0]).itemsize
        if not self._carry and len(part) % size == 0:
            return part
        buf = self._carry + bytes(part)
        cut = len(buf) - len(buf) % size
        self._carry = buf[cut:]
        return buf[:cut]

    def skip_to(self, pos: int) -> None:
        """Bytes not fed up to ``pos`` (a scan of named tensors only, no whole-file hash)."""
        assert self._whole is None and pos >= self.pos
        self.pos = pos
        self._finish_reached()

    def result(self) -> HeadScan:
        if self._k < len(self._infos):
            raise OSError(f"the file ends before tensor {self._infos[self._k][0]} does")
        for job in self._pending.values():
            job.result()
        self.out.file_sha256 = self._whole.hexdigest() if self._whole is not None else ""
        return self.out

    def _hash(self, stream: str, h: "hashlib._Hash", data: memoryview) -> None:
        if stream in self._pending:
            self._pending.pop(stream).result()
        self._pending[stream] = named_pool(f"hash-{stream}", 1).submit(h.update, data)

    def _finish_reached(self) -> None:
        """Every tensor the position has reached the end of: its digest and data checks."""
        while self._k < len(self._infos) and self._infos[self._k][1].end <= self.pos:
            k, info = self._infos[self._k]
            if "tensor" in self._pending:
                self._pending.pop("tensor").result()
            is_float = info.dtype in FLOAT_BITS
            finite = not is_float or self._largest < FLOAT_BITS[info.dtype][1]
            nonzero = self._nonzero or self._largest > 0  # -0.0 counts as zero, as `a != 0` does
            self.out.digests[k] = self._h.hexdigest()
            is_proj = k.endswith(".scales") or (len(info.shape) >= 2 and not k.endswith(".biases"))
            if not finite:
                self.out.nonfinite.append(k)
            elif is_proj and info.nbytes and not nonzero:
                self.out.degenerate.append(k)
            self._k += 1
            self._h, self._largest, self._nonzero, self._carry = hashlib.sha256(), 0, False, b""


def scan_head(path: Path, keys: Mapping[str, TensorInfo], *, whole_file: bool = True) -> HeadScan:
    """Digests and data checks of every tensor in ``path``, reading it once from start to end.

    ``whole_file=False`` reads only the tensors named (no whole-file hash): inspect's data check
    of a head that shares its shards with the backbone."""
    scan = HeadScanner(keys, whole_file=whole_file)
    infos = sorted(keys.values(), key=lambda i: i.begin)
    with open(path, "rb") as f:
        for info in infos:
            if not whole_file and info.begin > scan.pos:
                f.seek(info.begin)
                scan.skip_to(info.begin)
            while scan.pos < info.end:
                chunk = f.read(min(info.end - scan.pos, _CHUNK))
                if not chunk:
                    raise OSError(f"{path} is shorter than its header says")
                scan.feed(chunk)
        for chunk in iter(lambda: f.read(_CHUNK), b"") if whole_file else ():
            scan.feed(chunk)
    return scan.result()
