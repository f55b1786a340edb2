"""Recipes: an ``add-mtp`` run and its checks, kept as a YAML file in a repo and run by CI.

A recipe is validated completely before anything runs (the mergekit habit): a frozen pydantic
model refuses unknown keys and wrong types, cross-field validators refuse combinations that
cannot work, and every problem is reported as one line naming the file and line, because a
recipe is edited by hand and read by CI logs. Running it calls ``pipeline.add_mtp`` — the
same function as ``mtpforge add-mtp`` — then ``inspect`` and ``verify``.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from .errors import InputError, MtpforgeError
from .findings import CODES, WARNING
from .layouts.gguf import GGUF_LAYOUT_NAMES, beside_trunk
from .options import AddOptions, HeadOptions
from .runtimes import RUNTIME_NAMES

SCHEMA_URL = "https://json-schema.org/draft/2020-12/schema"
FIX = "edit the recipe; `mtpforge schema` lists every key and its type"

Runtime = Literal[RUNTIME_NAMES]  # type: ignore[valid-type]


def _nonblank(text: str) -> str:
    if not text.strip():
        raise ValueError("a prompt is empty; remove it or write the text")
    return text


Prompt = Annotated[str, AfterValidator(_nonblank)]


def _conflict(at: str, message: str) -> PydanticCustomError:
    """A cross-field error that points at one key (``at``, relative to the model raising it),
    so the line reported is that key's line, not the block's."""
    return PydanticCustomError("recipe_conflict", message.replace("{", "(").replace("}", ")"), {"at": at})


class _Strict(BaseModel):
    # strict: a YAML `revision: 1.0` is a float, not the tag "1.0" — say so instead of guessing
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class InspectCheck(_Strict):
    """Run ``mtpforge inspect`` on the folder that was written."""

    runtime: Optional[Runtime] = Field(None, description="Add compatibility findings for this runtime (as `inspect --runtime`).")
    strict: bool = Field(False, description="Warnings fail the check too, except the codes in allow_warnings.")
    allow_warnings: list[str] = Field(
        default_factory=list, description="Warning codes that do not fail a strict check (e.g. MLX_LM_LOAD_BREAKS).",
        json_schema_extra={"items": {"type": "string", "enum": sorted(c for c, sev in CODES.items() if sev == WARNING)}})
    compare_source: bool = Field(True, description="Compare the written head with the source's tensors (exact norm convention and shapes; fetches only a few KB).")

    @model_validator(mode="after")
    def _allowed_codes(self) -> InspectCheck:
        warnings = sorted(c for c, sev in CODES.items() if sev == WARNING)
        for i, code in enumerate(self.allow_warnings):
            if code not in CODES:
                raise _conflict(f"allow_warnings.{i}", f"unknown finding code {code!r}; warning codes are: {', '.join(warnings)}")
            if code not in warnings:
                raise _conflict(f"allow_warnings.{i}", f"{code} is an error, and errors cannot be allowed; fix what it reports instead")
        if self.allow_warnings and not self.strict:
            raise _conflict("allow_warnings", "allow_warnings only matters with strict: true (warnings never fail otherwise); set strict: true or remove allow_warnings")
        return self


class VerifyCheck(_Strict):
    """Run ``mtpforge verify`` on the folder that was written."""

    generate: bool = Field(True, description="Decode and measure (as `verify --generate`); false only checks that the head loads and drafts one step.")
    prompts: Optional[list[Prompt]] = Field(None, min_length=1, description="Prompts to decode (default: verify's built-in set).")
    max_tokens: int = Field(64, ge=1, description="Tokens to generate per prompt.")
    depth: int = Field(1, ge=1, le=8, description="Draft tokens per step.")
    hidden: Literal["auto", "pre", "post"] = Field("auto", description="Backbone hidden state that feeds the head; auto measures both and keeps the better.")
    temp: float = Field(0.0, ge=0.0, description="Sampling temperature; 0 is greedy, where the output must equal plain decoding token for token.")
    seed: Optional[int] = Field(None, ge=0, le=2**32 - 1, description="Random seed for sampling (0 to 2^32 - 1, as verify --seed).")
    min_acceptance: float = Field(0.0, ge=0.0, le=1.0, description="Fail when accepted / drafted is below this fraction.")
    record: bool = Field(False, description="Write the measured hidden-state variant and acceptance into the folder's manifest.")

    @model_validator(mode="after")
    def _needs_generate(self) -> VerifyCheck:
        if not self.generate:
            if self.prompts is not None:
                raise _conflict("prompts", "prompts are only decoded with generate: true; set generate: true or remove prompts")
            if self.min_acceptance > 0:
                raise _conflict("min_acceptance", "min_acceptance is measured by decoding; set generate: true or remove min_acceptance")
        return self


class Checks(_Strict):
    inspect: Optional[InspectCheck] = Field(default_factory=InspectCheck, description="Inspect the written folder (null to skip).")
    verify: Optional[VerifyCheck] = Field(None, description="Decode with the head and check identity and acceptance (off unless given).")


class Recipe(HeadOptions, _Strict):
    """One add-mtp run and the checks that prove it, as CI runs it. The head's options are
    add-mtp's own (:class:`~mtpforge.options.HeadOptions`)."""

    version: Literal[1] = Field(1, description="Recipe format version.")
    source: str = Field(..., min_length=1, description="The original checkpoint: a Hugging Face repo id (Qwen/Qwen3.5-27B) or a folder (./path, relative to the recipe).")
    target: str = Field(..., min_length=1, description="The MLX model folder, or llama.cpp .gguf trunk (relative to the recipe), that gets the head.")
    output: Optional[str] = Field(None, min_length=1, description="Write a new folder instead of changing target (for mlx-vlm-drafter: the drafter folder, default <target>-mtp-drafter).")
    checks: Checks = Field(default_factory=Checks, description="Checks run after add-mtp; a failed check exits 1.")

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        # the runtime tables inspect reports from (docs/SPEC.md §5), so a recipe cannot ask for a pairing
        # that inspect would then fail
        from .layouts.table import LAYOUTS
        from .runtimes import RUNTIMES

        inspect, verify = self.checks.inspect, self.checks.verify
        runtime = (inspect.runtime if inspect else None) or self.runtime
        row = RUNTIMES[runtime] if runtime else None
        reads = row.layouts if row else ()
        if reads and self.layout is not None and self.layout not in reads:
            raise _conflict("checks.inspect.runtime", f"{runtime} reads its head from the {' / '.join(reads)} layout, "
                            f"but the recipe writes {self.layout}; set layout: {reads[0]} or pick the runtime that reads {self.layout}")
        loads = row.expert_formats if row else None
        if loads and self.experts != "auto":
            wanted = ("per-expert", "fused") if self.experts == "source" else ("switch_mlp",)
            if not set(wanted) & set(loads):
                raise _conflict("experts", f"{runtime} loads MoE experts only as {' / '.join(loads)}; set experts: auto")
        written = LAYOUTS.get(self.layout) if self.layout else None
        if written and not written.source_experts and self.experts == "source":
            raise _conflict("experts", "the mlx-vlm drafter loads stacked switch_mlp experts; set experts: auto or switch_mlp")
        if written and not written.has_backbone and verify is not None:
            raise _conflict("checks.verify", "the mlx-vlm drafter is a separate folder without a backbone, so verify has nothing to decode; "
                            "remove checks.verify (inspect still checks the drafter) or write the head into the model with another layout")
        return self


