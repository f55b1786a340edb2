"""What a family spec says, as a frozen dataclass: the rows a family module fills in.

Tensor names are data (the gguf-py ``tensor_mapping`` idea): each row names a canonical
:class:`Role`, the family's bare key template (relative to the head prefix, ``{i}`` for the MTP
layer, ``{e}`` for the expert) and a shape in config dimensions. A new family is a new module
that builds one :class:`FamilySpec`; nothing else branches on its name.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any, Callable, Iterator, Mapping

Shape = tuple[str, ...]


class Role(str, Enum):
    """Canonical name of one head tensor, independent of any checkpoint's spelling."""

    FC = "fc"
    PRE_FC_NORM_HIDDEN = "pre_fc_norm_hidden"
    PRE_FC_NORM_EMBEDDING = "pre_fc_norm_embedding"
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
    # NextN heads (GLM, DeepSeek): the head's own output projection and embedding copies, the
    # attention biases, the sigmoid router's score-correction bias
    SHARED_HEAD = "shared_head"
    EMBED_TOKENS = "embed_tokens"
    Q_BIAS = "q_bias"
    K_BIAS = "k_bias"
    V_BIAS = "v_bias"
    ROUTER_BIAS = "router_bias"
    # multi-head latent attention (MLA: DeepSeek-V2/V3, GLM-4.7-Flash): the low-rank query and
    # key/value projections and their norms; llama.cpp's converter splits ``kv_b_proj`` into the
    # absorbed per-head key and value matrices ``K_B`` / ``V_B`` (passes/mla.py), which are
    # llama.cpp-side roles no source spells
    Q_A_PROJ = "q_a_proj"
    Q_A_NORM = "q_a_norm"
    Q_B_PROJ = "q_b_proj"
    KV_A_PROJ = "kv_a_proj"
    KV_A_NORM = "kv_a_norm"
    KV_B_PROJ = "kv_b_proj"
    K_B = "k_b"
    V_B = "v_b"
    # latent MoE (Nemotron 3 Super): the routed experts run in a narrower space than the hidden
    # state, entered by ``fc1_latent_proj`` (H -> L) and left by ``fc2_latent_proj`` (L -> H);
    # the shared expert still reads the un-projected input, so these are roles of their own
    LATENT_DOWN = "latent_down_proj"
    LATENT_UP = "latent_up_proj"
    # a head-wise attention gate (Step-3.5's ``g_proj``: one sigmoid gate per query head)
    ATTN_GATE = "attn_gate"
    # DeepSeek Sparse Attention's indexer (DeepSeek-V3.2, GLM-5): a query projection from the
    # low-rank query, a key projection, the key's LayerNorm (weight and bias) and the per-head
    # weights of its scores; llama.cpp loads them in the MTP block as in every other layer
    INDEXER_Q_B = "indexer_q_b"
    INDEXER_K = "indexer_k"
    INDEXER_K_NORM = "indexer_k_norm"
    INDEXER_K_NORM_BIAS = "indexer_k_norm_bias"
    INDEXER_PROJ = "indexer_proj"
    # MiMo-V2: the attention's per-head sink logits, the MTP layer's own output norm (its
    # ``final_layernorm``, before the shared lm_head), and the fused query/key/value projection
    # llama.cpp's ``mimo2`` MTP graph reads (a llama.cpp-side role no source spells:
    # ``FamilySpec.gguf_fused``)
    ATTN_SINKS = "attn_sinks"
    LAYER_OUT_NORM = "layer_out_norm"
    QKV_PROJ = "qkv_proj"
    # Qwen3.8-Flash-Next (hyper-connections): the head's input fusion projects the token
    # embedding and each residual stream on its own (two matrices, not one ``fc``); Qwen Sparse
    # Attention's indexer projects its queries and key in one matrix and RMS-normalizes both;
    # each gated residual (before attention, before the MLP, and the final stream mixer) has a
    # grouped norm over the streams, a low-rank input mixer (down, up) and, but the final one,
    # the projection that spreads the branch back over the streams
    FC_EMBEDDING = "fc_embedding"
    FC_HIDDEN = "fc_hidden"
    INDEXER_QK = "indexer_qk"
    INDEXER_Q_NORM = "indexer_q_norm"
    ATTN_HC_NORM = "attn_hc_norm"
    ATTN_HC_DOWN = "attn_hc_down"
    ATTN_HC_UP = "attn_hc_up"
    ATTN_HC_INJECT = "attn_hc_inject"
    MLP_HC_NORM = "mlp_hc_norm"
    MLP_HC_DOWN = "mlp_hc_down"
    MLP_HC_UP = "mlp_hc_up"
    MLP_HC_INJECT = "mlp_hc_inject"
    OUT_HC_NORM = "out_hc_norm"
    OUT_HC_DOWN = "out_hc_down"
    OUT_HC_UP = "out_hc_up"
    # DeepSeek-V4: the NextN projection stored as its two halves (embedding, hidden), which
    # llama.cpp reads side by side as ``eh_proj``; one key/value projection shared by every head
    # (``wkv``); the grouped output projection (``wo_a`` per head group, then ``wo_b``); the
    # manifold-constrained hyper-connections' mixing weights, biases and gains around the
    # attention, around the MLP and before the head's output (``hc_head_*``)
    E_PROJ = "e_proj"
    H_PROJ = "h_proj"
    KV_PROJ = "kv_proj"
    O_A_PROJ = "o_a_proj"
    O_B_PROJ = "o_b_proj"
    HC_ATTN_FN = "hc_attn_fn"
    HC_ATTN_BASE = "hc_attn_base"
    HC_ATTN_SCALE = "hc_attn_scale"
    HC_FFN_FN = "hc_ffn_fn"
    HC_FFN_BASE = "hc_ffn_base"
    HC_FFN_SCALE = "hc_ffn_scale"
    HC_HEAD_FN = "hc_head_fn"
    HC_HEAD_BASE = "hc_head_base"
    HC_HEAD_SCALE = "hc_head_scale"
    # a drafter of its own (DeepSeek-V4's DSpark): the norm after its input projection, a
    # low-rank bigram bias on the draft logits and the per-position confidence score
    MAIN_NORM = "main_norm"
    MARKOV_W1 = "markov_w1"
    MARKOV_W2 = "markov_w2"
    CONF_PROJ = "conf_proj"


