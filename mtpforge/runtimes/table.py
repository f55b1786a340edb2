"""The runtimes mtpforge writes for and checks against (docs/SPEC.md §5, §5.1), one row each, and the
write rules of plain ``add-mtp`` and of ``--layout`` alone.

A new runtime is a new row here (and, if it needs one, a layout in ``layouts/`` or an output
format); ``add-mtp --runtime``, ``inspect --runtime`` and recipes pick it up from this table.
Rows whose ``version_checked`` says "measured" are held to the runtime's released code by
``tests/conformance``; the others carry docs/SPEC.md §5.1's measurements of pull-request code that
cannot be installed here.
"""

from __future__ import annotations

from .norms import below_half, mtplx_two_signal
from .quant import (default_quant, every_linear_but_fc_quant, float_router_quant, mtplx_float_loads,
                    mtplx_scales_loads, mtplx_scales_quant, mtplx_loads,
                    mtplx_template_quant, one_precision_loads, one_precision_quant, vllm_next_loads, vllm_next_quant,
                    whole_head_loads, whole_head_quant)
from ..families.spec import STACKED
from .spec import OutputFormat, QuantRule, RuntimeSpec, WriteRule

DEFAULT = QuantRule(default_quant)
SOURCE_EXPERTS = ("per-expert", "fused")
ALL_EXPERTS = ("switch_mlp", "fused", "per-expert")
#: mlx-lm releases whose qwen3_5 sanitize adds +1 to every backbone norm once an ``mtp.`` key
#: reaches it (docs/SPEC.md §4)
DOUBLE_SHIFT = ((0, 30, 7), (0, 31, 3))
MLX_LM_031 = ((0, 31, 0), (0, 31, 99))

#: plain add-mtp (no --runtime, no --layout): outside every ``model*.safetensors`` glob, so no
#: pinned mlx-lm ever sees an ``mtp.`` key; experts stacked; MoE heads in bf16, the one
#: precision that both MTPLX's templates and exo's single-precision rule load (measured:
#: tests/conformance, "default" cells); Qwen3.8-Flash-Next: mlx-vlm's drafter, the one MLX form
#: any runtime drafts it from
PORTABLE = WriteRule("sidecar", DEFAULT, layout_by_family={"qwen4_exp": "mlx-vlm-drafter"},
                     quant_by_family={"qwen4_exp": QuantRule(float_router_quant)},
                     precision_by_family={"qwen3_5_moe": "bf16", "qwen3_next": "bf16", "glm4_moe": "bf16",
                                          "glm4_moe_lite": "bf16", "deepseek_v3": "bf16", "nemotron_h": "bf16",
                                          "step3p5": "bf16", "deepseek_v32": "bf16", "glm_moe_dsa": "bf16"})
#: the runtimes' own words for GLM-4.5/4.6/4.7, which only MTPLX drafts among them (read in their
#: code: docs/families/glm4_moe.md)
_NO_GLM = {
    "mlx-lm-mtp": "mlx-lm #990 adds MTP to Qwen3.5/3.6 only, not GLM-4.x",
    "vllm-mlx": "vllm-mlx 0.6.0 drafts Qwen MTP heads only, not GLM-4.x",
    "exo": "exo #2110 adds MTP to Qwen3.5/3.6 only, not GLM-4.x",
    "mlx-vlm": "mlx-vlm 0.7.10 has MTP drafters for Qwen3.5, GLM-5 and Nemotron-H, not GLM-4.x",
    "omlx": "oMLX's MTP path is the embedded layout, which is for Qwen3.5/3.6, not GLM-4.x",
}
#: the same for GLM-4.7-Flash (docs/families/glm4_moe_lite.md): mlx-vlm prepares a drafter for it
#: and cannot build one (measured)
_NO_GLM_FLASH = {
    "mlx-lm-mtp": "mlx-lm #990 adds MTP to Qwen3.5/3.6 only, not GLM-4.7-Flash",
    "vllm-mlx": "vllm-mlx 0.6.0 drafts Qwen MTP heads only, not GLM-4.7-Flash",
    "exo": "exo #2110 adds MTP to Qwen3.5/3.6 only, not GLM-4.7-Flash",
    "mlx-vlm": "mlx-vlm 0.7.10 splits a GLM-4.7-Flash drafter (glm4_moe_lite_mtp) but has no model for it: "
               "\"module 'mlx_vlm.speculative.drafters.glm4_moe_lite_mtp' has no attribute 'Model'\"",
    "omlx": "oMLX's MTP path is the embedded layout, which is for Qwen3.5/3.6, not GLM-4.7-Flash",
}

