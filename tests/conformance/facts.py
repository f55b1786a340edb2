"""What the real runtimes were measured to do with each folder ``add-mtp`` writes (this suite's
own measurements; SPEC §5.1 has the same facts from the original survey).

The tests hold the runtimes to these tables: a cell listed here must keep failing exactly so
(a runtime upgrade that fixes it makes the test fail until the row is removed), every other cell
must pass all checks.
"""

from __future__ import annotations

#: what each runtime is given (the add-mtp flags that pick its layout)
LAYOUT_ARGS: dict[str, tuple[str, ...]] = {
    "mtplx": ("--layout", "sidecar"),
    "vllm-mlx": ("--layout", "vllm-mlx"),
    "mlx-vlm": ("--layout", "mlx-vlm-drafter"),
}

#: families a runtime has no MTP path for at all, with the runtime's own words
UNSUPPORTED: dict[tuple[str, str], str] = {
    ("mlx-vlm", "next"): "mlx-vlm 0.7.10 has no Qwen3-Next MTP drafter (its DRAFTER_KIND_BY_MODEL_TYPE "
                         "lists qwen3_5_mtp, no qwen3_next_mtp)",
}

#: runtime refusals measured with LAYOUT_ARGS: cell id -> the runtime's words (substring)
EXPECTED: dict[str, str] = {
    # MTPLX dequantizes every triplet of a head whose key set is not one of its templates with
    # the single default bits; the 8-bit router then does not fit (mtp_patch.py).
    "mtplx-moe-default": "Shape of scales and biases does not match",
    "mtplx-next-default": "Shape of scales and biases does not match",
    # vllm-mlx's LLM route (Qwen3-Next is a text model) installs its MTP step on mlx-lm's
    # BatchGenerator._step, which its own pinned mlx-lm 0.31.3 no longer has: it logs
    # "[MTP] disabled" and never drafts, whatever the head.
    "vllm-mlx-next-default": "lacks the _step hook",
    "vllm-mlx-next-bf16": "lacks the _step hook",
    # mlx-vlm's batched MoE verify flips one near-tie greedy token (prompt 2, token 36) against
    # its own plain decode, at both precisions alike: verification numerics of the runtime, not
    # the head (the head's tensors load strictly and as written; the backbone is unchanged).
    "mlx-vlm-moe-default": "'prompt': 2, 'token': 36",
    "mlx-vlm-moe-bf16": "'prompt': 2, 'token': 36",
}

#: what plain ``add-mtp`` (no --layout) output does in each runtime: cell id -> harm (substring
#: of the verdict: "BACKBONE CHANGED", or the runtime's words when it cannot load the folder)
EXPECTED_DEFAULT: dict[str, str] = {
    # MTPLX pins mlx-lm 0.31.x, whose qwen3_5 sanitize adds +1 to every backbone norm once an
    # mtp. key is in model*.safetensors (the embedded layout)
    "mtplx-dense-default-default-layout": "BACKBONE CHANGED",
    # (and its MoE head, at the default precision, is refused as in the sidecar layout)
    "mtplx-moe-default-default-layout": "Shape of scales and biases does not match",
    "mtplx-next-default-default-layout": "Shape of scales and biases does not match",
}
