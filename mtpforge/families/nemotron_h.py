"""Nemotron-H (``nemotron_h``, llama.cpp ``nemotron_h_moe``): a hybrid Mamba-2 / attention / MoE
trunk whose MTP head is two ordinary Nemotron-H blocks, ``mtp.layers.0`` (attention) and
``mtp.layers.1`` (MoE), with the NextN extras on the first and the final norm on the last
(docs/families/nemotron_h.md).

The two source blocks are one MTP step (``num_nextn_predict_layers`` 1, pattern ``*E``), and
llama.cpp's converter folds them into one block ``blk.{N}``: layer 0's pre-norm is the block's
``attn_norm``, layer 1's its ``post_attention_norm``, ``final_layernorm`` its
``nextn.shared_head_norm``. So the rows below spell the source's layer index literally
(``layers.0.``, ``layers.1.`` after the prefix ``mtp.``) instead of an ``{i}`` placeholder: every
row belongs to MTP step 0, i.e. to the one llama.cpp block, which is how the GGUF names come out
right with no Nemotron case anywhere else; and the bare keys are mlx-lm's module paths of the
head (``layers.1.mixer.switch_mlp.fc1``), as MTPLX and mlx-lm #1533 build it.

Attention without rotary embedding (the q/k/v/o rows carry no norm or bias); the MoE is a sigmoid
router with its score-correction bias, ReLU² experts with an up and a down projection only (no
gate projection), one shared expert (up/down), and, in Nemotron 3 Super's latent MoE, the
projections into and out of the experts' latent space. Norms are raw (``w · x̂``): the converter
copies all five as stored (measured), so no offset.

The head uses the trunk's ``backbone.embeddings`` and ``lm_head``; it has no copies of its own.
In MLX folders the head keeps the source's names: MTPLX's ``nemotron_h_mtp`` reads the sidecar,
mlx-lm #1533 the embedded form; the ``switch_mlp`` rows spell the stacked experts as mlx-lm's
``SwitchMLP`` (``fc1`` / ``fc2``) names them there and in mlx-vlm's drafter, and are what
llama.cpp's stacked ``ffn_*_exps`` are checked against.
"""

from __future__ import annotations

from typing import Mapping

from .spec import FamilySpec, MlxBackbone, Role, Row, Topology, backbone_marker, mlx_lm_class, mlx_lm_model

#: the NextN tensors: the input fusion on the first source block, the final norm on the last
HEAD_ROWS = (
    Row(Role.FC, "layers.0.eh_proj.weight", ("H", "2H")),
    Row(Role.PRE_FC_NORM_EMBEDDING, "layers.0.enorm.weight", ("H",)),
    Row(Role.PRE_FC_NORM_HIDDEN, "layers.0.hnorm.weight", ("H",)),
    Row(Role.FINAL_NORM, "layers.1.final_layernorm.weight", ("H",)),
)
#: ``mtp.layers.0``: pre-norm and attention (no RoPE, no q/k norm, no biases)
LAYER_ROWS = (
    Row(Role.INPUT_NORM, "layers.0.norm.weight", ("H",)),
    Row(Role.Q_PROJ, "layers.0.mixer.q_proj.weight", ("QD", "H")),
    Row(Role.K_PROJ, "layers.0.mixer.k_proj.weight", ("KD", "H")),
    Row(Role.V_PROJ, "layers.0.mixer.v_proj.weight", ("KD", "H")),
    Row(Role.O_PROJ, "layers.0.mixer.o_proj.weight", ("H", "QD")),
)
#: ``mtp.layers.1``: pre-norm (llama.cpp's ``post_attention_norm`` of the folded block), the
#: sigmoid router, the shared expert, and the latent projections where the MoE has them
MLP_ROWS = (
    Row(Role.POST_ATTENTION_NORM, "layers.1.norm.weight", ("H",)),
    Row(Role.ROUTER, "layers.1.mixer.gate.weight", ("E", "H")),
    Row(Role.ROUTER_BIAS, "layers.1.mixer.gate.e_score_correction_bias", ("E",)),
    Row(Role.SHARED_UP, "layers.1.mixer.shared_experts.up_proj.weight", ("IS", "H")),
    Row(Role.SHARED_DOWN, "layers.1.mixer.shared_experts.down_proj.weight", ("H", "IS")),
    Row(Role.LATENT_DOWN, "layers.1.mixer.fc1_latent_proj.weight", ("L", "H"), when="moe_latent_size"),
    Row(Role.LATENT_UP, "layers.1.mixer.fc2_latent_proj.weight", ("H", "L"), when="moe_latent_size"),
)
#: ReLU² experts: up and down only; ``X`` is the width they read and write (the latent size,
#: else the hidden size)
EXPERT_ROWS = {
    "per-expert": (
        Row(Role.EXPERT_UP, "layers.1.mixer.experts.{e}.up_proj.weight", ("IM", "X")),
        Row(Role.EXPERT_DOWN, "layers.1.mixer.experts.{e}.down_proj.weight", ("X", "IM")),
    ),
    "switch_mlp": (
        Row(Role.EXPERT_UP, "layers.1.mixer.switch_mlp.fc1.weight", ("E", "IM", "X")),
        Row(Role.EXPERT_DOWN, "layers.1.mixer.switch_mlp.fc2.weight", ("E", "X", "IM")),
    ),
}
DIM_KEYS: dict[str, "str | tuple[str, ...]"] = {
    "H": "hidden_size", "NH": "num_attention_heads", "D": "head_dim", "KV": "num_key_value_heads",
    "I": "intermediate_size", "E": "n_routed_experts", "IM": "moe_intermediate_size",
    "IS": "moe_shared_expert_intermediate_size", "V": "vocab_size", "L": "moe_latent_size",
}
#: the converter states the shared expert's width itself, the latent size where there is one,
#: and no dense width: ``feed_forward_length`` is a per-layer array of the MoE width
GGUF_DIM_KEYS: dict[str, "str | None"] = {
    "I": None, "IS": "expert_shared_feed_forward_length", "L": "moe_latent_size",
}
#: the folded MTP block is both an attention and a MoE layer: the converter extends these
#: per-layer arrays by the attention's KV heads and the MoE width (measured)
GGUF_LAYER_ARRAYS: dict[str, str] = {"feed_forward_length": "IM", "attention.head_count_kv": "KV"}


