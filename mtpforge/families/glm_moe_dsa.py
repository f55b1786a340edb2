"""GLM-5 / 5.1 (``glm_moe_dsa``, llama.cpp ``glm-dsa``): DeepSeek-V3.2's head under GLM's name
(docs/families/glm_moe_dsa.md).

Its keys sit under ``model.layers.{N}.`` (N = ``num_hidden_layers``, 78 in the release): the
NextN tensors, MLA attention with DeepSeek Sparse Attention's indexer
(``self_attn.indexer.{wq_b,wk,k_norm,weights_proj}``, required by llama.cpp in the MTP block) and
the sigmoid-routed MoE, spelled and sized as DeepSeek-V3.2's (families/deepseek_v32.py); raw
norms. llama.cpp's converter (``GlmMoeDsaModel``) writes it as ``glm-dsa``, whose tensor list the
gguf-py mtpforge installs already has. In an MLX folder it is DeepSeek-V3.2's sidecar, which
MTPLX's ``deepseek_mtp`` reads for ``glm_moe_dsa`` too.
"""

from __future__ import annotations

from dataclasses import replace

from .deepseek_v32 import DEEPSEEK_V32
from .spec import mlx_lm_class, mlx_lm_model

#: DeepSeek-V3.2's NextN/MLA/DSA/MoE spec on llama.cpp's ``glm-dsa``
GLM_MOE_DSA = replace(
    DEEPSEEK_V32,
    name="glm_moe_dsa",
    model_types=("glm_moe_dsa",),
    # mlx-lm's glm_moe_dsa model is its deepseek_v32 one under GLM's arguments
    mlx_lm_classes=mlx_lm_model("glm_moe_dsa"),
    head_layer=mlx_lm_class("deepseek_v32", "DeepseekV32DecoderLayer"),
    # mlx-vlm 0.7.10's GlmMoeDsaMTPDraftModel: the NextN layer under ``mtp.``, its final norm
    # renamed, ``kv_b_proj`` split into embed_q / unembed_out (``mlx_layer_parts``), experts stacked
    layouts=("sidecar", "mlx-vlm-drafter"),
    mlx_vlm_drafter_type="glm_moe_dsa_mtp",
    mlx_vlm_drafter_prefix="mtp.",
    mlx_vlm_drafter_renames={"shared_head.norm": "shared_head_norm"},
    gguf_arch="glm-dsa",
    gguf_names_as=None,
    example_repo="zai-org/GLM-5",
)
