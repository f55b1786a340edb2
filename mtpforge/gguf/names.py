"""llama.cpp's names for the MTP head, as data (docs/SPEC.md §5.1).

llama.cpp stores the MTP layer as one more block after the trunk's: ``blk.{n}`` with ``n`` the
trunk's layer count, holding the ordinary layer tensors plus four ``nextn.*`` tensors. The rows
below map a bare source key (relative to ``mtp.``, ``{i}`` = MTP layer) to that name; they are
checked against llama.cpp's own converter in the tests. Expert tensors (per-expert, fused) are
stacked into one ``ffn_*_exps`` tensor per projection.
"""

from __future__ import annotations

import re

#: mtpforge family -> llama.cpp architecture (``general.architecture``)
ARCH: dict[str, str] = {"qwen3_5": "qwen35", "qwen3_5_moe": "qwen35moe", "qwen3_next": "qwen3next"}
FAMILY_OF_ARCH = {v: k for k, v in ARCH.items()}

#: head-level tensors: they belong to the first MTP block
HEAD_NAMES: dict[str, str] = {
    "fc.weight": "nextn.eh_proj.weight",
    "pre_fc_norm_embedding.weight": "nextn.enorm.weight",
    "pre_fc_norm_hidden.weight": "nextn.hnorm.weight",
    "norm.weight": "nextn.shared_head_norm.weight",
}

#: per-layer tensors, relative to ``layers.{i}.`` -> relative to ``blk.{n}.``
LAYER_NAMES: dict[str, str] = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}

#: expert projection -> stacked tensor (one per projection, experts on the slowest axis)
EXPERT_NAMES: dict[str, str] = {
    "gate_proj": "ffn_gate_exps.weight",
    "up_proj": "ffn_up_exps.weight",
    "down_proj": "ffn_down_exps.weight",
}

#: the trunk tensors an MTP-only file carries for the draft model (llama.cpp's converter keeps
#: exactly these three beside the MTP block)
SHARED_TENSORS: tuple[str, ...] = ("token_embd.weight", "output_norm.weight", "output.weight")

#: tensors llama.cpp keeps in F32 whatever the file type (its converter's rule: norms, 1-D
#: tensors, routers)
F32_SUFFIXES: tuple[str, ...] = ("_norm.weight", "nextn.enorm.weight", "nextn.hnorm.weight", "ffn_gate_inp.weight",
                                 "ffn_gate_inp_shexp.weight")

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")


def gguf_name(bare: str, n_trunk: int) -> str | None:
    """The GGUF name of a non-expert source head tensor (None for expert tensors)."""
    if bare in HEAD_NAMES:
        return f"blk.{n_trunk}.{HEAD_NAMES[bare]}"
    m = _LAYER.match(bare)
    if m and m.group(2) in LAYER_NAMES:
        return f"blk.{n_trunk + int(m.group(1))}.{LAYER_NAMES[m.group(2)]}"
    return None


def block_of(name: str) -> int | None:
    m = _BLK.match(name)
    return int(m.group(1)) if m else None


def keeps_f32(name: str, n_dims: int) -> bool:
    """llama.cpp's converter keeps norms, 1-D tensors and routers in F32."""
    return n_dims <= 1 or name.endswith(F32_SUFFIXES)


#: llama.cpp's norms that the converter shifts +1 (zero-centred in the source), by GGUF suffix
SHIFTED_NORMS: tuple[str, ...] = (
    "nextn.enorm.weight", "nextn.hnorm.weight", "nextn.shared_head_norm.weight",
    "attn_norm.weight", "post_attention_norm.weight", "attn_q_norm.weight", "attn_k_norm.weight",
)


def is_shifted_norm(name: str) -> bool:
    return name.endswith(SHIFTED_NORMS)


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
