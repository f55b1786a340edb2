"""Text cells every command's human output is made of: label/value rows that keep a path whole
at any width, sizes with units, the norm convention with how it is known. One module below the
renderers, so the GGUF renderer and the MLX one share them without importing each other."""

from __future__ import annotations

from typing import Any, Iterable

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from .checks.basis import norm_convention_text


def counted(n: int, noun: str) -> str:
    """``1 norm tensor``, ``2 norm tensors``: a count a person reads (English plurals in -s)."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def fits(table: Table, console: Console) -> bool:
    """Whether every cell keeps its longest word (a path) whole at the console's width."""
    unbounded = console.options.update_width(1 << 20)  # rich clamps a measurement to the width it is given
    return Measurement.get(console, unbounded, table).minimum <= console.width


def _cell(v: str) -> Text:
    """A value as text; a verdict the renderer styled (``[green]passed[/]``) keeps its style."""
    return Text.from_markup(v) if v.startswith("[") and v.endswith("[/]") else Text(v)


def print_rows(rows: Iterable[tuple[str, Any]], console: Console) -> None:
    """Label and value pairs: a borderless-key table where it fits, else ``label: value`` lines
    (a value of several lines: one indented line each), never a path cut in two."""
    rows = [(k, "" if v is None else str(v)) for k, v in rows]
    t = Table(show_header=False)
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    for k, v in rows:
        t.add_row(escape(k), _cell(v))
    if fits(t, console):
        console.print(t)
        return
    for k, v in rows:
        lines = v.split("\n")
        if len(lines) == 1:
            console.print(f"[bold]{escape(k)}:[/bold] ", _cell(v), sep="", soft_wrap=True, highlight=False)
        else:
            console.print(f"[bold]{escape(k)}:[/bold]", soft_wrap=True, highlight=False)
            for line in lines:
                console.print("  ", Text(line), sep="", soft_wrap=True, highlight=False)


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if x < 1024 or unit == "TiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return str(n)


def norm_convention(r: dict[str, Any]) -> str:
    """The head's norm convention and what decided it; a folder without a head has none to tell."""
    if r.get("norm_convention") in (None, "none"):
        return "none (no MTP tensors)" if not r.get("mtp_tensors") else "undecided"
    return norm_convention_text(r)