#: every norm of a head (RMSNorms, DSpark's main_norm among them; the DSA indexer's key LayerNorm), zero-centred or not
#: (``FamilySpec.norm_roles`` says which are)
NORM_ROLES = frozenset({
    Role.PRE_FC_NORM_EMBEDDING, Role.PRE_FC_NORM_HIDDEN, Role.FINAL_NORM, Role.INPUT_NORM,
    Role.POST_ATTENTION_NORM, Role.Q_NORM, Role.K_NORM, Role.Q_A_NORM, Role.KV_A_NORM, Role.INDEXER_K_NORM,
    Role.LAYER_OUT_NORM, Role.MAIN_NORM,
})
#: the routers: mlx-lm's MoE convention keeps them at 8 bits, llama.cpp in F32
ROUTER_ROLES = frozenset({Role.ROUTER, Role.SHARED_EXPERT_GATE})
#: tensors mlx-lm's ``convert`` leaves in the source's float dtype (its GLM and DeepSeek models'
#: ``cast_predicate``): the sigmoid router's score-correction bias, float32 in the releases,
#: whose rounding to bf16 can change which experts a token is routed to
UNCAST_ROLES = frozenset({Role.ROUTER_BIAS})
#: expert tensors in any format (one per expert, fused, or stacked)
EXPERT_ROLES = frozenset({Role.EXPERT_GATE, Role.EXPERT_UP, Role.EXPERT_DOWN, Role.EXPERTS_GATE_UP, Role.EXPERTS_DOWN})
#: a fused gate+up stack holds these two roles, gate rows first (docs/SPEC.md §2)
FUSED_PARTS: Mapping[Role, tuple[Role, ...]] = {
    Role.EXPERTS_GATE_UP: (Role.EXPERT_GATE, Role.EXPERT_UP), Role.EXPERTS_DOWN: (Role.EXPERT_DOWN,),
}
#: the stacked expert format mlx-lm's ``SwitchGLU`` loads (also an ``--experts`` value)
STACKED = "switch_mlp"