# ----------------------------------------------------------------------------- loading

class _Lines:
    """Maps a key path (``("checks", "verify", "depth")``) to its line in the YAML text."""

    def __init__(self, root: yaml.Node | None) -> None:
        self.root = root

    def line(self, loc: tuple[Any, ...], *, key: bool = False) -> int:
        node, line = self.root, 1
        if node is not None:
            line = node.start_mark.line + 1
        for i, part in enumerate(loc):
            if isinstance(node, yaml.MappingNode):
                hit = next(((k, v) for k, v in node.value if str(k.value) == str(part)), None)
                if hit is None:
                    return line
                k, v = hit
                last = i == len(loc) - 1
                line = (k.start_mark.line if key and last else v.start_mark.line) + 1
                # a block mapping or list starts on the line after its key: point at the key
                if isinstance(v, (yaml.MappingNode, yaml.SequenceNode)) and not v.flow_style:
                    line = k.start_mark.line + 1
                node = v
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                return line
        return line


def _located(name: str, lines: _Lines | None, loc: tuple[Any, ...], msg: str, fix: str = FIX) -> InputError:
    line = lines.line(loc) if lines is not None else 1
    return InputError(f"{name}:{line}: {'.'.join(map(str, loc))}: {msg}", fix)


@dataclass(frozen=True)
class LoadedRecipe:
    """A validated recipe with its paths resolved against the recipe's folder."""

    path: Path
    name: str  # the path as the user wrote it, for messages
    recipe: Recipe
    source: str  # absolute folder, or a repo id
    source_is_local: bool
    target: Path
    output: Path | None
    family: str | None = None  # known offline only when the source is a local folder
    notes: list[str] = field(default_factory=list)
    lines: _Lines | None = None  # to name the line of a problem found when the recipe runs

    def problem(self, loc: tuple[Any, ...], msg: str, fix: str = FIX) -> InputError:
        return _located(self.name, self.lines, loc, msg, fix)