def expert_width(d: Mapping[str, int]) -> dict[str, int]:
    """``X``, the width the routed experts read and write: the latent size when the MoE has
    one (a config's null and a GGUF's absent ``moe_latent_size`` both read as 0), else H."""
    return {"X": d.get("L") or d["H"]}


RAW_MARKERS = (".mixer.experts.0.up_proj.weight",)

NEMOTRON_H = FamilySpec(
    mlx_float_roles=frozenset({Role.ROUTER}),
    name="nemotron_h",
    model_types=("nemotron_h",),
    text_model_types=(),
    moe=True,
    head_rows=HEAD_ROWS,
    layer_rows=LAYER_ROWS,
    mlp_rows=MLP_ROWS,
    expert_rows=EXPERT_ROWS,
    norm_roles=frozenset(),
    norm_offset=0.0,
    hf_head_prefix="mtp.",
    head_file_prefix="mtp.",
    # mlx-lm #1533 keeps the head in model*.safetensors under the source's prefix
    mlx_head_prefixes=("mtp.",),
    count_keys=("num_nextn_predict_layers",),
    count_keys_written=("num_nextn_predict_layers",),
    ships_head_undeclared=False,
    nested_text_config=False,
    # the sidecar MTPLX's nemotron_h_mtp reads; embedded: mlx-lm #1533's form; the drafter
    # folder mlx-vlm's NemotronHMTPDraftModel loads (bare keys, its own config)
    layouts=("sidecar", "embedded", "mlx-vlm-drafter"),
    mlx_vlm_drafter_type="nemotron_h_mtp",
    mlx_lm_classes=mlx_lm_model("nemotron_h"),
    lm_module_path=(),
    head_layer=mlx_lm_class("nemotron_h", "NemotronHBlock"),
    dim_keys=DIM_KEYS,
    gguf_arch="nemotron_h_moe",
    # the Nemotron 3 release that ships the MTP head (Nemotron 3 Nano has none); the head is
    # read from the BF16 checkpoint (FP8 / NVFP4 releases: docs/families/nemotron_h.md)
    example_repo="nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16",
    raw_marker_suffixes=RAW_MARKERS,
    # a per-expert backbone expert: mlx-lm's sanitize stacks them
    is_raw_tensor=backbone_marker("backbone.layers.", RAW_MARKERS),
    derived_dims=expert_width,
    gguf_dim_keys=GGUF_DIM_KEYS,
    optional_dims=frozenset({"L"}),
    gguf_layer_arrays=GGUF_LAYER_ARRAYS,
    # the converter adds nextn_predict_layers after the MoE keys, not before the SSM ones
    gguf_nextn_before=("general.quantization_version",),
    # Granite's converter, which Nemotron-H's extends, permutes q/k as for RoPE (measured: the
    # values differ from the source's otherwise; the attention itself has no RoPE)
    gguf_permutes_qk=True,
    # measured: the MTP block's router is F16 / BF16 / Q8_0 in the converter's file (the
    # trunk's routers stay F32)
    gguf_quantized_roles=frozenset({Role.ROUTER}),
    mlx_backbone=MlxBackbone(inner="backbone", embed="embeddings", final_norm="norm_f"),
    topology=Topology(mlx_blocks=("*", "E")),
)
