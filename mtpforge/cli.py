"""The command line: a thin shell over the Python API (docs/CONTRACT.md).

Each command maps its flags one-to-one onto the keyword arguments of one function, renders the
result, and turns an ``MtpforgeError`` into one line and an exit code. Tracebacks only with
``--debug``.
"""

from __future__ import annotations

import inspect
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional

import typer
from pydantic import BaseModel
from rich.console import Console

from .errors import InputError, MtpforgeError
from .interrupts import caused_by_interrupt, settle
from .output_schema import OUTPUT_NAMES
from .runtimes import RUNTIME_NAMES

# Plain click help (rich_markup_mode=None): rich's panels cut flag names and split choice lists
# mid-word at 80 columns; click keeps a flag and its choices whole and wraps only the prose.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Put the multi-token-prediction head back into MLX checkpoints, correctly, and prove it.",
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"mtpforge {version('mtpforge')}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print mtpforge's version and exit."),
) -> None:
    """Put the multi-token-prediction head back into MLX checkpoints, correctly, and prove it."""


app.callback()(_root)

JsonOpt = typer.Option(False, "--json", help="Print one JSON object on stdout; human output goes to stderr.")
DebugOpt = typer.Option(False, "--debug", help="Show tracebacks.")


class OutputFormat(str, Enum):
    text = "text"
    json = "json"
    github = "github"


FormatOpt = typer.Option(
    OutputFormat.text, "--format", case_sensitive=False, metavar="text|json|github",
    help="text | json (= --json) | github (workflow-command annotations on stdout, the report on stderr).")


def _machine(as_json: bool, fmt: OutputFormat) -> bool:
    """Progress is for people at a terminal: off for --json and --format json|github."""
    return as_json or fmt is not OutputFormat.text


def _console(as_json: bool) -> Console:
    return Console(stderr=True) if as_json else Console()


def run_command(
    fn: Callable[[], Any],
    *,
    as_json: bool,
    debug: bool,
    render: Callable[[dict[str, Any], Console], None] | None = None,
    fmt: OutputFormat = OutputFormat.text,
    command: str = "",
) -> None:
    """Run one API call and exit with the contract's code.

    ``--format github`` prints workflow-command annotations on stdout and the human report on
    stderr; with ``GITHUB_STEP_SUMMARY`` set, a Markdown summary is appended there whatever the
    format."""
    from .github import annotations, summary_markdown, write_step_summary
    from .output_schema import SCHEMA_VERSION

    as_json = as_json or fmt is OutputFormat.json
    github = fmt is OutputFormat.github and not as_json
    console = _console(as_json or github)
    try:
        result = fn()
    except MtpforgeError as e:
        if e.exit_code == 130:  # a command that said itself what a Ctrl-C left
            _INTERRUPTED.append(True)
        elif debug:
            raise
        _print_error(e, as_json, github, command)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        _print_error(_interrupted(command), as_json, github, command)
        raise typer.Exit(130) from None
    except Exception as e:  # a bug: still one line, the traceback is one flag away
        try:  # the handler of a Ctrl-C on its way runs at the first call here (MLX's compiler died of it first)
            interrupted = caused_by_interrupt(e) or settle()
        except KeyboardInterrupt:
            interrupted = True
        if interrupted:  # Python wrapped the Ctrl-C, or it was on its way
            _print_error(_interrupted(command), as_json, github, command)
            raise typer.Exit(130) from None
        if debug:
            raise
        err = MtpforgeError(
            f"internal error: {e.__class__.__name__}: {e}",
            "re-run with --debug and report the traceback (include `mtpforge env`)",
            code="INTERNAL",
        )
        _print_error(err, as_json, github, command)
        raise typer.Exit(2) from None
    _DONE.append(True)
    _ignore_sigint()  # the work is done (and committed): a late Ctrl-C must not turn it into a traceback
    if hasattr(result, "as_dict"):  # a typed result: its .ok decides the exit code
        code, result = (0 if result.ok else 1), result.as_dict()
    else:
        code = int(result.pop("exit_code", 0) or 0)
    write_step_summary(summary_markdown(command, result, exit_code=code))
    if as_json:
        sys.stdout.write(json.dumps({"schema_version": SCHEMA_VERSION, **result}, indent=2, default=str) + "\n")
    else:
        if render is not None:
            render(result, console)
        if github:
            for line in annotations(command, result):
                sys.stdout.write(line + "\n")
    raise typer.Exit(code)


