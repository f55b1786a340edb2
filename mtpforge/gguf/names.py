"""llama.cpp's names for the MTP head, as data (docs/SPEC.md §5.1).

llama.cpp stores the MTP layer as one more block after the trunk's: ``blk.{n}`` with ``n`` the
trunk's layer count, holding the ordinary layer tensors plus four ``nextn.*`` tensors. The rows
below map a canonical :class:`~mtpforge.families.spec.Role` to that name (the family spec spells
the source key); they are checked against llama.cpp's own converter in the tests. Expert tensors
(per-expert, fused) are stacked into one ``ffn_*_exps`` tensor per projection.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping

import gguf

from ..families import FAMILIES
from ..families.spec import EXPERT_ROLES, NORM_ROLES, ROUTER_ROLES, STACKED, FamilySpec, Role, Row
from ..passes.mla import SPLITS
from .gguffile import GgufFile

#: mtpforge family -> llama.cpp architecture (``general.architecture``), from the family rows
ARCH: dict[str, str] = {s.name: s.gguf_arch for s in FAMILIES.values() if s.gguf_arch}
#: llama.cpp architecture -> its families, the first registered first (a drafter of its own,
#: ``FamilySpec.gguf_drafter``, is its trunk's family's second head, never a trunk's family; a
#: family whose files are another's, ``FamilySpec.gguf_same_as``, is read as that one)
FAMILIES_OF_ARCH: dict[str, tuple[str, ...]] = {
    a: tuple(f for f, fa in ARCH.items() if fa == a and FAMILIES[f].gguf_drafter is None and FAMILIES[f].gguf_same_as is None)
    for a in ARCH.values()}
#: a second family on an architecture is told from the first by its pre-tokenizer (DeepSeek-V3
#: shares GLM-4.7-Flash's ``deepseek2``): every later one must name its own
assert all(FAMILIES[f].gguf_tokenizer_pre for fs in FAMILIES_OF_ARCH.values() for f in fs[1:]), FAMILIES_OF_ARCH
#: llama.cpp architecture -> the family registered first on it
FAMILY_OF_ARCH = {a: fs[0] for a, fs in FAMILIES_OF_ARCH.items()}


def family_of(g: GgufFile) -> str | None:
    """The family of a GGUF: its architecture's, told apart by ``tokenizer.ggml.pre`` where
    several families share one (a family that names the file's pre-tokenizer, else the first)."""
    fams = FAMILIES_OF_ARCH.get(g.arch, ())
    pre = g.get("tokenizer.ggml.pre")
    return next((f for f in fams if pre in FAMILIES[f].gguf_tokenizer_pre), fams[0] if fams else None)


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
    Role.Q_A_PROJ: (_T.ATTN_Q_A, "weight"),
    Role.Q_A_NORM: (_T.ATTN_Q_A_NORM, "weight"),
    Role.Q_B_PROJ: (_T.ATTN_Q_B, "weight"),
    Role.KV_A_PROJ: (_T.ATTN_KV_A_MQA, "weight"),
    Role.KV_A_NORM: (_T.ATTN_KV_A_NORM, "weight"),
    Role.K_B: (_T.ATTN_K_B, "weight"),
    Role.V_B: (_T.ATTN_V_B, "weight"),
    Role.LATENT_DOWN: (_T.MOE_LATENT_DOWN, "weight"),
    Role.LATENT_UP: (_T.MOE_LATENT_UP, "weight"),
    Role.ATTN_GATE: (_T.ATTN_GATE, "weight"),
    Role.INDEXER_Q_B: (_T.INDEXER_ATTN_Q_B, "weight"),
    Role.INDEXER_K: (_T.INDEXER_ATTN_K, "weight"),
    Role.INDEXER_K_NORM: (_T.INDEXER_K_NORM, "weight"),
    Role.INDEXER_K_NORM_BIAS: (_T.INDEXER_K_NORM, "bias"),
    Role.INDEXER_PROJ: (_T.INDEXER_PROJ, "weight"),
    Role.ATTN_SINKS: (_T.ATTN_SINKS, "weight"),
    Role.LAYER_OUT_NORM: (_T.LAYER_OUT_NORM, "weight"),
    Role.QKV_PROJ: (_T.ATTN_QKV, "weight"),
}
#: the row a role takes in an architecture whose tensor list (gguf-py's ``MODEL_TENSORS``) lacks
#: its default one: DeepSeek-2's layers call the post-attention norm ``ffn_norm``
ALTERNATES: dict[Role, tuple[gguf.MODEL_TENSOR, ...]] = {Role.POST_ATTENTION_NORM: (_T.FFN_NORM,)}
_ARCH_ENUM = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}


