"""Metadata of the files add-mtp writes for llama.cpp, derived from the trunk's.

llama.cpp's converter writes an MTP-only file with the trunk's metadata and exactly these
changes (checked against it in the tests): ``block_count`` counts the MTP layers too,
``{arch}.nextn_predict_layers`` is added (where the family's converter class writes it: before
the linear-attention keys for Qwen3.5, after the family's own keys for GLM and Nemotron-H),
per-layer arrays get one entry per MTP layer (an MTP layer is full attention; a family names the
arrays its converter also extends, with the block's entry, e.g. Nemotron-H's KV heads and MoE
width), and ``general.size_label`` / ``general.file_type``
describe the file's own tensors. A trunk with the MTP block appended (``gguf-tail``) gets the
same layer keys and keeps the trunk's file type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import gguf

from ..families.spec import FamilySpec
from .gguffile import KV

U32 = gguf.GGUFValueType.UINT32

#: per-layer arrays every architecture extends, and the value an MTP layer takes in them (a
#: family adds its own: ``FamilySpec.gguf_layer_arrays``, filled by :func:`mtp_meta`)
PER_LAYER_ARRAYS: dict[str, object] = {"{arch}.attention.recurrent_layers": False}
#: where ``nextn_predict_layers`` goes when no family is given (``FamilySpec.gguf_nextn_before``'s default)
NEXTN_BEFORE: tuple[str, ...] = ("{arch}.ssm.", "general.quantization_version")


@dataclass(frozen=True)
class MtpMeta:
    """What the family says about the metadata of its MTP layers: the per-layer arrays' entry
    for an MTP block (key with ``{arch}`` -> value) and where the layer count is written."""

    layer_entries: Mapping[str, object] = field(default_factory=dict)
    nextn_before: tuple[str, ...] = NEXTN_BEFORE


def mtp_meta(spec: FamilySpec, dims: Mapping[str, int]) -> MtpMeta:
    """The family's rules for its MTP block's metadata, the per-layer entries filled from the
    source's dimensions (``dims``: the family's shape symbols)."""
    return MtpMeta({f"{{arch}}.{k}": dims[sym] if isinstance(sym, str) else sym for k, sym in spec.gguf_layer_arrays.items()},
                   spec.gguf_nextn_before)


def _anchor(kv: dict[str, KV], arch: str, before: tuple[str, ...]) -> str | None:
    """The key the converter writes ``nextn_predict_layers`` in front of (None: at the end)."""
    for prefix in (p.format(arch=arch) for p in before):
        hit = next((k for k in kv if k.startswith(prefix)), None)
        if hit is not None:
            return hit
    return None


def with_mtp_layers(kv: dict[str, KV], arch: str, n_trunk: int, n_mtp: int, meta: MtpMeta = MtpMeta()) -> dict[str, KV]:
    """The trunk's metadata for ``n_mtp`` MTP blocks after its ``n_trunk``: the block count,
    the layer count where ``meta`` says the converter writes it, the per-layer arrays extended."""
    out: dict[str, KV] = {}
    nextn = f"{arch}.nextn_predict_layers"
    anchor = _anchor(kv, arch, meta.nextn_before)
    fills = {t.format(arch=arch): v for t, v in {**PER_LAYER_ARRAYS, **meta.layer_entries}.items()}
    for k, v in kv.items():
        if k == nextn:
            continue
        if k == anchor and nextn not in out:
            out[nextn] = KV(n_mtp, U32)
        if k == f"{arch}.block_count":
            v = KV(n_trunk + n_mtp, v.type)
        if k in fills and isinstance(v.value, list) and len(v.value) == n_trunk:
            v = KV(list(v.value) + [fills[k]] * n_mtp, v.type, v.sub_type)
        out[k] = v
    if nextn not in out:
        out[nextn] = KV(n_mtp, U32)
    return out


def size_label(tensors: list[tuple[str, tuple[int, ...]]], expert_count: int) -> str:
    """gguf-py's size label for these tensors, counted by gguf-py's writer as the converter does."""
    import numpy as np

    w = gguf.GGUFWriter(None, "size")
    for name, shape in tensors:
        w.add_tensor_info(name, shape, np.dtype(np.float32), 0, raw_dtype=gguf.GGMLQuantizationType.F32)
    total, shared, expert, count = w.get_total_parameter_count()
    return gguf.size_label(total, shared, expert, count)


def mtp_only_kv(kv: dict[str, KV], arch: str, n_trunk: int, n_mtp: int, file_type: int,
                tensors: list[tuple[str, tuple[int, ...]]], expert_count: int, meta: MtpMeta = MtpMeta()) -> dict[str, KV]:
    out = with_mtp_layers(kv, arch, n_trunk, n_mtp, meta)
    if "general.file_type" in out:
        out["general.file_type"] = KV(int(file_type), out["general.file_type"].type)
    if "general.size_label" in out:
        out["general.size_label"] = KV(size_label(tensors, expert_count), out["general.size_label"].type)
    return out


def mtp_file_name(kv: dict[str, KV], precision: str, fallback: str, prefix: str = "mtp-") -> str:
    """``mtp-<name>.gguf`` as llama.cpp's converter names an MTP-only file (``--mtp``): gguf-py's
    naming convention on the model's name, without a size label, with the file's type."""
    def s(key: str) -> str | None:
        v = kv.get(key)
        return str(v.value) if v is not None and v.value is not None else None

    name = gguf.naming_convention(s("general.name") or fallback, s("general.basename"), s("general.finetune"),
                                  s("general.version"), size_label=None, output_type=precision.upper(), model_type=None)
    return f"{prefix}{safe_file_stem(name, f'-{precision.upper()}')}.gguf"


#: bytes of a head's name stem: with ``mtp-``, ``.gguf``, the record's ``.mtpforge.json`` and a
#: temporary file's suffix, every name stays under the usual 255-byte limit
MAX_STEM_BYTES = 160


def safe_file_stem(name: str, tail: str) -> str:
    """``name`` as one file name: a control character (NUL, newline) or a path separator becomes
    ``-``, and a name too long for the filesystem is shortened before ``tail`` (the type), which
    stays. A trunk's ``general.name`` is whatever its maker wrote (300 characters, a NUL, a
    newline: internal errors and a file name holding a newline)."""
    name = "".join("-" if ord(c) < 32 or ord(c) == 127 or c in "/\\" else c for c in name)
    if len(name.encode("utf-8")) <= MAX_STEM_BYTES:
        return name
    base = name[: -len(tail)] if tail and name.endswith(tail) else name
    room = MAX_STEM_BYTES - len(tail.encode("utf-8"))
    return base.encode("utf-8")[:room].decode("utf-8", "ignore") + tail


#: the value types a drafter's added keys are written in (``GgufDrafter.added`` / ``tail``)
_TYPES = {"u32": gguf.GGUFValueType.UINT32, "i32": gguf.GGUFValueType.INT32}


def _added(key: str, src: tuple[str, str, int], config: Mapping[str, object]) -> KV:
    """One key a drafter's converter adds from the source's config (a list: each entry plus
    the row's offset, llama.cpp's 1-based layer outputs)."""
    ckey, typ, plus = src
    v = config.get(ckey)
    if isinstance(v, list) and all(isinstance(x, int) for x in v):
        return KV([int(x) + plus for x in v], gguf.GGUFValueType.ARRAY, _TYPES[typ])
    if isinstance(v, int) and not isinstance(v, bool):
        return KV(v + plus, _TYPES[typ])
    from ..errors import CorruptFileError

    raise CorruptFileError(f"the source's config.json has no integer {ckey} (for {key})",
                           "pass the config.json of the release as published")


def drafter_kv(kv: dict[str, KV], arch: str, spec: FamilySpec, n_blocks: int, dims: Mapping[str, object],
               config: Mapping[str, object], tensors: list[tuple[str, tuple[int, ...]]], expert_count: int) -> dict[str, KV]:
    """The metadata of a drafter llama.cpp loads as a model of its own (``FamilySpec.gguf_drafter``):
    the trunk's, in its order, under the drafter's architecture, with ``n_blocks`` blocks, its
    per-layer arrays one entry per block, its values set or dropped, the config's keys added where
    the converter adds them, the file's own size label and type."""
    d = spec.gguf_drafter
    assert d is not None
    old, new = f"{arch}.", f"{d.arch}."
    arrays = {new + k: dims[v] if isinstance(v, str) else v for k, v in d.layer_arrays.items()}
    out: dict[str, KV] = {}
    for k, v in kv.items():
        k = new + k.removeprefix(old) if k.startswith(old) else k
        if k.removeprefix(new) in d.dropped:
            continue
        if k == d.before.format(arch=d.arch):
            out.update({new + a: _added(a, src, config) for a, src in d.added.items()})
        if k == new + "block_count":
            v = KV(n_blocks, v.type)
        elif k in arrays and isinstance(v.value, list):
            v = KV([arrays[k]] * n_blocks, v.type, v.sub_type)
        elif k.removeprefix(new) in d.values:
            v = KV(d.values[k.removeprefix(new)], v.type)
        elif k == "general.architecture":
            v = KV(d.arch, v.type)
        out[k] = v
    out.update({a: _added(a, src, config) for a, src in d.tail.items()})
    if spec.gguf_file_type is not None and "general.file_type" in out:
        out["general.file_type"] = KV(spec.gguf_file_type, out["general.file_type"].type)
    if "general.size_label" in out:
        out["general.size_label"] = KV(size_label(tensors, expert_count), out["general.size_label"].type)
    return out