def _duplicate_key(node: yaml.Node | None) -> tuple[int, str, int] | None:
    """PyYAML keeps the last of two equal keys silently; a recipe edited by hand must not."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            name = str(k.value)
            if name in seen:
                return k.start_mark.line + 1, name, seen[name]
            seen[name] = k.start_mark.line + 1
            hit = _duplicate_key(v)
            if hit:
                return hit
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            hit = _duplicate_key(v)
            if hit:
                return hit
    return None


def _no_aliases(text: str, name: str) -> None:
    """Refuse anchors and aliases before anything is built: a recipe needs none, and nested
    aliases expand exponentially (a "billion laughs" file takes minutes and gigabytes)."""
    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(ev, yaml.AliasEvent) or getattr(ev, "anchor", None):
            line = ev.start_mark.line + 1
            raise InputError(f"{name}:{line}: YAML anchors and aliases (&name / *name) are not allowed in recipes",
                             "write the value out in full where it is used")


#: a recipe is a handful of keys; these bound what the YAML parser is given (PyYAML takes
#: minutes over a few hundred kilobytes of nested brackets)
MAX_RECIPE_BYTES = 1 << 20
MAX_RECIPE_DEPTH = 32


def _check_size(text: str, name: str) -> None:
    """Refuse a recipe too large, or nested deeper than any recipe is, before YAML parses it."""
    if len(text) > MAX_RECIPE_BYTES:
        raise InputError(f"{name}: {len(text):,} characters, more than a recipe ({MAX_RECIPE_BYTES:,} at most)",
                         "pass the recipe YAML file (a few keys: source, target, options, checks)")
    depth, line, quote = 0, 1, ""
    for ch in text:
        if ch == "\n":
            line, quote = line + 1, ""
        elif quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
            if depth > MAX_RECIPE_DEPTH:
                raise InputError(f"{name}:{line}: brackets nested more than {MAX_RECIPE_DEPTH} deep, deeper than any recipe",
                                 "write the recipe's values as plain strings, numbers, lists or mappings (see recipes/)")
        elif ch in "]}":
            depth = max(0, depth - 1)


def _parse_yaml(text: str, name: str) -> tuple[Any, _Lines]:
    _check_size(text, name)
    try:
        _no_aliases(text, name)
        data = yaml.safe_load(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        # an unclosed bracket is reported at the stream end, one past the last line
        line = min(mark.line + 1, max(1, len(text.splitlines()))) if mark is not None else 1
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        if isinstance(e, yaml.constructor.ConstructorError) and "constructor for the tag" in what:
            tag = what.split("tag", 1)[1].strip(" '").replace("tag:yaml.org,2002:", "!!")
            raise InputError(f"{name}:{line}: the tag {tag} is not allowed: recipes are plain YAML (safe_load), never Python objects",
                             "remove the tag and write the value as a plain string, number, list or mapping") from None
        raise InputError(f"{name}:{line}: not valid YAML: {what}", "fix the YAML syntax at that line (indentation, quotes, colons)") from None
    dup = _duplicate_key(root)
    if dup:
        line, key, first = dup
        raise InputError(f"{name}:{line}: duplicate key {key!r} (first at line {first})", "keep one of the two")
    return data, _Lines(root)


def _error_line(err: dict[str, Any], lines: _Lines, name: str) -> tuple[int, str]:
    loc = tuple(err["loc"])
    ctx = err.get("ctx") or {}
    if err["type"] == "recipe_conflict" and ctx.get("at"):
        loc = loc + tuple(int(p) if p.isdigit() else p for p in str(ctx["at"]).split("."))
    where = ".".join(str(p) for p in loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        parent = _model_at(loc[:-1])
        allowed = sorted(parent.model_fields) if parent else []
        guess = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f" (did you mean {guess[0]!r}?)" if guess else ""
        msg = f"unknown key{hint}; allowed here: {', '.join(allowed)}"
        return lines.line(loc, key=True), f"{name}:{lines.line(loc, key=True)}: {where}: {msg}"
    if err["type"] == "missing":
        line = lines.line(loc[:-1], key=True)
        return line, f"{name}:{line}: {where}: required key missing"
    line = lines.line(loc)
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"].endswith("_type") or err["type"] == "literal_error":
        got = err.get("input")
        if isinstance(got, (str, int, float, bool)) or got is None:
            msg += f", got {type(got).__name__} {got!r}" + (" (quote it to make it a string)" if err["type"] == "string_type" else "")
    return line, f"{name}:{line}: {where}: {msg}"


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = Recipe
    for part in loc:
        f = model.model_fields.get(str(part))
        if f is None:
            return None
        ann = f.annotation
        inner = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        elif inner:
            model = inner[0]
        else:
            return None
    return model


def _validate(data: Any, lines: _Lines, name: str) -> Recipe:
    if data is None:
        raise InputError(f"{name}:1: the recipe is empty", "write at least source: and target: (see recipes/ for examples)")
    if not isinstance(data, dict):
        raise InputError(f"{name}:1: a recipe is a mapping of keys (source:, target:, ...), not a {type(data).__name__}",
                         "see recipes/ for examples")
    try:
        return Recipe.model_validate(data)
    except ValidationError as e:
        located = sorted((_error_line(err, lines, name) for err in e.errors()), key=lambda x: x[0])
        first = located[0][1]
        more = f" (and {len(located) - 1} more: line {', '.join(str(ln) for ln, _ in located[1:4])}{', ...' if len(located) > 4 else ''})" \
            if len(located) > 1 else ""
        raise InputError(first + more, FIX) from None


def _looks_like_path(s: str) -> bool:
    return s.startswith(("./", "../", "/", "~", ".\\", "..\\")) or s in (".", "..") or os.path.isabs(s)


def _resolve(value: str, base: Path) -> Path:
    p = Path(value).expanduser()
    return Path(os.path.abspath(p if p.is_absolute() else base / p))


def _is_repo_id(s: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if s.count("/") != 1:
        return False
    try:
        validate_repo_id(s)
    except HFValidationError:
        return False
    return True


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.relative_to(parent)
        return True
    except ValueError:
        return False


def load_recipe(path: str | os.PathLike[str]) -> LoadedRecipe:
    """Parse, validate and resolve a recipe file; every problem is an InputError naming a line."""
    p = Path(path)
    name = str(path)
    if not p.is_file():
        raise InputError(f"recipe {name} does not exist", "pass the path of a recipe YAML file (see recipes/)")
    try:
        text = p.read_text("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{name}: not a UTF-8 text file", "save the recipe as UTF-8 YAML") from None
    data, lines = _parse_yaml(text, name)
    recipe = _validate(data, lines, name)
    base = p.resolve().parent

    def problem(loc: tuple[Any, ...], msg: str, fix: str = FIX) -> InputError:
        return _located(name, lines, loc, msg, fix)

    notes: list[str] = []
    src = recipe.source
    local = _looks_like_path(src) or _resolve(src, base).exists()
    if local:
        source = str(_resolve(src, base))
        if recipe.revision is not None:
            raise problem(("revision",), "a local source folder has no revisions", "remove revision, or use a Hugging Face repo id as source")
    elif _is_repo_id(src):
        source = src
    else:
        raise problem(("source",), f"{src!r} is neither a folder next to the recipe nor a Hugging Face repo id (owner/name)",
                      "write a folder as ./path (relative to the recipe) or a repo id such as Qwen/Qwen3.5-27B")
    target = _resolve(recipe.target, base)
    output = _resolve(recipe.output, base) if recipe.output else None
    if local and Path(source) == target:
        raise problem(("target",), "target is the source folder", "target is the MLX model; source is the original Hugging Face checkpoint")
    if output is not None:
        if output == target:
            raise problem(("output",), "output is the target folder", "remove output to change target in place, or name a new folder")
        if _inside(output, target) or _inside(target, output):
            raise problem(("output",), "output and target are nested", "put output beside target, not inside it")
        if local and output == Path(source):
            raise problem(("output",), "output is the source folder", "name a new folder for output")

    family = None
    if local and (Path(source) / "config.json").is_file():
        family = _local_family(Path(source))
        if family is not None and recipe.layout is not None and recipe.layout not in GGUF_LAYOUT_NAMES:
            from .families import FAMILIES

            if recipe.layout not in FAMILIES[family].layouts:
                raise problem(("layout",), f"the {recipe.layout} layout does not apply to {family} (the source's family)",
                              f"use one of: {', '.join(FAMILIES[family].layouts)}")
    elif local:
        notes.append(f"source folder {source} is not there yet; it is read when the recipe runs")
    if recipe.keep_fc_full_precision and recipe.precision in ("bf16", "float16"):
        notes.append(f"keep_fc_full_precision has no effect with precision {recipe.precision} (nothing is quantized)")
    return LoadedRecipe(p, name, recipe, source, local, target, output, family, notes, lines)


def _local_family(folder: Path) -> str | None:
    from .families.detect import detect_family

    try:
        cfg = json.loads((folder / "config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return detect_family(cfg) if isinstance(cfg, dict) else None


# ----------------------------------------------------------------------------- running

def _inspect_passed(report: dict[str, Any], check: InspectCheck) -> tuple[bool, list[str]]:
    """Errors always fail; warnings fail a strict check unless allowed."""
    failing = []
    for f in report.get("findings", []):
        if f["severity"] == "error" or (check.strict and f["severity"] == "warning" and f["code"] not in check.allow_warnings):
            failing.append(f"{f['code']}: {f['message']}")
    return not failing, failing


def _summary(loaded: LoadedRecipe, mode: str) -> dict[str, Any]:
    r = loaded.recipe
    return {
        "recipe": loaded.name,
        "mode": mode,
        "source": loaded.source,
        "revision": r.revision,
        "target": str(loaded.target),
        "output": str(loaded.output) if loaded.output else None,
        "layout": r.layout or (f"{r.runtime}'s" if r.runtime else "default (sidecar)"),
        "precision": r.precision or (f"{r.runtime}'s" if r.runtime else "default (match; bf16 for MoE heads)"),
        "family": loaded.family,
        "checks": [name for name in ("inspect", "verify") if getattr(r.checks, name) is not None],
        "notes": list(loaded.notes),
    }


def run_recipe(path: str, *, validate: bool = False, dry_run: bool = False, progress: bool = True) -> dict[str, Any]:
    """Validate a recipe, then (unless ``validate``) run add-mtp and its checks.

    ``exit_code`` is 1 when a check fails after add-mtp ran; the report then says what was
    written. Recipe problems and add-mtp refusals raise (exit 2 / 1), nothing changed.
    """
    if validate and dry_run:
        raise InputError("--validate and --dry-run are exclusive", "use --validate to check the recipe offline, --dry-run to also plan")
    loaded = load_recipe(path)
    r = loaded.recipe
    if validate:
        return {**_summary(loaded, "validate"), "valid": True, "exit_code": 0}

    if loaded.source_is_local and not Path(loaded.source).is_dir():
        raise loaded.problem(("source",), f"the folder {loaded.source} does not exist",
                             "fix the path (relative to the recipe's folder) or use a Hugging Face repo id")
    if not loaded.target.is_dir() and not (loaded.target.suffix == ".gguf" and loaded.target.is_file()):
        raise loaded.problem(("target",), f"the folder {loaded.target} does not exist (relative paths resolve against the recipe's folder)",
                             "make or download the MLX model there first (e.g. hf download mlx-community/<model>-4bit --local-dir <target>), "
                             "or copy the recipe beside the model folder")

    from .pipeline import add_mtp
    from .progress import Progress

    prog = Progress(enabled=progress)
    prog.step(f"recipe {path}: add-mtp from {loaded.source} into {loaded.output or loaded.target}")
    # every head option passes through as is: a new HeadOptions field needs no change here
    head = r.model_dump(include=set(HeadOptions.model_fields))
    added = add_mtp(AddOptions(**head, source=loaded.source, target=str(loaded.target),
                               output=str(loaded.output) if loaded.output else None, dry_run=dry_run),
                    progress=progress)
    added.pop("exit_code", None)
    report = {**_summary(loaded, "dry-run" if dry_run else "run"), "layout": added.get("layout")}
    steps: dict[str, Any] = {"add_mtp": added}
    if dry_run:
        report.update(status="planned", files_to_write=added.get("files_to_write", []), fetch_bytes=added.get("fetch_bytes"),
                      steps=steps, ok=True, exit_code=0)
        return report

    folder = added.get("output") or added.get("target") or str(loaded.target)
    if beside_trunk(added.get("layout")):  # checks run on the trunk, which finds its MTP file
        folder = added.get("target") or str(loaded.target)
    report.update(status=added.get("status"), written_to=folder, files_written=added.get("files_written", []))
    failures: list[str] = []

    if r.checks.inspect is not None:
        steps["inspect"], ok = _run_inspect(folder, loaded, r.checks.inspect, prog)
        if not ok:
            failures.append("inspect")
    if r.checks.verify is not None:
        if failures:
            steps["verify"] = {"passed": False, "skipped": "inspect failed; verify would decode a broken head"}
            failures.append("verify")
        else:
            steps["verify"], ok = _run_verify(folder, r.checks.verify, progress, prog)
            if not ok:
                failures.append("verify")

    report["steps"] = steps
    report["check_results"] = {k: ("passed" if v.get("passed") else "FAILED") for k, v in steps.items() if k != "add_mtp"}
    report["ok"] = not failures
    report["exit_code"] = 1 if failures else 0
    if failures:
        prog.step(f"[bold red]failed:[/bold red] {', '.join(failures)} (the head was written: {folder})")
    else:
        prog.done(f"recipe {path}: every check passed")
    return report


def _run_inspect(folder: str, loaded: LoadedRecipe, check: InspectCheck, prog: Any) -> tuple[dict[str, Any], bool]:
    from .inspect import inspect_checkpoint

    runtime = check.runtime or loaded.recipe.runtime  # a head written for a runtime is checked against it
    prog.step(f"inspect {folder}" + (f" --runtime {runtime}" if runtime else ""))
    try:
        rep = inspect_checkpoint(folder, source=loaded.source if check.compare_source else None, runtime=runtime,
                                 strict=False, source_revision=loaded.recipe.revision)
    except MtpforgeError as e:
        return {"passed": False, "error": e.as_dict()}, False
    rep.pop("exit_code", None)
    ok, failing = _inspect_passed(rep, check)
    rep.update(passed=ok, failing=failing)
    if prog.enabled:
        from .render import render_findings

        render_findings(rep.get("findings", []), prog.console)
    return rep, ok


def _run_verify(folder: str, check: VerifyCheck, progress: bool, prog: Any) -> tuple[dict[str, Any], bool]:
    from .verify import verify

    prog.step(f"verify {folder}" + (" --generate" if check.generate else ""))
    try:
        res = verify(folder, generate=check.generate, prompts=check.prompts, max_tokens=check.max_tokens, depth=check.depth,
                     hidden=check.hidden, temp=check.temp, seed=check.seed, min_acceptance=check.min_acceptance,
                     record=check.record, progress=progress)
    except MtpforgeError as e:
        return {"passed": False, "error": e.as_dict()}, False
    res.pop("exit_code", None)
    ok = bool(res.get("ok", True))
    res["passed"] = ok
    if prog.enabled:
        from .render import render_verify

        render_verify(res, prog.console)
    return res, ok


def recipe_schema() -> dict[str, Any]:
    """The recipe format as JSON Schema, for editors and CI linters."""
    schema = Recipe.model_json_schema()
    schema.pop("title", None)
    return {"$schema": SCHEMA_URL, "title": "mtpforge recipe", **schema}


__all__ = ["Recipe", "InspectCheck", "VerifyCheck", "Checks", "LoadedRecipe", "load_recipe", "run_recipe", "recipe_schema"]
