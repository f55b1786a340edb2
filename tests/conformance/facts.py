"""What the real runtimes were measured to do with each folder ``add-mtp`` writes (this suite's
own measurements; docs/SPEC.md §5.1 has the same facts from the original survey).

The tests hold the runtimes to these tables: a cell listed here must keep failing exactly so
(a runtime upgrade that fixes it makes the test fail until the row is removed), every other cell
must pass all checks.
"""

from __future__ import annotations

#: runtimes installable here, each driven in its own virtualenv (released mlx-lm: mtpforge's own)
MEASURED = ("mtplx", "vllm-mlx", "mlx-vlm", "mlx-lm")
#: runtimes that read no head: the head must not hurt them (backbone unchanged is the check)
HEADLESS = ("mlx-lm",)

#: (runtime, family) it does not support at all, with the runtime's own words. mlx-vlm: add-mtp
#: --runtime refuses with them; vllm-mlx: the head loads (every tensor consumed, backbone
#: unchanged) and the runtime never drafts.
UNSUPPORTED: dict[tuple[str, str], str] = {
    ("mlx-vlm", "next"): "no Qwen3-Next MTP drafter",
    # vllm-mlx's LLM route (Qwen3-Next is a text model) installs its MTP step on mlx-lm's
    # BatchGenerator._step, which its own pinned mlx-lm 0.31.3 no longer has: it logs
    # "[MTP] disabled" and never drafts, whatever the head.
    ("vllm-mlx", "next"): "lacks the _step hook",
    # the non-Qwen families (MTPLX drafts all three, mlx-vlm Nemotron-H): add-mtp --runtime R
    # refuses (R's layout is not one the family has) with R's words from mtpforge's runtime table
    ("vllm-mlx", "glm4_moe"): "drafts Qwen MTP heads only, not GLM-4.x",
    ("vllm-mlx", "glm4_moe_lite"): "drafts Qwen MTP heads only, not GLM-4.7-Flash",
    ("vllm-mlx", "nemotron_h"): "drafts Qwen MTP heads only, not Nemotron-H",
    ("mlx-vlm", "glm4_moe"): "not GLM-4.x",
    ("mlx-vlm", "glm4_moe_lite"): "has no attribute 'Model'",
    ("vllm-mlx", "step3p5"): "drafts Qwen MTP heads only, not Step-3.5",
    ("mlx-vlm", "step3p5"): "has no Step-3.5 MTP drafter",
}

#: cells whose greedy MTP output differs from the runtime's own plain output although the head
#: loads strictly, as written, and the backbone is unchanged: the runtime's verification
#: numerics, not the head (mlx-vlm's batched MoE verify flips one near-tie token, at both
#: precisions alike). Value: where (substring of the divergence).
NUMERICS: dict[str, str] = {
    "mlx-vlm-moe-default": "'prompt': 2, 'token': 36",
    "mlx-vlm-moe-bf16": "'prompt': 2, 'token': 36",
    # vllm-mlx's MLLM route: one near-tie flip at the 63rd token of prompt 1 (seen once the suite
    # decodes verify's 64 tokens instead of 48), the same with a 4-bit and a bf16 head and with
    # its manifest or without: its batched verification step, not the head
    "vllm-mlx-dense-default": "'prompt': 1, 'token': 62",
    "vllm-mlx-dense-bf16": "'prompt': 1, 'token': 62",
}

