"""The runtimes mtpforge writes for and checks against (SPEC §5), one row each.

A new runtime is a new row here (and, if it needs one, a layout in ``layouts/`` or an output
format); ``inspect --runtime``, ``add-mtp`` and recipes pick it up from this table.
"""

from __future__ import annotations

from .quant import default_quant, every_linear_but_fc_quant, one_precision_quant
from .spec import QuantRule, RuntimeSpec

DEFAULT = QuantRule(default_quant)

MLX_LM = RuntimeSpec(
    "mlx-lm", "released mlx-lm: loads the backbone; reads no MTP head", DEFAULT,
    rejects_head_in_glob=("qwen3_next",),
    double_shift_versions=((0, 30, 7), (0, 31, 3)),
    mlx_lm=">=0.32",
)
MLX_LM_MTP = RuntimeSpec(
    "mlx-lm-mtp", "mlx-lm's MTP branch (#990)",
    QuantRule(default_quant, source_experts_note=(
        "MoE experts stay unquantized in the source layout: mlx-lm #990 loads no other form "
        "(--experts switch_mlp for runtimes that accept it)")),
    layouts=("embedded",), expert_formats=("per-expert", "fused"), quantized_experts=False,
    mlx_lm="its own branch", version_checked="mlx-lm #990",
)
VLLM_MLX = RuntimeSpec(
    "vllm-mlx", "vllm-mlx", QuantRule(one_precision_quant),
    layouts=("vllm-mlx",),
    expert_formats_by_family={"qwen3_5_moe": ("per-expert", "fused"), "qwen3_next": ("switch_mlp",)},
    quant_by_family={"qwen3_next": QuantRule(every_linear_but_fc_quant, float_request_note=(
        "vllm-mlx quantizes every Qwen3-Next head linear except fc at the model's bits: "
        "written so, whatever --precision says"))},
    norm_markers={"mtp/manifest.json": {"artifact_schema_version": 1, "rmsnorm_weight_format": "mlx_gamma"}},
)
EXO = RuntimeSpec(
    "exo", "exo", DEFAULT, layouts=("sidecar", "embedded", "vllm-mlx"),
    expert_formats=("switch_mlp", "per-expert", "fused"),
)
MTPLX = RuntimeSpec("mtplx", "MTPLX", DEFAULT, layouts=("sidecar",), expert_formats=("switch_mlp",))
MLX_VLM = RuntimeSpec(
    "mlx-vlm", "mlx-vlm --draft-kind mtp", DEFAULT, layouts=("mlx-vlm-drafter",), expert_formats=("switch_mlp",),
)

RUNTIMES: dict[str, RuntimeSpec] = {r.name: r for r in (MLX_LM, MLX_LM_MTP, VLLM_MLX, EXO, MTPLX, MLX_VLM)}
RUNTIME_NAMES = tuple(RUNTIMES)