@dataclass(frozen=True)
class Row:
    """One head tensor: its role, the family's key template and its shape template.

    ``optional``: a release may leave the tensor out (GLM-4.6 omits the ``shared_head.head`` /
    ``embed_tokens`` copies GLM-4.5 ships); the head is complete without it. ``when``: a
    text-config key that switches the tensor on (GLM's ``attention_bias``, ``use_qk_norm``): the
    tensor exists exactly when that key is true.
    """

    role: Role
    key: str
    shape: Shape
    optional: bool = False
    when: str | None = None

    @cached_property
    def pattern(self) -> "re.Pattern[str]":
        """The template as a regex: ``{i}`` and ``{e}`` become named integer groups."""
        body = re.escape(self.key).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{e\}", r"(?P<e>\d+)")
        return re.compile(f"^{body}$")


@dataclass(frozen=True)
class Topology:
    """How a head's MTP steps sit among the model's layers: the one part of a spec that says what
    ``{N}`` in its prefixes is, whether each step is a layer of its own, and which blocks make one
    step (the default: Qwen's own ``mtp.`` namespace, step ``i`` at ``mtp.layers.{i}``).

    Whether a head is one MTP step only (``FamilySpec.one_step``) follows from its rows (no
    ``{i}`` in any key), so it is not said twice."""

    #: text-config key whose value fills ``{N}`` in the head's prefixes: the head is a NextN
    #: layer appended after the backbone's (GLM: ``num_hidden_layers`` -> ``model.layers.{N}.``)
    index_key: str | None = None
    #: every MTP step is one more layer appended after the backbone's: ``{N}`` is the first, and
    #: step ``i`` sits at ``N + i`` (Step-3.5's three layers); its bare keys are ``{i}.`` + the
    #: layer's key, so the rows spell ``{i}`` as Qwen's ``mtp.layers.{i}`` do
    appended_steps: bool = False
    #: a hybrid head's blocks as mlx-lm's block class is built for them, in order (Nemotron-H:
    #: attention then MoE, ``("*", "E")``, what every runtime drafting it requires); empty for a
    #: head of one decoder layer per step (``decoder/hybrid.py`` builds the others)
    mlx_blocks: tuple[str, ...] = ()

    @property
    def nextn(self) -> bool:
        """The head is a NextN layer appended after the backbone's (its prefix names the index)."""
        return self.index_key is not None


@dataclass(frozen=True)
class MlxBackbone:
    """Where mlx-lm's model class keeps the parts a drafter shares with the backbone."""

    inner: str = "model"
    embed: str = "embed_tokens"
    final_norm: str = "norm"


