"""``mtpforge.json`` (and a GGUF head's ``*.gguf.mtpforge.json``): the record of what mtpforge
changed, validated for shape before anything reads a value from it.

The record travels with the folder and may have been edited or damaged; :func:`check_manifest`
says which key is not what mtpforge writes. What a valid record *claims* is then checked against
the files by ``manifest.py`` (the trust rules); this module only guarantees that every value the
code reads has the type it reads it as.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from .problems import Problem, problems_of

_SHA = "a sha256 (64 lowercase hex digits)"
Sha = Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]
Number = Union[StrictInt, StrictFloat]


class _Rec(BaseModel):
    # what a newer mtpforge adds is kept and ignored
    model_config = ConfigDict(extra="allow", frozen=True, protected_namespaces=())


class SourceRec(_Rec):
    repo: Optional[StrictStr] = Field(None, description="a repo id or folder name (a string)")
    revision: Optional[StrictStr] = Field(None, description="a commit sha (a string) or null")
    local: Optional[StrictBool] = Field(None, description="true or false")
    fingerprint: Optional[StrictStr] = Field(None, description="a string")


class PatchRec(_Rec):
    path: list[StrictStr] = Field(..., min_length=1, description="a non-empty list of key names")


class ChangeRec(_Rec):
    kind: Literal["file", "symlink", "absent"] = Field(..., description="\"file\", \"symlink\" or \"absent\"")
    text: Optional[StrictStr] = Field(None, description="the file's text (a string)")
    target: Optional[StrictStr] = Field(None, description="a link target (a string)")
    sha256: Optional[Sha] = Field(None, description=_SHA)
    after_sha256: Optional[Sha] = Field(None, description=_SHA)
    patch: Optional[list[PatchRec]] = Field(None, description="a list of {\"path\", \"before\", \"after\"}")


class CardRec(_Rec):
    file: Optional[StrictStr] = Field(None, description="a file name")
    separator: Literal["", "\n", "\n\n"] = Field(..., description="\"\", \"\\n\" or \"\\n\\n\"")
    section_sha256: list[Sha] = Field(..., min_length=1, description=f"a non-empty list of {_SHA}s")


class TensorRec(_Rec):
    sha256: Optional[Sha] = Field(None, description=_SHA)
    dtype: Optional[StrictStr] = Field(None, description="a dtype name")
    shape: Optional[list[StrictInt]] = Field(None, description="a list of integers")


class QuantRec(_Rec):
    bits: Optional[StrictInt] = Field(None, description="an integer")
    group_size: Optional[StrictInt] = Field(None, description="an integer")
    mode: Optional[StrictStr] = Field(None, description="a quantization mode")


class PrecisionRec(_Rec):
    float_dtype: Optional[StrictStr] = Field(None, description="a dtype name")
    default: Optional[QuantRec] = Field(None, description="{\"bits\", \"group_size\", \"mode\"} or null")
    modules: Optional[dict[str, Union[QuantRec, StrictStr]]] = Field(
        None, description="module -> {\"bits\", \"group_size\", \"mode\"} or a dtype name")


class VerifyRec(_Rec):
    hidden_state: Optional[StrictStr] = Field(None, description="\"pre\" or \"post\"")
    acceptance: Optional[Number] = Field(None, description="a fraction (a number)")
    hidden_variants: Optional[dict[str, Number]] = Field(None, description="variant -> a fraction")
    acceptance_by_position: Optional[list[Number]] = Field(None, description="a list of fractions")
    depth: Optional[StrictInt] = Field(None, description="an integer")
    identical: Optional[StrictBool] = Field(None, description="true, false or null")
    measured_at: Optional[StrictStr] = Field(None, description="a time (a string)")


class ManifestFile(_Rec):
    """Every key of ``mtpforge.json`` that mtpforge reads, typed as it reads it."""

    mtpforge_manifest: Optional[StrictInt] = Field(None, description="the manifest version (an integer)")
    mtpforge_version: Optional[StrictStr] = Field(None, description="a version (a string)")
    family: Optional[StrictStr] = Field(None, description="a family name")
    layout: Optional[StrictStr] = Field(None, description="a layout name")
    source: Optional[SourceRec] = Field(None, description="an object {\"repo\", \"revision\", \"local\", \"fingerprint\"}")
    options: Optional[dict[str, Any]] = Field(None, description="an object of add-mtp options")
    norm_convention: Optional[StrictStr] = Field(None, description="a norm convention name")
    expert_format: Optional[StrictStr] = Field(None, description="an expert format name")
    precision: Optional[PrecisionRec] = Field(None, description="an object {\"float_dtype\", \"default\", \"modules\"}")
    mtp_layers: Optional[Annotated[StrictInt, Field(ge=0)]] = Field(None, description="an integer >= 0")
    tensors: Optional[dict[str, TensorRec]] = Field(None, description="tensor -> {\"sha256\", \"dtype\", \"shape\"}")
    file_sha256: Optional[dict[str, Sha]] = Field(None, description=f"file -> {_SHA}")
    added: Optional[list[StrictStr]] = Field(None, description="a list of file names")
    changed: Optional[dict[str, ChangeRec]] = Field(None, description="file -> how it looked before")
    model_card: Optional[CardRec] = Field(None, description="an object {\"file\", \"separator\", \"section_sha256\"}")
    verify: Optional[VerifyRec] = Field(None, description="the measurement verify --record wrote")
    repairs: Optional[list[dict[str, Any]]] = Field(None, description="a list of repair records")
    aligned: Optional[list[dict[str, Any]]] = Field(None, description="a list of align records")


class GgufTrunkRec(_Rec):
    file: Optional[StrictStr] = Field(None, description="the trunk's file name")


class GgufCardRec(_Rec):
    file: StrictStr = Field(..., description="the card's file name")
    separator: Literal["", "\n", "\n\n"] = Field(..., description="\"\", \"\\n\" or \"\\n\\n\"")
    section_sha256: list[Sha] = Field(..., min_length=1, description=f"a non-empty list of {_SHA}s")
    before: ChangeRec = Field(..., description="how the card was before: {\"kind\": \"absent\" | \"file\" | \"symlink\", ...}")
    after_sha256: Sha = Field(..., description=_SHA)


class GgufManifestFile(_Rec):
    """``<head>.gguf.mtpforge.json``: what add-mtp wrote beside a GGUF trunk."""

    fingerprint: Optional[dict[str, Any]] = Field(None, description="an object")
    file_sha256: Optional[Sha] = Field(None, description=_SHA)
    trunk: Optional[GgufTrunkRec] = Field(None, description="an object {\"file\", ...}")
    #: every trunk the head serves (other quantizations of the same model added later)
    trunks: Optional[list[GgufTrunkRec]] = Field(None, description="a list of {\"file\", ...}")
    model_card: Optional[GgufCardRec] = Field(None, description="the card's record")
    #: what the head's norms carry: "shifted" (+1, a zero-centred family) or "raw"
    norm_convention: Optional[Literal["shifted", "raw"]] = Field(None, description="\"shifted\" or \"raw\"")


def gguf_trunk_files(m: GgufManifestFile) -> set[str]:
    """The trunks a GGUF head's record says it serves."""
    return {t.file for t in [*(m.trunks or []), *([m.trunk] if m.trunk else [])] if t.file}


def check_manifest(obj: Any, file: str, model: type[BaseModel] = ManifestFile) -> Optional[Problem]:
    """The first key of a parsed record that is not what mtpforge writes (None: it validates)."""
    if not isinstance(obj, dict):
        return Problem(file, "(top level)", type(obj).__name__, "a JSON object")
    try:
        model.model_validate(obj)
    except ValidationError as e:
        return problems_of(e, model, obj, file)[0]
    return None


def read_gguf_manifest(path: Any) -> tuple[Optional[GgufManifestFile], Optional[Problem]]:
    """A GGUF head's record: the validated value, or what is wrong with it (both None: absent)."""
    import json
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        return None, None
    try:
        obj = json.loads(p.read_bytes().decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
        return None, Problem(str(p), "(the file)", f"not JSON ({e.__class__.__name__})", "a JSON object")
    bad = check_manifest(obj, str(p), GgufManifestFile)
    return (GgufManifestFile.model_validate(obj), None) if bad is None else (None, bad)


__all__ = ["ManifestFile", "GgufManifestFile", "check_manifest", "gguf_trunk_files", "read_gguf_manifest"]
