"""Module precision on disk vs what the config makes a loader build (docs/SPEC.md §4).

Bits and group size are inferred from shapes — packed uint32 width and scales width against the
unquantized input dimension the family table gives — so the check does not trust the config it
is checking.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..checkpoint.safetensors_header import TensorInfo
from ..inputs.model_config import as_config
from ..passes.quantize import QSpec

_ST_TO_NAME = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def quant_defaults(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The default ``{bits, group_size, mode}`` of a quantized MLX model, else None (also when
    the config's quantization does not validate: that is a problem of the config, see inputs)."""
    return as_config(config).quant_dict()


def module_quant(config: Mapping[str, Any]) -> dict[str, QSpec | bool]:
    """Per-module entries of the config's quantization: a (merged) spec, or true / false."""
    return dict(as_config(config).quant_modules)


def stored_precision(
    entries: Mapping[str, TensorInfo], module: str, in_features: int | None
) -> dict[str, Any]:
    """What is on disk for ``module`` (bare, no ``.weight``): a float dtype or a quantized triplet."""
    w = entries.get(f"{module}.weight") or entries.get(module)
    s = entries.get(f"{module}.scales")
    if w is None:
        return {"missing": True}
    if s is None:
        return {"dtype": _ST_TO_NAME.get(w.dtype, w.dtype)}
    b = entries.get(f"{module}.biases")
    packed = w.shape[-1]
    groups = s.shape[-1]
    out: dict[str, Any] = {"quantized": True}
    if in_features:
        bits = packed * 32 / in_features
        out["bits"] = int(bits) if bits == int(bits) else bits
        out["group_size"] = in_features // groups if groups and in_features % groups == 0 else None
    if b is not None:
        out["mode"] = "affine"
    elif s.dtype == "U8":
        gs = out.get("group_size")
        out["mode"] = "nvfp4" if gs == 16 else ("mxfp8" if out.get("bits") == 8 else "mxfp4")
    else:
        out["mode"] = "affine"
    return out


def expected_precision(
    config: Mapping[str, Any], runtime_path: str, has_scales: bool
) -> dict[str, Any] | None:
    """What the loader builds for a module: a per-path entry wins; else quantized iff
    ``.scales`` exists, with the default bits (docs/SPEC.md §4). None means unquantized."""
    cfg = as_config(config)
    e = cfg.quant_modules.get(runtime_path)
    if e is False:
        return None
    if isinstance(e, QSpec):
        return {"bits": e.bits, "group_size": e.group_size, "mode": e.mode}
    if has_scales:
        return cfg.quant_dict() or {"bits": None, "group_size": None, "mode": "affine"}
    return None