@dataclass(frozen=True)
class GgufDrafter:
    """A head llama.cpp loads as a model of its own beside the trunk, not as its MTP block
    (DeepSeek-V4's DSpark, architecture ``dflash``): the file's metadata is the trunk's under
    ``arch`` with these changes, its blocks count from 0, it carries no trunk tensor. Each entry
    is what the family's converter class writes (``gguf/meta.drafter_kv`` applies them)."""

    #: the file's llama.cpp architecture and the ``--spec-type`` that loads it
    arch: str
    spec_type: str
    #: the written file's name: ``<prefix><model name>-<TYPE>.gguf``
    file_prefix: str
    #: per-layer arrays (key after ``{arch}.``) rewritten with one entry per drafter block: a
    #: shape symbol or a value
    layer_arrays: Mapping[str, "str | int | float"] = field(default_factory=dict)
    #: keys (after ``{arch}.``) set to a value, and keys the trunk states that the file does not
    values: Mapping[str, int] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()
    #: keys added from the source's config, in order, before ``before`` (``{arch}`` filled) or,
    #: with ``tail`` keys, after everything: gguf key -> (config key, value type, added to each
    #: entry of a list)
    added: Mapping[str, tuple[str, str, int]] = field(default_factory=dict)
    before: str = "general.quantization_version"
    tail: Mapping[str, tuple[str, str, int]] = field(default_factory=dict)


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
    #: prefix of the head's keys in a raw Hugging Face checkpoint (stripped to get bare keys); a
    #: template where ``{N}`` is the config's ``topology.index_key`` (a NextN layer appended after
    #: the backbone's: ``model.layers.{N}.``), else a plain string (Qwen: ``mtp.``)
    hf_head_prefix: str
    #: prefixes of the head's keys inside an MLX folder's ``model*.safetensors``, stripped too
    mlx_head_prefixes: tuple[str, ...]
    #: prefix of the head's keys in a file that holds only the head (the sidecar, vllm-mlx's
    #: weights): the spelling the runtimes reading those files look up
    head_file_prefix: str
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
    #: config dimension -> config key (``text_config`` level), or a tuple of keys whose values
    #: multiply (GLM's shared-expert width: ``n_shared_experts`` x ``moe_intermediate_size``)
    dim_keys: Mapping[str, "str | tuple[str, ...]"] = field(default_factory=dict)
    #: how the MTP steps map onto layers (``Topology``)
    topology: Topology = Topology()
    #: head tensors no MLX runtime reads, left out of MLX folders (GLM's ``embed_tokens`` copy:
    #: MTPLX drafts with the trunk's embedding; llama.cpp reads the copy, so GGUF keeps it)
    unread_in_mlx: frozenset[Role] = frozenset()
    #: a released checkpoint of the family that ships the head (what a fix's ``--source`` names)
    example_repo: str = "Qwen/Qwen3.5-27B"
    #: for a family mtpforge writes for llama.cpp only (``layouts`` empty): which MLX runtime
    #: drafts its head today and from what (measured), said in the fix for a head-less MLX folder
    mlx_drafted_by: str | None = None
    #: llama.cpp's ``general.architecture`` for this family (None: no GGUF output)
    gguf_arch: str | None = None
    #: the architecture whose gguf-py tensor list spells this family's GGUF names, where the
    #: gguf-py mtpforge installs predates ``gguf_arch`` (None: ``gguf_arch``'s own list)
    gguf_names_as: str | None = None
    #: llama.cpp pre-tokenizers (``tokenizer.ggml.pre``) that tell this family's GGUFs from those
    #: of the family registered first on the same architecture (DeepSeek-V3's ``deepseek-v3``
    #: beside GLM-4.7-Flash's ``glm4``, both ``deepseek2``: the converter writes no other key that
    #: differs by family rather than by size); empty: the architecture's only or first family
    gguf_tokenizer_pre: tuple[str, ...] = ()
    #: Role -> llama.cpp's name relative to ``blk.{n}.`` where this family's converter and loader
    #: spell it otherwise than the architecture's gguf-py rows (Hy3's suffix-less
    #: ``exp_probs_b``: its converter keeps the source's missing suffix and its loader asks for
    #: that name); empty: the rows' names
    gguf_names: Mapping[Role, str] = field(default_factory=dict)
    #: backbone key suffixes whose tensor tells a raw release from a converted one (a remote
    #: source's shard holding one is read for its header)
    raw_marker_suffixes: tuple[str, ...] = ()
    #: ``(key, shape) -> True`` for a backbone tensor only a raw release stores that way (how
    #: mlx-lm tells a checkpoint to sanitize); None: the family has no such marker
    is_raw_tensor: Callable[[str, tuple[int, ...]], bool] | None = None
    #: shape symbols built from the others (MLA's ``n·(d_nope+d_rope)``): base symbols -> the
    #: added ones, applied to a config's dimensions and to a GGUF's alike; None: none
    derived_dims: Callable[[Mapping[str, int]], dict[str, int]] | None = None
    #: shape symbol -> llama.cpp metadata key (after ``{arch}.``) where this family's GGUF says
    #: it differently from the default (``names.GGUF_DIM_KEYS``); None: the GGUF does not state
    #: that dimension (MLA is written as MQA: its ``head_count_kv`` / ``key_length`` are not the
    #: config's)
    gguf_dim_keys: Mapping[str, "str | None"] = field(default_factory=dict)
    #: shape symbols a config may leave unset (absent or null reads as 0), each used only by
    #: rows a ``when`` key switches on or by ``derived_dims`` (Nemotron-H's ``moe_latent_size``:
    #: Nemotron 3 Super has one, Nano none)
    optional_dims: frozenset[str] = frozenset()
    #: llama.cpp per-layer metadata arrays (key after ``{arch}.``) that the converter extends
    #: by an entry for each MTP block, -> the shape symbol that entry takes (Nemotron-H's folded
    #: block counts as an attention and a MoE layer: ``attention.head_count_kv`` gets KV,
    #: ``feed_forward_length`` the expert width), or the entry itself where it is not a
    #: dimension (a bool or a float: Step-3.5's ``sliding_window_pattern`` gets ``True``, its
    #: SwiGLU clamps ``0.0``); arrays not named here keep their default (``gguf/meta.py``)
    gguf_layer_arrays: Mapping[str, "str | bool | float"] = field(default_factory=dict)
    #: where the converter writes ``{arch}.nextn_predict_layers``: before the first metadata key
    #: starting with one of these (first one found wins; ``{arch}`` filled), else last. Each
    #: converter class adds it at its own point: Qwen3.5's before the SSM keys, GLM's and
    #: Nemotron-H's after all of the family's own keys
    gguf_nextn_before: tuple[str, ...] = ("{arch}.ssm.", "general.quantization_version")
    #: llama.cpp's converter reorders each head's query/key rows as Llama's does for rotary
    #: embedding (``passes/rope.py``): Nemotron-H's inherits it from Granite's
    gguf_permutes_qk: bool = False
    #: matrices llama.cpp's converter keeps in F32 elsewhere but writes at the file's type in this
    #: family's MTP block (Nemotron-H's router: the converter's F32 rule matches the block index
    #: it reads from the source name, and ``mtp.layers.1`` gives 1, not the block's)
    gguf_quantized_roles: frozenset[Role] = frozenset()
    #: roles whose module mlx-lm builds as a bare parameter, not a Linear (GLM's, DeepSeek's and
    #: Nemotron-H's ``MoEGate``): ``mlx_lm.convert`` keeps them float and a loader refuses their
    #: scales, so an MLX head keeps them float at any ``--precision``
    mlx_float_roles: frozenset[Role] = frozenset()
    #: a llama.cpp-side role -> the source roles whose rows it holds, concatenated in this order,
    #: where the family's llama.cpp graph reads one fused tensor but the source (and the
    #: converter) keep them apart (MiMo-V2's MTP ``attn_qkv``: query, key, value rows, at the
    #: offsets ``mimo2.cpp`` views); the GGUF emitter writes the fused tensor in their place
    gguf_fused: Mapping[Role, tuple[Role, ...]] = field(default_factory=dict)
    #: roles whose block-FP8 release stores the rows rank by rank over tensor-parallel ranks, each
    #: rank's share of every part together (MiMo-V2.5's ``qkv_proj``): the dims of the parts, in
    #: order (``headplan.rank_sharded`` unshards them as the family's converter does). The GGUF
    #: emitter reads it; no family that has it writes an MLX layout (the architecture test holds that)
    rank_sharded: Mapping[Role, tuple[str, ...]] = field(default_factory=dict)
    #: the family whose GGUF files this family's are, tensor for tensor (one llama.cpp
    #: architecture, one layout: a file does not say which release it came from)
    gguf_same_as: str | None = None
    #: fused roles (``gguf_fused``) whose parts lie side by side, columns after columns, not rows
    #: after rows (DeepSeek-V4's ``eh_proj``: ``e_proj`` then ``h_proj`` along the input axis)
    gguf_fused_columns: frozenset[Role] = frozenset()
    #: Role -> llama.cpp's name for a head tensor it keeps outside the MTP block (DeepSeek-V4's
    #: converter writes the head's own ``hc_head_*`` as the MTP file's ``output_hc_*``)
    gguf_root_names: Mapping[Role, str] = field(default_factory=dict)
    #: ``(role, source dtype, n_dims) -> ggml type name`` where the family's converter writes a
    #: tensor in a type of its own whatever ``--outtype`` says (DeepSeek-V4: block-FP8 matrices
    #: as Q8_0, bf16 ones as BF16, F32 as F32, FP4 experts as MXFP4); None from it, or no hook:
    #: the precision's type
    gguf_type_of: Callable[["Role | None", str, int], "str | None"] | None = None
    #: ``general.file_type`` of the family's MTP-only file where its converter fixes it (DeepSeek-V4:
    #: 38, MXFP4 MoE); None: the precision's
    gguf_file_type: int | None = None
    #: the head is a drafter llama.cpp loads as a model of its own (``GgufDrafter``), not an MTP
    #: block; ``config_marker``: the config key whose presence tells such a release from the
    #: family's other one (DeepSeek-V4-Flash-DSpark's ``dspark_block_size``)
    gguf_drafter: "GgufDrafter | None" = None
    config_marker: str | None = None
    #: widths a release's config need not state, read from a head tensor's header where it does
    #: not (config key -> the tensor's key under the head prefix and the axis), as the family's
    #: converter reads them (DSpark's Markov rank: ``markov_w1``'s columns)
    header_dims: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    #: the trunk hidden state llama.cpp's MTP graph for this family hands the head (its
    #: ``t_h_nextn``): ``post`` (after ``output_norm``: Qwen, GLM, DeepSeek, ...) or ``pre``
    #: (``mimo2.cpp`` takes it before the norm); what ``verify`` of a GGUF reports
    gguf_mtp_hidden: str = "post"
    #: part role -> module path (``{i}``: the MTP layer) in mlx-lm's decoder layer, for a tensor
    #: the family stores whole and mlx-lm's sanitize splits (MLA's ``kv_b_proj`` into the
    #: absorbed ``K_B`` / ``V_B``): what the bundled decoder splits on load (passes/mla.py);
    #: empty: the decoder layer holds the stored tensors as they are
    mlx_layer_parts: Mapping[Role, str] = field(default_factory=dict)
    #: the decoder layer takes its attention mask as an array, never mlx-lm's ``"causal"``
    #: shorthand (MLA's attention adds the mask to its rope scores itself: mlx-lm's
    #: ``glm4_moe_lite`` model and MTPLX's head build it with ``return_array=True``)
    mask_as_array: bool = False
    #: the cache one NextN layer needs where one ``KVCache`` is not it, as mlx-lm's model makes it
    #: per layer (DeepSeek-V3.2's: the attention's and the indexer's, a ``CacheList``); the mask is
    #: then built from its first entry, as mlx-lm's model and MTPLX's head build it
    head_cache: "Callable[[], Any] | None" = None
    #: mlx-lm's attribute names on the language model module: the inner model, its embedding
    #: and its final norm (Nemotron-H: ``backbone`` / ``embeddings`` / ``norm_f``); the decoder
    #: taps the norm and embeds with the embedding
    mlx_backbone: MlxBackbone = MlxBackbone()
    #: the ``model_type`` of the drafter folder mlx-vlm's ``--draft-kind mtp`` loads for this
    #: family (layout ``mlx-vlm-drafter``: its ``DRAFTER_KIND_BY_MODEL_TYPE`` key); None: mlx-vlm
    #: has no drafter for it
    mlx_vlm_drafter_type: str | None = None
    #: the module the drafter model holds the head in (GLM-5's ``mtp.``), prefixed to every key
    #: and module path of its folder; empty: the head's modules are the drafter's own (Qwen)
    mlx_vlm_drafter_prefix: str = ""
    #: bare module path -> the drafter's name for it, where mlx-vlm's splitter renames a module
    #: its drafter model holds under another name (GLM-5's ``shared_head.norm``)
    mlx_vlm_drafter_renames: Mapping[str, str] = field(default_factory=dict)

    @property
    def one_step(self) -> bool:
        """Every row belongs to MTP step 0 (no ``{i}``): the head is one MTP step whatever its
        source calls its layers (Nemotron-H's two blocks are one step), never more."""
        return not any("{i}" in r.key for r in self.rows())

    @property
    def gguf_only(self) -> bool:
        """mtpforge writes this family's head for llama.cpp only: no MLX layout, so no MLX norm
        convention to hold a head to and no decoder head to verify one with."""
        return not self.layouts

    def gguf_only_refusal(self, what: str, fix: str = "put the head into the trunk's GGUF: mtpforge add-mtp "
                                                     "--source SOURCE --target TRUNK.gguf") -> tuple[str, str]:
        """(message, fix) for what a command cannot do with an MLX folder of a ``gguf_only``
        family; the fix also says which MLX runtime drafts its head today."""
        today = self.mlx_drafted_by or f"docs/families/{self.name}.md says which MLX runtime drafts it"
        return f"mtpforge writes the {self.name} head for llama.cpp only so far, {what}", f"{fix}; {today}"

    def mlx_fix(self, source: str, target: str) -> str:
        """The fix for an MLX folder of this family that lacks its head: the add-mtp command,
        or, for a family mtpforge writes for llama.cpp only, where its MLX runtimes stand."""
        if not self.gguf_only:
            return f"mtpforge add-mtp --source {source} --target {target}"
        today = self.mlx_drafted_by or f"docs/families/{self.name}.md says which MLX runtime drafts it"
        return f"mtpforge writes this head for llama.cpp only: mtpforge add-mtp --source {source} --target TRUNK.gguf; in MLX, {today}"

    def rows(self, fmt: str | None = None) -> Iterator[Row]:
        """Every row: per-head, per-MTP-layer, MLP, then the experts of ``fmt`` (all formats
        when None). Per-head rows have no ``{i}``; per-layer rows are repeated per MTP layer."""
        yield from (*self.head_rows, *self.layer_rows, *self.mlp_rows)
        for f, rows in self.expert_rows.items():
            if fmt is None or f == fmt:
                yield from rows

    def row(self, role: Role, fmt: str | None = None) -> Row:
        """The row of ``role`` (experts: in format ``fmt``, default the stacked one)."""
        want = fmt or (STACKED if role in EXPERT_ROLES else None)
        for r in self.rows(want):
            if r.role == role:
                return r
        raise KeyError(f"{self.name} has no {role.value} tensor" + (f" in the {want} expert format" if want else ""))

    def key(self, role: Role, i: int = 0, e: int = 0, fmt: str | None = None) -> str:
        """The bare key of ``role`` in MTP layer ``i`` (expert ``e``), as this family spells it."""
        return self.row(role, fmt).key.format(i=i, e=e)

    def module(self, role: Role, i: int = 0, e: int = 0, fmt: str | None = None) -> str:
        """The module path of ``role`` (its key without ``.weight``): what quantization keys."""
        k = self.key(role, i, e, fmt)
        return k[: -len(".weight")] if k.endswith(".weight") else k

    def match(self, bare: str) -> tuple[Row, str | None, int | None, int | None] | None:
        """(row, expert format or None, MTP layer, expert) of a bare key or module path (the
        reverse map, like gguf-py's ``TensorNameMap``); None for a key no row spells."""
        for fmt, rows in ((None, (*self.head_rows, *self.layer_rows, *self.mlp_rows)), *self.expert_rows.items()):
            for r in rows:
                m = r.pattern.match(bare) or r.pattern.match(bare + ".weight")
                if m:
                    d = m.groupdict()
                    return r, fmt, (int(d["i"]) if d.get("i") else None), (int(d["e"]) if d.get("e") else None)
        return None

    def role_of(self, bare: str) -> Role | None:
        """The role of a bare key or module path, None for one this family does not spell."""
        hit = self.match(bare)
        return hit[0].role if hit else None

    def head_prefix(self, config: Any = None) -> str:
        """The raw checkpoint's head prefix, ``{N}`` filled from ``config`` (``topology.index_key``)."""
        return self.fill(self.hf_head_prefix, config)

    def file_prefix(self, config: Any = None) -> str:
        """The head-only file's prefix, ``{N}`` filled as in :meth:`head_prefix`."""
        return self.fill(self.head_file_prefix, config)

    def fill(self, template: str, config: Any) -> str:
        """``template`` with ``{N}`` (the NextN layer's index) from the config's ``topology.index_key``."""
        key = self.topology.index_key
        if key is None:
            return template
        if config is None:
            raise ValueError(f"{self.name}'s head prefix depends on the config ({key})")
        from ..inputs.model_config import as_config

        return template.format(N=getattr(as_config(config).text, key))

    def head_prefixes(self, config: Any = None) -> tuple[str, ...]:
        """Every prefix a head key of this family carries: the MLX spellings, the head-only
        file's, then the raw one."""
        mlx = (self.fill(p, config) for p in self.mlx_head_prefixes)
        return tuple(dict.fromkeys((*mlx, self.file_prefix(config), self.head_prefix(config))))

    def strip_prefix(self, key: str, config: Any = None) -> str | None:
        """The bare key of a stored head key (MLX or raw spelling), None for a backbone key."""
        if self.topology.appended_steps:
            return self._appended_bare(key, config)
        p = next((p for p in self.head_prefixes(config) if key.startswith(p)), None)
        return None if p is None else key[len(p):]

    def _appended_bare(self, key: str, config: Any) -> str | None:
        """``{i}.`` + the rest for a key of the appended layer ``N + i`` (``topology.appended_steps``)."""
        first = self.head_prefix(config)
        stem = self.hf_head_prefix.split("{N}")[0]
        n = int(first[len(stem):].rstrip("."))
        m = re.match(re.escape(stem) + r"(\d+)\.(.+)$", key)
        if m is None or int(m.group(1)) < n:
            return None
        return f"{int(m.group(1)) - n}.{m.group(2)}"

    def is_head_key(self, key: str, config: Any = None) -> bool:
        """A stored key (any layout) that belongs to the MTP head, not to the backbone."""
        return self.strip_prefix(key, config) is not None

    def is_norm_key(self, bare: str) -> bool:
        """A zero-centred norm of this family (never e.g. ``linear_attn.norm``)."""
        return self.role_of(bare) in self.norm_roles

    def offset_of(self, bare: str) -> float:
        """What MLX adds to this tensor of the raw release: ``norm_offset`` for a zero-centred
        norm, 0 otherwise (and 0 everywhere for a raw-norm family)."""
        return self.norm_offset if self.is_norm_key(bare) else 0.0

    def expert_format_of(self, keys: Any) -> str:
        """Which expert format (a key of ``expert_rows``) a set of bare keys uses; 'none' for
        a dense head. Stacked first: a converted head is never taken for a source one."""
        ks = list(keys)
        order = sorted(self.expert_rows, key=lambda f: f != STACKED)
        for fmt in order:
            if any(r.pattern.match(k) for r in self.expert_rows[fmt] for k in ks):
                return fmt
        return "none"


