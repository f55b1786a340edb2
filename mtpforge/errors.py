"""One exception family for everything a user can cause.

Each error carries the one-line message and the fix the CLI prints; ``exit_code`` follows
docs/CONTRACT.md: 2 for input that cannot be used at all, 1 for a check that refused the operation.
"""

from __future__ import annotations


class MtpforgeError(Exception):
    """Base of every error mtpforge reports to a user (never a traceback)."""

    exit_code: int = 2
    code: str = "ERROR"

    def __init__(self, message: str, fix: str | None = None, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        if code is not None:
            self.code = code

    def as_dict(self) -> dict[str, str | None]:
        return {"code": self.code, "message": self.message, "fix": self.fix}


class InputError(MtpforgeError):
    """Input that cannot be used at all: no such path or repo, no config, bad recipe (exit 2)."""

    code = "BAD_INPUT"


class CorruptFileError(InputError):
    """A weight or index file that cannot be parsed."""

    code = "CORRUPT_FILE"


class NetworkError(InputError):
    """The Hub (or HF_ENDPOINT) could not be reached or answered wrongly."""

    code = "NETWORK"


class RefusedError(MtpforgeError):
    """A validation refused the operation; nothing was changed (exit 1)."""

    exit_code = 1
    code = "REFUSED"


def unknown_choice(flag: str, value: object, values: "tuple[str, ...] | list[str]") -> InputError:
    """One wording for a value an option does not take, wherever it is checked (the CLI, the
    API, inspect): the value, the closest choice, then the choices once."""
    import difflib

    guess = difflib.get_close_matches(str(value), list(values), n=1, cutoff=0.6)
    hint = f"did you mean {guess[0]}? " if guess else ""
    return InputError(f"{flag} {value!s} is not one of its choices", f"{hint}choices: {', '.join(values)}")


class Interrupted(MtpforgeError):
    """Ctrl-C, said by the command that knows what is on disk now (exit 130)."""

    exit_code = 130
    code = "INTERRUPTED"
