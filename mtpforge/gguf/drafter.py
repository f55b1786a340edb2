"""A drafter llama.cpp loads as a model of its own beside the trunk (``FamilySpec.gguf_drafter``;
DeepSeek-V4's DSpark, architecture ``dflash``): how to tell one, find the one beside a trunk,
and which tensors it must hold — for ``inspect`` and ``verify``, which otherwise read MTP heads
as NextN blocks.

The expectation comes from the family's rows, as for an MTP block: its stages are whole layers
(``blk.{s}``), the tensors outside them are the family's head rows under their converter names
(``FamilySpec.gguf_root_names``). Widths the file's metadata does not state come from where the
converter took them: a list's length (the target layers) and a tensor's header
(``FamilySpec.header_dims``: the Markov rank).
"""

from __future__ import annotations

from pathlib import Path

from ..families import FAMILIES
from ..families.spec import FamilySpec
from .gguffile import GgufFile
from .names import expected_block, family_names, gguf_dims


def drafter_family(g: GgufFile) -> str | None:
    """The drafter family of a GGUF: its architecture is a drafter's and it holds one of the
    family's tensors outside the blocks (another kind of ``dflash`` file, a plain DFlash
    drafter, holds none of DSpark's Markov and hyper-connection tensors)."""
    for name, spec in FAMILIES.items():
        d = spec.gguf_drafter
        if d is not None and g.arch == d.arch and any(n in g.tensors for n in spec.gguf_root_names.values()):
            return name
    return None


def drafter_files(trunk: Path, arch: str) -> list[tuple[Path, str]]:
    """(file, family) of each drafter file beside a trunk of ``arch``, by the file names add-mtp
    and the converter's users give them (``GgufDrafter.file_prefix``)."""
    out: list[tuple[Path, str]] = []
    for name, spec in FAMILIES.items():
        d = spec.gguf_drafter
        if d is not None and spec.gguf_arch == arch:
            out += [(p, name) for p in sorted(trunk.parent.glob(f"{d.file_prefix}*.gguf")) if p.is_file()]
    return out


def drafter_dims(g: GgufFile, spec: FamilySpec) -> dict[str, int]:
    """The family rows' widths from a drafter file: its metadata, the vocabulary and the widths
    the converter read from a list's length or a tensor's header."""
    assert spec.gguf_drafter is not None

    def get(key: str) -> int:
        v = g.get("{arch}." + key, 0)
        if isinstance(v, list):
            v = max(v) if v else 0
        return int(v or 0)

    gguf_of = {cfg: key for key, (cfg, _, _) in {**spec.gguf_drafter.added, **spec.gguf_drafter.tail}.items()}
    root = {r.key: (r, g.tensors.get(spec.gguf_root_names.get(r.role, ""))) for r in spec.head_rows}
    stated: dict[str, int] = {}
    for sym, key in spec.dim_keys.items():
        if isinstance(key, str) and key.startswith("#") and key[1:] in gguf_of:
            listed = g.get("{arch}." + gguf_of[key[1:]], [])
            stated[sym] = len(listed) if isinstance(listed, list) else 0
        elif isinstance(key, str) and key in spec.header_dims:
            bare, axis = spec.header_dims[key]
            t = root.get(bare, (None, None))[1]
            stated[sym] = t.shape[axis] if t is not None and len(t.shape) > axis else 0
    # no token_embd in a drafter: the vocabulary is the first width of a tensor shaped by it
    vocab = next((t.shape[0] for r, t in root.values() if t is not None and r.shape[:1] == ("V",)), 0)
    return gguf_dims(get, vocab, spec, stated)


def expected_drafter(spec: FamilySpec, dims: dict[str, int]) -> tuple[dict[str, tuple[int, ...]], set[str],
                                                                       dict[str, tuple[int, ...]], set[str]]:
    """(a stage's tensors relative to ``blk.{s}.`` and shapes, a stage's optional ones, the
    tensors outside the stages and shapes, the optional ones of those)."""
    want, maybe = expected_block(spec, dims)
    names = family_names(spec)
    for r in spec.head_rows:  # the head's rows live outside the stages, under their converter names
        if r.role in names:
            want.pop(names[r.role], None)
            maybe.discard(names[r.role])
    root: dict[str, tuple[int, ...]] = {}
    root_maybe: set[str] = set()
    for r in spec.head_rows:
        name = spec.gguf_root_names.get(r.role)
        if name is None:
            continue
        if r.optional:
            root_maybe.add(name)
        else:
            root[name] = tuple(dims[s] for s in r.shape)
    return want, maybe, root, root_maybe


__all__ = ["drafter_dims", "drafter_family", "drafter_files", "expected_drafter"]
