"""Plan the head's conversion before anything is fetched or written.

A plan lists every output tensor with its final dtype, shape and the contiguous byte slices of
source tensors it is made of (one per expert for stacks). Everything that can be refused is
refused here, before a byte is downloaded; the dry run prints exactly this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from .checkpoint.safetensors_header import DTYPE_SIZES, TensorInfo
from .errors import CorruptFileError, InputError, RefusedError, unknown_choice
from .families import FAMILIES
from .families.spec import STACKED, UNCAST_ROLES, FamilySpec
from .families.tables import dims, expected_head, expert_format_of, family_spec, is_moe
from .headplan import (HeadPart, SliceRef, is_scale, scale_of, fetch_list as _fetch_slices, head_parts, parse_precision as _parse_precision,
                       peak_memory_estimate as _peak, refuse_misfit, step_bytes)
from .inputs.model_config import as_config
from .layouts.spec import Placement
from .layouts.table import GGUF_LAYOUT_NAMES, LAYOUT_NAMES, LAYOUTS, loads_in_mlx_lm_glob, placement
from .passes.quantize import QSpec, check_qspec, quantized_shapes
from .runtimes import LAYOUT_WRITES, PORTABLE, RUNTIMES, HeadFacts, OutputFormat, QuantAsk, WriteRule
from .runtimes.predict import BACKBONE_HARM, Placed, predict
from .writer.safetensors_stream import TensorSpec

#: source dtypes that pass through a cast unchanged in meaning
FLOAT_SOURCE_DTYPES = ("BF16", "F16", "F32")
#: a float source dtype -> the output float dtype that keeps it
_KEEP_FLOAT = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


@dataclass
class OutModule:
    """One output module: written as ``<key>`` (float) or a quantized triplet."""

    bare: str  # module path without ".weight" (fused tensors: the tensor name itself)
    has_weight_suffix: bool
    shape: tuple[int, ...]
    q: QSpec | None
    float_dtype: str
    norm: bool
    slices: list[SliceRef]  # one for a plain tensor, E for a stack
    #: what the norm pass adds (the family spec's ``offset_of``: 0 but for zero-centred norms)
    offset: float = 0.0
    #: float32 source tensor -> this module's values, for a part of a tensor the placement
    #: stores split (``Placement.parts``); the slice is then converted whole
    transform: Callable[[Any], Any] | None = None

    def specs(self, placement: Placement) -> list[TensorSpec]:
        base = placement.key(self.bare)
        if self.q is None:
            st = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[self.float_dtype]
            name = base + (".weight" if self.has_weight_suffix else "")
            return [TensorSpec(name, st, self.shape)]
        return [
            TensorSpec(base + sfx, dt, shp)
            for sfx, (shp, dt) in quantized_shapes(self.shape, self.q, self.float_dtype).items()
        ]


@dataclass
class Plan:
    family: str
    layout: str
    expert_format: str  # output format: none | per-expert | fused | switch_mlp
    n_layers: int
    float_dtype: str
    default_q: QSpec | None
    modules: list[OutModule]
    placement: Placement
    notes: list[str] = field(default_factory=list)

    @property
    def file(self) -> str:
        return self.placement.file

    def specs(self) -> list[TensorSpec]:
        return [s for m in self.modules for s in m.specs(self.placement)]

    @property
    def mtp_tensors(self) -> int:
        return len(self.specs())

    @property
    def mtp_bytes(self) -> int:
        return sum(s.nbytes for s in self.specs())

    def quant_entries(self) -> dict[str, dict[str, Any]]:
        """Per-path config entries for every module whose precision differs from the default."""
        out: dict[str, dict[str, Any]] = {}
        for m in self.modules:
            if m.q is not None and m.q != self.default_q:
                out[self.placement.module_path(m.bare)] = m.q.as_config()
        return out

    def peak_memory_estimate(self, entries: Mapping[str, TensorInfo]) -> int:
        """As ``convert`` steps through the modules: a transformed one whole, the rest in row blocks."""
        return _peak(step_bytes(s, entries[s.src], None if m.transform is not None else 1)
                     for m in self.modules for s in m.slices)


def resolve_layout(layout: str, family: str) -> str:
    fam = FAMILIES[family]
    if layout not in LAYOUT_NAMES:
        if layout in GGUF_LAYOUT_NAMES:
            raise InputError(f"--layout {layout} is for a llama.cpp .gguf target, and this target is an MLX folder",
                             f"for an MLX folder use one of: {', '.join(LAYOUT_NAMES)}")
        raise unknown_choice("--layout", layout, LAYOUT_NAMES)
    if fam.gguf_only:
        raise InputError(*fam.gguf_only_refusal("not into an MLX folder", "pass the trunk's .gguf as --target"))
    if layout not in fam.layouts:
        raise InputError(f"the {layout} layout does not apply to {family}", f"use --layout {' or '.join(fam.layouts)}")
    return layout


@dataclass(frozen=True)
class WriteChoice:
    """What add-mtp writes, resolved from ``--runtime`` / ``--layout`` / ``--precision``: the
    rule, its layout, the precision, and the runtime the result is checked against."""

    rule: WriteRule
    layout: str
    precision: str | int
    #: the runtime row whose loader must take the result (None: plain add-mtp, for every runtime)
    reader: Optional[str]


def resolve_write(runtime: str | None, layout: str | None, precision: str | int | None, family: str) -> WriteChoice:
    """``--runtime R`` writes R's rule; ``--layout X`` alone, the layout's own rule; neither,
    the portable default (docs/SPEC.md §5.1: a sidecar no pinned mlx-lm sees). An explicit
    ``--layout`` / ``--precision`` wins over the rule's choice."""
    if runtime is not None:
        row = RUNTIMES[runtime]
        if row.write is None:
            raise InputError(f"{runtime} loads a GGUF file, not an MLX folder",
                             "pass the llama.cpp .gguf trunk as --target (add-mtp writes the GGUF head for it)")
        rule, reader = row.write, runtime
        if layout is None and family in row.no_mtp and rule.layout_for(family) not in FAMILIES[family].layouts:
            raise InputError(f"{runtime} has no MTP path for {family}: {row.no_mtp[family]}",
                             "pick a runtime that drafts this family (README: the runtime matrix)")
    elif layout is not None:
        rule, reader = LAYOUT_WRITES[resolve_layout(layout, family)], LAYOUTS[layout].runtime
    else:
        rule, reader = PORTABLE, None
    chosen = resolve_layout(layout or rule.layout_for(family), family)
    prec = parse_precision(precision) if precision is not None else rule.precision_for(family)
    return WriteChoice(rule, chosen, prec, reader)


