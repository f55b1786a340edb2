"""DeepSeek-V3.2 (``deepseek_v32``, llama.cpp ``deepseek32``): GLM-4.7-Flash's NextN head over MLA
and MoE, plus DeepSeek Sparse Attention's indexer (docs/families/deepseek_v32.md).

Its keys sit under ``model.layers.{N}.`` (N = ``num_hidden_layers``, 61 in the release): the
NextN tensors, MLA attention (``kv_b_proj`` split by llama.cpp's converter into ``attn_k_b`` /
``attn_v_b``), the sigmoid-routed MoE with its score-correction bias and one shared expert, and
the indexer every DSA layer carries (``self_attn.indexer.{wq_b,wk,k_norm,weights_proj}``), which
llama.cpp requires in the MTP block too. Norms are raw (the indexer's key norm is a LayerNorm with
a bias), copied as stored. The release is FP8 e4m3 with 128x128 ``weight_scale_inv`` blocks.
In an MLX folder the head is the sidecar MTPLX's ``deepseek_mtp`` reads, as for DeepSeek-V3: the
source's names, ``kv_b_proj`` whole (it splits it on load), the indexer's tensors as stored
(mlx-lm's ``DeepseekV32DecoderLayer`` holds them under the same names).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from .glm4_moe_lite import GGUF_DIM_KEYS as MLA_GGUF_DIM_KEYS, GLM4_MOE_LITE, LAYER_ROWS as MLA_ROWS, mla_dims
from .glm4_moe_lite import DIM_KEYS as MLA_DIM_KEYS
from .spec import Role, Row, mlx_lm_class, mlx_lm_model

#: the DSA indexer of the layer: query from the low-rank query (``RQ``), key from the hidden state
INDEXER_ROWS = (
    Row(Role.INDEXER_Q_B, "self_attn.indexer.wq_b.weight", ("IQ", "RQ")),
    Row(Role.INDEXER_K, "self_attn.indexer.wk.weight", ("ID", "H")),
    Row(Role.INDEXER_K_NORM, "self_attn.indexer.k_norm.weight", ("ID",)),
    Row(Role.INDEXER_K_NORM_BIAS, "self_attn.indexer.k_norm.bias", ("ID",)),
    Row(Role.INDEXER_PROJ, "self_attn.indexer.weights_proj.weight", ("IN", "H")),
)
DIM_KEYS: dict[str, "str | tuple[str, ...]"] = {**MLA_DIM_KEYS, "IN": "index_n_heads", "ID": "index_head_dim"}
#: the converter states the indexer's heads and width (``DeepseekV32Model.set_gguf_parameters``)
GGUF_DIM_KEYS: dict[str, "str | None"] = {**MLA_GGUF_DIM_KEYS, "IN": "attention.indexer.head_count",
                                          "ID": "attention.indexer.key_length"}


def dsa_layer_cache() -> Any:
    """One DSA layer's cache as mlx-lm's ``deepseek_v32`` model makes it: the attention's keys and
    the indexer's, side by side (a single ``KVCache`` is not subscriptable by the layer)."""
    from mlx_lm.models.cache import CacheList, KVCache

    return CacheList(KVCache(), KVCache())


def dsa_dims(d: Mapping[str, int]) -> dict[str, int]:
    """MLA's composite widths and the indexer's query width (heads x head width)."""
    return {**mla_dims(d), "IQ": d["IN"] * d["ID"]}


#: GLM-4.7-Flash's NextN/MLA/MoE spec with the indexer in the layer, on llama.cpp's ``deepseek32``
DEEPSEEK_V32 = replace(
    GLM4_MOE_LITE,
    name="deepseek_v32",
    model_types=("deepseek_v32",),
    layer_rows=(*MLA_ROWS, *INDEXER_ROWS),
    # the MLX head is DeepSeek-V3's sidecar (layouts, mlx_layer_parts inherited): MTPLX's
    # deepseek_mtp reads the indexer's tensors in the source's names, as mlx-lm's layer holds them
    mlx_lm_classes=mlx_lm_model("deepseek_v32"),
    head_layer=mlx_lm_class("deepseek_v32", "DeepseekV32DecoderLayer"),
    head_cache=dsa_layer_cache,
    dim_keys=DIM_KEYS,
    gguf_arch="deepseek32",
    # gguf-py 0.19 (the newest release) predates deepseek32; llama.cpp's own gguf-py lists for it
    # glm-dsa's tensors (constants.py), which gguf-py 0.19 has
    gguf_names_as="glm-dsa",
    # llama.cpp's converter writes nextn_predict_layers between DeepSeek-V2's keys and the
    # indexer's (DeepseekV32Model.set_gguf_parameters)
    gguf_nextn_before=("{arch}.attention.indexer.", "general.quantization_version"),
    example_repo="deepseek-ai/DeepSeek-V3.2",
    derived_dims=dsa_dims,
    gguf_dim_keys=GGUF_DIM_KEYS,
)
