"""How a head's norm convention is known, said with it: measured, recorded or assumed.

``inspect`` decides a convention from one kind of evidence (``norm_convention_from``); a reader
must not take a convention the family or the layout merely implies for one that was measured.
No MLX here: the renderers import it.
"""

from __future__ import annotations

from typing import Any, Mapping

#: what decided a convention -> how it is known: measured (the tensors compared with the source's,
#: the head run against its backbone, the level of the backbone's or the trunk's own norms),
#: recorded (mtpforge's manifest, its hashes checked), assumed (a raw checkpoint's provenance,
#: a family's rule)
BASIS = {"source": "measured", "behaviour": "measured", "backbone": "measured", "trunk": "measured",
         "manifest": "recorded", "source layout": "assumed", "family": "assumed"}


def basis(how: str | None, convention: str | None) -> str:
    """measured / recorded / assumed, ``undecided`` for a convention nothing told, ``none`` for
    a head without norms (or no head)."""
    if convention == "none":
        return "none"
    if convention == "unknown" or how is None:
        return "undecided"
    return BASIS.get(how, "undecided")


def norm_convention_text(r: Mapping[str, Any]) -> str:
    """``raw (measured: behaviour)``: the convention, how it is known and what told it."""
    conv, how = r.get("norm_convention"), r.get("norm_convention_from")
    b = r.get("norm_convention_basis") or basis(how, conv)
    if conv == "unknown":
        return "undecided (pass --source to compare exactly)"
    if conv == "none" or b == "none":
        return str(conv)
    return f"{conv} ({b}: {how})"
