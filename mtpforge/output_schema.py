"""The ``--json`` outputs as versioned JSON Schemas (``mtpforge schema --output NAME``).

Every JSON object mtpforge prints carries ``schema_version``; a CI script checks it before it
reads further, and a change that removes or retypes a key raises the version. The models list
what docs/CONTRACT.md promises (required keys) and leave room for more (``extra="allow"``): outputs
grow, and a consumer must not break when they do.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from .families import FAMILIES
from .layouts.table import GGUF_LAYOUT_NAMES, LAYOUT_NAMES

SCHEMA_VERSION = 1
SCHEMA_URL = "https://json-schema.org/draft/2020-12/schema"

Severity = Literal["error", "warning", "info"]
#: the tables' names, so a new family or layout is in the schema without an edit here
Family = Literal[tuple(FAMILIES)]  # type: ignore[valid-type]
#: where a head was found: a layout, ``hf`` (a raw checkpoint's mtp.*), or ``none``
FoundLayout = Literal[LAYOUT_NAMES + GGUF_LAYOUT_NAMES + ("none", "hf")]  # type: ignore[valid-type]


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")
    schema_version: Literal[1] = Field(description="Version of this output format; raised when a key is removed or retyped.")


class Finding(BaseModel):
    model_config = ConfigDict(extra="allow")
    code: str = Field(description="A code of docs/SPEC.md §6, e.g. MTP_NORMS_RAW.")
    severity: Severity
    message: str
    fix: str


class Quantization(BaseModel):
    model_config = ConfigDict(extra="allow")
    default: Optional[Dict[str, Any]] = Field(None, description="bits, group_size, mode of the checkpoint; null when not quantized.")


class InspectOutput(_Out):
    target: str
    family: Optional[Family]
    layout: FoundLayout
    config_mtp_layers: int
    mtp_tensors: int
    mtp_bytes: int
    norm_convention: Literal["shifted", "raw", "mixed", "double-shifted", "unknown", "none"]
    expert_format: Literal["none", "per-expert", "fused", "switch_mlp", "stacked"] = Field(
        description="stacked: a GGUF file's ffn_*_exps tensors.")
    quantization: Optional[Quantization]
    findings: List[Finding]


class AddMtpOutput(_Out):
    layout: str
    files_written: List[str]
    mtp_tensors: int
    mtp_bytes: int
    fetched_bytes: int
    revision: Optional[str] = Field(description="Resolved commit sha; null for a local source.")
    manifest: str
    status: Optional[Literal["written", "already-present", "planned"]] = None
    precision: Optional[str] = Field(None, description="The head's precision in --precision's words (match resolved: "
                                     "bf16, float16 or the bits; a GGUF head: its ggml type).")


class VerifyOutput(_Out):
    target: str
    family: str
    layout: str
    ok: bool
    generate: bool
    identical: Optional[bool] = Field(None, description="With --generate: MTP output equals plain greedy; null when sampling.")
    tokens: Optional[int] = None
    drafted: Optional[int] = None
    accepted: Optional[int] = None
    acceptance: Optional[float] = None
    acceptance_by_position: Optional[List[float]] = None
    hidden: Optional[Literal["pre", "post"]] = None
    hidden_variants: Optional[Dict[str, float]] = None
    accepted_per_verify: Optional[float] = None
    baseline_tok_s: Optional[float] = None
    mtp_tok_s: Optional[float] = None
    speedup: Optional[float] = None
    per_prompt: Optional[List[Dict[str, Any]]] = Field(
        None, description="With --generate: prompt, tokens, drafted, accepted and acceptance for each prompt.")
    report: Optional[str] = Field(None, description="With --report: the page written.")
    problems: List[str]


class RunOutput(_Out):
    recipe: str
    mode: Literal["validate", "dry-run", "run"]
    source: str
    target: str
    check_results: Optional[Dict[str, str]] = None
    ok: Optional[bool] = None


class ConvertOutput(_Out):
    source: str
    revision: Optional[str]
    mlx_path: str
    layout: str
    mtp_tensors: int
    mtp_bytes: int
    fetched_bytes: int = Field(description="Tensor bytes downloaded again for the head; 0 when the converter's download served it.")
    files_written: List[str]
    manifest: str
    findings: List[Finding]


class AlignMeasure(BaseModel):
    model_config = ConfigDict(extra="allow")
    acceptance: float = Field(description="verify --generate's acceptance (greedy, depth 1) of the better hidden variant.")
    hidden: Literal["pre", "post"]
    hidden_variants: Dict[str, float]
    identical: bool = Field(description="MTP output equals plain greedy decoding on every prompt and variant.")


class AlignOutput(_Out):
    target: str
    head_folder: str
    family: str
    layout: str
    dry_run: bool
    status: Literal["aligned", "planned", "not-improved", "not-written"] = Field(
        description="aligned: written; planned: --dry-run, would be written; not-improved / not-written: the folder is unchanged.")
    train_steps: int = Field(description="--steps: the fine-tuning steps run.")
    seed: int
    before: AlignMeasure
    after: AlignMeasure
    gain: float = Field(description="after minus before acceptance (a fraction).")
    trained_tensors: int
    changed_tensors: int
    requantized_modules: List[str]
    files_written: List[str]
    text_seconds: float
    train_seconds: float
    seconds: float
    problems: List[str]


class ErrorBody(BaseModel):
    code: str
    message: str
    fix: Optional[str]


class ErrorOutput(_Out):
    error: ErrorBody


#: ``schema --output NAME`` -> the model of that command's ``--json`` object
OUTPUTS: dict[str, type[_Out]] = {
    "inspect": InspectOutput, "add-mtp": AddMtpOutput, "verify": VerifyOutput, "run": RunOutput,
    "convert": ConvertOutput, "align": AlignOutput, "error": ErrorOutput,
}


OUTPUT_NAMES = tuple(OUTPUTS)


def output_schema(name: str) -> dict[str, Any]:
    model = OUTPUTS[name]
    schema = model.model_json_schema()
    schema.pop("title", None)
    return {"$schema": SCHEMA_URL, "$id": f"mtpforge/{name}-output/v{SCHEMA_VERSION}",
            "title": f"mtpforge {name} --json output (schema_version {SCHEMA_VERSION})", **schema}


__all__ = ["SCHEMA_VERSION", "OUTPUTS", "OUTPUT_NAMES", "output_schema", "InspectOutput", "AddMtpOutput", "VerifyOutput", "RunOutput",
           "ConvertOutput", "ErrorOutput"]
