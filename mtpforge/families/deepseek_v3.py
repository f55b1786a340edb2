"""DeepSeek-V3 / V3.1 / R1 (``deepseek_v3``): GLM-4.7-Flash's NextN head over MLA, at DeepSeek's
size (docs/families/deepseek_v3.md).

The release keeps one NextN layer at ``model.layers.{N}.`` (N = ``num_hidden_layers``, 61): the
same tensors as GLM-4.7-Flash's (``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.{norm,head}``,
``embed_tokens``, MLA attention, a sigmoid-routed MoE with ``e_score_correction_bias``, per-expert
experts and shared experts), raw norms, block-FP8 projections (``weight_scale_inv``, 128x128:
passes/fp8.py). What differs is config only (group-limited routing ``n_group`` / ``topk_group``,
``routed_scaling_factor``, YaRN ``rope_scaling``, ``first_k_dense_replace`` 3), which the head's
tensors do not depend on. llama.cpp's converter (``DeepseekV2Model``, arch ``deepseek2``) drops the
layer (``skip_mtp``), yet ``deepseek2`` loads and drafts a NextN block written as its converter
writes GLM-4.7-Flash's (measured): so the GGUF rows are GLM-4.7-Flash's, and a DeepSeek-V3 GGUF
is told from a GLM-4.7-Flash one by its pre-tokenizer. In an MLX folder the head is the sidecar
MTPLX's ``deepseek_mtp`` reads: the source's names, ``kv_b_proj`` whole (it splits it on load).
"""

from __future__ import annotations

from dataclasses import replace

from .glm4_moe_lite import GLM4_MOE_LITE
from .spec import mlx_lm_class, mlx_lm_model

#: GLM-4.7-Flash's spec (rows, prefixes, raw norms, MLA split, GGUF naming) with DeepSeek's
#: model type, mlx-lm classes and release
DEEPSEEK_V3 = replace(
    GLM4_MOE_LITE,
    name="deepseek_v3",
    model_types=("deepseek_v3",),
    mlx_lm_classes=mlx_lm_model("deepseek_v3"),
    head_layer=mlx_lm_class("deepseek_v3", "DeepseekV3DecoderLayer"),
    example_repo="deepseek-ai/DeepSeek-V3",
    # what llama.cpp's converter writes for DeepSeek-V3's tokenizer (GLM-4.7-Flash's: glm4)
    gguf_tokenizer_pre=("deepseek-v3",),
)