#: set once a Ctrl-C was reported: the process then ends with 130 whatever Python thinks of it
_INTERRUPTED: list[bool] = []
#: set once a command's work returned (a Ctrl-C after it is not "before anything was written")
_DONE: list[bool] = []


def _interrupted(command: str = "") -> MtpforgeError:
    """What Ctrl-C left: the truth depends on whether the swap had happened. The demo and
    convert say it themselves once they began (their own folders); before that, nothing."""
    from .writer.atomic import COMMITTED

    _INTERRUPTED.append(True)
    if command in ("demo", "convert"):
        return MtpforgeError("interrupted before anything was written", "re-run the command; every folder was left as it was",
                             code="INTERRUPTED")
    if COMMITTED:
        return MtpforgeError(f"interrupted after the change was committed: {COMMITTED[-1]} holds the new state",
                             "nothing to undo; run `mtpforge inspect` on it to see the result", code="INTERRUPTED")
    return MtpforgeError("interrupted", "re-run the command; the model folder was left as it was", code="INTERRUPTED")


def _ignore_sigint() -> None:
    import signal

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (ValueError, OSError):  # not the main thread
        pass


def _print_error(e: MtpforgeError, as_json: bool, github: bool = False, command: str = "") -> None:
    from .github import error_annotation, summary_markdown, write_step_summary
    from .output_schema import SCHEMA_VERSION

    line = f"error: {e.message}" + (f" — fix: {e.fix}" if e.fix else "")
    Console(stderr=True, highlight=False, soft_wrap=True).print(line, markup=False)
    write_step_summary(summary_markdown(command, None, e.as_dict(), exit_code=e.exit_code))
    if as_json:
        sys.stdout.write(json.dumps({"schema_version": SCHEMA_VERSION, "error": e.as_dict()}) + "\n")
    elif github:
        sys.stdout.write(error_annotation(command, e.as_dict()) + "\n")


@app.command("inspect", short_help="Report what a checkpoint holds and its MTP problems.")
def inspect_cmd(
    target: str = typer.Argument(..., help="MLX model folder, .gguf file, or a Hugging Face repo id (headers only)."),
    source: Optional[str] = typer.Option(None, "--source", help="Original HF folder or repo: compare norms and shapes exactly."),
    runtime: Optional[str] = typer.Option(None, "--runtime", metavar="|".join(RUNTIME_NAMES),
                                          help="Predict this runtime's own loader (its errors and warnings)."),
    strict: bool = typer.Option(False, "--strict", help="Warnings fail too (exit 1)."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Revision of TARGET when it is a repo id."),
    as_json: bool = JsonOpt,
    fmt: OutputFormat = FormatOpt,
    debug: bool = DebugOpt,
) -> None:
    """Report what a checkpoint holds and every MTP problem it has."""
    from .inspect import inspect_checkpoint
    from .render import render_inspect

    run_command(
        lambda: inspect_checkpoint(target, source=source, runtime=runtime, strict=strict, revision=revision),
        as_json=as_json, debug=debug, render=render_inspect, fmt=fmt, command="inspect",
    )


def _option_params(model: type[BaseModel], only: tuple[str, ...] | None = None,
                   choices_of: Callable[[str], tuple[str, ...]] | None = None,
                   help_of: Mapping[str, str] | None = None) -> list[inspect.Parameter]:
    """typer parameters for the fields of an options model (all, or ``only`` these):
    ``--field-name``, its default, its choices in ``--help`` (``choices_of`` and ``help_of``
    narrow them for a command that accepts fewer). Validation stays with the model (one clear
    line, JSON error)."""
    from .options import choices

    params = []
    fields = sorted(model.model_fields.items(), key=lambda nf: not nf[1].is_required())
    for name, f in fields:
        if only is not None and name not in only:
            continue
        flag = "--" + name.replace("_", "-")
        text = (help_of or {}).get(name, f.description)
        if f.annotation is bool:
            opt, ann = typer.Option(False, flag, help=text), bool
        else:
            default = ... if f.is_required() else (None if f.default is None else str(f.default))
            vals = (choices_of or choices)(name)
            opt = typer.Option(default, flag, help=text, metavar="|".join(vals) if vals else None)
            ann = Optional[str] if default is None else str
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann))
    return params


