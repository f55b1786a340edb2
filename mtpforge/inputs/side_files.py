"""``generation_config.json`` and ``tokenizer_config.json``: what inspect's stop-token and chat
template checks read, and what mlx-lm's tokenizer loader reads when verify decodes.

Neither file is needed to read the checkpoint, so a value that does not validate is a problem
of the folder (an ``INVALID_VALUE`` warning in inspect) and reads as unset; verify, which hands
the files to mlx-lm, refuses it (exit 2).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError

from ..errors import MtpforgeError
from .model_config import TokenIds
from .problems import Problem, describe, problems_of

GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"

_IDS = "a token id (an integer >= 0) or a list of them"
_TOKEN = "a token's text, or an object with its \"content\""


class GenerationConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, protected_namespaces=())

    eos_token_id: Optional[TokenIds] = Field(None, description=_IDS)
    pad_token_id: Optional[TokenIds] = Field(None, description=_IDS)
    bos_token_id: Optional[TokenIds] = Field(None, description=_IDS)


class _AddedToken(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, protected_namespaces=())

    content: StrictStr


class _NamedTemplate(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, protected_namespaces=())

    name: StrictStr
    template: StrictStr


Token = Union[StrictStr, _AddedToken]


class TokenizerConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, protected_namespaces=())

    eos_token: Optional[Token] = Field(None, description=_TOKEN)
    pad_token: Optional[Token] = Field(None, description=_TOKEN)
    bos_token: Optional[Token] = Field(None, description=_TOKEN)
    unk_token: Optional[Token] = Field(None, description=_TOKEN)
    chat_template: Optional[Union[StrictStr, list[_NamedTemplate]]] = Field(
        None, description="a Jinja template (a string), or a list of {\"name\", \"template\"}")
    tokenizer_class: Optional[StrictStr] = Field(None, description="a class name (a string)")
    model_max_length: Optional[Union[Annotated[StrictInt, Field(ge=1)], Annotated[StrictFloat, Field(ge=1)]]] = Field(
        None, description="a number of tokens (>= 1)")

    @staticmethod
    def text(token: Optional[Token]) -> Optional[str]:
        return token.content if isinstance(token, _AddedToken) else token


@dataclass(frozen=True)
class SideFile:
    """A parsed side file: its value (None when absent), and what did not validate."""

    value: Any
    problems: tuple[Problem, ...] = ()


def parse_side_file(model: type[BaseModel], raw: bytes, file: str) -> SideFile:
    """Validate ``raw`` (the file's bytes); keys that do not validate read as unset."""
    fix = f"repair {file.rsplit('/', 1)[-1]} (or copy it from the original model)"
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return SideFile(model(), (Problem(file, "(the file)", f"not JSON ({e.__class__.__name__})", "a JSON object", fix),))
    if not isinstance(obj, dict):
        return SideFile(model(), (Problem(file, "(top level)", describe(obj), "a JSON object", fix),))
    picked = {k: obj[k] for k in model.model_fields if k in obj}
    problems: list[Problem] = []
    for _ in range(len(picked) + 1):
        try:
            return SideFile(model.model_validate(picked), tuple(problems))
        except ValidationError as e:
            for p in problems_of(e, model, picked, file, (), fix):
                problems.append(p)
                picked.pop(p.key.split(".")[0], None)
    return SideFile(model(), tuple(problems))


def read_side_file(store: Any, rel: str) -> SideFile:
    """``rel`` of a store as its model (``GENERATION_CONFIG`` / ``TOKENIZER_CONFIG``); absent
    or unreadable files read as unset (a missing file is not this value's problem)."""
    model = {GENERATION_CONFIG: GenerationConfig, TOKENIZER_CONFIG: TokenizerConfig}[rel]
    try:
        if not store.exists(rel):
            return SideFile(None)
        raw = store.read_bytes(rel)
    except (OSError, MtpforgeError):
        return SideFile(None)
    return parse_side_file(model, raw, f"{store.name}/{rel}")


__all__ = ["GENERATION_CONFIG", "TOKENIZER_CONFIG", "GenerationConfig", "TokenizerConfig", "SideFile",
           "parse_side_file", "read_side_file"]
