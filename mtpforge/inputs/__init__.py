"""Every file mtpforge reads, parsed once where it is read into a typed, validated value.

The rest of the code works with these values and never with the raw JSON for what it relies
on, so a malformed value is reported once, here, as one line that names the file, the key and
what was expected — never as a ``TypeError`` three modules later.

| file | parsed by | value |
|---|---|---|
| ``config.json`` | ``checkpoint/catalogue.py`` | :class:`~mtpforge.inputs.model_config.ModelConfig` |
| ``model.safetensors.index.json`` | ``checkpoint/catalogue.py`` | :class:`~mtpforge.inputs.index.IndexFile` |
| safetensors headers | ``checkpoint/safetensors_header.py`` | ``Header`` / ``TensorInfo`` |
| block-FP8 scales (``*_scale_inv``) | ``plan.validate_source_head`` | checked pairs of ``TensorInfo`` |
| ``mtpforge.json`` | ``manifest.py`` | :class:`~mtpforge.inputs.manifest_file.ManifestFile` |
| ``generation_config.json``, ``tokenizer_config.json`` | ``inputs/side_files.py`` | :class:`~mtpforge.inputs.side_files.GenerationConfig`, :class:`~mtpforge.inputs.side_files.TokenizerConfig` |
| recipes | ``recipe.py`` | ``Recipe`` |
| GGUF metadata | ``gguf/gguffile.py`` | ``GgufFile`` (typed ``KV`` values checked on read) |

A value that does not validate is refused with exit 2 (``InvalidValue``, an ``InputError``);
``inspect`` reports it as an ``INVALID_VALUE`` finding instead where the folder is otherwise
readable (the problems a parsed value carries: :class:`Problem`).
"""

from __future__ import annotations

from .problems import InvalidValue, Problem, describe

__all__ = ["InvalidValue", "Problem", "describe"]
