"""The add-mtp options: one frozen, validated model for the CLI, the Python API and recipes.

``HeadOptions`` holds what decides the head that is written; the CLI builds its ``add-mtp``
flags from these fields (name, default, choices, help) and recipes inherit them, so a new
option is one new field here (mergekit's validated frozen config).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, TypeVar, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, WithJsonSchema, field_validator
from pydantic_core import PydanticCustomError

from .errors import InputError, unknown_choice
from .layouts.table import GGUF_LAYOUT_NAMES, LAYOUT_NAMES
from .passes.quantize import AFFINE_BITS
from .runtimes import RUNTIME_NAMES

Layout = Literal[LAYOUT_NAMES + GGUF_LAYOUT_NAMES]  # type: ignore[valid-type]
Bits = Literal[AFFINE_BITS]  # type: ignore[valid-type]
#: ggml tensor types a GGUF head is written in (llama.cpp targets only)
GgmlPrecision = Literal["f32", "f16", "q8_0"]
Precision = Union[Literal["match", "bf16", "float16", "f32", "f16", "q8_0"], Bits]
Experts = Literal["auto", "source", "switch_mlp"]
Runtime = Literal[RUNTIME_NAMES]  # type: ignore[valid-type]
Fetch = Literal["auto", "ranges", "stream", "shards"]

_PRECISION_ALIASES = {"bfloat16": "bf16", "fp16": "float16", "float16": "float16", "bf16": "bf16", "match": "match",
                      **{t: t for t in get_args(GgmlPrecision)}}


def normalise_precision(v: Any) -> Any:
    """``match`` | ``bf16`` | ``float16`` | bits, from any spelling a user types."""
    if isinstance(v, str) and v.strip().lower() in _PRECISION_ALIASES:
        return _PRECISION_ALIASES[v.strip().lower()]
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v.strip())
    if isinstance(v, int) and not isinstance(v, bool) and v in AFFINE_BITS:
        return v
    raise PydanticCustomError(
        "precision", "must be match, bf16, float16 or bits 2, 3, 4, 5, 6 or 8 (affine; 7 is not supported by MLX), "
        "or for a GGUF target f32, f16, bf16 or q8_0, not "
        + repr(v).replace("{", "(").replace("}", ")"))


def _path_text(v: Any) -> str:
    """A path as the OS gave it: pydantic's own ``str`` check refuses the surrogate escapes
    Python uses for file names that are not UTF-8, which are valid paths on Linux."""
    if not isinstance(v, str):
        raise PydanticCustomError("string_type", "Input should be a valid string")
    if not v:
        raise PydanticCustomError("string_too_short", "String should have at least 1 character")
    return v


PathText = Annotated[str, PlainValidator(_path_text), WithJsonSchema({"type": "string", "minLength": 1})]


class HeadOptions(BaseModel):
    """What decides the head add-mtp writes (shared by the CLI, the API and recipes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    revision: Optional[str] = Field(None, min_length=1, description="Source revision (branch, tag or commit sha) for a repo id; pin a sha for reproducible CI.")
    runtime: Optional[Runtime] = Field(None, description="Write the head exactly as this runtime loads and drafts it (layout, experts, per-module precision, markers); default: a sidecar no runtime's pinned mlx-lm sees, loaded by MTPLX, exo and released mlx-lm.")
    layout: Optional[Layout] = Field(None, description="Where the head goes (overrides --runtime's choice; default: sidecar); a GGUF trunk: gguf-mtp (default) or gguf-tail.")
    precision: Optional[Precision] = Field(None, description="match (the target's bits), bf16, float16, or bits (2, 3, 4, 5, 6, 8); default: what the runtime loads (match; bf16 for MoE heads without --runtime); a GGUF head: f32, f16 (default), bf16 or q8_0.")
    keep_fc_full_precision: bool = Field(False, description="Keep the head's fc (its input projection) unquantized.")
    experts: Experts = Field("auto", description="MoE expert format; auto picks what the layout's runtime loads.")
    fetch: Fetch = Field("auto", description="ranges: only the head's bytes, kept in a cache on disk; stream: only the head's bytes, held in memory until converted (nothing cached; auto takes it where the disk has no room for the cache); shards: whole shards that hold it.")
    force: bool = Field(False, description="Replace an MTP head already present.")

    @field_validator("precision", mode="before")
    @classmethod
    def _precision(cls, v: Any) -> Any:
        return None if v is None else normalise_precision(v)

    @classmethod
    def parse(cls: type[_Options], **kw: Any) -> _Options:
        """Validate, turning the first problem into one line naming the flag (for add-mtp and
        for ``convert``, which takes the head's fields as its own flags)."""
        try:
            return cls(**kw)
        except ValidationError as e:
            err = e.errors()[0]
            name = str(err["loc"][0]) if err["loc"] else "options"
            flag = "--" + name.replace("_", "-")
            return_choices = choices(name) if name in AddOptions.model_fields else ()
            if err["type"] == "literal_error" and return_choices:
                raise unknown_choice(flag, err["input"], return_choices) from None
            fix = f"use one of: {', '.join(return_choices)}" if return_choices else f"see `mtpforge add-mtp --help` for {flag}"
            raise InputError(f"{flag}: {err['msg']}", fix) from None


_Options = TypeVar("_Options", bound=HeadOptions)


class AddOptions(HeadOptions):
    """One add-mtp run (``mtpforge add-mtp`` and :func:`mtpforge.pipeline.add_mtp`)."""

    source: PathText = Field(..., description="Original HF folder or repo id (e.g. Qwen/Qwen3.5-27B).")
    target: PathText = Field(..., description="MLX model folder (or llama.cpp .gguf trunk) to add the head to.")
    output: Optional[PathText] = Field(None, description="Write a new folder instead of changing TARGET.")
    dry_run: bool = Field(False, description="Print the plan; change nothing, download no tensor data.")


def choices(field: str) -> tuple[str, ...]:
    """The values a field accepts, for ``--help`` and error messages (empty: free-form)."""
    ann = AddOptions.model_fields[field].annotation
    out: list[str] = []

    def walk(t: Any) -> None:
        args = get_args(t)
        if getattr(t, "__origin__", None) is Literal:
            out.extend(str(a) for a in args)
        else:
            for a in args:
                walk(a)

    walk(ann)
    return tuple(out)
