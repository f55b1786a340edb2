"""A remote head's bytes streamed into memory in the order the conversion reads them
(``--fetch stream``): nothing of the source reaches the disk.

``--fetch ranges`` keeps every run it downloads in a cache on disk (a second run, or one after an
interruption, downloads nothing again) — which writes the head's bytes once more than the output
does and reads them back. Where the link is fast and the disk is what limits (a mirror on the
LAN; the loopback benchmark of a full-size DeepSeek-V3.2 head, whose disk took the 11.7 GB of the
download beside the 23.6 GB of the f16 output at ~1.1 GB/s throughout), that second write is a
third of the run. Here each tensor (with its block scale, a neighbour in the file) is one Range
request, asked for in the order the conversion reads the tensors, held in memory until the
conversion has read all of it, and dropped: at most ``WINDOW`` bytes ahead of the reader. The cost
is what the cache buys: an interrupted run downloads again whatever it had, and each tensor is a
request of its own (hundreds for a giant head's experts, where ``ranges`` makes a few dozen).

Runs an earlier ``--fetch ranges`` left in the cache, and whole shards in the HF cache, are read
from there, as every mode does.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from ..errors import NetworkError, RefusedError
from ..progress import Progress
from .direct_read import read_span
from .fetch import FetchCancelled, FetchResult, RangeCache, Run, _cancellable, _left_by_earlier_runs, offline_miss
from .hub import HubStore, RangeIgnoredError, hub_errors, stream_range
from .safetensors_header import TensorInfo

#: bytes downloaded ahead of what the conversion has read (a tensor the reader waits for is
#: fetched past it): enough to keep the link busy while a few expert matrices convert
WINDOW = 256 << 20
#: the most requests in flight at once. A giant head is hundreds of requests, and on the real Hub
#: each is a redirect and a round trip to the CDN before its first byte: one at a time, that wait
#: would add up to minutes. Where it does not (a fast link, the loopback benchmark), every
#: connection more costs CPU — measured over a full-size head's 11.7 GB from the loopback hub: 6.9 s
#: with one, 10.3 s with two, 12.2 s with four. So a download starts with one connection and opens
#: another (up to this many) each time ``SLOW_STARTS`` requests in a row waited for their first
#: byte more than ``LATENCY`` of their whole time and more than ``ROUND_TRIP`` seconds (a loopback
#: or LAN answer comes in a few ms, a CDN's after tens to hundreds; one slow answer in a row is as
#: likely the process's own cores busy converting, where another connection only costs more).
CONNECTIONS = 4
LATENCY = 0.25
ROUND_TRIP = 0.03
SLOW_STARTS = 3


@dataclass(frozen=True)
class Group:
    """Tensors read one after the other that lie side by side in one file: one request."""

    run: Run
    tensors: tuple[TensorInfo, ...]


def stream_groups(infos: list[TensorInfo], cap: int = WINDOW // 4) -> list[Group]:
    """``infos`` in the order given, neighbours in that order that touch in the file (a weight
    and its block scale; a layer's small norms) joined into one request of at most ``cap``
    bytes — a part of the window, which holds whole requests (a tensor larger than ``cap`` is a
    request of its own)."""
    groups: list[Group] = []
    for i in infos:
        if groups:
            g = groups[-1]
            r = g.run
            if i.file == r.file and r.nbytes + i.nbytes <= cap and (i.begin == r.end or i.end == r.start):
                groups[-1] = Group(Run(r.file, min(r.start, i.begin), max(r.end, i.end)), g.tensors + (i,))
                continue
        groups.append(Group(Run(i.file, i.begin, i.end), (i,)))
    return groups


class _Memory:
    """The body of one request, written into the first ``n`` bytes of ``buf`` (at least that long)."""

    def __init__(self, buf: bytearray, n: int) -> None:
        self.view, self.pos = memoryview(buf)[:n], 0

    def write(self, b: "bytes | memoryview") -> int:
        n = len(b)
        self.view[self.pos:self.pos + n] = b
        self.pos += n
        return n


def _unshared(buf: bytearray) -> bool:
    """Whether nothing refers into ``buf`` any more: a bytearray refuses to change its size while
    any view of it lives (a conversion job's array over a tensor's bytes), so a one-byte shrink
    and its undoing, which move no memory, tell."""
    try:
        last = buf.pop()
    except BufferError:
        return False
    buf.append(last)
    return True


class _Buffers:
    """Request buffers used again once free. A fresh 15 MB buffer for each expert's request cost
    the kernel fresh pages every time (faults, zeroing, and with several connections the unmapping's
    cross-core flushes): measured over a full-size head's 11.7 GB, the download alone took 11.3 s
    of CPU with fresh buffers and 6.1 s with reused ones (one connection). A buffer returned while
    a reader still holds a view of it waits here until the view is gone; at most ``keep`` wait."""

    def __init__(self, keep: int) -> None:
        self._idle: list[bytearray] = []
        self._keep = keep
        self._lock = threading.Lock()

    def take(self, n: int) -> bytearray:
        """The smallest free buffer of at least ``n`` bytes, else a new one."""
        with self._lock:
            fits = sorted((len(b), k) for k, b in enumerate(self._idle) if n <= len(b) <= 2 * n)
            for _, k in fits:
                if _unshared(self._idle[k]):
                    return self._idle.pop(k)
        return bytearray(n)

    def give(self, buf: bytearray) -> None:
        with self._lock:
            self._idle.append(buf)
            if len(self._idle) > self._keep:
                self._idle.pop(0)


class StreamFetch:
    """The downloads in threads of their own (one, up to ``CONNECTIONS`` where requests wait for
    their first byte), ``WINDOW`` ahead of the reads (the
    room of a request is taken when it starts, so the requests in flight count); the interface of
    ``fetch.BackgroundFetch`` as ``source.SourceBytes`` uses it (``read``, ``result``, ``close``).
    A tensor is dropped, once its every byte has been read, when the window needs its room; one
    read again after that is downloaded again, and counted."""

    def __init__(self, store: HubStore, infos: list[TensorInfo], progress: Progress | None = None,
                 window: int | None = None, connections: int = CONNECTIONS) -> None:
        window = window or WINDOW
        self._store, self._window = store, window
        unique = list({i.name: i for i in infos}.values())
        self._cached: dict[str, tuple[str, int, int]] = {}
        left = _left_by_earlier_runs(store, RangeCache(store.repo_id, store.commit), unique,
                                     lambda name, where: self._cached.__setitem__(name, where))
        self._groups = stream_groups([i for i in left if i.nbytes], cap=window // 4)
        self._group_of = {t.name: k for k, g in enumerate(self._groups) for t in g.tensors}
        self._held: dict[str, memoryview] = {}
        self._spans: dict[str, list[tuple[int, int]]] = {}
        self._held_bytes = 0
        self._dropped: set[str] = set()
        self._read_whole: OrderedDict[str, None] = OrderedDict()
        self._taken: set[int] = set()
        self._buf_of: dict[int, bytearray] = {}
        self._live: dict[int, int] = {}
        self._buffers = _Buffers(keep=2 * connections + 2)
        self._waiting: str | None = None
        self._cv = threading.Condition()
        self._error: BaseException | None = None
        self._cancel = threading.Event()
        self.fetched = 0
        self.requests = 0
        if left and store.offline:
            raise offline_miss(store, len(left))
        self._most = connections
        self._slow = 0
        self._running = 0
        bar = _cancellable((progress or Progress(enabled=False)).bytes_bar, self._cancel)
        self._bar = bar("downloading MTP tensors", sum(g.run.nbytes for g in self._groups)) if self._groups else None
        self._advance = self._bar.__enter__() if self._bar is not None else None
        self._threads: list[threading.Thread] = []
        self._connect()

    def _connect(self) -> None:
        """One connection more (the lock held, or before any runs)."""
        t = threading.Thread(target=self._run, name=f"mtpforge-stream-{len(self._threads)}", daemon=True)
        self._threads.append(t)
        self._running += 1
        t.start()

    @property
    def connections(self) -> int:
        """How many connections the download opened."""
        return len(self._threads)

    # ------------------------------------------------------------------ the downloading thread

    def _run(self) -> None:
        """One connection's loop: the next group, downloaded, handed to the readers; another
        connection opened when this one's requests mostly wait for their first byte."""
        try:
            while (k := self._next()) is not None:
                buf = self._buffers.take(self._groups[k].run.nbytes)
                first: list[float] = []

                def advance(n: int) -> None:
                    if not first:
                        first.append(time.perf_counter())
                    if self._advance is not None:
                        self._advance(n)

                t0 = time.perf_counter()
                body = self._download(self._groups[k].run, advance, buf)
                waited, took = (first[0] if first else t0) - t0, time.perf_counter() - t0
                self._take(k, buf, body)
                with self._cv:
                    self._slow = self._slow + 1 if waited > max(LATENCY * took, ROUND_TRIP) else 0
                    if self._slow >= SLOW_STARTS and len(self._threads) < self._most and len(self._taken) < len(self._groups):
                        self._slow = 0
                        self._connect()
        except BaseException as e:  # raised in the reader, where the command handles it
            with self._cv:
                if self._error is None:
                    self._error = e
                self._cancel.set()  # the other connections stop too
                self._cv.notify_all()
        finally:
            with self._cv:
                self._running -= 1
                self._cv.notify_all()

    def _next(self) -> int | None:
        """The group the reader waits for, else the first not yet taken once the window has room."""
        with self._cv:
            while True:
                if self._cancel.is_set():
                    if self._error is not None:
                        return None  # another connection failed: its error is the one raised
                    raise FetchCancelled()
                want = self._group_of.get(self._waiting) if self._waiting not in self._held else None
                if want is not None and want not in self._taken:
                    k = want
                else:
                    k = next((j for j in range(len(self._groups)) if j not in self._taken), None)
                    if k is None:
                        return None
                    size = self._groups[k].run.nbytes
                    while self._read_whole and self._held_bytes + size > self._window:
                        self._drop(next(iter(self._read_whole)))
                    if self._held_bytes and self._held_bytes + size > self._window:
                        self._cv.wait(0.2)
                        continue
                self._taken.add(k)
                self._held_bytes += self._groups[k].run.nbytes  # its room is taken from now, not on arrival
                return k

    def _download(self, run: Run, advance, buf: bytearray | None = None) -> memoryview:
        sink = _Memory(buf if buf is not None else bytearray(run.nbytes), run.nbytes)
        with hub_errors(self._store.repo_id, self._store.commit):
            try:
                received = stream_range(self._store.url(run.file), run.start, run.end, sink,
                                        file_size=self._store.size(run.file),
                                        what=f"{run.file} of {self._store.short_name}", on_bytes=advance)
            except RangeIgnoredError as e:
                raise NetworkError(f"{e.message}; --fetch stream needs Range requests",
                                   "use --fetch shards (downloads whole shards) or --fetch auto") from None
        with self._cv:
            self.fetched += received
            self.requests += 1
        return sink.view

    def _take(self, k: int, buf: bytearray, body: memoryview) -> None:
        g = self._groups[k]
        with self._cv:
            self._buf_of[k], self._live[k] = buf, len(g.tensors)
            for t in g.tensors:
                self._held[t.name] = body[t.begin - g.run.start:t.end - g.run.start]
                self._spans[t.name] = []
            self._cv.notify_all()

    # ------------------------------------------------------------------ the reader's side

    def read(self, info: TensorInfo, a: int, b: int) -> memoryview | bytes:
        """Bytes ``[a, b)`` of tensor ``info`` (waits for its download)."""
        where = self._cached.get(info.name)
        if a == b:
            return b""
        if where is not None:
            path, off, _ = where
            return read_span(path, off + a, b - a)
        with self._cv:
            while info.name not in self._held:
                if self._error is not None:
                    raise self._error
                k = self._group_of.get(info.name)
                if k is None:
                    raise RefusedError(f"tensor {info.name} was not planned for download", "report this as a bug")
                if info.name in self._dropped:
                    break  # read in full and dropped before: downloaded again below
                self._waiting = info.name
                self._cv.wait(0.2)  # a timeout: a Ctrl-C reaches this thread between waits
            view = self._held.get(info.name)
        if view is None:
            return self._again(info, a, b)
        self._consumed(info, a, b)
        return view[a:b]

    def _again(self, info: TensorInfo, a: int, b: int) -> memoryview:
        """A span of a tensor already read in full and dropped, downloaded on its own."""
        return self._download(Run(info.file, info.begin + a, info.begin + b), None)

    def _consumed(self, info: TensorInfo, a: int, b: int) -> None:
        """A tensor whose every byte has been read may go when the window needs room, the one
        read whole longest ago first: not at once, since another output may read it again (a
        split's second half, a block scale two outputs share)."""
        with self._cv:
            spans = self._spans.get(info.name)
            if spans is None:
                if info.name in self._read_whole:
                    self._read_whole.move_to_end(info.name)
                return
            spans.append((a, b))
            spans.sort()
            covered, reach = 0, 0
            for s, e in spans:
                if e > reach:
                    covered += e - max(s, reach)
                    reach = e
            if covered >= info.nbytes:
                del self._spans[info.name]
                self._read_whole[info.name] = None
                self._cv.notify_all()

    def _drop(self, name: str) -> None:
        """Room in the window: the tensor read whole longest ago goes (with the lock held)."""
        view = self._held.pop(name)
        del self._read_whole[name]
        self._dropped.add(name)
        self._held_bytes -= len(view)
        k = self._group_of[name]
        self._live[k] -= 1
        if not self._live[k]:
            self._buffers.give(self._buf_of.pop(k))

    def result(self) -> FetchResult:
        """What was downloaded, once every read is done (waits for the downloads to end)."""
        with self._cv:
            while self._running:  # the first connection starts in __init__: none left is the end
                self._cv.wait(0.2)
            if self._error is not None:
                raise self._error
            mode = "stream" if self.requests else "cached"
            return FetchResult(mode=mode, fetched_bytes=self.fetched, where=dict(self._cached), requests=self.requests)

    def close(self) -> None:
        """Stop the downloads (a finished fetch has nothing left to stop)."""
        self._cancel.set()
        for t in self._threads:
            t.join(timeout=5)
        if self._bar is not None:
            bar, self._bar = self._bar, None
            bar.__exit__(None, None, None)


def planned_stream_requests(infos: list[TensorInfo]) -> int:
    """The requests ``StreamFetch`` makes for ``infos`` with nothing cached."""
    return len(stream_groups(list({i.name: i for i in infos}.values())))


__all__ = ["StreamFetch", "stream_groups", "planned_stream_requests", "WINDOW", "CONNECTIONS", "LATENCY", "Group"]
