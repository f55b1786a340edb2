"""config.json as a runtime's own pinned mlx-lm reads it.

Released mlx-lm 0.32 writes a non-finite float of config.json the way transformers does, tagged
so the file stays strict JSON: Nemotron-H's ``"time_step_limit": [0.0, {"__float__": "Infinity"}]``.
mlx-lm 0.31.x — what MTPLX 2.12.2, vllm-mlx 0.6.0 and mlx-lm #1533 are built on — has no decoder
for the tag: the value reaches the Mamba mixer as a dict and the first decode step stops with
``ValueError: Invalid type dict received in array initialization`` (measured in MTPLX's own
virtualenv). ``add-mtp --runtime R`` promises a folder R loads *and drafts*, so for a row whose
loader reads no tags (``RuntimeSpec.reads_tagged_floats``) the written config.json carries the
values themselves: a key left out where its value is the family's mlx-lm default (the same in
0.31 and 0.32, so every mlx-lm reads the same number), else the bare float (``Infinity``, which
Python's json reads). The manifest records which keys changed; ``remove-mtp`` restores the
tagged form with the rest of config.json.
"""

from __future__ import annotations

import math
from typing import Any

TAG = "__float__"
TAGS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}

#: what mlx-lm's ModelArgs uses for a key config.json leaves out, per family (mlx-lm 0.31.3 and
#: 0.32.2, models/nemotron_h.py: ``time_step_limit = (0.0, float("inf"))`` when None)
MLX_LM_DEFAULTS: dict[str, dict[str, list[float]]] = {
    "nemotron_h": {"time_step_limit": [0.0, math.inf]},
}
#: the only keys add-mtp rewrites so (remove-mtp restores no other key of config.json than
#: those add-mtp writes: manifest.allowed_change); a tag elsewhere is left as it is
REWRITTEN_FOR_RUNTIME = frozenset(k for d in MLX_LM_DEFAULTS.values() for k in d)


def _tagged(obj: Any) -> bool:
    return isinstance(obj, dict) and set(obj) == {TAG} and obj[TAG] in TAGS


def _untag(obj: Any) -> Any:
    if _tagged(obj):
        return TAGS[obj[TAG]]
    if isinstance(obj, dict):
        return {k: _untag(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_untag(v) for v in obj]
    return obj


def _has_tag(obj: Any) -> bool:
    if _tagged(obj):
        return True
    if isinstance(obj, dict):
        return any(_has_tag(v) for v in obj.values())
    if isinstance(obj, list):
        return any(_has_tag(v) for v in obj)
    return False


def untagged_config(cfg: dict[str, Any], family: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``cfg`` with every tagged float turned into what mlx-lm 0.31 reads, and per key (a nested
    ``text_config``'s as ``text_config.<key>``) what was done: ``"left out (mlx-lm's default)"``
    or ``"bare float"``."""
    out = dict(cfg)
    done: dict[str, str] = {}
    defaults = MLX_LM_DEFAULTS.get(family, {})

    def fix(holder: dict[str, Any], prefix: str) -> None:
        for k in [k for k in holder if k in REWRITTEN_FOR_RUNTIME and _has_tag(holder[k])]:
            value = _untag(holder[k])
            if k in defaults and value == defaults[k]:
                del holder[k]
                done[prefix + k] = "left out (mlx-lm's default)"
            else:
                holder[k] = value
                done[prefix + k] = "bare float"

    if isinstance(out.get("text_config"), dict):
        out["text_config"] = dict(out["text_config"])
        fix(out["text_config"], "text_config.")
    fix(out, "")
    return out, done


__all__ = ["MLX_LM_DEFAULTS", "REWRITTEN_FOR_RUNTIME", "untagged_config"]
