"""The command line: a thin shell over the Python API (CONTRACT.md).

Each command maps its flags one-to-one onto the keyword arguments of one function, renders the
result, and turns an ``MtpforgeError`` into one line and an exit code. Tracebacks only with
``--debug``.
"""

from __future__ import annotations

import inspect
import json
import sys
from typing import Any, Callable, List, Optional

import typer
from pydantic import BaseModel
from rich.console import Console

from .errors import InputError, MtpforgeError
from .runtimes.table import RUNTIME_NAMES

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Put the multi-token-prediction head back into MLX checkpoints, correctly, and prove it.",
    pretty_exceptions_enable=False,
)

JsonOpt = typer.Option(False, "--json", help="Print one JSON object on stdout; human output goes to stderr.")
DebugOpt = typer.Option(False, "--debug", help="Show tracebacks.")


def _console(as_json: bool) -> Console:
    return Console(stderr=True) if as_json else Console()


def run_command(
    fn: Callable[[], Any],
    *,
    as_json: bool,
    debug: bool,
    render: Callable[[dict[str, Any], Console], None] | None = None,
) -> None:
    """Run one API call and exit with the contract's code."""
    console = _console(as_json)
    try:
        result = fn()
    except MtpforgeError as e:
        if debug:
            raise
        _print_error(e, as_json)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        _print_error(_interrupted(), as_json)
        raise typer.Exit(130) from None
    except Exception as e:  # a bug: still one line, the traceback is one flag away
        if debug:
            raise
        err = MtpforgeError(
            f"internal error: {e.__class__.__name__}: {e}",
            "re-run with --debug and report the traceback (include `mtpforge env`)",
            code="INTERNAL",
        )
        _print_error(err, as_json)
        raise typer.Exit(2) from None
    _ignore_sigint()  # the work is done (and committed): a late Ctrl-C must not turn it into a traceback
    if hasattr(result, "as_dict"):  # a typed result: its .ok decides the exit code
        code, result = (0 if result.ok else 1), result.as_dict()
    else:
        code = int(result.pop("exit_code", 0) or 0)
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
    elif render is not None:
        render(result, console)
    raise typer.Exit(code)


def _interrupted() -> MtpforgeError:
    """What Ctrl-C left: the truth depends on whether the swap had happened."""
    from .writer.atomic import COMMITTED

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


def _print_error(e: MtpforgeError, as_json: bool) -> None:
    line = f"error: {e.message}" + (f" — fix: {e.fix}" if e.fix else "")
    Console(stderr=True, highlight=False, soft_wrap=True).print(line, markup=False)
    if as_json:
        sys.stdout.write(json.dumps({"error": e.as_dict()}) + "\n")