def _add_mtp_cmd(*, as_json: bool = False, fmt: OutputFormat = OutputFormat.text, debug: bool = False, **kw: Any) -> None:
    """Fetch the source's MTP head, transform it for the runtime, and write it atomically."""
    from .options import AddOptions
    from .pipeline import add
    from .render import render_add

    def call() -> Any:
        return add(AddOptions.parse(**{k: v for k, v in kw.items() if v is not None}), progress=not _machine(as_json, fmt))

    run_command(call, as_json=as_json, debug=debug, render=render_add, fmt=fmt, command="add-mtp")


def _with_options(fn: Callable[..., None], params: list[inspect.Parameter]) -> Callable[..., None]:
    params = params + [
        inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, default=JsonOpt, annotation=bool),
        inspect.Parameter("fmt", inspect.Parameter.KEYWORD_ONLY, default=FormatOpt, annotation=OutputFormat),
        inspect.Parameter("debug", inspect.Parameter.KEYWORD_ONLY, default=DebugOpt, annotation=bool),
    ]
    fn.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    fn.__annotations__ = {p.name: p.annotation for p in params}
    return fn


def _convert_cmd(*, hf_path: str, mlx_path: str, quantize: bool, q_group_size: Optional[int], q_bits: Optional[int],
                 q_mode: str, quant_predicate: Optional[str], dtype: Optional[str], trust_remote_code: bool,
                 as_json: bool = False, fmt: OutputFormat = OutputFormat.text, debug: bool = False, **head: Any) -> None:
    """mlx_lm.convert that keeps the MTP head: same flags, then the head from the same source."""
    from .convert_with_head import convert
    from .render import render_convert

    run_command(
        lambda: convert(
            hf_path, mlx_path, quantize=quantize, q_group_size=q_group_size, q_bits=q_bits, q_mode=q_mode,
            dtype=dtype, quant_predicate=quant_predicate, trust_remote_code=trust_remote_code,
            progress=not _machine(as_json, fmt), **head,
        ),
        as_json=as_json, debug=debug, render=render_convert, fmt=fmt, command="convert",
    )


def _convert_params() -> list[inspect.Parameter]:
    """mlx_lm.convert's flags (its names, aliases and choices), then add-mtp's head flags from
    ``HeadOptions`` (the fields convert passes on: same name, same meaning)."""
    from .convert_with_head import DTYPES, HEAD_FIELDS, HEAD_HELP, Q_MODES, QUANT_RECIPES, head_choices
    from .options import HeadOptions

    def p(name: str, opt: Any, ann: Any) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann)

    return [
        p("hf_path", typer.Option(..., "--hf-path", "--model", help="Hugging Face model folder or repo id (as mlx_lm.convert)."), str),
        p("mlx_path", typer.Option("mlx_model", "--mlx-path", help="Folder to write (must not exist, as mlx_lm.convert)."), str),
        p("quantize", typer.Option(False, "-q", "--quantize", help="Generate a quantized model."), bool),
        p("q_group_size", typer.Option(None, "--q-group-size", help="Group size for quantization."), Optional[int]),
        p("q_bits", typer.Option(None, "--q-bits", help="Bits per weight for quantization."), Optional[int]),
        p("q_mode", typer.Option("affine", "--q-mode", metavar="|".join(Q_MODES), help="Quantization mode."), str),
        p("quant_predicate", typer.Option(None, "--quant-predicate", metavar="|".join(QUANT_RECIPES),
                                          help="Mixed-precision recipe (mlx-lm's)."), Optional[str]),
        p("dtype", typer.Option(None, "--dtype", metavar="|".join(DTYPES),
                                help="Type of the unquantized weights (default: the config's torch_dtype)."), Optional[str]),
        p("trust_remote_code", typer.Option(False, "--trust-remote-code", help="Trust remote code when loading the tokenizer."), bool),
    ] + _option_params(HeadOptions, only=HEAD_FIELDS, choices_of=head_choices, help_of=HEAD_HELP)


def _register_option_commands() -> None:
    from .options import AddOptions

    app.command("add-mtp", short_help="Put a source's MTP head into a model, atomically.")(
        _with_options(_add_mtp_cmd, _option_params(AddOptions)))
    app.command("convert", short_help="mlx_lm.convert that keeps the MTP head.")(
        _with_options(_convert_cmd, _convert_params()))


