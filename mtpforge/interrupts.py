"""A Ctrl-C is never lost.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be; when that is a
finalizer (a ``__del__`` run by the garbage collector inside a library), Python prints
"Exception ignored in …" and goes on, and a long command ran to its end after the user asked it
to stop. The handler installed here also records the interrupt, and every long command checks
the record at each of its steps (``Progress.step``, the demo's steps), so an interrupt a
finalizer swallowed stops the command at its next step, with the usual one line and exit 130.
"""

from __future__ import annotations

import signal
from typing import Any

#: set by the handler; cleared once the interrupt was reported
_PENDING: list[bool] = []


def _handler(signum: int, frame: Any) -> None:
    _PENDING.append(True)
    f = frame
    while f is not None:  # inside a finalizer Python would only print "Exception ignored in …"
        if f.f_code.co_name == "__del__":
            return  # recorded: the command's next step raises it (``check``)
        f = f.f_back
    raise KeyboardInterrupt


def install() -> None:
    """Take SIGINT in the main thread (elsewhere Python allows no handler: nothing to do)."""
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _handler)
    except (ValueError, OSError):
        pass


def check() -> None:
    """Raise the Ctrl-C that arrived but was swallowed on its way (see the module's doc)."""
    if _PENDING:
        raise KeyboardInterrupt


def settle() -> bool:
    """Let a Ctrl-C that is on its way arrive; True if one did (or had). A terminal's Ctrl-C
    reaches the whole process group at once: a compiler MLX runs for a kernel dies of it and its
    caller raises an ordinary error, while this process's own handler runs a few instructions
    later, inside whatever handles that error. Called before an error is judged a bug."""
    import time

    try:
        for _ in range(3):
            time.sleep(0.01)  # a sleep returns to run pending signal handlers
    except KeyboardInterrupt:
        return True
    return bool(_PENDING)


def clear() -> None:
    _PENDING.clear()


class shielded:
    """Ignore Ctrl-C while a cleanup that makes the disk match the report runs (a second
    Ctrl-C must not leave half a temporary folder behind)."""

    def __enter__(self) -> None:
        try:
            self._previous: Any = signal.signal(signal.SIGINT, signal.SIG_IGN)
        except (ValueError, OSError):
            self._previous = None

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def caused_by_interrupt(e: BaseException) -> bool:
    """A Ctrl-C, or one Python re-raised as another exception (a lazily imported module defining
    a class turns it into ``RuntimeError: Error calling __set_name__``)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False
