"""Configs no family spec claims, said in one line: a family that ships an MTP head mtpforge does
not write yet is named, with what writes or drafts its head today, instead of "not a Qwen model"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Unwritten:
    """A family whose releases ship an MTP head that no spec in ``FAMILIES`` describes yet."""

    title: str
    model_types: tuple[str, ...]
    #: what produces or drafts its head today (measured where docs/families/ has a page)
    today: str


UNWRITTEN: tuple[Unwritten, ...] = (
    Unwritten("dots3", ("dots3_note", "dots3_note_text"),
              "llama.cpp's converter writes its MTP block (--mtp) from the whole source checkpoint, but llama.cpp "
              "cannot draft with it yet (no MTP graph for dots3note), nor can any MLX runtime "
              "(docs/families/dots3.md)"),
)


def _model_type(config: Mapping[str, Any]) -> str:
    tc = config.get("text_config")
    inner = tc.get("model_type") if isinstance(tc, Mapping) else None
    top = config.get("model_type")
    return str(top if isinstance(top, str) and top else inner if isinstance(inner, str) else "")


def handled_model_types() -> str:
    """The model types mtpforge writes heads for, from the registry (never a list kept by hand)."""
    from . import FAMILIES

    return ", ".join(sorted({t for s in FAMILIES.values() for t in s.model_types if not t.endswith("_mtp")}))


def not_handled(what: str, config: Mapping[str, Any], fix: str) -> tuple[str, str]:
    """(message, fix) for ``what`` whose config no spec claims; ``fix`` is the caller's for a
    model type nobody ships an MTP head for; the message lists the handled types from the registry."""
    mt = _model_type(config)
    handled = handled_model_types()
    known = next((u for u in UNWRITTEN if mt in u.model_types), None)
    if known is not None:
        return (f"{what} is a {known.title} model (model_type {mt!r}), whose MTP head mtpforge does not write yet",
                f"today {known.today}; mtpforge writes heads of the model types {handled}")
    return f"{what} is not a model mtpforge handles (model_type {mt!r}; it handles {handled})", fix