def resolve_experts(experts: str, rule: WriteRule, family: str, source_fmt: str) -> str:
    """Output expert format: ``auto`` keeps the source's format where the rule's runtime loads
    it, else stacks to switch_mlp (docs/SPEC.md §5)."""
    if experts not in ("auto", "source", "switch_mlp"):
        raise InputError(f"--experts must be auto, source or switch_mlp, not {experts!r}", "use --experts auto")
    if source_fmt == "none":
        return "none"
    if experts == "source":
        return source_fmt
    if experts == STACKED:
        return STACKED
    return source_fmt if source_fmt in rule.keeps(family) else STACKED


def parse_precision(precision: str | int) -> str | int:
    """An MLX head's ``--precision`` (``headplan.parse_precision``, the one parser of both formats)."""
    return _parse_precision(precision)


def _target_float_dtype(target_config: Mapping[str, Any]) -> str:
    return "float16" if as_config(target_config).float_dtype_name == "float16" else "bfloat16"


def validate_source_head(
    src_config: Mapping[str, Any], entries: Mapping[str, TensorInfo], n_layers: int
) -> str:
    """The source head must be exactly what its config implies; returns its expert format."""
    fmt = expert_format_of(entries, src_config) if is_moe(src_config) else "none"
    if fmt == STACKED:
        raise RefusedError(f"the source's MTP experts are already stacked ({STACKED}): it is not an original Hugging Face checkpoint",
                           "pass the original Hugging Face repo (e.g. Qwen/Qwen3.5-35B-A3B) as --source")
    weights = {k: v for k, v in entries.items() if not is_scale(k, entries)}
    spec = family_spec(src_config)
    if n_layers > 1 and spec.one_step:
        raise RefusedError(f"the source's config declares {n_layers} MTP layers; a {spec.name} head is one MTP step "
                           "(its layers are not repeated per step)", "pass the release as published, with one MTP step, as --source")
    expected = expected_head(src_config, n_layers, fmt if fmt != "none" else None, present=weights)
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        what = f"missing {missing[:2]}" if missing else f"unexpected {extra[:2]}"
        raise RefusedError(f"the source's MTP head does not match its config ({what})",
                           "check that --source is the original Hugging Face checkpoint of this model")
    for k, shp in expected.items():
        if tuple(weights[k].shape) != shp:
            raise RefusedError(f"source tensor {spec.head_prefix(src_config)}{k} has shape {list(weights[k].shape)}, its config implies {list(shp)}",
                               "check that --source is the original Hugging Face checkpoint of this model")
        if weights[k].dtype in FP4_DTYPES and spec.gguf_type_of is not None and k.endswith(".weight"):
            _check_fp4(weights[k], entries.get(k.removesuffix(".weight") + ".scale"))
            continue
        if weights[k].dtype not in FLOAT_SOURCE_DTYPES and weights[k].dtype != "F8_E4M3":
            raise RefusedError(
                f"source tensor {spec.head_prefix(src_config)}{k} is {weights[k].dtype}; mtpforge converts bf16/fp16/fp32 and block-FP8 sources",
                "use the bf16 release of the model as --source (NVFP4/AWQ/GPTQ sources are not supported)",
            )
        if weights[k].dtype == "F8_E4M3":
            sk = scale_of(k, entries)
            _check_fp8(weights[k], entries.get(sk) if sk else None, spec.role_of(k) in spec.rank_sharded)
    return fmt


