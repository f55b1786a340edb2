"""writer/ahead.py: converting on other threads must not change what is written, nor when an
error or a stop takes effect (the emitters' byte-for-byte tests hold the bytes; these the order,
the errors and the bound on work done ahead)."""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterator

import pytest

from mtpforge.writer.ahead import in_order, run_ahead


def _counted(n: int, seen: list[int], fail_at: int | None = None) -> Iterator[int]:
    for i in range(n):
        if i == fail_at:
            raise ValueError(f"bad item {i}")
        seen.append(i)
        yield i


def test_run_ahead_keeps_the_order_and_raises_where_the_worker_failed() -> None:
    seen: list[int] = []
    assert list(run_ahead(_counted(50, seen))) == list(range(50))
    got: list[int] = []
    with pytest.raises(ValueError, match="bad item 7"):
        for x in run_ahead(_counted(50, [], fail_at=7)):
            got.append(x)
    assert got == list(range(7))  # every item before the failure, none after


def test_a_consumer_that_stops_stops_the_worker_within_the_window() -> None:
    """A write that fails (or Ctrl-C) ends the conversion: the worker computes at most the few
    items the queue holds past the last one taken, then stops, and its thread is gone."""
    seen: list[int] = []
    it = run_ahead(_counted(1000, seen), depth=2)
    for x in it:
        if x == 3:
            break
    it.close()
    assert len(seen) <= 3 + 1 + 2 + 1
    assert not any(t.name == "mtpforge-convert" for t in threading.enumerate())


def _job(i: int, log: list[int]) -> Callable[[], int]:
    def run() -> int:
        time.sleep(0.02 * ((7 * i) % 5))  # later jobs often finish first
        log.append(i)
        if i == 11:
            raise RuntimeError("job 11 failed")
        return i * i

    return run


def test_in_order_returns_results_in_job_order_whatever_finishes_first() -> None:
    log: list[int] = []
    assert list(in_order(_job(i, log) for i in range(10))) == [i * i for i in range(10)]
    assert sorted(log) == list(range(10))


def test_in_order_raises_at_the_failed_job_and_holds_a_bounded_window() -> None:
    log: list[int] = []
    got: list[int] = []
    with pytest.raises(RuntimeError, match="job 11"):
        for r in in_order((_job(i, log) for i in range(100)), window=3):
            got.append(r)
    assert got == [i * i for i in range(11)]
    time.sleep(0.2)  # jobs already running finish; none beyond the window was started
    assert max(log) <= 11 + 3


@pytest.mark.parametrize("given, expected", [("3", 3), ("16", 16), ("0", None), ("many", None), ("", None)])
def test_mtpforge_threads_sets_the_converting_threads_and_a_bad_value_keeps_the_default(
        monkeypatch: pytest.MonkeyPatch, given: str, expected: int | None) -> None:
    import os

    from mtpforge.writer import ahead

    monkeypatch.setenv("MTPFORGE_THREADS", given)
    default = max(1, min(4, os.cpu_count() or 1))
    assert ahead._workers() == (expected if expected is not None else default)


def test_early_sync_flushes_the_callers_buffer_every_stretch_and_keeps_the_bytes(tmp_path) -> None:
    """A large output is synced every ``every`` bytes while it is written (the caller's buffer
    emptied first, in the caller's thread); what is written is unchanged, and a sync that failed
    is raised at the next wait, not lost."""
    import os

    from mtpforge.writer.ahead import EarlySync

    flushed: list[int] = []
    path = tmp_path / "out.bin"
    with open(path, "wb") as f:
        sync = EarlySync(f.fileno(), lambda: (flushed.append(f.tell()), f.flush()), every=4096)
        for i in range(64):
            f.write(bytes([i]) * 1024)
            sync.wrote(1024)
            sync.wait()  # each sync done before the next stretch: every stretch gets one
        f.flush()
    assert len(flushed) == 16 and flushed[0] == 4096 and flushed[-1] == 64 * 1024
    assert path.read_bytes() == b"".join(bytes([i]) * 1024 for i in range(64))
    fd = os.open(path, os.O_RDONLY)
    os.close(fd)
    broken = EarlySync(fd, every=1)
    broken.wrote(1)
    with pytest.raises(OSError):
        broken.wait()