#: the same for DeepSeek-V3/R1 (docs/families/deepseek_v3.md): MTPLX's deepseek_mtp drafts it
_NO_DEEPSEEK_V3 = {
    "mlx-lm-mtp": "mlx-lm #990 adds MTP to Qwen3.5/3.6 only, not DeepSeek-V3",
    "vllm-mlx": "vllm-mlx 0.6.0 drafts Qwen MTP heads only, not DeepSeek-V3",
    "exo": "exo #2110 adds MTP to Qwen3.5/3.6 only, not DeepSeek-V3",
    "mlx-vlm": "mlx-vlm 0.7.10 has no DeepSeek-V3 MTP drafter (its DRAFTER_KIND_BY_MODEL_TYPE and MTP_SPLITTERS "
               "list no deepseek_v3)",
    "omlx": "oMLX's MTP path is the embedded layout, which is for Qwen3.5/3.6, not DeepSeek-V3",
}
#: DeepSeek-V3.2 and GLM-5 (docs/families/deepseek_v32.md, glm_moe_dsa.md): MTPLX's deepseek_mtp
#: drafts them; mlx-vlm 0.7.10 drafts GLM-5 from its glm_moe_dsa_mtp drafter folder (add-mtp
#: --runtime mlx-vlm writes it), and has no drafter for DeepSeek-V3.2
_DSA_NAMES = {"deepseek_v32": "DeepSeek-V3.2", "glm_moe_dsa": "GLM-5"}
_NO_DSA = {f: {
    "mlx-lm-mtp": f"mlx-lm #990 adds MTP to Qwen3.5/3.6 only, not {n}",
    "vllm-mlx": f"vllm-mlx 0.6.0 drafts Qwen MTP heads only, not {n}",
    "exo": f"exo #2110 adds MTP to Qwen3.5/3.6 only, not {n}",
    "omlx": f"oMLX's MTP path is the embedded layout, which is for Qwen3.5/3.6, not {n}",
} for f, n in _DSA_NAMES.items()}
_NO_DSA["deepseek_v32"]["mlx-vlm"] = ("mlx-vlm 0.7.10 has no DeepSeek-V3.2 MTP drafter (its "
                                      "DRAFTER_KIND_BY_MODEL_TYPE lists no deepseek_v32)")

#: Nemotron-H: MTPLX's nemotron_h_mtp and mlx-lm #1533 draft it; mlx-vlm 0.7.10 has a drafter
#: mtpforge does not write yet (docs/families/nemotron_h.md)
_NO_NEMOTRON = {
    "vllm-mlx": "vllm-mlx 0.6.0 drafts Qwen MTP heads only, not Nemotron-H",
    "exo": "exo #2110 adds MTP to Qwen3.5/3.6 only, not Nemotron-H",
    "omlx": "oMLX's MTP path is the embedded layout, which is for Qwen3.5/3.6, not Nemotron-H",
}

#: Qwen3.8-Flash-Next (docs/families/qwen4_exp.md): only mlx-vlm drafts it (its drafter
#: ``qwen4_exp_mtp``); none of the others names ``qwen4_exp`` in its installed or read code
_NO_QWEN4_EXP = {
    "mlx-lm-mtp": "mlx-lm #990 adds MTP to Qwen3.5/3.6 only, not Qwen3.8-Flash-Next (mlx-lm has no qwen4_exp model)",
    "mtplx": "MTPLX 2.12.2 has no Qwen3.8-Flash-Next (qwen4_exp) backend",
    "vllm-mlx": "vllm-mlx 0.6.0 drafts Qwen3.5/3.6 MTP heads only, not Qwen3.8-Flash-Next (qwen4_exp)",
    "exo": "exo #2110 adds MTP to Qwen3.5/3.6 only, not Qwen3.8-Flash-Next (qwen4_exp)",
    "omlx": "oMLX's MTP path is the embedded layout, which is for Qwen3.5/3.6, not Qwen3.8-Flash-Next",
}