#: source dtypes a block-FP8 scale may have: ``weight_scale_inv`` a float, ``.scale`` (DeepSeek-V4)
#: an E8M0 power-of-two exponent
FP8_SCALE_DTYPES = ("F32", "BF16", "F16")
E8M0_SCALE_DTYPES = ("F8_E8M0",)
#: the dtypes an FP4 weight is stored in, two E2M1 values a byte (DeepSeek-V4's routed experts)
FP4_DTYPES = ("I8", "U8")


def _check_fp4(w: TensorInfo, s: TensorInfo | None) -> None:
    """An FP4 weight [rows, values/2] has one E8M0 exponent per 32 values of each row: what
    ``passes/fp8.repack_mxfp4`` moves into ggml's MXFP4 blocks."""
    from .passes.fp8 import MXFP4_GROUP

    fix = f"re-download {w.file} (its header is damaged), or pass the original checkpoint as --source"
    if s is None:
        raise RefusedError(f"source tensor {w.name} is FP4 without its exponents (.scale)", "pass the original checkpoint as --source")
    want = [w.shape[0], 2 * w.shape[-1] // MXFP4_GROUP] if len(w.shape) == 2 else None
    if want is None or 2 * w.shape[-1] % MXFP4_GROUP or s.dtype not in ("F8_E8M0", "U8") or list(s.shape) != want:
        raise CorruptFileError(f"{s.file}: tensor {s.name} is {s.dtype} {list(s.shape)}, expected F8_E8M0 {want} "
                               f"(one exponent per {MXFP4_GROUP} values of {w.name} {list(w.shape)})", fix)


def _check_fp8(w: TensorInfo, s: TensorInfo | None, sharded: bool = False) -> None:
    """A block-FP8 weight is a 2-D matrix with one float scale per 128x128 block: the values
    ``passes/fp8.py`` dequantizes with, checked where the source's headers are read. A
    rank-sharded one (``FamilySpec.rank_sharded``) has each rank's 128-row blocks."""
    from .passes.fp8 import BLOCK, rank_count

    fix = f"re-download {w.file} (its header is damaged), or use the bf16 release of the model as --source"
    if len(w.shape) != 2:
        raise CorruptFileError(f"{w.file}: tensor {w.name} is FP8 with shape {list(w.shape)}, expected a 2-D matrix "
                               "(block-FP8 releases keep norms and 1-D tensors in bf16)", fix)
    if s is None:
        raise RefusedError(f"source tensor {w.name} is FP8 without a block scale (weight_scale_inv)",
                           "use the bf16 release of the model as --source")
    want = [-(-w.shape[0] // BLOCK), -(-w.shape[1] // BLOCK)]
    ranks = rank_count(w.shape[0], s.shape[0]) if sharded and s.shape else None
    if ranks is not None:
        want[0] = s.shape[0]
    dtypes = E8M0_SCALE_DTYPES if s.name.endswith(".scale") else FP8_SCALE_DTYPES
    if s.dtype not in dtypes or list(s.shape) != want:
        raise CorruptFileError(f"{s.file}: tensor {s.name} is {s.dtype} {list(s.shape)}, expected {'/'.join(dtypes)} "
                               f"{want} (one scale per {BLOCK}x{BLOCK} block of {w.name} {list(w.shape)})", fix)


def check_compatible(src_config: Mapping[str, Any], tgt_config: Mapping[str, Any], src_family: str, tgt_family: str) -> None:
    """Refuse a source from another family or size before anything is downloaded."""
    if src_family != tgt_family:
        raise RefusedError(f"source is {src_family} but target is {tgt_family}",
                           "pass the original checkpoint of the same model as --source")
    refuse_misfit(_fit_dims(src_config), _fit_dims(tgt_config))


def _fit_dims(config: Mapping[str, Any]) -> dict[str, int]:
    return {**dims(config), "layers": as_config(config).text.num_hidden_layers}


def _spec_ok(q: QSpec) -> bool:
    try:
        check_qspec(q)
    except ValueError:
        return False
    return True


def build_plan(
    *, family: str, src_config: Mapping[str, Any], tgt_config: Mapping[str, Any], entries: Mapping[str, TensorInfo],
    n_layers: int, choice: WriteChoice, keep_fc: bool, experts: str, default_q: QSpec | None,
) -> Plan:
    src_fmt = validate_source_head(src_config, entries, n_layers)
    out_fmt = resolve_experts(experts, choice.rule, family, src_fmt)
    layout, precision = choice.layout, choice.precision
    notes: list[str] = []
    prec = parse_precision(precision)
    if prec == "match":
        base, float_dtype = default_q, _target_float_dtype(tgt_config)
    elif prec in ("bf16", "float16"):
        base, float_dtype = None, ("bfloat16" if prec == "bf16" else "float16")
    else:
        assert isinstance(prec, int)
        base = QSpec(prec, default_q.group_size if default_q else 64, default_q.mode if default_q else "affine")
        float_dtype = _target_float_dtype(tgt_config)
    if base is not None:
        try:
            check_qspec(base)
        except ValueError as e:
            if prec == "match" or (default_q is not None and not _spec_ok(default_q)):
                # the target's own quantization entry is what is wrong, not a flag the user passed
                raise InputError(f"the target's config.json declares a quantization mtpforge cannot match: {e}",
                                 "repair the quantization entry of config.json, or pass --precision bf16") from None
            raise InputError(f"--precision {precision}: {e}", "pick bits 2, 3, 4, 5, 6 or 8") from None
    rule = choice.rule.quant_for(family)
    if rule.source_experts_note and out_fmt in ("per-expert", "fused") and base is not None:
        notes.append(rule.source_experts_note)
    if rule.float_request_note and prec in ("bf16", "float16") and default_q is not None:
        notes.append(rule.float_request_note)
    ask = QuantAsk(family, base, default_q, out_fmt, keep_fc, notes)

    pl = placement(layout, family, src_config)
    modules = _plan_modules(family_spec(src_config), entries, dims(src_config), src_fmt, out_fmt,
                            lambda mod, shape: rule.predicate(mod, shape, ask), float_dtype, pl)
    return Plan(family, layout, out_fmt, n_layers, float_dtype, default_q, modules, pl, notes)


def _plan_modules(spec: FamilySpec, entries: Mapping[str, TensorInfo], dm: Mapping[str, int], src_fmt: str,
                  out_fmt: str, predicate: Any, float_dtype: str, pl: Placement) -> list[OutModule]:
    """The MLX emitter: every part of the head (``headplan.head_parts``) as an output module —
    a stack by its MLX module path, a tensor the placement stores split as its parts, any other
    part by its source key. Tensors no MLX runtime reads (``FamilySpec.unread_in_mlx``), or the
    placement's runtime takes from the target, are neither fetched nor written; those mlx-lm's
    convert does not cast (``UNCAST_ROLES``) keep the source's float dtype."""
    modules: list[OutModule] = []
    skip = spec.unread_in_mlx | pl.skip_roles
    for p in head_parts(spec, entries, dm["E"], src_fmt, stack=out_fmt == STACKED, skip_roles=skip):
        if (split := _split_modules(p, dm, predicate, float_dtype, pl)):
            modules += split
            continue
        if p.stacked:
            assert p.role is not None
            mod = spec.module(p.role, p.step)
            modules.append(OutModule(mod, True, p.shape, predicate(mod, p.shape), float_dtype, False, list(p.slices)))
            continue
        has_w = p.source.endswith(".weight")
        mod = p.source[: -len(".weight")] if has_w else p.source
        src_dtype = entries[p.source].dtype
        dtype = _KEEP_FLOAT.get(src_dtype, float_dtype) if p.role in UNCAST_ROLES else float_dtype
        modules.append(OutModule(mod, has_w, p.shape, predicate(mod, p.shape), dtype, p.norm, list(p.slices), p.offset))
    return modules


def _split_modules(p: HeadPart, dm: Mapping[str, int], predicate: Any, float_dtype: str,
                   pl: Placement) -> list[OutModule]:
    """The parts of a source tensor the placement stores split (passes/mla.py, op for op as the
    runtime's splitter), each read from the whole source tensor; [] for any other tensor."""
    from .passes.mla import SPLITS, split_part

    parts = dict(pl.parts)
    if p.role not in SPLITS or not all(r in parts for r, _ in SPLITS[p.role].parts):
        return []
    out = []
    for j, (role, shape_syms) in enumerate(SPLITS[p.role].parts):
        mod, shape = parts[role].format(i=p.step), tuple(dm[s] for s in shape_syms)
        out.append(OutModule(mod, True, shape, predicate(mod, shape), float_dtype, False, list(p.slices),
                             transform=split_part(p.role, j, dm)))
    return out


def _planned_facts(plan: Plan) -> HeadFacts:
    precisions: dict[str, dict[str, Any]] = {
        m.bare: ({"quantized": True, "bits": m.q.bits, "group_size": m.q.group_size} if m.q else {"dtype": m.float_dtype})
        for m in plan.modules}
    return HeadFacts(plan.family, precisions, plan.default_q)


def load_problems(plan: Plan, reader: str | None, target_config: Mapping[str, Any]) -> list[tuple[str, bool, str]]:
    """What each MLX runtime's loader will make of the planned head: (runtime, meant, message)
    for every problem predicted — ``meant``: the head is written for that runtime (plain add-mtp:
    every runtime that reads its layout), else the problem is another runtime's."""
    meant = {reader} if reader is not None else \
        {r.name for r in RUNTIMES.values()
         if (plan.layout in r.layouts_for(plan.family) or not r.layouts) and plan.family not in r.no_mtp}
    pl = plan.placement
    placed = Placed(plan.layout, plan.expert_format, loads_in_mlx_lm_glob(pl.file) and not pl.separate_folder,
                    frozenset(target_config))
    facts = _planned_facts(plan)
    return [(row.name, row.name in meant, p.message) for row in RUNTIMES.values()
            if row.output_format == OutputFormat.MLX_FOLDER for p in predict(row, facts, placed)
            if row.name in meant or p.code in BACKBONE_HARM]


def load_notes(plan: Plan, reader: str | None, target_config: Mapping[str, Any], *, explicit: bool) -> list[str]:
    """Why the runtime the head is meant for will not load or draft it, and which other runtime's
    backbone the folder would break (empty: none)."""
    notes = []
    for name, meant, message in load_problems(plan, reader, target_config):
        if meant:
            how = (f"pass --runtime {name} to write what it loads" if explicit
                   else "--layout / --precision / --experts override what it loads")
            notes.append(f"will not work in {name}: {message} ({how})")
        else:
            notes.append(f"breaks {name}: {message} (plain add-mtp writes a folder no runtime's loader minds)")
    return notes


def fetch_list(plan: Plan, entries: Mapping[str, TensorInfo]) -> list[TensorInfo]:
    """Every source tensor the plan reads (FP8 scales included)."""
    return _fetch_slices((s for m in plan.modules for s in m.slices), entries)


def source_bytes(infos: list[TensorInfo]) -> int:
    return sum(i.nbytes for i in infos)


__all__ = ["Plan", "OutModule", "SliceRef", "build_plan", "fetch_list", "load_notes", "load_problems", "resolve_layout",
           "resolve_write", "check_compatible", "DTYPE_SIZES"]
