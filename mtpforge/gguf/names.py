"""llama.cpp's names for the MTP head, as data (docs/SPEC.md §5.1).

llama.cpp stores the MTP layer as one more block after the trunk's: ``blk.{n}`` with ``n`` the
trunk's layer count, holding the ordinary layer tensors plus four ``nextn.*`` tensors. The rows
below map a canonical :class:`~mtpforge.families.spec.Role` to that name (the family spec spells
the source key); they are checked against llama.cpp's own converter in the tests. Expert tensors
(per-expert, fused) are stacked into one ``ffn_*_exps`` tensor per projection.
"""

from __future__ import annotations

import re
from typing import Callable

import gguf

from ..families import FAMILIES
from ..families.spec import EXPERT_ROLES, NORM_ROLES, ROUTER_ROLES, STACKED, FamilySpec, Role

#: mtpforge family -> llama.cpp architecture (``general.architecture``), from the family rows
ARCH: dict[str, str] = {s.name: s.gguf_arch for s in FAMILIES.values() if s.gguf_arch}
FAMILY_OF_ARCH = {v: k for k, v in ARCH.items()}


def handled_archs(name: str, arch: str | None) -> tuple[str, str]:
    """(message, fix) for a GGUF of an architecture no family writes."""
    archs = ", ".join(sorted(FAMILY_OF_ARCH))
    return (f"{name} is a llama.cpp {arch or 'unknown'} model, whose MTP head mtpforge does not write",
            f"mtpforge handles the GGUF architectures {archs}")

_T = gguf.MODEL_TENSOR
#: Role -> gguf-py's ``MODEL_TENSOR`` row and the tensor's suffix (llama.cpp's name is the row's
#: ``blk.{bid}.…`` template plus it). Per-head roles land in the first MTP block, per-layer ones
#: in block ``n_trunk + i``; the expert roles name the stacked tensor (one per projection,
#: experts on the slowest axis).
TENSORS: dict[Role, tuple[gguf.MODEL_TENSOR, str]] = {
    Role.FC: (_T.NEXTN_EH_PROJ, "weight"),
    Role.PRE_FC_NORM_EMBEDDING: (_T.NEXTN_ENORM, "weight"),
    Role.PRE_FC_NORM_HIDDEN: (_T.NEXTN_HNORM, "weight"),
    Role.FINAL_NORM: (_T.NEXTN_SHARED_HEAD_NORM, "weight"),
    Role.SHARED_HEAD: (_T.NEXTN_SHARED_HEAD_HEAD, "weight"),
    Role.EMBED_TOKENS: (_T.NEXTN_EMBED_TOKENS, "weight"),
    Role.INPUT_NORM: (_T.ATTN_NORM, "weight"),
    Role.POST_ATTENTION_NORM: (_T.ATTN_POST_NORM, "weight"),
    Role.Q_PROJ: (_T.ATTN_Q, "weight"),
    Role.K_PROJ: (_T.ATTN_K, "weight"),
    Role.V_PROJ: (_T.ATTN_V, "weight"),
    Role.O_PROJ: (_T.ATTN_OUT, "weight"),
    Role.Q_BIAS: (_T.ATTN_Q, "bias"),
    Role.K_BIAS: (_T.ATTN_K, "bias"),
    Role.V_BIAS: (_T.ATTN_V, "bias"),
    Role.Q_NORM: (_T.ATTN_Q_NORM, "weight"),
    Role.K_NORM: (_T.ATTN_K_NORM, "weight"),
    Role.MLP_GATE: (_T.FFN_GATE, "weight"),
    Role.MLP_UP: (_T.FFN_UP, "weight"),
    Role.MLP_DOWN: (_T.FFN_DOWN, "weight"),
    Role.ROUTER: (_T.FFN_GATE_INP, "weight"),
    Role.ROUTER_BIAS: (_T.FFN_EXP_PROBS_B, "bias"),
    Role.SHARED_GATE: (_T.FFN_GATE_SHEXP, "weight"),
    Role.SHARED_UP: (_T.FFN_UP_SHEXP, "weight"),
    Role.SHARED_DOWN: (_T.FFN_DOWN_SHEXP, "weight"),
    Role.SHARED_EXPERT_GATE: (_T.FFN_GATE_INP_SHEXP, "weight"),
    Role.EXPERT_GATE: (_T.FFN_GATE_EXP, "weight"),
    Role.EXPERT_UP: (_T.FFN_UP_EXP, "weight"),
    Role.EXPERT_DOWN: (_T.FFN_DOWN_EXP, "weight"),
}