def _relative(tensor: gguf.MODEL_TENSOR, suffix: str) -> str:
    return gguf.TENSOR_NAMES[tensor].format(bid=0).split(".", 2)[2] + "." + suffix


def _row_in(role: Role, arch: str | None) -> gguf.MODEL_TENSOR:
    """The role's gguf-py row in ``arch`` (its default where the arch lists none of them)."""
    default, _ = TENSORS[role]
    listed = gguf.MODEL_TENSORS.get(_ARCH_ENUM.get(arch or ""), ())
    return next((t for t in (default, *ALTERNATES.get(role, ())) if t in listed), default)


def tensor_names(arch: str | None) -> dict[Role, str]:
    """Role -> llama.cpp's name relative to ``blk.{n}.`` in ``arch`` (e.g. ``nextn.eh_proj.weight``)."""
    return {role: _relative(_row_in(role, arch), suffix) for role, (_, suffix) in TENSORS.items()}


def family_names(spec: FamilySpec) -> dict[Role, str]:
    """Role -> llama.cpp's name relative to ``blk.{n}.`` in the family's GGUFs."""
    return {**tensor_names(spec.gguf_names_as or spec.gguf_arch), **spec.gguf_names}


#: Role -> llama.cpp's name relative to ``blk.{n}.``, as most architectures spell it
TENSOR_NAMES: dict[Role, str] = tensor_names(None)


#: the trunk tensors an MTP-only file carries for the draft model (llama.cpp's converter keeps
#: exactly these three beside the MTP block)
SHARED_TENSORS: tuple[str, ...] = ("token_embd.weight", "output_norm.weight", "output.weight")

#: the first trunk block's attention norm, which every llama.cpp model has and an MTP-only file
#: lacks (gguf-py's name, so no family's key is spelled here)
FIRST_BLOCK_NORM: str = gguf.TENSOR_NAMES[_T.ATTN_NORM].format(bid=0) + ".weight"

#: tensors llama.cpp keeps in F32 whatever the file type (its converter's rule: norms, 1-D
#: tensors, routers, the DSA indexer's head weights)
F32_SUFFIXES: tuple[str, ...] = ("_norm.weight", *(TENSOR_NAMES[r] for r in sorted(NORM_ROLES | ROUTER_ROLES | {Role.INDEXER_PROJ})
                                                     if r in TENSOR_NAMES))

_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")


def gguf_name(bare: str, n_trunk: int, spec: FamilySpec) -> str | None:
    """The GGUF name of a non-expert source head tensor (None for expert tensors and for a key
    the family does not spell)."""
    hit = spec.match(bare)
    if hit is None or hit[0].role in EXPERT_ROLES:
        return None
    if hit[0].role in spec.gguf_root_names:
        return spec.gguf_root_names[hit[0].role]
    names = family_names(spec)
    if hit[0].role not in names:
        return None
    return f"blk.{n_trunk + (hit[2] or 0)}.{names[hit[0].role]}"


def split_names(bare: str, n_trunk: int, spec: FamilySpec) -> list[tuple[str, Role]]:
    """The GGUF tensors llama.cpp's converter writes in place of a source tensor it splits
    (``kv_b_proj`` -> ``attn_k_b``, ``attn_v_b``), with their roles; [] for any other tensor."""
    hit = spec.match(bare)
    if hit is None or hit[0].role not in SPLITS:
        return []
    names = family_names(spec)
    return [(f"blk.{n_trunk + (hit[2] or 0)}.{names[part]}", part) for part, _ in SPLITS[hit[0].role].parts]


def expert_name(role: Role, layer: int, n_trunk: int) -> str:
    """The stacked GGUF tensor of expert ``role`` in MTP layer ``layer``."""
    return f"blk.{n_trunk + layer}.{TENSOR_NAMES[role]}"


def block_of(name: str) -> int | None:
    m = _BLK.match(name)
    return int(m.group(1)) if m else None


def keeps_f32(name: str, n_dims: int) -> bool:
    """llama.cpp's converter keeps norms, 1-D tensors and routers in F32."""
    return n_dims <= 1 or name.endswith(F32_SUFFIXES)


