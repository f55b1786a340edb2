"""DeepSeek-V4's DSpark drafter (``-DSpark`` releases; llama.cpp architecture ``dflash``): a
drafter of its own in the release's ``mtp.*``, in place of the MTP layer
(docs/families/deepseek_v4.md §6).

Each ``mtp.{s}.`` stage is a whole DeepSeek-V4 decoder layer (the MTP layer's rows: hyper-
connections, the low-rank query, the shared ``wkv``, sinks, the grouped output projection, the
sqrt-softplus MoE with FP4 experts), uncompressed and never hash-routed. Outside the stages:
``main_proj`` reads the target layers' hidden states side by side (``dspark_target_layer_ids``)
and ``main_norm`` normalizes its output; ``norm`` and ``hc_head_*`` close the last stage; the
Markov head (``markov_w1`` / ``markov_w2``) is a rank-R bigram bias on the draft logits and the
confidence head scores each drafted position. llama.cpp's converter (``--dspark``,
``DeepseekV4DSparkModel``) takes those from whichever stage holds them and writes them outside
the blocks, the stages as ``blk.{s}``, every type as for the MTP layer (``converter_type``).

A release is told from the MTP one by its config (``dspark_block_size``): the source decides
what add-mtp writes, as ``model_type`` decides the family. Written for llama.cpp only, as a file
of its own beside the trunk (``GgufDrafter``): ``llama-server -m TRUNK -md FILE --spec-type
draft-dspark``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from .deepseek_v4 import DEEPSEEK_V4, EXPERT_ROWS, LAYER_ROWS, MLP_ROWS
from .spec import GgufDrafter, Role, Row

#: the drafter's tensors outside its stages, under the first stage's prefix (bare keys under
#: ``mtp.``; the converter would take them from any stage: which one the release uses was not read)
ROOT_ROWS = (
    Row(Role.FC, "0.main_proj.weight", ("H", "TH")),
    Row(Role.MAIN_NORM, "0.main_norm.weight", ("H",)),
    Row(Role.FINAL_NORM, "0.norm.weight", ("H",)),
    Row(Role.HC_HEAD_FN, "0.hc_head_fn", ("HC", "HCH")),
    Row(Role.HC_HEAD_BASE, "0.hc_head_base", ("HC",)),
    Row(Role.HC_HEAD_SCALE, "0.hc_head_scale", ("1",)),
    Row(Role.MARKOV_W1, "0.markov_head.markov_w1.weight", ("V", "MR")),
    Row(Role.MARKOV_W2, "0.markov_head.markov_w2.weight", ("V", "MR")),
    Row(Role.CONF_PROJ, "0.confidence_head.proj.weight", ("1", "HMR"), optional=True),
)
#: llama.cpp's names of the tensors ``DeepseekV4DSparkModel`` writes outside the blocks
GGUF_ROOT_NAMES: dict[Role, str] = {
    Role.FC: "fc.weight", Role.MAIN_NORM: "enc.output_norm.weight", Role.FINAL_NORM: "output_norm.weight",
    Role.HC_HEAD_FN: "output_hc_fn.weight", Role.HC_HEAD_BASE: "output_hc_base.weight",
    Role.HC_HEAD_SCALE: "output_hc_scale.weight", Role.MARKOV_W1: "markov_w1.weight",
    Role.MARKOV_W2: "markov_w2.weight", Role.CONF_PROJ: "conf_proj.weight",
}
#: ``T``: how many target layers feed ``main_proj`` (``#``: a list's length); ``MR``: the Markov rank
DIM_KEYS = {**DEEPSEEK_V4.dim_keys, "T": "#dspark_target_layer_ids", "MR": "dspark_markov_rank"}

#: what the converter's DSpark file says beside the trunk's metadata (``set_gguf_parameters``,
#: ``set_vocab``): every stage uncompressed, no hash layers, no output width of the trunk's
#: streams; the block size, the target layers (1-based: the trunk's layer outputs) and the noise
#: token from the source's config
DRAFTER = GgufDrafter(
    arch="dflash", spec_type="draft-dspark", file_prefix="dspark-",
    layer_arrays={"swiglu_clamp_exp": "SWL", "swiglu_clamp_shexp": "SWL", "attention.compress_ratios": 0},
    values={"hash_layer_count": 0}, dropped=("embedding_length_out",),
    added={"block_size": ("dspark_block_size", "u32", 0), "target_layers": ("dspark_target_layer_ids", "i32", 1)},
    tail={"tokenizer.ggml.mask_token_id": ("dspark_noise_token_id", "u32", 0)},
)


def dspark_dims(d: Mapping[str, int]) -> dict[str, int]:
    """DeepSeek-V4's widths plus ``main_proj``'s input (the target layers side by side) and the
    confidence head's ([hidden | markov])."""
    assert DEEPSEEK_V4.derived_dims is not None
    return {**DEEPSEEK_V4.derived_dims(d), "TH": d["T"] * d["H"], "HMR": d["H"] + d["MR"]}


DEEPSEEK_V4_DSPARK = replace(
    DEEPSEEK_V4,
    name="deepseek_v4_dspark",
    head_rows=ROOT_ROWS,
    layer_rows=LAYER_ROWS,
    mlp_rows=MLP_ROWS,
    expert_rows=EXPERT_ROWS,
    count_keys=(),
    count_keys_written=(),
    dim_keys=DIM_KEYS,
    derived_dims=dspark_dims,
    example_repo="deepseek-ai/DeepSeek-V4-Flash-DSpark",
    mlx_drafted_by="mlx-vlm's deepseek_v4_dspark reads it from the release (docs/families/deepseek_v4.md)",
    gguf_root_names=GGUF_ROOT_NAMES,
    gguf_fused={},
    gguf_fused_columns=frozenset(),
    gguf_layer_arrays={},
    gguf_drafter=DRAFTER,
    config_marker="dspark_block_size",
    # the released configs were not seen to state the rank; the converter takes it from the tensor
    header_dims={"dspark_markov_rank": ("0.markov_head.markov_w1.weight", 1)},
)
