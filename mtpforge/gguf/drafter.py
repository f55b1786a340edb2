"""A drafter llama.cpp loads as a model of its own beside the trunk (``FamilySpec.gguf_drafter``;
DeepSeek-V4's DSpark, architecture ``dflash``): how to tell one, find the one beside a trunk,
which tensors it must hold and whether a file holds them (``check_drafter_file``) — for
``inspect`` and ``verify``, which otherwise read MTP heads as NextN blocks.

The expectation comes from the family's rows, as for an MTP block: its stages are whole layers
(``blk.{s}``), the tensors outside them are the family's head rows under their converter names
(``FamilySpec.gguf_root_names``). Widths the file's metadata does not state come from where the
converter took them: a list's length (the target layers) and a tensor's header
(``FamilySpec.header_dims``: the Markov rank).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..families import FAMILIES
from ..families.spec import FamilySpec
from ..findings import Finding, finding
from .gguffile import GgufFile
from .names import block_of, expected_block, family_names, gguf_dims
from .tensor_checks import held_against


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


def check_drafter_file(d: GgufFile, family: str, trunk: GgufFile | None, where: str) -> tuple[list[Finding], dict[str, Any]]:
    """A drafter file (``gguf/drafter.py``): every stage and the tensors outside them against the
    family's rows at the file's own widths, and, beside its trunk, that it is this model's
    (architecture, width, vocabulary, target layers within the trunk)."""
    spec = FAMILIES[family]
    dm = drafter_dims(d, spec)
    want, maybe, root_want, root_maybe = expected_drafter(spec, dm)
    out: list[Finding] = []
    for b in range(d.block_count):
        have = {n.split(".", 2)[2]: t for n, t in d.tensors.items() if block_of(n) == b}
        out += held_against(f"{where}: the drafter's stage blk.{b}", have, want, maybe)
    root = {n: t for n, t in d.tensors.items() if block_of(n) is None}
    out += held_against(f"{where}: the drafter", root, root_want, root_maybe)
    targets = [int(v) for v in d.get("{arch}.target_layers", []) or []]
    if trunk is not None:
        mismatch = []
        if spec.gguf_arch != trunk.arch:
            mismatch.append(f"it drafts for {spec.gguf_arch}, the trunk is {trunk.arch}")
        elif d.get("{arch}.embedding_length") != trunk.get("{arch}.embedding_length"):
            mismatch.append(f"its width is {d.get('{arch}.embedding_length')}, the trunk's "
                            f"{trunk.get('{arch}.embedding_length')}")
        emb = trunk.tensors.get("token_embd.weight")
        if emb is not None and dm["V"] and emb.shape[0] != dm["V"]:
            mismatch.append(f"its vocabulary is {dm['V']}, the trunk's {emb.shape[0]}")
        if any(not 1 <= t <= trunk.block_count for t in targets):
            mismatch.append(f"it reads the trunk's layers {targets}, the trunk has {trunk.block_count}")
        out += [finding("MTP_SHAPE_MISMATCH", f"{where} is another model's drafter: {m}",
                        "write one for this trunk with mtpforge add-mtp") for m in mismatch[:1]]
    info: dict[str, Any] = {
        "architecture": d.arch, "family": family, "spec_type": spec.gguf_drafter.spec_type if spec.gguf_drafter else None,
        "stages": d.block_count, "block_size": d.get("{arch}.block_size"), "target_layers": targets,
        "mtp_tensors": len(d.tensors), "mtp_bytes": sum(t.nbytes for t in d.tensors.values()),
        "types": {k.split(".", 2)[2]: t.type_name for k, t in sorted(d.tensors.items()) if block_of(k) == 0},
        "expert_format": "stacked" if any(k.endswith("_exps.weight") for k in d.tensors) else "none",
    }
    return out, info


__all__ = ["check_drafter_file", "drafter_dims", "drafter_family", "drafter_files", "expected_drafter"]