_register_option_commands()


@app.command("remove-mtp", short_help="Undo add-mtp, restoring the folder byte for byte.")
def remove_mtp_cmd(
    target: str = typer.Argument(..., help="MLX model folder that add-mtp changed."),
    as_json: bool = JsonOpt,
    fmt: OutputFormat = FormatOpt,
    debug: bool = DebugOpt,
) -> None:
    """Remove what add-mtp added, restoring the folder's previous state."""
    from .pipeline import remove_mtp
    from .render import render_remove

    run_command(lambda: remove_mtp(target, progress=not _machine(as_json, fmt)), as_json=as_json, debug=debug,
                render=render_remove, fmt=fmt, command="remove-mtp")


@app.command("repair-norms", short_help="Fix a foreign head's RMSNorm convention in place.")
def repair_norms_cmd(
    target: str = typer.Argument(..., help="MLX model folder whose MTP head (not written by mtpforge) has wrong norms."),
    source: Optional[str] = typer.Option(None, "--source", help="Original HF folder or repo: decide exactly instead of by behaviour."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Source revision."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would change; change nothing."),
    as_json: bool = JsonOpt,
    fmt: OutputFormat = FormatOpt,
    debug: bool = DebugOpt,
) -> None:
    """Put the head's RMSNorms into MLX's convention in place; refuses unless the evidence is decisive."""
    from .render import render_repair
    from .repair import repair_norms

    run_command(lambda: repair_norms(target, source=source, revision=revision, dry_run=dry_run,
                                     progress=not _machine(as_json, fmt)),
                as_json=as_json, debug=debug, render=render_repair, fmt=fmt, command="repair-norms")


