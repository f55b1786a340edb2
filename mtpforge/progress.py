"""Progress for long work (rich, on stderr), silent for machines (``--json``)."""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn, TransferSpeedColumn


class Progress:
    """Steps, done lines and byte bars of one command. Bars open at the same time (a Hub source's
    download in its own thread beside the conversion that reads it) share one live display, one
    line each: rich allows one live display at a time, and a conversion bar alone would sit at
    zero while the download it waits for made progress nobody saw."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.console = Console(stderr=True)
        self._lock = threading.Lock()
        self._live: RichProgress | None = None
        self._bars = 0

    def step(self, text: str) -> None:
        from .interrupts import check

        check()  # a Ctrl-C a library's finalizer swallowed stops the command here
        if self.enabled:
            self.console.print(f"[bold cyan]•[/bold cyan] {text}")

    def done(self, text: str) -> None:
        if self.enabled:
            self.console.print(f"[bold green]✓[/bold green] {text}")

    @contextlib.contextmanager
    def bytes_bar(self, label: str, total: int) -> Iterator[Callable[[int], None]]:
        if not self.enabled or not self.console.is_terminal:  # a log gets no bar (rich leaves a blank line there)
            yield lambda n: None
            return
        with self._lock:
            if self._live is None:
                cols = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        TimeRemainingColumn())
                self._live = RichProgress(*cols, console=self.console, transient=True)
                self._live.start()
            live, self._bars = self._live, self._bars + 1
            task = live.add_task(label, total=total)
        try:
            yield lambda n: live.advance(task, n)
        finally:
            with self._lock:
                live.remove_task(task)
                self._bars -= 1
                if not self._bars:
                    live.stop()
                    self._live = None


class TqdmBridge:
    """Stands in for tqdm where huggingface_hub draws its own bar (``hf_hub_download(tqdm_class=
    functools.partial(TqdmBridge, advance=...))``): its byte counts go to our rich bar, so a run
    shows one style of progress, and nothing when progress is off (``--json``)."""

    def __init__(self, *args: object, advance: Callable[[int], None] = lambda n: None, **kwargs: object) -> None:
        self._advance = advance
        self.n = int(kwargs.get("initial", 0) or 0)  # type: ignore[call-overload]
        self.total = kwargs.get("total")

    def update(self, n: float | None = 1) -> None:
        if n:
            self.n += int(n)
            self._advance(int(n))

    def close(self) -> None:
        pass

    def __enter__(self) -> "TqdmBridge":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