def norm_sources(spec: FamilySpec, first: int, steps: int = 1) -> dict[str, tuple[str, float]]:
    """The norms of the MTP blocks from ``first`` on, one block per MTP step: GGUF name -> (bare
    source key, the offset llama.cpp's converter adds: the family's for a zero-centred norm, 0
    for a raw one)."""
    out = {}
    for r in spec.rows():
        for i in range(steps) if "{i}" in r.key else range(1):
            bare = r.key.format(i=i, e=0)
            if r.role in NORM_ROLES and (name := gguf_name(bare, first, spec)) is not None:
                out[name] = (bare, spec.offset_of(bare))
    return out


#: shape symbol -> the llama.cpp metadata key (after ``{arch}.``) that states it, by default;
#: a family overrides or drops rows (``FamilySpec.gguf_dim_keys``)
GGUF_DIM_KEYS: dict[str, str] = {
    "H": "embedding_length", "NH": "attention.head_count", "KV": "attention.head_count_kv", "D": "attention.key_length",
    "I": "feed_forward_length", "E": "expert_count", "IM": "expert_feed_forward_length",
}


def dim_keys(spec: FamilySpec) -> dict[str, str]:
    """Shape symbol -> metadata key for ``spec``'s GGUFs (the symbols its GGUF states)."""
    return {s: k for s, k in {**GGUF_DIM_KEYS, **spec.gguf_dim_keys}.items() if k is not None}


def gguf_dims(get: Callable[[str], int], vocab: int, spec: FamilySpec,
              stated: Mapping[str, int] | None = None) -> dict[str, int]:
    """The family rows' shape symbols from a GGUF's metadata (``get`` reads ``{arch}.*`` keys;
    ``stated``: symbols the file gives some other way, before the derived ones are built)."""
    base = {**{s: get(k) for s, k in dim_keys(spec).items()}, **(stated or {})}
    H, heads, kv, D, X = (base.get(s, 0) for s in ("H", "NH", "KV", "D", "IM"))
    S = get("expert_shared_feed_forward_length") or get("expert_shared_count") * X
    out = {**base, "2H": 2 * H, "QD": heads * D, "KD": kv * D, "2IM": 2 * X, "IS": S, "1": 1,
           "V": vocab}
    return {**out, **(spec.derived_dims(out) if spec.derived_dims else {})}


def _stated_switch(row: Row, spec: FamilySpec, dims: Mapping[str, int]) -> bool | None:
    """Whether a row that a config key switches on is in the block, where that key is a
    dimension the GGUF states (Nemotron-H's ``moe_latent_size``: absent or 0 is off); None where
    the GGUF cannot tell (GLM's ``attention_bias``: the block may hold the tensor or not)."""
    sym = next((s for s, k in spec.dim_keys.items() if k == row.when), None)
    if sym is None or sym not in dim_keys(spec):
        return None
    return bool(dims.get(sym))


def expected_block(spec: FamilySpec, dims: dict[str, int]) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """The MTP block as llama.cpp loads it, from the family's rows: (GGUF name relative to
    ``blk.{n}.`` -> shape in numpy order, names a block may also hold: optional tensors and
    those a config switch turns on)."""
    want: dict[str, tuple[int, ...]] = {}
    maybe: set[str] = set()
    names = family_names(spec)
    rows = [*spec.head_rows, *spec.layer_rows, *spec.mlp_rows, *spec.expert_rows.get(STACKED, ())]
    for r in rows:
        split = SPLITS.get(r.role)
        on = _stated_switch(r, spec, dims) if r.when is not None else None
        for role, shape in split.parts if split else ((r.role, r.shape),):
            if role not in names or on is False:
                continue
            if r.optional or (r.when is not None and on is None):
                maybe.add(names[role])
            else:
                want[names[role]] = tuple(dims[s] for s in shape)
    for fused, parts in spec.gguf_fused.items():
        # a part llama.cpp never names on its own (DeepSeek-V4's e_proj / h_proj) has its row's shape
        shapes = [want.pop(names[p]) if p in names and names[p] in want else tuple(dims[s] for s in spec.row(p).shape)
                  for p in parts]
        if fused in spec.gguf_fused_columns:
            want[names[fused]] = (shapes[0][0], sum(s[-1] for s in shapes))
        else:
            want[names[fused]] = (sum(s[0] for s in shapes), *shapes[0][1:])
    return want, maybe