def _relative(role: Role) -> str:
    tensor, suffix = TENSORS[role]
    return gguf.TENSOR_NAMES[tensor].format(bid=0).split(".", 2)[2] + "." + suffix


#: Role -> llama.cpp's name relative to ``blk.{n}.`` (e.g. ``nextn.eh_proj.weight``)
TENSOR_NAMES: dict[Role, str] = {role: _relative(role) for role in TENSORS}


#: the trunk tensors an MTP-only file carries for the draft model (llama.cpp's converter keeps
#: exactly these three beside the MTP block)
SHARED_TENSORS: tuple[str, ...] = ("token_embd.weight", "output_norm.weight", "output.weight")

#: tensors llama.cpp keeps in F32 whatever the file type (its converter's rule: norms, 1-D
#: tensors, routers)
F32_SUFFIXES: tuple[str, ...] = ("_norm.weight", *(TENSOR_NAMES[r] for r in sorted(NORM_ROLES | ROUTER_ROLES)))

_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")


def gguf_name(bare: str, n_trunk: int, spec: FamilySpec) -> str | None:
    """The GGUF name of a non-expert source head tensor (None for expert tensors and for a key
    the family does not spell)."""
    hit = spec.match(bare)
    if hit is None or hit[0].role in EXPERT_ROLES or hit[0].role not in TENSOR_NAMES:
        return None
    return f"blk.{n_trunk + (hit[2] or 0)}.{TENSOR_NAMES[hit[0].role]}"


def expert_name(role: Role, layer: int, n_trunk: int) -> str:
    """The stacked GGUF tensor of expert ``role`` in MTP layer ``layer``."""
    return f"blk.{n_trunk + layer}.{TENSOR_NAMES[role]}"


def block_of(name: str) -> int | None:
    m = _BLK.match(name)
    return int(m.group(1)) if m else None


def keeps_f32(name: str, n_dims: int) -> bool:
    """llama.cpp's converter keeps norms, 1-D tensors and routers in F32."""
    return n_dims <= 1 or name.endswith(F32_SUFFIXES)


def norm_sources(spec: FamilySpec, block: int) -> dict[str, tuple[str, float]]:
    """The first MTP block's norms: GGUF name -> (bare source key, the offset llama.cpp's
    converter adds: the family's for a zero-centred norm, 0 for a raw one)."""
    out = {}
    for r in spec.rows():
        if r.role in NORM_ROLES and (name := gguf_name(r.key.format(i=0, e=0), block, spec)) is not None:
            out[name] = (r.key.format(i=0, e=0), spec.offset_of(r.key.format(i=0, e=0)))
    return out


def gguf_dims(get: Callable[[str], int], vocab: int) -> dict[str, int]:
    """The family rows' shape symbols from a GGUF's metadata (``get`` reads ``{arch}.*`` keys)."""
    H, heads, kv, D = get("embedding_length"), get("attention.head_count"), get("attention.head_count_kv"), \
        get("attention.key_length")
    X = get("expert_feed_forward_length")
    S = get("expert_shared_feed_forward_length") or get("expert_shared_count") * X
    return {"H": H, "2H": 2 * H, "D": D, "QD": heads * D, "2QD": 2 * heads * D, "KD": kv * D,
            "I": get("feed_forward_length"), "E": get("expert_count"), "IM": X, "2IM": 2 * X, "IS": S, "1": 1, "V": vocab}


def expected_block(spec: FamilySpec, dims: dict[str, int]) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """The MTP block as llama.cpp loads it, from the family's rows: (GGUF name relative to
    ``blk.{n}.`` -> shape in numpy order, names a block may also hold: optional tensors and
    those a config switch turns on)."""
    want: dict[str, tuple[int, ...]] = {}
    maybe: set[str] = set()
    rows = [*spec.head_rows, *spec.layer_rows, *spec.mlp_rows, *spec.expert_rows.get(STACKED, ())]
    for r in rows:
        name = TENSOR_NAMES.get(r.role)
        if name is None:
            continue
        if r.optional or r.when is not None:
            maybe.add(name)
        else:
            want[name] = tuple(dims[s] for s in r.shape)
    return want, maybe