#: Step-3.5 (docs/families/step3p5.md §6): only MTPLX's step3p5_mtp drafts it among the MLX runtimes
_NO_STEP3P5 = {
    "mlx-lm-mtp": "mlx-lm #990 adds MTP to Qwen3.5/3.6 only, not Step-3.5 "
                  "(mlx-lm's step3p5 sanitize drops the MTP layers)",
    "vllm-mlx": "vllm-mlx 0.6.0 drafts Qwen MTP heads only, not Step-3.5",
    "exo": "exo #2110 adds MTP to Qwen3.5/3.6 only, not Step-3.5",
    "mlx-vlm": "mlx-vlm 0.7.10 has no Step-3.5 MTP drafter (its DRAFTER_KIND_BY_MODEL_TYPE lists no step3p5)",
    "omlx": "oMLX's MTP path is the embedded layout, which is for Qwen3.5/3.6, not Step-3.5",
}


def _not_drafted(runtime: str) -> dict[str, str]:
    """A runtime's ``no_mtp`` entries for the GLM families, DeepSeek-V3/V3.2, GLM-5, Nemotron-H,
    Qwen3.8-Flash-Next and Step-3.5."""
    nemotron = {"nemotron_h": _NO_NEMOTRON[runtime]} if runtime in _NO_NEMOTRON else {}
    qwen4 = {"qwen4_exp": _NO_QWEN4_EXP[runtime]} if runtime in _NO_QWEN4_EXP else {}
    return {"glm4_moe": _NO_GLM[runtime], "glm4_moe_lite": _NO_GLM_FLASH[runtime],
            "deepseek_v3": _NO_DEEPSEEK_V3[runtime], "step3p5": _NO_STEP3P5[runtime], **nemotron, **qwen4,
            **{f: no[runtime] for f, no in _NO_DSA.items() if runtime in no}}


#: mlx-lm #1533's ``convert`` form: the head in model*.safetensors, experts stacked, every linear
#: at the model's bits but the router (a gate, not a Linear: docs/families/nemotron_h.md §3)
_1533 = QuantRule(one_precision_quant)

_990 = WriteRule("embedded", QuantRule(default_quant, source_experts_note=(
    "MoE experts stay unquantized in the source layout: mlx-lm #990 loads no other form "
    "(--experts switch_mlp for runtimes that accept it)")), keep_experts=SOURCE_EXPERTS,
    quant_by_family={"nemotron_h": _1533}, keep_experts_by_family={"nemotron_h": ()})
#: mlx-vlm's drafters: Qwen3.5's router is a Linear (8-bit as mlx-lm keeps it), Nemotron-H's a bare
#: parameter that stays float (its NemotronHMTPSplitter never quantizes ``mixer.gate`` either);
#: Qwen3.8-Flash-Next's routers stay float too (its Qwen4ExpMTPSplitter and the drafter's
#: ``quant_predicate`` never quantize ``mlp.gate``)
_DRAFTER = WriteRule("mlx-vlm-drafter", DEFAULT, quant_by_family={"nemotron_h": QuantRule(float_router_quant),
                                                                  "qwen4_exp": QuantRule(float_router_quant)})

#: what ``--layout X`` without ``--runtime`` writes: each layout's rule as before runtimes were
#: measured (tests/golden holds these bytes); add-mtp notes where the result does not load in
#: the layout's runtime and names the ``--runtime`` that does
LAYOUT_WRITES: dict[str, WriteRule] = {
    "embedded": _990,
    "sidecar": WriteRule("sidecar", DEFAULT),
    "vllm-mlx": WriteRule(
        "vllm-mlx", QuantRule(one_precision_quant), keep_experts_by_family={"qwen3_5_moe": SOURCE_EXPERTS},
        quant_by_family={"qwen3_next": QuantRule(every_linear_but_fc_quant, float_request_note=(
            "vllm-mlx quantizes every Qwen3-Next head linear except fc at the model's bits: "
            "written so, whatever --precision says"))}),
    "mlx-vlm-drafter": _DRAFTER,
}