#: The seven RMSNorm kinds of a Qwen3 MTP head that are zero-centred in the source (docs/SPEC.md §4).
QWEN3_NORM_ROLES = frozenset({
    Role.PRE_FC_NORM_EMBEDDING, Role.PRE_FC_NORM_HIDDEN, Role.FINAL_NORM, Role.INPUT_NORM,
    Role.POST_ATTENTION_NORM, Role.Q_NORM, Role.K_NORM,
})


def backbone_marker(prefix: str, suffixes: tuple[str, ...]) -> Callable[[str, tuple[int, ...]], bool]:
    """``FamilySpec.is_raw_tensor`` for a family whose raw release is told by a backbone key
    under ``prefix`` ending in one of ``suffixes`` (a per-expert tensor mlx-lm's sanitize stacks,
    an unsplit one it splits, a name it renames): the shape does not matter."""

    def is_raw_tensor(key: str, shape: tuple[int, ...]) -> bool:
        return key.startswith(prefix) and key.endswith(suffixes)

    return is_raw_tensor


def mlx_lm_model(module: str) -> Callable[[], tuple[type, type]]:
    """``FamilySpec.mlx_lm_classes`` for mlx-lm's ``mlx_lm.models.<module>``: its ``Model`` and
    ``ModelArgs``, imported when called (importing mtpforge must not import every model)."""

    def classes() -> tuple[type, type]:
        m = importlib.import_module(f"mlx_lm.models.{module}")
        return m.Model, m.ModelArgs

    return classes


def mlx_lm_class(module: str, name: str) -> Callable[[], type]:
    """``FamilySpec.head_layer``: the class ``name`` of ``mlx_lm.models.<module>``, imported when
    called."""
    return lambda: getattr(importlib.import_module(f"mlx_lm.models.{module}"), name)
