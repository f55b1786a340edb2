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
        if self.enabled:
            self.console.print(f"[bold cyan]•[/bold cyan] {text}")

    def done(self, text: str) -> None:
        if self.enabled:
            self.console.print(f"[bold green]✓[/bold green] {text}")

    @contextlib.contextmanager
    def bytes_bar(self, label: str, total: int) -> Iterator[Callable[[int], None]]:
        if not self.enabled:
            yield lambda n: None
            return
        cols = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
        with RichProgress(*cols, console=self.console, transient=True) as p:
            task = p.add_task(label, total=total)
            yield lambda n: p.advance(task, n)
