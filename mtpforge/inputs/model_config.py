"""``config.json`` as mtpforge relies on it: the family's keys, the dimensions the head's shapes
come from, the MTP layer count, the quantization a loader builds, the stop and pad ids.

:func:`parse_config` is called where the file is read (``checkpoint/catalogue.py``). What
decides whether the folder is a model mtpforge can read at all — ``model_type``, the nesting
under ``text_config``, the dimensions and layer counts — is refused at once (exit 2, one line
naming the key). The rest — quantization, stop and pad ids, the float dtype — is kept as
:class:`Problem` s on the value: ``inspect`` reports them as findings, and the commands that rely
on them (add-mtp, verify) refuse them with exit 2 before anything is changed.

A :class:`ModelConfig` is also a read-only mapping over the file's raw object, so the files
mtpforge writes keep every key it does not know about.
"""

from __future__ import annotations

from typing import Annotated, Any, Iterator, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError

from ..passes.quantize import AFFINE_BITS, FIXED_MODES, QSpec, check_qspec
from .problems import Problem, describe, problems_of

#: no released dimension comes near this; a config beyond it is hostile or corrupt, and sizes
#: computed from it would ask for absurd memory
MAX_DIM = 1 << 24
MAX_MTP_LAYERS = 64
#: the top-level keys that hold mlx-lm's quantization (the first one present counts)
QUANT_KEYS = ("quantization", "quantization_config")
#: keys of a quantization object that are its defaults; every other key names a module
QUANT_DEFAULT_KEYS = ("bits", "group_size", "mode")

_DIM = f"an integer in 0..{MAX_DIM}"
_DIM1 = f"an integer in 1..{MAX_DIM}"
_COUNT = f"an integer in 0..{MAX_MTP_LAYERS}"
_IDS = "a token id (an integer >= 0) or a list of them"
QUANT_EXPECTED = (f"a quantization MLX builds: affine with bits {', '.join(map(str, AFFINE_BITS))} and group size 32, 64 "
                  "or 128, or " + ", ".join(f"{m} (bits {b}, group {g})" for m, (b, g) in FIXED_MODES.items()))
QUANT_FIX = ('repair the quantization entry of config.json (mlx-lm writes {"group_size": 64, "bits": 4, "mode": "affine"}), '
             "or re-convert the model with mlx_lm.convert")

Dim = Annotated[StrictInt, Field(ge=0, le=MAX_DIM)]
Dim1 = Annotated[StrictInt, Field(ge=1, le=MAX_DIM)]
Count = Annotated[StrictInt, Field(ge=0, le=MAX_MTP_LAYERS)]
TokenId = Annotated[StrictInt, Field(ge=0)]
TokenIds = Union[TokenId, list[TokenId]]


class _OtherAttention(BaseModel):
    """Step-3.5's ``attention_other_setting``: the sliding-window layers' own head counts."""

    model_config = ConfigDict(extra="ignore", frozen=True, protected_namespaces=())

    num_attention_heads: Optional[Dim1] = Field(None, description=_DIM1)
    num_attention_groups: Optional[Dim] = Field(None, description=_DIM)


class _Core(BaseModel):
    """What decides whether mtpforge can read the model: one level of the config (the top, or
    the nested ``text_config``)."""

    model_config = ConfigDict(extra="ignore", frozen=True, protected_namespaces=())

    model_type: Optional[StrictStr] = Field(None, description="a string")
    hidden_size: Optional[Dim1] = Field(None, description=_DIM1)
    num_attention_heads: Optional[Dim1] = Field(None, description=_DIM1)
    head_dim: Optional[Dim] = Field(None, description=_DIM)
    num_key_value_heads: Optional[Dim] = Field(None, description=_DIM)
    intermediate_size: Optional[Dim] = Field(None, description=_DIM)
    num_experts: Optional[Dim] = Field(None, description=_DIM)
    n_routed_experts: Optional[Dim] = Field(None, description=_DIM)
    n_shared_experts: Optional[Dim] = Field(None, description=_DIM)
    num_shared_experts: Optional[Dim] = Field(None, description=_DIM)
    moe_intermediate_size: Optional[Dim] = Field(None, description=_DIM)
    shared_expert_intermediate_size: Optional[Dim] = Field(None, description=_DIM)
    vocab_size: Optional[Dim] = Field(None, description=_DIM)
    num_hidden_layers: Optional[Dim] = Field(None, description=_DIM)
    mtp_num_hidden_layers: Optional[Count] = Field(None, description=_COUNT)
    num_nextn_predict_layers: Optional[Count] = Field(None, description=_COUNT)
    # multi-head latent attention (GLM-4.7-Flash, DeepSeek): the head's low-rank widths
    q_lora_rank: Optional[Dim] = Field(None, description=_DIM)
    kv_lora_rank: Optional[Dim] = Field(None, description=_DIM)
    qk_nope_head_dim: Optional[Dim] = Field(None, description=_DIM)
    qk_rope_head_dim: Optional[Dim] = Field(None, description=_DIM)
    v_head_dim: Optional[Dim] = Field(None, description=_DIM)
    # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): the indexer's heads and head width
    index_n_heads: Optional[Dim] = Field(None, description=_DIM)
    index_head_dim: Optional[Dim] = Field(None, description=_DIM)
    # Nemotron-H's MoE: the shared expert's own width, and the latent width (Nemotron 3 Super)
    moe_shared_expert_intermediate_size: Optional[Dim] = Field(None, description=_DIM)
    moe_latent_size: Optional[Dim] = Field(None, description=_DIM)
    # MiMo-V2: the sliding-window attention's kv heads (its MTP layers are sliding-window ones)
    swa_num_key_value_heads: Optional[Dim] = Field(None, description=_DIM)
    # DeepSeek-V4: the hyper-connection copies, the grouped output projection, the SwiGLU clamp
    # (a float: llama.cpp's converter writes it for every block, the MTP block's included)
    hc_mult: Optional[Dim] = Field(None, description=_DIM)
    o_groups: Optional[Dim] = Field(None, description=_DIM)
    o_lora_rank: Optional[Dim] = Field(None, description=_DIM)
    swiglu_limit: Optional[Union[StrictInt, StrictFloat]] = Field(None, description="a number")
    # Step-3.5: the sliding-window attention's head counts
    attention_other_setting: Optional[_OtherAttention] = Field(None, description="an object")