@app.command("align", short_help="Re-fit the head to its own quantized trunk; keep it only if acceptance rises.")
def align_cmd(
    target: str = typer.Argument(..., help="MLX model folder with an MTP head (MLX only for now)."),
    steps: int = typer.Option(150, "--steps", min=1, help="Fine-tuning steps (AdamW, batch 16)."),
    prompt: Optional[List[str]] = typer.Option(
        None, "--prompt", help="Prompt (repeatable) the trunk continues for its training text and acceptance is measured on; default: verify's."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="Tokens per prompt when measuring acceptance (as verify --generate)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the trunk's sampled text and the batches (0 to 2^32-1)."),
    sequences: int = typer.Option(256, "--sequences", min=1, help="Sequences the trunk writes for its own training text."),
    length: int = typer.Option(96, "--length", min=2, help="New tokens in each of those sequences."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Fine-tune and measure, write nothing."),
    as_json: bool = JsonOpt,
    fmt: OutputFormat = FormatOpt,
    debug: bool = DebugOpt,
) -> None:
    """Fine-tune the MTP head alone on the folder's own (quantized) trunk; write it only if acceptance rises."""
    from .align import align
    from .render import render_align

    run_command(lambda: align(target, steps=steps, prompts=prompt or None, max_tokens=max_tokens, seed=seed,
                              sequences=sequences, length=length, dry_run=dry_run, progress=not _machine(as_json, fmt)),
                as_json=as_json, debug=debug, render=render_align, fmt=fmt, command="align")


@app.command("verify", short_help="Decode with the head: identity, acceptance, speed.")
def verify_cmd(
    target: str = typer.Argument(..., help="MLX model folder with an MTP head, or a llama.cpp .gguf trunk."),
    generate: bool = typer.Option(False, "--generate", help="Decode and measure acceptance."),
    prompt: Optional[List[str]] = typer.Option(None, "--prompt", help="Prompt (repeatable)."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1,
                                   help="Tokens to decode per prompt (a prompt may end sooner, at end of text)."),
    depth: int = typer.Option(1, "--depth", min=1, max=8, help="Draft tokens per step."),
    hidden: str = typer.Option("auto", "--hidden", help="auto | pre | post"),
    temp: float = typer.Option(0.0, "--temp", min=0.0, help="Sampling temperature; 0 is greedy (output must be identical)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed for sampling with --temp above 0 (0 to 2^32-1)."),
    min_acceptance: float = typer.Option(0.0, "--min-acceptance", min=0.0, max=100.0,
                                         help="Fail (exit 1) below this acceptance: a fraction (0.6) or a percentage (60)."),
    record: bool = typer.Option(False, "--record", help="Write the measured variant and acceptance to the manifest."),
    llama_server: Optional[str] = typer.Option(None, "--llama-server", help="GGUF targets: the llama-server binary (default: PATH)."),
    draft: Optional[str] = typer.Option(None, "--draft", help="GGUF targets: the MTP-only GGUF (default: the mtp-*.gguf beside it)."),
    report: Optional[str] = typer.Option(None, "--report", help="Also write the figures as a page: FILE.html (with plots) or FILE.md."),
    as_json: bool = JsonOpt,
    fmt: OutputFormat = FormatOpt,
    debug: bool = DebugOpt,
) -> None:
    """Decode with the head on the target's own backbone: identity, acceptance, speed."""
    from .render import render_verify

    def call() -> dict[str, Any]:
        if hidden not in ("auto", "pre", "post"):
            raise InputError(f"--hidden must be auto, pre or post, not {hidden!r}", "use --hidden auto")
        floor = min_acceptance / 100 if min_acceptance > 1 else min_acceptance  # 60 and 0.6 mean the same
        if seed is not None and not 0 <= seed < 2**32:
            raise InputError(f"--seed must be between 0 and {2**32 - 1}, not {seed}", "e.g. --seed 0")
        if report is not None:
            from .report_page import report_format

            report_format(report)
            if not generate:
                raise InputError("--report needs --generate (the page shows the decoding figures)", "add --generate")
        from .verify import verify

        res = verify(
            target, generate=generate, prompts=prompt or None, max_tokens=max_tokens, depth=depth,
            hidden=hidden, temp=temp, seed=seed, min_acceptance=floor, record=record,
            progress=not _machine(as_json, fmt), llama_server=llama_server, draft=draft,
        )
        res.setdefault("exit_code", 0 if res.get("ok", True) else 1)
        if report is not None:
            from .report_page import write_report

            res["report"] = write_report(report, res)
        return res

    run_command(call, as_json=as_json, debug=debug, render=render_verify, fmt=fmt, command="verify")


@app.command("run", short_help="Run a recipe: add-mtp, then its checks.")
def run_cmd(
    recipe: str = typer.Argument(..., help="Recipe YAML file."),
    validate: bool = typer.Option(False, "--validate", help="Schema and static checks only (offline)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and plan; download no tensor data."),
    as_json: bool = JsonOpt,
    fmt: OutputFormat = FormatOpt,
    debug: bool = DebugOpt,
) -> None:
    """Run a recipe: add-mtp with its options, then its checks."""
    from .recipe import run_recipe
    from .render import render_run

    run_command(lambda: run_recipe(recipe, validate=validate, dry_run=dry_run, progress=not _machine(as_json, fmt)),
                as_json=as_json, debug=debug, render=render_run, fmt=fmt, command="run")


SchemaName = Enum("SchemaName", {n: n for n in ("recipe", *OUTPUT_NAMES)}, type=str)  # type: ignore[misc]


@app.command("schema", short_help="Print a JSON Schema: a recipe's or an output's.")
def schema_cmd(
    output: Optional[SchemaName] = typer.Option(  # type: ignore[valid-type]
        None, "--output", case_sensitive=False, metavar="|".join(("recipe", *OUTPUT_NAMES)),
        help="Whose JSON Schema: recipe (the recipe file, the default) or a command's versioned --json output."),
) -> None:
    """Print a JSON Schema: the recipe format, or a command's versioned --json output."""
    if output is None or output.value == "recipe":
        from .recipe import recipe_schema

        schema = recipe_schema()
    else:
        from .output_schema import output_schema

        schema = output_schema(output.value)
    sys.stdout.write(json.dumps(schema, indent=2) + "\n")


@app.command("annotate", hidden=True)
def annotate_cmd(
    report: str = typer.Argument(..., help="A --json report that mtpforge wrote."),
    command: str = typer.Option(..., "--command", help="The command that wrote it (inspect, run, ...)."),
) -> None:
    """GitHub workflow-command annotations for a saved --json report (the Action uses it, so
    that one run gives both the report and the annotations)."""
    from .github import annotations, error_annotation

    try:
        obj = json.loads(Path(report).read_text("utf-8"))
    except (OSError, ValueError) as e:
        _print_error(InputError(f"cannot read the report {report}: {e}", "pass the file that --json wrote"), False)
        raise typer.Exit(2) from None
    lines = [error_annotation(command, obj["error"])] if isinstance(obj.get("error"), dict) else annotations(command, obj)
    for line in lines:
        sys.stdout.write(line + "\n")


@app.command("demo", short_help="The whole job on a bundled tiny model, offline.")
def demo_cmd(
    directory: Optional[str] = typer.Argument(None, help="Work folder (default: a new temporary folder)."),
    keep: Optional[str] = typer.Option(None, "--keep", metavar="DIR",
                                       help="Also leave the source and the head-less conversion in DIR (new or empty) "
                                            "for the README's tour."),
    as_json: bool = JsonOpt,
    fmt: OutputFormat = FormatOpt,
    debug: bool = DebugOpt,
) -> None:
    """The main job end to end on the bundled tiny trained model, offline."""
    from .demo import run_demo
    from .render import render_demo

    run_command(lambda: run_demo(directory, progress=not _machine(as_json, fmt), keep=keep), as_json=as_json, debug=debug,
                render=render_demo, fmt=fmt, command="demo")


@app.command("env", short_help="Versions of mtpforge and its dependencies.")
def env_cmd(as_json: bool = JsonOpt) -> None:
    """Versions of mtpforge and its dependencies, for bug reports."""
    from .envinfo import env_info
    from .output_schema import SCHEMA_VERSION

    info = env_info()
    if as_json:
        sys.stdout.write(json.dumps({"schema_version": SCHEMA_VERSION, **info}, indent=2) + "\n")
    else:
        for k, v in info.items():
            typer.echo(f"{k}: {v}")


def _plain_metavars(cmd: Any) -> Any:
    """Metavars a person would write: ``TARGET`` for an argument (typer's usage line reads
    ``{target}``) and the option's name for a value (typer's read ``<str>``, ``<int range>``);
    choices are written out where the option is declared; flags without a value keep none. Applied to the whole command tree;
    duck-typed because typer vendors its own click from 0.2x on."""
    for param in getattr(cmd, "params", []):
        kind = getattr(param, "param_type_name", "")
        name = (param.name or "").upper()
        if kind == "argument":
            param.metavar = name
            if hasattr(param, "_usage_display_name"):  # typer's braces around a required argument
                param._usage_display_name = lambda name=name, p=param: name if p.required else f"[{name}]"
            if hasattr(param, "display_type_rich"):  # and its "<str>" after the name
                param.display_type_rich = lambda ctx=None: None
        elif kind == "option" and not getattr(param, "is_flag", False):
            if param.metavar is None or param.metavar.startswith("<"):
                param.metavar = name
    for sub in getattr(cmd, "commands", {}).values():
        _plain_metavars(sub)
    return cmd


def main() -> None:
    from .interrupts import install

    install()
    for stream in (sys.stdout, sys.stderr):  # a non-UTF-8 file name must print, not crash the report
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError):
            pass
    try:
        _plain_metavars(typer.main.get_command(app))(prog_name="mtpforge")
    except KeyboardInterrupt:  # between typer's start and run_command, or after its output
        command = next((a for a in sys.argv[1:] if not a.startswith("-")), "") if not _DONE else ""
        _print_error(_interrupted(command), "--json" in sys.argv)
        _exit_interrupted()
    except SystemExit as e:
        if not _INTERRUPTED and e.code == 130:  # click's own answer to a Ctrl-C that got past run_command
            command = next((a for a in sys.argv[1:] if not a.startswith("-")), "") if not _DONE else ""
            _print_error(_interrupted(command), "--json" in sys.argv)
        if _INTERRUPTED:
            _exit_interrupted()
        raise


def _exit_interrupted() -> None:
    """End with 130 after a Ctrl-C was reported. A KeyboardInterrupt that passed through the
    builtin exec (a lazy import defining a dataclass, a namedtuple) leaves CPython's "unhandled
    interrupt" flag set although it was handled here, and the interpreter would then kill
    itself with SIGINT at exit (status -2, no message to match). The work is undone or
    committed and the line is printed: flush and leave with the contract's code."""
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(130)


if __name__ == "__main__":
    main()
