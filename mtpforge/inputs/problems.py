"""A value read from a file that does not validate: where it is, what it is, what was expected."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from pydantic import BaseModel, ValidationError

from ..errors import InputError


def describe(value: Any, limit: int = 60) -> str:
    """A value as the file spells it (JSON), cut short: a message stays one line."""
    try:
        text = json.dumps(value, ensure_ascii=True, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def key_path(loc: Iterable[Any]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


@dataclass(frozen=True)
class Problem:
    """``file``: ``key`` is ``got``, expected ``expected``."""

    file: str
    key: str
    got: str  # as ``describe`` spells it
    expected: str
    fix: str = ""

    @property
    def message(self) -> str:
        return f"{self.file}: {self.key} is {self.got}, expected {self.expected}"

    def error(self) -> "InvalidValue":
        return InvalidValue(self.message, self.fix or f"repair {self.file.rsplit('/', 1)[-1]} (or re-download it)")


class InvalidValue(InputError):
    """A value in a file mtpforge reads is not what the file format allows (exit 2)."""

    code = "INVALID_VALUE"


def _at(data: Any, loc: tuple[Any, ...]) -> Any:
    for p in loc:
        try:
            data = data[p]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _data_loc(data: Any, loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The longest start of ``loc`` that names a value of ``data``."""
    out: list[Any] = []
    for p in loc:
        if isinstance(data, dict) and p in data:
            data = data[p]
        elif isinstance(data, list) and isinstance(p, int) and 0 <= p < len(data):
            data = data[p]
        else:
            break
        out.append(p)
    return tuple(out)


def _expected(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """The field's own description of what it takes (the loc's first named field that has one)."""
    m: Any = model
    found = ""
    for p in loc:
        fields = getattr(m, "model_fields", None)
        if not fields or not isinstance(p, str) or p not in fields:
            break
        f = fields[p]
        found = f.description or found
        ann = f.annotation
        inner = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        m = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else (inner[0] if inner else None)
    return found


def problems_of(error: ValidationError, model: type[BaseModel], data: Any, file: str, prefix: tuple[Any, ...] = (),
                fix: str = "") -> list[Problem]:
    """One :class:`Problem` per distinct key pydantic refused, in the file's own terms."""
    out: list[Problem] = []
    seen: set[tuple[Any, ...]] = set()
    for err in error.errors():
        loc = tuple(err["loc"])
        # the key as the file spells it: a union reports each member under a tag of its own
        # ("constrained-int", "list[...]"), which is no key of the data
        field_loc = loc[:-1] + loc[-1:] if err["type"] == "missing" else _data_loc(data, loc)
        if field_loc in seen:
            continue
        seen.add(field_loc)
        expected = _expected(model, field_loc) or err["msg"].removeprefix("Value error, ").lower()
        got = describe(_at(data, field_loc)) if err["type"] != "missing" else "missing"
        out.append(Problem(file, key_path(prefix + field_loc), got, expected, fix))
    return out


__all__ = ["InvalidValue", "Problem", "describe", "key_path", "problems_of"]
