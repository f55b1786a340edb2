"""What a family spec says, as a frozen dataclass: the rows a family module fills in.

Tensor names are data (the gguf-py ``tensor_mapping`` idea): each row names a canonical
:class:`Role`, the family's bare key template (relative to the head prefix, ``{i}`` for the MTP
layer, ``{e}`` for the expert) and a shape in config dimensions. A new family is a new module
that builds one :class:`FamilySpec`; nothing else branches on its name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Mapping

Shape = tuple[str, ...]


class Role(str, Enum):
    """Canonical name of one head tensor, independent of any checkpoint's spelling."""

    FC = "fc"
    PRE_FC_NORM_EMBEDDING = "pre_fc_norm_embedding"
    PRE_FC_NORM_HIDDEN = "pre_fc_norm_hidden"
    FINAL_NORM = "final_norm"
    INPUT_NORM = "input_norm"
    POST_ATTENTION_NORM = "post_attention_norm"
    Q_PROJ = "q_proj"
    K_PROJ = "k_proj"
    V_PROJ = "v_proj"
    O_PROJ = "o_proj"
    Q_NORM = "q_norm"
    K_NORM = "k_norm"
    MLP_GATE = "mlp_gate"
    MLP_UP = "mlp_up"
    MLP_DOWN = "mlp_down"
    ROUTER = "router"
    SHARED_GATE = "shared_expert_gate_proj"
    SHARED_UP = "shared_expert_up_proj"
    SHARED_DOWN = "shared_expert_down_proj"
    SHARED_EXPERT_GATE = "shared_expert_gate"
    EXPERT_GATE = "expert_gate"
    EXPERT_UP = "expert_up"
    EXPERT_DOWN = "expert_down"
    EXPERTS_GATE_UP = "experts_gate_up"
    EXPERTS_DOWN = "experts_down"


@dataclass(frozen=True)
class Row:
    """One head tensor: its role, the family's key template and its shape template."""

    role: Role
    key: str
    shape: Shape


@dataclass(frozen=True)
class FamilySpec:
    """How one model family spells and sizes its MTP head."""

    name: str
    #: ``model_type`` values (top level, or of a nested ``text_config``) that name this family
    model_types: tuple[str, ...]
    text_model_types: tuple[str, ...]
    #: an MoE config of this family's dense sibling is this family (Qwen3.5 dense vs MoE)
    moe: bool
    head_rows: tuple[Row, ...]
    layer_rows: tuple[Row, ...]
    mlp_rows: tuple[Row, ...]
    #: expert format -> rows (MoE families only)
    expert_rows: Mapping[str, tuple[Row, ...]]
    #: roles stored zero-centred in the raw release; MLX adds ``norm_offset`` (docs/SPEC.md §4)
    norm_roles: frozenset[Role]
    norm_offset: float
    #: prefix of the head's keys in a raw Hugging Face checkpoint (stripped to get bare keys)
    hf_head_prefix: str
    #: prefixes of the head's keys inside an MLX folder's ``model*.safetensors``, stripped too
    mlx_head_prefixes: tuple[str, ...]
    #: config keys runtimes read for the number of MTP layers, first one preferred
    count_keys: tuple[str, ...]
    #: config keys that announce the MTP layer count when a head is written (in order)
    count_keys_written: tuple[str, ...]
    #: the release ships a head even when its config declares none (Qwen3-Next)
    ships_head_undeclared: bool
    #: the language model's config sits under ``text_config``
    nested_text_config: bool
    layouts: tuple[str, ...]
    #: mlx-lm's ``Model`` and ``ModelArgs`` classes of the family (imported when called)
    mlx_lm_classes: Callable[[], tuple[type, type]]
    #: attribute path from mlx-lm's top-level model to the language model module
    lm_module_path: tuple[str, ...]
    #: the backbone's decoder layer class that an MTP layer is built from (imported when called)
    head_layer: Callable[[], type]
    #: config dimension -> config key (``text_config`` level); ``None`` marks derived ones
    dim_keys: Mapping[str, str] = field(default_factory=dict)

    @property
    def norm_keys(self) -> frozenset[str]:
        """Bare key templates of the zero-centred norms."""
        return frozenset(r.key for r in (*self.head_rows, *self.layer_rows) if r.role in self.norm_roles)


#: The seven RMSNorm kinds of a Qwen3 MTP head that are zero-centred in the source (docs/SPEC.md §4).
QWEN3_NORM_ROLES = frozenset({
    Role.PRE_FC_NORM_EMBEDDING, Role.PRE_FC_NORM_HIDDEN, Role.FINAL_NORM, Role.INPUT_NORM,
    Role.POST_ATTENTION_NORM, Role.Q_NORM, Role.K_NORM,
})
