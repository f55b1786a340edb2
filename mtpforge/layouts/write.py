"""What each layout changes besides the tensor file: config keys, index entries, manifests.

Pure functions from (old config / index, plan facts) to new JSON objects; the pipeline stages
them. Everything a layout adds to config.json is listed in ``CONFIG_KEYS_ADDED`` so remove-mtp
can restore the original file byte for byte from the manifest.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Mapping

from ..families.spec import FamilySpec
from .sidecar import SIDECAR_CONFIG_KEY
from .spec import Placement


def dump_json(obj: Any) -> bytes:
    """JSON as mlx-lm and huggingface_hub write it (indent 4, sorted keys kept as given)."""
    # a lone surrogate (a non-UTF-8 file name, decoded by the OS layer) becomes its JSON escape
    return (json.dumps(obj, indent=4, ensure_ascii=False) + "\n").encode("utf-8", "backslashreplace")


def _text(config: dict[str, Any]) -> dict[str, Any]:
    tc = config.get("text_config")
    return tc if isinstance(tc, dict) else config


def updated_config(
    config: Mapping[str, Any], placement: Placement, *, n_layers: int, mtp_tensors: int,
    quant_entries: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """The target's config.json after adding a head with ``placement``."""
    cfg = copy.deepcopy(dict(config))
    tc = _text(cfg)
    for key in placement.count_keys:
        tc[key] = n_layers
    if placement.sidecar_reference:
        cfg[SIDECAR_CONFIG_KEY] = {"mtp_file": placement.file, "mtp_tensor_count": mtp_tensors}
    for qkey in ("quantization", "quantization_config"):
        q = cfg.get(qkey)
        if isinstance(q, dict) and quant_entries:
            for path, spec in quant_entries.items():
                q[path] = dict(spec)
    if quant_entries and not isinstance(cfg.get("quantization"), dict):
        # an unquantized target with a quantized head: the per-path entries tell the loader, and
        # mlx-lm's loader reads the top-level group_size and bits before any entry (a KeyError
        # without them). They quantize nothing else: its predicate takes only modules whose
        # ``.scales`` are stored or that an entry names.
        first = next(iter(quant_entries.values()))
        top = {k: first[k] for k in ("group_size", "bits", "mode") if k in first}
        cfg["quantization"] = {**top, **{k: dict(v) for k, v in quant_entries.items()}}
        cfg["quantization_config"] = {**top, **{k: dict(v) for k, v in quant_entries.items()}}
    return cfg


def updated_index(index: Mapping[str, Any] | None, file: str, keys: list[str], nbytes: int,
                  total_size: int | None = None) -> dict[str, Any]:
    """The index with the head's keys pointing at ``file`` and ``total_size`` (the validated
    value of the index's ``metadata.total_size``, when it has one) grown by its bytes."""
    idx = copy.deepcopy(dict(index)) if index else {"metadata": {}, "weight_map": {}}
    wm = dict(idx.get("weight_map") or {})
    for k in keys:
        wm[k] = file
    idx["weight_map"] = dict(sorted(wm.items()))
    meta = dict(idx.get("metadata") or {})
    if total_size is not None:
        meta["total_size"] = total_size + nbytes
    idx["metadata"] = meta
    return idx


def drafter_config(family: FamilySpec, target_config: Mapping[str, Any], n_layers: int,
                   quant: Mapping[str, Any] | None) -> dict[str, Any]:
    """config.json of an mlx-vlm drafter folder: the family's drafter model_type and the
    target's text_config with the MTP layer count. A target without a nested text_config (its
    whole config is the language model's: Nemotron-H) gives that config, less its own
    quantization: the drafter's is stated at the top level (mlx-vlm's loader would otherwise
    take the target's ``quantization_config`` for the drafter's)."""
    nested = isinstance(target_config.get("text_config"), dict)
    tc = copy.deepcopy(_text(dict(target_config)))
    if not nested:
        for qkey in ("quantization", "quantization_config"):
            tc.pop(qkey, None)
    for key in family.count_keys_written:
        tc[key] = n_layers
    cfg: dict[str, Any] = {"model_type": family.mlx_vlm_drafter_type, "text_config": tc}
    if quant:
        cfg["quantization"] = dict(quant)
        cfg["quantization_config"] = dict(quant)
    return cfg


def vllm_mlx_manifest(*, family: str, n_layers: int, mtp_tensors: int, expert_format: str, source: str, revision: str | None) -> dict[str, Any]:
    """mtp/manifest.json for vllm-mlx: with the schema version, it trusts the declared norm format
    instead of its mean<0.5 heuristic (which double-shifts correct heads)."""
    return {
        "artifact_schema_version": 1,
        "rmsnorm_weight_format": "mlx_gamma",
        "weights_file": "weights.safetensors",
        "num_nextn_predict_layers": n_layers,
        "tensor_count": mtp_tensors,
        "expert_format": expert_format,
        "family": family,
        "source": source,
        "source_revision": revision,
        "producer": "mtpforge",
    }
