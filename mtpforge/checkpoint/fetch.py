"""Get the bytes of a few tensors of a remote checkpoint onto local disk, once.

``ranges`` downloads only the wanted byte spans: neighbouring tensors are coalesced into runs
(one Range request each) while the bytes in between stay under 1 % of the wanted bytes, so a
head spread over thousands of contiguous expert tensors costs a handful of requests — one per
512 MiB at most (``RUN_CAP``: what an interrupted run costs again). Each run
lands in ``<HF_HUB_CACHE>/mtpforge-ranges/<repo>/<commit>/ranges/<file>/<start>-<end>.bin``,
written to a temp file and renamed only when complete and of the right length — so what the
cache holds is always whole, a second run downloads nothing, and a run that failed half-way
leaves the finished runs behind for the next one to reuse.

``shards`` downloads whole shards with ``hf_hub_download`` into the ordinary HF cache (where
other tools find them too). ``auto`` is ``ranges``, switching to ``shards`` when the server
answers a Range request with the whole file — noticed from the status line, before any of that
body is read — and to ``stream`` (``stream_fetch``: nothing cached) where the disk has no room
for the cache beside the head.

Memory: everything streams to disk in 1 MiB chunks; nothing here holds a run or shard in memory.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import struct
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote

import httpx2
from huggingface_hub import constants, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError

from ..cells import counted
from ..errors import InputError, NetworkError, RefusedError
from ..progress import Progress, TqdmBridge
from ..writer.atomic import check_download_room
from ..writer.uncached import UncachedAppender
from .hub import HubStore, RangeIgnoredError, snapshot_file, hub_errors, repo_cache_dir, retry_wait, stream_range
from .safetensors_header import TensorInfo
from .store import Store

MODES = ("auto", "ranges", "stream", "shards")
#: bytes between wanted tensors that a run may carry along, as a share of the wanted bytes
SLACK = 0.01
#: the most one run asks for, cut between tensors (a tensor larger than this is a run of its own):
#: a run cut short (Ctrl-C, a link lost past the retries) is downloaded again whole, and a giant
#: head lies in runs of gigabytes, so this bounds what an interruption costs — a few more requests
RUN_CAP = 512 << 20
_RUN = re.compile(r"^(\d+)-(\d+)\.bin$")
#: temp files of killed runs older than this are removed
STALE_PART_SECONDS = 3600


@dataclass
class FetchResult:
    mode: str  # "ranges" | "shards" | "ranges+shards" | "cached": how this run obtained the bytes
    fetched_bytes: int  # tensor-data bytes downloaded by this run (0 when everything was cached)
    where: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    requests: int = 0


@dataclass(frozen=True)
class Run:
    """A byte span of one file fetched with one Range request."""

    file: str
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def plan_runs(infos: list[TensorInfo], slack: float = SLACK, cap: int = RUN_CAP) -> list[Run]:
    """Coalesce tensors into runs: touching spans merge; gaps are bridged smallest first while
    the bridged bytes stay within ``slack`` x the wanted bytes (so transfer <= 1.01x); then each
    run is cut between tensors into pieces of at most ``cap`` bytes (``RUN_CAP``)."""
    by_file: dict[str, list[tuple[int, int]]] = {}
    for i in infos:
        by_file.setdefault(i.file, []).append((i.begin, i.end))
    segs: dict[str, list[list[int]]] = {}
    for f, spans in by_file.items():
        merged: list[list[int]] = []
        for a, b in sorted(spans):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        segs[f] = merged
    wanted = sum(b - a for m in segs.values() for a, b in m)
    budget = int(wanted * slack)
    gaps = sorted((m[k + 1][0] - m[k][1], f, k) for f, m in segs.items() for k in range(len(m) - 1))
    bridged: set[tuple[str, int]] = set()
    for size, f, k in gaps:
        if size > budget:
            break
        budget -= size
        bridged.add((f, k))
    runs: list[Run] = []
    for f in sorted(segs):
        m, spans = segs[f], sorted(by_file[f])
        a = m[0][0]
        for k in range(len(m)):
            if (f, k) not in bridged:
                runs += _cut(Run(f, a, m[k][1]), spans, cap)
                if k + 1 < len(m):
                    a = m[k + 1][0]
    return runs


def _cut(run: Run, spans: list[tuple[int, int]], cap: int) -> list[Run]:
    """``run`` in pieces of at most ``cap`` bytes, each cut where a tensor begins (a piece ends
    where its last tensor does; a tensor larger than ``cap`` is a piece of its own)."""
    if run.nbytes <= cap:
        return [run]
    pieces: list[Run] = []
    start = end = run.start
    for a, b in spans:
        if b <= run.start or a >= run.end:
            continue
        if end > start and b - start > cap:
            pieces.append(Run(run.file, start, end))
            start = a
        end = max(end, b)
    pieces.append(Run(run.file, start, run.end))
    return pieces


class RangeCache:
    """Completed runs of one commit, on disk. A file named ``<start>-<end>.bin`` of exactly
    ``end - start`` bytes is complete by construction (temp file + ``os.replace``)."""

    def __init__(self, repo_id: str, commit: str) -> None:
        self.root = repo_cache_dir(repo_id) / commit / "ranges"

    def dir(self, file: str) -> Path:
        return self.root / quote(file, safe="")

    def runs(self, file: str) -> list[tuple[int, int, Path]]:
        d = self.dir(file)
        out = []
        with contextlib.suppress(FileNotFoundError):
            for p in d.iterdir():
                m = _RUN.match(p.name)
                if m is None:
                    if p.name.endswith(".part"):
                        with contextlib.suppress(OSError):
                            if time.time() - p.stat().st_mtime > STALE_PART_SECONDS:
                                p.unlink()
                    continue
                a, b = int(m.group(1)), int(m.group(2))
                with contextlib.suppress(OSError):
                    if p.stat().st_size == b - a:
                        out.append((a, b, p))
        return out

    def find(self, info: TensorInfo, runs: list[tuple[int, int, Path]]) -> tuple[str, int, int] | None:
        for a, b, p in runs:
            if a <= info.begin and info.end <= b:
                return str(p), info.begin - a, info.nbytes
        return None

    def path(self, run: Run) -> Path:
        return self.dir(run.file) / f"{run.start}-{run.end}.bin"


def _download_run(store: HubStore, run: Run, dest: Path, advance) -> tuple[Path, int]:
    """Download one run into a temporary file beside ``dest``; return it and the body bytes
    received. ``_settle_run`` makes it part of the cache."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")
    try:
        with open(tmp, "wb") as f:
            # past the page cache where the platform has a way: the conversion reads these bytes
            # once, straight from the disk (checkpoint.direct_read), and the kernel's copy into its
            # cache was a giant head's largest cost while it downloads
            direct = UncachedAppender.open(tmp, f.fileno(), 0, b"", pool="direct-fetch")
            try:
                received = stream_range(store.url(run.file), run.start, run.end, direct or f,
                                        file_size=store.size(run.file), what=f"{run.file} of {store.short_name}",
                                        on_bytes=advance)
                if direct is not None:
                    direct.finish()
            finally:
                if direct is not None:
                    direct.close()
        return tmp, received
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _settle_run(tmp: Path, dest: Path, run: Run) -> None:
    """The run on disk (fsync), of the right length, renamed into the cache: the cache holds whole
    runs only. It runs in a second thread, so that the disk's write-back of one run overlaps the
    download of the next (the two were a giant head's fetch time, one after the other)."""
    try:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if tmp.stat().st_size != run.nbytes:
            raise NetworkError(f"{run.file}: wrote {tmp.stat().st_size} of {run.nbytes} bytes", "retry")
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _fetch_runs(store: HubStore, cache: RangeCache, runs: list[Run], advance,
                next_run: Callable[[list[Run]], int] | None = None) -> Iterator[tuple[Run, Path, int]]:
    """Each run downloaded and settled (``_settle_run`` one run behind the download), yielded
    once it is in the cache; ``next_run`` picks which of the runs left goes next (default: in
    order). A failure stops the downloads; the runs already downloaded are still settled, for
    the next try to reuse."""
    left = list(runs)
    with ThreadPoolExecutor(1, thread_name_prefix="mtpforge-settle") as settle:
        pending: deque[tuple[Run, Path, int, Future[None]]] = deque()
        while left:
            run = left.pop(next_run(left) if next_run is not None else 0)
            dest = cache.path(run)
            with hub_errors(store.repo_id, store.commit):
                tmp, received = _download_run(store, run, dest, advance)
            pending.append((run, dest, received, settle.submit(_settle_run, tmp, dest, run)))
            while pending and pending[0][3].done():
                yield _settled(store, pending.popleft())
        while pending:
            yield _settled(store, pending.popleft())


