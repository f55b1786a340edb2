"""Converting while writing: the next chunks of a head are computed in a worker thread while the
caller writes and hashes the last ones.

A giant head's conversion is CPU work (dequantize, cast, quantize: numpy, which releases the GIL)
and I/O work (write, sha256: both release it too); done one after the other they took 4-10x the
time of copying the output's bytes. Run side by side, the slower of the two sets the pace. Order
is kept, at most ``depth`` chunks wait in memory (the bound on peak memory stays a few row
blocks), an error in the worker is raised in the caller at the chunk where it happened, and a
caller that stops early (an error of its own, Ctrl-C) stops the worker before its next chunk.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_DONE = object()


class _Raised:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def run_ahead(items: Iterator[T], depth: int = 2) -> Iterator[T]:
    """``items``, each computed in a worker thread up to ``depth`` ahead of the consumer."""
    q: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                q.put(item)
        except BaseException as e:  # handed to the consumer, raised there
            q.put(_Raised(e))
            return
        q.put(_DONE)

    worker = threading.Thread(target=produce, name="mtpforge-convert", daemon=True)
    worker.start()
    try:
        while True:
            got = q.get()
            if got is _DONE:
                return
            if isinstance(got, _Raised):
                raise got.error
            yield got  # type: ignore[misc]
    finally:
        stop.set()
        while worker.is_alive():  # unblock a worker waiting on a full queue, then let it see stop
            try:
                q.get(timeout=0.05)
            except queue.Empty:
                pass
        worker.join()


def _workers() -> int:
    """Threads converting row blocks: each holds one (a few MB of source, 4x that in float32), so
    memory stays flat in their number. ``MTPFORGE_THREADS`` sets it (a shared machine, a benchmark
    of the scaling); an unusable value falls back to the default rather than failing a long run."""
    given = os.environ.get("MTPFORGE_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, min(4, os.cpu_count() or 1))


WORKERS = _workers()
_POOLS: dict[str, ThreadPoolExecutor] = {}
_POOL_LOCK = threading.Lock()


def named_pool(name: str, workers: int) -> ThreadPoolExecutor:
    """One process-wide pool per job kind, made on first use and never shut down (callers wait
    on their own futures)."""
    with _POOL_LOCK:
        if name not in _POOLS:
            _POOLS[name] = ThreadPoolExecutor(workers, thread_name_prefix=f"mtpforge-{name}")
        return _POOLS[name]


def _pool() -> ThreadPoolExecutor:
    return named_pool("rows", WORKERS)


def side_thread() -> ThreadPoolExecutor:
    """One thread for the work beside a reader's or writer's own: a sha256 of the chunk that just
    passed (hashlib lets go of the GIL on large buffers) runs while the caller reads or writes the
    next. Not the row pool: a hash queued behind row blocks would hold the writer up."""
    return named_pool("side", 1)


def in_order(jobs: Iterator[Callable[[], R]], window: int | None = None) -> Iterator[R]:
    """Each job's result, in the jobs' order, the jobs run on every core with at most ``window``
    (default: one more than the cores) started and not yet taken — the bound on the row blocks
    held at once. Jobs must not wait on other jobs (they share one pool)."""
    pool = _pool()
    window = window or WORKERS + 1
    pending: deque[Future[R]] = deque()
    try:
        for job in jobs:
            pending.append(pool.submit(job))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()


#: bytes written between two early syncs of a large output (``EarlySync``)
SYNC_EVERY = 256 << 20


def _datasync(fd: int) -> None:
    (getattr(os, "fdatasync", None) or os.fsync)(fd)  # macOS has no fdatasync


class EarlySync:
    """Starts a large output's bytes on their way to the disk while later ones are still being
    converted: every ``every`` bytes the file is synced in a thread of its own. The commit's own
    fsync then has only the last stretch left, where it had the whole file — on a giant head it
    cost as long as writing it, after all the conversion was done. Durability is unchanged: the
    final fsync still comes before the rename. ``flush``: the caller's buffer, emptied first (in
    the caller's thread: a buffered file is not shared between threads)."""

    def __init__(self, fd: int, flush: Callable[[], None] | None = None, every: int = SYNC_EVERY) -> None:
        self._fd, self._flush, self._every = fd, flush, every
        self._since = 0
        self._pending: Future[None] | None = None

    def wrote(self, n: int) -> None:
        self._since += n
        if self._since < self._every or (self._pending is not None and not self._pending.done()):
            return  # a sync still running covers these bytes' neighbours: the next one takes them
        self.wait()
        if self._flush is not None:
            self._flush()
        self._since = 0
        self._pending = named_pool("sync", 1).submit(_datasync, self._fd)

    def wait(self) -> None:
        """The running sync finished (its error raised here): before the final fsync or a close."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()


__all__ = ["run_ahead", "in_order", "side_thread", "named_pool", "EarlySync"]