#: hand-broken (or hand-picked) folders for the inspect agreement test: id -> (runtime, family,
#: add-mtp arguments, edit after writing or None, what the runtime was measured to do:
#: "works" | "costs" (loads and drafts, values re-shifted) | "fails")
VARIANTS: dict[str, tuple[str, str, tuple[str, ...], str | None, str]] = {
    # the old default: mtp. keys in model*.safetensors under MTPLX's mlx-lm 0.31.3 (+1 on every
    # backbone norm)
    "mtplx-dense-embedded": ("mtplx", "dense", ("--layout", "embedded"), None, "fails"),
    # MTPLX finds a bare mtp.safetensors without the config reference
    "mtplx-dense-unreferenced": ("mtplx", "dense", ("--runtime", "mtplx"), "drop-sidecar-reference", "works"),
    # the sidecar layout's own rule (8-bit routers, fc quantized): no MTPLX template
    "mtplx-moe-layout-sidecar": ("mtplx", "moe", ("--layout", "sidecar"), None, "fails"),
    # fused experts: MTPLX restacks them itself (no false EXPERT_LAYOUT_INCOMPATIBLE)
    "mtplx-moe-fused-bf16": ("mtplx", "moe", ("--runtime", "mtplx", "--experts", "source", "--precision", "bf16"),
                             None, "works"),
    "mtplx-moe-fused": ("mtplx", "moe", ("--runtime", "mtplx", "--experts", "source"), None, "works"),
    "mtplx-moe-8bit": ("mtplx", "moe", ("--runtime", "mtplx", "--precision", "8"), None, "works"),
    # MTPLX loads an already converted Qwen3-Next strictly: "Received 42 parameters not in model"
    "mtplx-next-in-model-files": ("mtplx", "next", ("--runtime", "mtplx", "--layout", "vllm-mlx"), None, "fails"),
    # without mtp/manifest.json vllm-mlx decides the norms by mean < 0.5: the trained head's
    # shifted norms all sit above it, the fixture's pre_fc norms below it (re-shifted)
    "vllm-mlx-dense-no-manifest": ("vllm-mlx", "dense", ("--runtime", "vllm-mlx"), "drop-vllm-manifest", "works"),
    "vllm-mlx-moepe-no-manifest": ("vllm-mlx", "moepe", ("--runtime", "vllm-mlx"), "drop-vllm-manifest", "costs"),
    # Qwen3.5 checkpoints go through the MLLM route (mlx-vlm's loader drops mtp.* unchanged), and
    # its injection falls back to model-mtp.safetensors
    "vllm-mlx-dense-embedded": ("vllm-mlx", "dense", ("--layout", "embedded"), None, "works"),
    # MTPLX's rule in vllm-mlx's layout: an 8-bit shared_expert_gate dequantized with 4 bits
    "vllm-mlx-moe-mtplx-rule": ("vllm-mlx", "moe", ("--runtime", "mtplx", "--layout", "vllm-mlx"), None, "fails"),
    # a per-expert Qwen3.5 MoE source: the layout's own rule keeps per-expert experts
    "vllm-mlx-moepe-layout": ("vllm-mlx", "moepe", ("--layout", "vllm-mlx"), None, "fails"),
    "vllm-mlx-moepe-runtime": ("vllm-mlx", "moepe", ("--runtime", "vllm-mlx"), None, "works"),
    # mlx-vlm loads every expert format (no false EXPERT_LAYOUT_INCOMPATIBLE)
    "mlx-vlm-moe-fused": ("mlx-vlm", "moe", ("--runtime", "mlx-vlm", "--experts", "source"), None, "works"),
    "mlx-vlm-moepe-per-expert": ("mlx-vlm", "moepe", ("--runtime", "mlx-vlm", "--experts", "source"), None, "works"),
    "mlx-vlm-dense-8bit": ("mlx-vlm", "dense", ("--runtime", "mlx-vlm", "--precision", "8"), None, "works"),
    # released mlx-lm drops mtp.* for Qwen3.5 and refuses it for an already converted Qwen3-Next
    "mlx-lm-dense-embedded": ("mlx-lm", "dense", ("--layout", "embedded"), None, "works"),
    "mlx-lm-next-in-model-files": ("mlx-lm", "next", ("--layout", "vllm-mlx"), None, "fails"),
}

#: how each driver runs its runtime (the lane a user of that runtime takes), what its acceptance
#: counts, and why that count differs from ``mtpforge verify``'s on the same head, prompts and
#: tokens (verify: the reference loop, head KV cache prefilled over the prompt, every draft kept)
LANES: dict[str, str] = {
    "mtplx": "lane of `mtplx run` (generate_mtpk, depth 1, post-norm hidden, persistent head cache, committed "
             "history; batched verification: its capture_commit path diverges from its own plain output on "
             "the CPU); count: accepted_drafts/drafted_tokens, what `mtplx run` prints; within about a point "
             "of verify's",
    "vllm-mlx": "lane of `vllm-mlx serve` (BatchedEngine MLLM route for Qwen3.5/3.6, Scheduler for Qwen3-Next); "
                "count: the engine's mtp stats accepted/attempted, what its /v1/status reports; below verify's: "
                "it drafts without the head's own KV cache",
    "mlx-vlm": "lane of `mlx_vlm.generate --draft-kind mtp` (stream_generate on the prompt's token ids with the "
               "drafter, as its CLI's generate() does); count: sum(accept_lens)/sum(draft_lens), what it prints; "
               "about 20 points below verify's on Qwen3.5, whose drafter drafts two tokens a round and counts "
               "the second also after a rejected first; at one draft a round (--draft-block-size 2, measured "
               "beside it) it counts what verify counts",
    "mlx-lm": "released mlx-lm reads no head: its row checks only that the backbone is unchanged",
}
