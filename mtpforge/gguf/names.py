"""llama.cpp's names for the MTP head, as data (docs/SPEC.md §5.1).

llama.cpp stores the MTP layer as one more block after the trunk's: ``blk.{n}`` with ``n`` the
trunk's layer count, holding the ordinary layer tensors plus four ``nextn.*`` tensors. The rows
below map a canonical :class:`~mtpforge.families.spec.Role` to that name (the family spec spells
the source key); they are checked against llama.cpp's own converter in the tests. Expert tensors
(per-expert, fused) are stacked into one ``ffn_*_exps`` tensor per projection.
"""

from __future__ import annotations

import re

from ..families import FAMILIES
from ..families.spec import EXPERT_ROLES, FamilySpec, Role

#: mtpforge family -> llama.cpp architecture (``general.architecture``), from the family rows
ARCH: dict[str, str] = {s.name: s.gguf_arch for s in FAMILIES.values() if s.gguf_arch}
FAMILY_OF_ARCH = {v: k for k, v in ARCH.items()}

#: Role -> llama.cpp's name relative to ``blk.{n}.`` (gguf-py's ``MODEL_TENSOR`` rows:
#: ``NEXTN_EH_PROJ``, ``NEXTN_ENORM``, ``ATTN_NORM``, ``FFN_GATE_EXP``, ...). Per-head roles land
#: in the first MTP block, per-layer ones in block ``n_trunk + i``; the expert roles name the
#: stacked tensor (one per projection, experts on the slowest axis).
TENSOR_NAMES: dict[Role, str] = {
    Role.FC: "nextn.eh_proj.weight",
    Role.PRE_FC_NORM_EMBEDDING: "nextn.enorm.weight",
    Role.PRE_FC_NORM_HIDDEN: "nextn.hnorm.weight",
    Role.FINAL_NORM: "nextn.shared_head_norm.weight",
    Role.INPUT_NORM: "attn_norm.weight",
    Role.POST_ATTENTION_NORM: "post_attention_norm.weight",
    Role.Q_PROJ: "attn_q.weight",
    Role.K_PROJ: "attn_k.weight",
    Role.V_PROJ: "attn_v.weight",
    Role.O_PROJ: "attn_output.weight",
    Role.Q_NORM: "attn_q_norm.weight",
    Role.K_NORM: "attn_k_norm.weight",
    Role.MLP_GATE: "ffn_gate.weight",
    Role.MLP_UP: "ffn_up.weight",
    Role.MLP_DOWN: "ffn_down.weight",
    Role.ROUTER: "ffn_gate_inp.weight",
    Role.SHARED_GATE: "ffn_gate_shexp.weight",
    Role.SHARED_UP: "ffn_up_shexp.weight",
    Role.SHARED_DOWN: "ffn_down_shexp.weight",
    Role.SHARED_EXPERT_GATE: "ffn_gate_inp_shexp.weight",
    Role.EXPERT_GATE: "ffn_gate_exps.weight",
    Role.EXPERT_UP: "ffn_up_exps.weight",
    Role.EXPERT_DOWN: "ffn_down_exps.weight",
}


#: the trunk tensors an MTP-only file carries for the draft model (llama.cpp's converter keeps
#: exactly these three beside the MTP block)
SHARED_TENSORS: tuple[str, ...] = ("token_embd.weight", "output_norm.weight", "output.weight")

#: tensors llama.cpp keeps in F32 whatever the file type (its converter's rule: norms, 1-D
#: tensors, routers)
F32_SUFFIXES: tuple[str, ...] = ("_norm.weight", "nextn.enorm.weight", "nextn.hnorm.weight", "ffn_gate_inp.weight",
                                 "ffn_gate_inp_shexp.weight")

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


def norm_sources(spec: FamilySpec, block: int) -> dict[str, str]:
    """The first MTP block's zero-centred norms: GGUF name -> bare source key (the norms
    llama.cpp's converter shifts by the family's offset)."""
    out = {}
    for r in spec.rows():
        if r.role in spec.norm_roles and (name := gguf_name(r.key.format(i=0, e=0), block, spec)) is not None:
            out[name] = r.key.format(i=0, e=0)
    return out


#: the MTP block as llama.cpp loads it, with shapes (numpy order) in trunk dimensions:
#: H embedding, Q = heads x head_dim, K = kv heads x head_dim, D head_dim, F dense FFN,
#: E experts, X expert FFN, S shared-expert FFN
BLOCK_ROWS: dict[str, tuple[str, ...]] = {
    "nextn.eh_proj.weight": ("H", "2H"),
    "nextn.enorm.weight": ("H",),
    "nextn.hnorm.weight": ("H",),
    "nextn.shared_head_norm.weight": ("H",),
    "attn_norm.weight": ("H",),
    "post_attention_norm.weight": ("H",),
    "attn_q.weight": ("2Q", "H"),
    "attn_k.weight": ("K", "H"),
    "attn_v.weight": ("K", "H"),
    "attn_output.weight": ("H", "Q"),
    "attn_q_norm.weight": ("D",),
    "attn_k_norm.weight": ("D",),
}
DENSE_ROWS: dict[str, tuple[str, ...]] = {
    "ffn_gate.weight": ("F", "H"), "ffn_up.weight": ("F", "H"), "ffn_down.weight": ("H", "F"),
}
MOE_ROWS: dict[str, tuple[str, ...]] = {
    "ffn_gate_inp.weight": ("E", "H"),
    "ffn_gate_exps.weight": ("E", "X", "H"), "ffn_up_exps.weight": ("E", "X", "H"), "ffn_down_exps.weight": ("E", "H", "X"),
    "ffn_gate_shexp.weight": ("S", "H"), "ffn_up_shexp.weight": ("S", "H"), "ffn_down_shexp.weight": ("H", "S"),
    "ffn_gate_inp_shexp.weight": ("1", "H"),
}


def expected_block(dims: dict[str, int], moe: bool) -> dict[str, tuple[int, ...]]:
    rows = {**BLOCK_ROWS, **(MOE_ROWS if moe else DENSE_ROWS)}
    return {k: tuple(dims[s] for s in shp) for k, shp in rows.items()}