@app.command("inspect")
def inspect_cmd(
    target: str = typer.Argument(..., help="MLX model folder, .gguf file, or a Hugging Face repo id (headers only)."),
    source: Optional[str] = typer.Option(None, "--source", help="Original HF folder or repo: compare norms and shapes exactly."),
    runtime: Optional[str] = typer.Option(None, "--runtime", help="Predict this runtime's own loader: " + " | ".join(RUNTIME_NAMES)),
    strict: bool = typer.Option(False, "--strict", help="Warnings fail too (exit 1)."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Revision of TARGET when it is a repo id."),
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Report what a checkpoint holds and every MTP problem it has."""
    from .inspect import inspect_checkpoint
    from .render import render_inspect

    run_command(
        lambda: inspect_checkpoint(target, source=source, runtime=runtime, strict=strict, revision=revision),
        as_json=as_json, debug=debug, render=render_inspect,
    )


def _option_params(model: type[BaseModel]) -> list[inspect.Parameter]:
    """typer parameters for every field of an options model: ``--field-name``, its default,
    its choices in ``--help``. Validation stays with the model (one clear line, JSON error)."""
    from .options import choices

    params = []
    fields = sorted(model.model_fields.items(), key=lambda nf: not nf[1].is_required())
    for name, f in fields:
        flag = "--" + name.replace("_", "-")
        if f.annotation is bool:
            opt, ann = typer.Option(False, flag, help=f.description), bool
        else:
            default = ... if f.is_required() else (None if f.default is None else str(f.default))
            vals = choices(name)
            opt = typer.Option(default, flag, help=f.description, metavar="|".join(vals) if vals else None)
            ann = Optional[str] if default is None else str
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann))
    return params


def _add_mtp_cmd(*, as_json: bool = False, debug: bool = False, **kw: Any) -> None:
    """Fetch the source's MTP head, transform it for the runtime, and write it atomically."""
    from .options import AddOptions
    from .pipeline import add
    from .render import render_add

    def call() -> Any:
        return add(AddOptions.parse(**{k: v for k, v in kw.items() if v is not None}), progress=not as_json)

    run_command(call, as_json=as_json, debug=debug, render=render_add)


def _with_options(fn: Callable[..., None], model: type[BaseModel]) -> Callable[..., None]:
    params = _option_params(model) + [
        inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, default=JsonOpt, annotation=bool),
        inspect.Parameter("debug", inspect.Parameter.KEYWORD_ONLY, default=DebugOpt, annotation=bool),
    ]
    fn.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    fn.__annotations__ = {p.name: p.annotation for p in params}
    return fn


def _register_add_mtp() -> None:
    from .options import AddOptions

    app.command("add-mtp")(_with_options(_add_mtp_cmd, AddOptions))


_register_add_mtp()


@app.command("remove-mtp")
def remove_mtp_cmd(
    target: str = typer.Argument(..., help="MLX model folder that add-mtp changed."),
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Remove what add-mtp added, restoring the folder's previous state."""
    from .pipeline import remove_mtp
    from .render import render_remove

    run_command(lambda: remove_mtp(target), as_json=as_json, debug=debug, render=render_remove)


@app.command("repair-norms")
def repair_norms_cmd(
    target: str = typer.Argument(..., help="MLX model folder whose MTP head (not written by mtpforge) has wrong norms."),
    source: Optional[str] = typer.Option(None, "--source", help="Original HF folder or repo: decide exactly instead of by behaviour."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Source revision."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would change; change nothing."),
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Put the head's RMSNorms into MLX's convention in place; refuses unless the evidence is decisive."""
    from .render import render_repair
    from .repair import repair_norms

    run_command(lambda: repair_norms(target, source=source, revision=revision, dry_run=dry_run, progress=not as_json),
                as_json=as_json, debug=debug, render=render_repair)


@app.command("verify")
def verify_cmd(
    target: str = typer.Argument(..., help="MLX model folder with an MTP head, or a llama.cpp .gguf trunk."),
    generate: bool = typer.Option(False, "--generate", help="Decode and measure acceptance."),
    prompt: Optional[List[str]] = typer.Option(None, "--prompt", help="Prompt (repeatable)."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1),
    depth: int = typer.Option(1, "--depth", min=1, max=8, help="Draft tokens per step."),
    hidden: str = typer.Option("auto", "--hidden", help="auto | pre | post"),
    temp: float = typer.Option(0.0, "--temp", min=0.0),
    seed: Optional[int] = typer.Option(None, "--seed"),
    min_acceptance: float = typer.Option(0.0, "--min-acceptance", min=0.0, max=1.0),
    record: bool = typer.Option(False, "--record", help="Write the measured variant and acceptance to the manifest."),
    llama_server: Optional[str] = typer.Option(None, "--llama-server", help="GGUF targets: the llama-server binary (default: PATH)."),
    draft: Optional[str] = typer.Option(None, "--draft", help="GGUF targets: the MTP-only GGUF (default: the mtp-*.gguf beside it)."),
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Decode with the head on the target's own backbone: identity, acceptance, speed."""
    from .render import render_verify

    def call() -> dict[str, Any]:
        if hidden not in ("auto", "pre", "post"):
            raise InputError(f"--hidden must be auto, pre or post, not {hidden!r}", "use --hidden auto")
        if seed is not None and not 0 <= seed < 2**32:
            raise InputError(f"--seed must be between 0 and {2**32 - 1}, not {seed}", "e.g. --seed 0")
        from .verify import verify

        res = verify(
            target, generate=generate, prompts=prompt or None, max_tokens=max_tokens, depth=depth,
            hidden=hidden, temp=temp, seed=seed, min_acceptance=min_acceptance, record=record,
            progress=not as_json, llama_server=llama_server, draft=draft,
        )
        res.setdefault("exit_code", 0 if res.get("ok", True) else 1)
        return res

    run_command(call, as_json=as_json, debug=debug, render=render_verify)


@app.command("run")
def run_cmd(
    recipe: str = typer.Argument(..., help="Recipe YAML file."),
    validate: bool = typer.Option(False, "--validate", help="Schema and static checks only (offline)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and plan; download no tensor data."),
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Run a recipe: add-mtp with its options, then its checks."""
    from .recipe import run_recipe
    from .render import render_run

    run_command(lambda: run_recipe(recipe, validate=validate, dry_run=dry_run, progress=not as_json),
                as_json=as_json, debug=debug, render=render_run)


@app.command("schema")
def schema_cmd() -> None:
    """Print the recipe JSON Schema."""
    from .recipe import recipe_schema

    sys.stdout.write(json.dumps(recipe_schema(), indent=2) + "\n")


@app.command("demo")
def demo_cmd(
    directory: Optional[str] = typer.Argument(None, help="Work folder (default: a new temporary folder)."),
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """The main job end to end on the bundled tiny trained model, offline."""
    from .demo import run_demo
    from .render import render_demo

    run_command(lambda: run_demo(directory, progress=not as_json), as_json=as_json, debug=debug, render=render_demo)


@app.command("env")
def env_cmd(as_json: bool = JsonOpt) -> None:
    """Versions of mtpforge and its dependencies, for bug reports."""
    from .envinfo import env_info

    info = env_info()
    if as_json:
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
    else:
        for k, v in info.items():
            typer.echo(f"{k}: {v}")


def main() -> None:
    for stream in (sys.stdout, sys.stderr):  # a non-UTF-8 file name must print, not crash the report
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError):
            pass
    try:
        app()
    except KeyboardInterrupt:  # between typer's start and run_command, or after its output
        _print_error(_interrupted(), "--json" in sys.argv)
        sys.exit(130)


if __name__ == "__main__":
    main()