def _settled(store: HubStore, item: tuple[Run, Path, int, "Future[None]"]) -> tuple[Run, Path, int]:
    run, dest, received, done = item
    with hub_errors(store.repo_id, store.commit):
        done.result()
    return run, dest, received


def _data_bytes(path: str) -> int:
    """Tensor-data bytes of a local safetensors file (what a whole-shard download carried)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8:
        return size
    (n,) = struct.unpack("<Q", head)
    return max(0, size - min(size, 8 + n))


def _cached_shard(store: HubStore, file: str) -> str | None:
    return snapshot_file(store.repo_id, store.commit, file, store.size(file))


def _transient(e: BaseException) -> bool:
    if isinstance(e, httpx2.TransportError):
        return True
    if isinstance(e, HfHubHTTPError):
        return e.response is not None and e.response.status_code >= 500
    return isinstance(e, OSError) and "Consistency check failed" in str(e)


def _download_shard(store: HubStore, file: str, advance) -> str:
    """``hf_hub_download`` with a bounded retry on transient failures (its GET itself retries
    only 408/429 and resumes dropped connections)."""
    bridge = functools.partial(TqdmBridge, advance=advance)
    attempts = 4
    for attempt in range(attempts):
        with hub_errors(store.repo_id, store.commit):
            try:
                return hf_hub_download(store.repo_id, file, revision=store.commit, tqdm_class=bridge)  # type: ignore[arg-type]
            except Exception as e:
                if attempt == attempts - 1 or not _transient(e):
                    raise
        time.sleep(retry_wait() * 2 ** attempt)
    raise AssertionError("unreachable")


class FetchCancelled(Exception):
    """The conversion reading a background fetch stopped (an error of its own, Ctrl-C)."""


def fetch_tensors(store: Store, infos: list[TensorInfo], *, mode: str = "auto", progress: bool | Progress = True,
                  on_ready: Callable[[str, tuple[str, int, int]], None] | None = None,
                  cancel: threading.Event | None = None, wanted: Callable[[], str | None] | None = None,
                  beside: tuple[Path, int] | None = None) -> FetchResult:
    """Make the bytes of ``infos`` available locally; see the module docstring. ``on_ready(name,
    where)`` is told of each tensor the moment its bytes are on disk, ``cancel`` stops the
    downloads at their next chunk, and ``wanted()`` names the tensor a reader waits for, whose
    run is downloaded next (:class:`BackgroundFetch`). ``progress`` may be the command's own,
    whose display the download's bar then shares; ``beside`` (the output's folder and size) counts
    in the download's room check where it shares the cache's disk."""
    if mode not in MODES:
        raise InputError(f"--fetch must be one of {', '.join(MODES)}, not {mode!r}", "use --fetch auto")
    if not isinstance(store, HubStore):
        raise InputError(f"{store.name} is not a Hub repo", "local sources are read in place")
    prog = progress if isinstance(progress, Progress) else Progress(enabled=progress)
    unique = list({i.name: i for i in infos}.values())
    res = FetchResult(mode="cached", fetched_bytes=0)

    def located(name: str, where: tuple[str, int, int]) -> None:
        res.where[name] = where
        if on_ready is not None:
            on_ready(name, where)

    advancing = prog.bytes_bar if cancel is None else _cancellable(prog.bytes_bar, cancel)

    # 1. what earlier runs left: cached runs, then whole shards in the HF cache
    cache = RangeCache(store.repo_id, store.commit)
    missing = _left_by_earlier_runs(store, cache, unique, located)
    if not missing:
        return res
    if store.offline:
        raise offline_miss(store, len(missing))

    # 2. ranges
    if mode in ("auto", "ranges"):
        runs = plan_runs(missing)
        need = sum(r.nbytes for r in runs)
        check_download_room(cache.root, need, beside)
        try:
            with advancing("downloading MTP tensors", need) as advance:
                for run, dest, received in _fetch_runs(store, cache, runs, advance, _by_want(missing, wanted)):
                    res.fetched_bytes += received
                    res.requests += 1
                    res.mode = "ranges"
                    for i in missing:
                        if i.file == run.file and run.start <= i.begin and i.end <= run.end:
                            located(i.name, (str(dest), i.begin - run.start, i.nbytes))
        except RangeIgnoredError:
            if mode == "ranges":
                raise
        missing = [i for i in missing if i.name not in res.where]
        if not missing:
            return res

    # 3. whole shards (asked for, or the server ignores Range)
    files = sorted({i.file for i in missing})
    need = sum(store.size(f) for f in files)
    check_download_room(Path(constants.HF_HUB_CACHE), need, beside)
    with advancing(f"downloading {counted(len(files), 'shard')}", need) as advance:
        for f in files:
            path = _download_shard(store, f, advance)
            if os.path.getsize(path) != store.size(f):
                raise NetworkError(f"{f} of {store.name} arrived with {os.path.getsize(path)} bytes, not {store.size(f)}",
                                   "delete it from the HF cache and retry")
            res.fetched_bytes += _data_bytes(path)
            res.requests += 1
            for i in missing:
                if i.file == f:
                    located(i.name, (path, i.begin, i.nbytes))
    res.mode = "ranges+shards" if res.mode == "ranges" else "shards"
    return res


def offline_miss(store: HubStore, n: int) -> NetworkError:
    """The one line for tensors a download would need while ``HF_HUB_OFFLINE`` forbids it (every
    fetch mode says the same)."""
    return NetworkError(f"HF_HUB_OFFLINE is set and {n} MTP tensors of {store.name} are not cached",
                        "unset HF_HUB_OFFLINE to download them, or run once online to fill the cache")


def no_room_to_cache(store: HubStore, infos: list[TensorInfo], beside: tuple[Path, int] | None) -> bool:
    """Whether ``--fetch ranges`` would be refused before downloading, its cache and the head not
    fitting on their disk: ``auto`` streams then (``stream_fetch``), which needs room for the head
    alone — a giant's 12 GB download beside its 24 GB head is what a full internal disk cannot
    take, while the head alone it can."""
    cache = RangeCache(store.repo_id, store.commit)
    missing = _left_by_earlier_runs(store, cache, list({i.name: i for i in infos}.values()), lambda name, where: None)
    if not missing:
        return False
    try:
        check_download_room(cache.root, sum(r.nbytes for r in plan_runs(missing)), beside)
    except RefusedError as e:
        if e.code == "NO_SPACE":
            return True
        raise
    return False


def _left_by_earlier_runs(store: HubStore, cache: RangeCache, infos: list[TensorInfo],
                          located: Callable[[str, tuple[str, int, int]], None]) -> list[TensorInfo]:
    """Locates what earlier runs left (cached runs, then whole shards in the HF cache); returns
    the tensors still to download."""
    runs_on_disk = {f: cache.runs(f) for f in {i.file for i in infos}}
    missing = []
    for i in infos:
        hit = cache.find(i, runs_on_disk[i.file])
        if hit is not None:
            located(i.name, hit)
        else:
            missing.append(i)
    found = set()
    for f in sorted({i.file for i in missing}):
        shard = _cached_shard(store, f)
        if shard is not None:
            for i in missing:
                if i.file == f:
                    located(i.name, (shard, i.begin, i.nbytes))
                    found.add(i.name)
    return [i for i in missing if i.name not in found]


def _cancellable(bar: Callable[[str, int], Any], cancel: threading.Event) -> Callable[[str, int], Any]:
    """A progress bar whose every advance raises :class:`FetchCancelled` once ``cancel`` is set:
    the download stops at its next chunk (a run's temporary file is removed as on any error)."""

    @contextlib.contextmanager
    def bytes_bar(label: str, total: int) -> Iterator[Callable[[int], None]]:
        with bar(label, total) as advance:
            def checked(n: int) -> None:
                if cancel.is_set():
                    raise FetchCancelled()
                advance(n)
            yield checked

    return bytes_bar


def _by_want(missing: list[TensorInfo], wanted: Callable[[], str | None] | None) -> Callable[[list[Run]], int] | None:
    """The next run: the one holding the tensor a reader waits for, else the first left."""
    if wanted is None:
        return None
    spans = {i.name: (i.file, i.begin, i.end) for i in missing}

    def pick(left: list[Run]) -> int:
        name = wanted()
        if name in spans:
            f, a, b = spans[name]
            for k, run in enumerate(left):
                if run.file == f and run.start <= a and b <= run.end:
                    return k
        return 0

    return pick


class BackgroundFetch:
    """``fetch_tensors`` in a thread of its own while the conversion reads: a tensor is read as
    soon as the run holding it is in the cache, and the run a read waits for is downloaded next,
    so the download and the conversion overlap (one after the other, the download was a third of
    a giant head's time from the Hub). An error of the fetch is raised at the read that waits
    for it (the same error the fetch would have raised before); ``close`` stops the downloads."""

    def __init__(self, store: Store, infos: list[TensorInfo], mode: str, progress: Progress | None = None,
                 beside: tuple[Path, int] | None = None) -> None:
        self._where: dict[str, tuple[str, int, int]] = {}
        self._cv = threading.Condition()
        self._error: BaseException | None = None
        self._result: FetchResult | None = None
        self._waiting: str | None = None
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(store, infos, mode, progress or False, beside),
                                        name="mtpforge-fetch", daemon=True)
        self._thread.start()

    def _run(self, store: Store, infos: list[TensorInfo], mode: str, progress: bool | Progress,
             beside: tuple[Path, int] | None) -> None:
        try:
            res = fetch_tensors(store, infos, mode=mode, progress=progress, on_ready=self._ready, cancel=self._cancel,
                                wanted=lambda: self._waiting, beside=beside)
        except BaseException as e:  # raised in the reader, where the command handles it
            with self._cv:
                self._error = e
                self._cv.notify_all()
        else:
            with self._cv:
                self._result = res
                self._cv.notify_all()

    def _ready(self, name: str, where: tuple[str, int, int]) -> None:
        with self._cv:
            self._where[name] = where
            self._cv.notify_all()

    def locate(self, name: str) -> tuple[str, int, int]:
        """Where the tensor's bytes are, once they are (waits for them)."""
        with self._cv:
            while name not in self._where:
                if self._error is not None:
                    raise self._error
                if self._result is not None:
                    raise RefusedError(f"tensor {name} was not fetched", "re-run; report it if it repeats")
                self._waiting = name
                self._cv.wait(0.2)  # a timeout: a Ctrl-C reaches this thread between waits
            return self._where[name]

    def result(self) -> FetchResult:
        """The fetch's result, once every read is done (waits for the downloads to end)."""
        with self._cv:
            while self._result is None and self._error is None:
                self._cv.wait(0.2)
            if self._error is not None:
                raise self._error
            assert self._result is not None
            return self._result

    def close(self) -> None:
        """Stop the downloads (a finished fetch has nothing left to stop)."""
        self._cancel.set()
        self._thread.join(timeout=5)


__all__ = ["BackgroundFetch", "FetchResult", "Run", "RangeCache", "fetch_tensors", "no_room_to_cache", "plan_runs", "MODES",
           "RUN_CAP", "SLACK"]
