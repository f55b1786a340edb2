"""Progress for long work (rich, on stderr), silent for machines (``--json``)."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn, TransferSpeedColumn


class Progress:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.console = Console(stderr=True)

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
        cols = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
        with RichProgress(*cols, console=self.console, transient=True) as p:
            task = p.add_task(label, total=total)
            yield lambda n: p.advance(task, n)


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