class _Soft(BaseModel):
    """What some commands rely on (stop/pad ids, float dtype): a bad value is a problem of the
    folder, reported by inspect and refused by the commands that use it."""

    model_config = ConfigDict(extra="ignore", frozen=True, protected_namespaces=())

    eos_token_id: Optional[TokenIds] = Field(None, description=_IDS)
    pad_token_id: Optional[TokenIds] = Field(None, description=_IDS)
    bos_token_id: Optional[TokenIds] = Field(None, description=_IDS)
    torch_dtype: Optional[StrictStr] = Field(None, description="a dtype name such as \"bfloat16\"")
    dtype: Optional[StrictStr] = Field(None, description="a dtype name such as \"bfloat16\"")


class _QuantEntry(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, protected_namespaces=())

    bits: Optional[StrictInt] = Field(None, description="an integer number of bits (2, 3, 4, 5, 6 or 8)")
    group_size: Optional[StrictInt] = Field(None, description="an integer group size (32, 64 or 128)")
    mode: Optional[StrictStr] = Field(None, description="affine, " + ", ".join(FIXED_MODES))


def _core_error(file: str, e: ValidationError, data: Any, prefix: tuple[str, ...]) -> Exception:
    from ..errors import CorruptFileError

    p = problems_of(e, _Core, data, file, prefix)[0]
    return CorruptFileError(p.message, f"repair {file.rsplit('/', 1)[-1]} (or re-download it)")


def _soft(data: Mapping[str, Any], file: str, prefix: tuple[str, ...], problems: list[Problem]) -> _Soft:
    """The soft values of one level; a key that does not validate is a problem and reads as unset."""
    picked = {k: data[k] for k in _Soft.model_fields if k in data}
    for _ in range(len(picked) + 1):
        try:
            return _Soft.model_validate(picked)
        except ValidationError as e:
            for p in problems_of(e, _Soft, picked, file, prefix):
                problems.append(p)
                picked.pop(p.key.split(".")[len(prefix)], None)
    return _Soft()


def _merged(entry: _QuantEntry, default: QSpec | None) -> QSpec:
    """A per-module entry over the default (4-bit, group 64, affine when the model has none)."""
    return QSpec(entry.bits if entry.bits is not None else (default.bits if default else 4),
                 entry.group_size if entry.group_size is not None else (default.group_size if default else 64),
                 entry.mode if entry.mode is not None else (default.mode if default else "affine"))


def _valid(q: QSpec) -> bool:
    try:
        check_qspec(q)
    except ValueError:
        return False
    return True


