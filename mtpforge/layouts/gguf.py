"""The GGUF output format's layouts (llama.cpp): where a head goes when the target is a trunk
GGUF rather than an MLX folder. Written by :mod:`mtpforge.gguf`, named here beside the MLX
layouts so that options, recipes and reports ask a row instead of comparing names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GgufLayout:
    """One way of giving llama.cpp an MTP head."""

    name: str
    #: an MTP-only GGUF beside the trunk (``llama-server -md``); else a new trunk whose blocks end
    #: with the MTP layer (needs ``--output``; the trunk itself is never modified)
    beside_trunk: bool


GGUF_MTP = GgufLayout("gguf-mtp", beside_trunk=True)
GGUF_TAIL = GgufLayout("gguf-tail", beside_trunk=False)
GGUF_LAYOUTS: dict[str, GgufLayout] = {g.name: g for g in (GGUF_MTP, GGUF_TAIL)}
GGUF_LAYOUT_NAMES = tuple(GGUF_LAYOUTS)


def beside_trunk(layout: object) -> bool:
    """Whether ``layout`` (any value a report carries) is a GGUF head file beside its trunk."""
    return isinstance(layout, str) and layout in GGUF_LAYOUTS and GGUF_LAYOUTS[layout].beside_trunk