MLX_LM = RuntimeSpec(
    "mlx-lm", "released mlx-lm: loads the backbone, reads no MTP head (the head must not hurt it)", PORTABLE,
    rejects_head_in_glob=("qwen3_next",), double_shift_versions=DOUBLE_SHIFT,
    double_shift_families=("qwen3_5", "qwen3_5_moe"),
    mlx_lm="mlx-lm >= 0.32", mlx_lm_range=((0, 32, 0), (99,)),
    version_checked="mlx-lm 0.32.2 (mtpforge's own dependency): measured by tests/conformance",
)
MLX_LM_MTP = RuntimeSpec(
    "mlx-lm-mtp", "mlx-lm's MTP branches (#990; Nemotron-H: #1533)", _990,
    layouts=("embedded",), expert_formats=SOURCE_EXPERTS, quantized_experts=False,
    expert_formats_by_family={"nemotron_h": (STACKED,)}, quantized_experts_by_family={"nemotron_h": True},
    quant_check={"nemotron_h": one_precision_loads},
    no_mtp={"qwen3_next": "mlx-lm #990 adds MTP to qwen3_5 only (docs/SPEC.md §5: the embedded layout is for Qwen3.5/3.6)",
            **_not_drafted("mlx-lm-mtp")},
    mlx_lm="its own mlx-lm branch",
    reads_tagged_floats=False,
    # Nemotron-H (#1533, PR head d620aea7): read, and its loader and mtp_step run on mtpforge's
    # output by scripts/check_mlx_lm_1533.py; not installable here
    version_checked="mlx-lm #990 (PR head, Aug 2026): docs/SPEC.md §5.1, not installable here",
)
MTPLX = RuntimeSpec(
    "mtplx", "MTPLX", WriteRule("sidecar", QuantRule(mtplx_template_quant),
                                quant_by_family={"glm4_moe": QuantRule(mtplx_scales_quant),
                                                 "glm4_moe_lite": QuantRule(mtplx_scales_quant),
                                                 "deepseek_v3": QuantRule(mtplx_scales_quant),
                                                 "deepseek_v32": QuantRule(mtplx_scales_quant),
                                                 "glm_moe_dsa": QuantRule(mtplx_scales_quant),
                                                 "nemotron_h": QuantRule(mtplx_scales_quant)},
                                # step3p5_mtp loads float linears only (mtplx_float_loads)
                                precision_by_family={"step3p5": "bf16"}),
    layouts=("sidecar", "vllm-mlx", "embedded"), expert_formats=ALL_EXPERTS,
    no_mtp={"qwen4_exp": _NO_QWEN4_EXP["mtplx"]},
    quant_check={None: mtplx_loads, "glm4_moe": mtplx_scales_loads, "glm4_moe_lite": mtplx_scales_loads,
                 "deepseek_v3": mtplx_scales_loads, "deepseek_v32": mtplx_scales_loads,
                 "glm_moe_dsa": mtplx_scales_loads,
                 "nemotron_h": mtplx_scales_loads, "step3p5": mtplx_float_loads},
    # step3p5_mtp adds 1 to each stored norm whose mean is below 0.5 (_apply_zero_centered_norm_shift)
    norm_rule={None: mtplx_two_signal, "step3p5": below_half}, rejects_head_in_glob=("qwen3_next",),
    mlx_lm="mlx-lm 0.31.x (it pins >=0.31,<0.32)", mlx_lm_range=MLX_LM_031,
    reads_tagged_floats=False,
    version_checked="MTPLX 2.12.2 (PyPI): measured by tests/conformance",
)
VLLM_MLX = RuntimeSpec(
    "vllm-mlx", "vllm-mlx",
    WriteRule("vllm-mlx", QuantRule(one_precision_quant), keep_experts_by_family={"qwen3_5_moe": ("fused",)},
              quant_by_family={"qwen3_next": QuantRule(vllm_next_quant, float_request_note=(
                  "vllm-mlx quantizes every Qwen3-Next head linear except fc and the expert stacks at the "
                  "model's bits: written so, whatever --precision says"))}),
    layouts=("vllm-mlx", "embedded"),
    expert_formats_by_family={"qwen3_5_moe": ("fused", "switch_mlp"), "qwen3_next": ("switch_mlp",)},
    no_mtp={"qwen3_next": "vllm-mlx 0.6.0 loads the head but never drafts Qwen3-Next: \"[MTP] disabled: mlx-lm "
                          "BatchGenerator lacks the _step hook\" (its own pinned mlx-lm 0.31.3)",
            **_not_drafted("vllm-mlx")},
    quant_check={None: one_precision_loads, "qwen3_next": vllm_next_loads},
    norm_rule={"qwen3_5": below_half, "qwen3_5_moe": below_half},
    norm_markers={"manifest.json": {"artifact_schema_version": 1, "rmsnorm_weight_format": "mlx_gamma"}},
    # vllm_mlx/api/utils.py _VLM_CONFIG_KEYS (its architecture keywords never name Qwen3.5)
    vl_route_keys=("vision_config", "audio_config", "vision_tower", "mm_vision_tower", "image_token_id",
                   "image_token_index", "audio_token_id", "audio_token_index"),
    mlx_lm="mlx-lm 0.31.3 (it pins >=0.31.3,<0.32)", mlx_lm_range=((0, 31, 3), (0, 31, 99)),
    reads_tagged_floats=False,
    loop_cost="vllm-mlx drafts without the head's KV cache (docs/SPEC.md §5.1: about -20 points)",
    version_checked="vllm-mlx 0.6.0 (PyPI): measured by tests/conformance",
)
EXO = RuntimeSpec(
    "exo", "exo (pull request #2110)",
    WriteRule("sidecar", QuantRule(whole_head_quant)),
    layouts=("sidecar", "embedded"), layouts_by_family={"qwen3_next": ("sidecar", "vllm-mlx")},
    expert_formats=("switch_mlp",), quant_check={None: whole_head_loads}, norm_rule={None: below_half},
    no_mtp=_not_drafted("exo"),
    mlx_lm="a fork of mlx-lm 0.31.3", mlx_lm_range=((0, 31, 3), (0, 31, 3)),
    reads_tagged_floats=False,
    loop_cost="exo skips head-cache entries of accepted drafts (docs/SPEC.md §5.1: -6 to -16 points)",
    version_checked="exo #2110 (PR head 2c33a38f, May 2026): docs/SPEC.md §5.1, not installable here",
)
MLX_VLM = RuntimeSpec(
    "mlx-vlm", "mlx-vlm --draft-kind mtp", _DRAFTER, layouts=("mlx-vlm-drafter",), expert_formats=ALL_EXPERTS,
    mlx_lm="none (its own model code)",
    no_mtp={"qwen3_next": "mlx-vlm 0.7.10 has no Qwen3-Next MTP drafter (its DRAFTER_KIND_BY_MODEL_TYPE lists "
                          "qwen3_5_mtp, no qwen3_next_mtp)", **_not_drafted("mlx-vlm")},
    loop_cost="mlx-vlm 0.7.10 drafts its drafter's block size less one token a round (Qwen3.5's: 2) and counts "
              "every draft, a later one also after the first was rejected, so its printed acceptance reads below "
              "verify's depth-1 figure on the same head (about 20 points on the tiny Qwen3.5 model); with "
              "--draft-block-size 2 it counts what verify counts (measured, docs/RUNTIMES.md)",
    version_checked="mlx-vlm 0.7.10 (PyPI): measured by tests/conformance",
)
OMLX = RuntimeSpec(
    "omlx", "oMLX (not checked against a release: docs/SPEC.md §5 facts only)",
    WriteRule("embedded", QuantRule(default_quant)),
    layouts=("embedded",), expert_formats=("switch_mlp",) + SOURCE_EXPERTS,
    no_mtp={"qwen3_next": "oMLX's MTP path is the embedded layout, which is for Qwen3.5/3.6",
            **_not_drafted("omlx")},
)
LLAMA_CPP = RuntimeSpec(
    "llama.cpp", "llama.cpp --spec-type draft-mtp (GGUF: pass the .gguf trunk as --target)", None,
    output_format=OutputFormat.GGUF,
    version_checked="llama.cpp b9180 (the llama-cpp-python 0.3.36 sdist): measured by tests/test_gguf_llama.py",
)

RUNTIMES: dict[str, RuntimeSpec] = {r.name: r for r in (MLX_LM, MLX_LM_MTP, MTPLX, VLLM_MLX, EXO, MLX_VLM, OMLX,
                                                        LLAMA_CPP)}
RUNTIME_NAMES = tuple(RUNTIMES)