def _quantization(config: Mapping[str, Any], file: str,
                  problems: list[Problem]) -> tuple[Optional[QSpec], dict[str, QSpec | bool]]:
    """The default quantization and the per-module entries. A Hugging Face quantization
    (``quant_method``: FP8, GPTQ, AWQ releases) is not mlx-lm's: read as far as it reads as
    one, never a problem of the folder."""
    key = next((k for k in QUANT_KEYS if config.get(k)), None)
    if key is None:
        return None, {}
    q = config[key]
    if not isinstance(q, dict):
        problems.append(Problem(file, key, describe(q), "an object (mlx-lm writes {\"group_size\": G, \"bits\": B, ...})",
                                QUANT_FIX))
        return None, {}
    if "quant_method" in q:
        problems = []
    default: Optional[QSpec] = None
    if "bits" in q:
        try:
            d = _QuantEntry.model_validate({k: q[k] for k in QUANT_DEFAULT_KEYS if k in q})
        except ValidationError as e:
            problems.extend(problems_of(e, _QuantEntry, q, file, (key,), QUANT_FIX))
        else:
            spec = QSpec(d.bits or 0, d.group_size if d.group_size is not None else 64, d.mode or "affine")
            if _valid(spec):
                default = spec
            else:
                problems.append(Problem(file, key, f"bits {spec.bits} / group_size {spec.group_size} / mode {spec.mode}",
                                        QUANT_EXPECTED, QUANT_FIX))
    modules: dict[str, QSpec | bool] = {}
    for path, v in q.items():
        if path in QUANT_DEFAULT_KEYS:
            continue
        if isinstance(v, bool):
            modules[path] = v
        elif isinstance(v, dict):
            try:
                entry = _QuantEntry.model_validate(v)
            except ValidationError as e:
                problems.extend(problems_of(e, _QuantEntry, v, file, (key, path), QUANT_FIX))
                continue
            spec = _merged(entry, default)
            if _valid(spec):
                modules[path] = spec
            else:
                problems.append(Problem(file, f"{key}.{path}", describe(v), QUANT_EXPECTED, QUANT_FIX))
    return default, modules


class ModelConfig(Mapping[str, Any]):
    """A validated ``config.json``: typed values for what mtpforge relies on, and a read-only
    mapping over the raw object for what it passes through."""

    def __init__(self, raw: dict[str, Any], *, file: str = "config.json") -> None:
        self._raw = raw
        self.file = file
        problems: list[Problem] = []
        tc = raw.get("text_config")
        if tc is not None and not isinstance(tc, dict):
            from ..errors import CorruptFileError

            raise CorruptFileError(f"{file}: text_config is {describe(tc)}, expected an object",
                                   f"repair {file.rsplit('/', 1)[-1]} (or re-download it)")
        self.nested = isinstance(tc, dict)
        try:
            self.top = _Core.model_validate(raw)
        except ValidationError as e:
            raise _core_error(file, e, raw, ()) from None
        try:
            self.text = _Core.model_validate(tc) if isinstance(tc, dict) else self.top
        except ValidationError as e:
            raise _core_error(file, e, tc, ("text_config",)) from None
        self.top_soft = _soft(raw, file, (), problems)
        self.text_soft = _soft(tc, file, ("text_config",), problems) if isinstance(tc, dict) else self.top_soft
        self.quant_default, self.quant_modules = _quantization(raw, file, problems)
        self.problems: tuple[Problem, ...] = tuple(problems)

    # --------------------------------------------------------------- the raw object, read-only
    def __getitem__(self, key: str) -> Any:
        return self._raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __repr__(self) -> str:
        return f"ModelConfig({self.file}, model_type={self.model_type!r})"

    # --------------------------------------------------------------- typed values
    @property
    def model_type(self) -> Optional[str]:
        return self.top.model_type

    @property
    def text_model_type(self) -> Optional[str]:
        return self.text.model_type if self.nested else None

    @property
    def text_raw(self) -> dict[str, Any]:
        """The language model's level as written (nested ``text_config``, or the whole file)."""
        tc = self._raw.get("text_config")
        return tc if isinstance(tc, dict) else self._raw

    def token_ids(self, key: str) -> set[int]:
        """``eos_token_id`` / ``pad_token_id`` / ``bos_token_id`` of both levels, as a set."""
        out: set[int] = set()
        for level in (self.top_soft, self.text_soft):
            v = getattr(level, key)
            out |= set(v) if isinstance(v, list) else ({v} if v is not None else set())
        return out

    @property
    def float_dtype_name(self) -> Optional[str]:
        return self.text_soft.torch_dtype or self.text_soft.dtype or self.top_soft.torch_dtype

    def quant_dict(self) -> Optional[dict[str, Any]]:
        """The default quantization as inspect reports it (``{bits, group_size, mode}``)."""
        q = self.quant_default
        return None if q is None else {"bits": q.bits, "group_size": q.group_size, "mode": q.mode}


def parse_config(raw: Any, *, file: str = "config.json") -> ModelConfig:
    """``raw`` (the parsed JSON) as a :class:`ModelConfig`; raises on a value that makes the
    folder unreadable as a model."""
    if isinstance(raw, ModelConfig):
        return raw
    if not isinstance(raw, Mapping):
        from ..errors import CorruptFileError

        raise CorruptFileError(f"{file} is not a JSON object", f"repair or re-download {file.rsplit('/', 1)[-1]}")
    return ModelConfig(raw if isinstance(raw, dict) else dict(raw), file=file)


def as_config(config: Mapping[str, Any]) -> ModelConfig:
    """The typed value of a config: itself when it was read by the catalogue, else parsed (an
    in-memory dict, as tests and the written drafter config pass)."""
    return config if isinstance(config, ModelConfig) else parse_config(config)


__all__ = ["MAX_DIM", "MAX_MTP_LAYERS", "ModelConfig", "QUANT_EXPECTED", "QUANT_FIX", "as_config", "parse_config"]
