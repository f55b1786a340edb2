"""Finding codes of docs/SPEC.md §6 with their default severity, as one table."""

from __future__ import annotations

from dataclasses import asdict, dataclass

ERROR, WARNING, INFO = "error", "warning", "info"

#: MTP_HEAD_DEAD's line, for MLX (inspect: drafts agreeing with the backbone) and GGUF (verify:
#: llama.cpp's acceptance) alike: below this share a head saves nothing, each step's verify pass
#: costs more than the rare accepted token gains (trained heads agree on 60-90%; the dead heads
#: reported in the wild on 0-4%)
DEAD_AGREEMENT = 0.10

#: code -> default severity (some are raised to error by ``--runtime``)
CODES: dict[str, str] = {
    "MTP_CONFIG_WITHOUT_WEIGHTS": ERROR,
    "MTP_HEAD_MISSING": WARNING,
    "CORRUPT_FILE": ERROR,
    "MTP_WEIGHTS_WITHOUT_CONFIG": ERROR,
    "MTP_MISSING_TENSORS": ERROR,
    "MTP_UNEXPECTED_TENSORS": ERROR,
    "MTP_SHAPE_MISMATCH": ERROR,
    "MTP_NORMS_RAW": ERROR,
    "MTP_NORMS_MIXED": ERROR,
    "MTP_NORMS_DOUBLE_SHIFTED": ERROR,
    "MTP_NORMS_SHIFTED": ERROR,
    # the head's drafts agree with its backbone on almost nothing (measured by running it)
    "MTP_HEAD_DEAD": WARNING,
    "QUANT_CONFIG_MISMATCH": ERROR,
    "STALE_SHARD": ERROR,
    "INDEX_INCONSISTENT": ERROR,
    "SIDECAR_UNREFERENCED": ERROR,
    "EXPERT_LAYOUT_INCOMPATIBLE": WARNING,
    "MLX_LM_LOAD_BREAKS": WARNING,
    "LEGACY_LOADER_DOUBLE_SHIFT": WARNING,
    "NONFINITE_WEIGHTS": ERROR,
    "DEGENERATE_TENSOR": ERROR,
    # whole-folder findings beyond the head (docs/FINDINGS.md)
    "TOKENIZER_MISSING": ERROR,
    "TOKENIZER_UNREADABLE": ERROR,
    "EOS_PAD_INCONSISTENT": WARNING,
    "CHAT_TEMPLATE_MISSING": WARNING,
    # a value in a file inspect reads is not what the format allows (mtpforge/inputs); warning
    # for the side files (generation_config.json, tokenizer_config.json, mtpforge.json)
    "INVALID_VALUE": ERROR,
    # informational notes that are not defects
    # an original Hugging Face checkpoint: a source for add-mtp, not an MLX folder
    "HF_SOURCE_CHECKPOINT": INFO,
    "NORM_CONVENTION_UNKNOWN": INFO,
    # some norm groups undecided (no source; the drafts do not depend on them measurably)
    "NORM_CONVENTION_PARTIAL": INFO,
    "LAYOUT_NOT_READ_BY_RUNTIME": INFO,
    # inspect --runtime R: R's own loader (runtimes/table.py) refuses or re-shifts the head
    "RUNTIME_NO_MTP": ERROR,
    "RUNTIME_QUANT_UNSUPPORTED": ERROR,
    "RUNTIME_RESHIFTS_NORMS": WARNING,
    "RUNTIME_ACCEPTANCE_COST": INFO,
    "MANIFEST_STALE": WARNING,
    # inspect --source names a checkpoint whose head is not this head's origin
    "SOURCE_MISMATCH": WARNING,
}


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    message: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def finding(code: str, message: str, fix: str, severity: str | None = None) -> Finding:
    return Finding(code, severity or CODES[code], message, fix)
