"""``mtpforge convert``: ``mlx_lm.convert`` that keeps the MTP head.

mlx-lm's converter drops every ``mtp.*`` tensor (mlx-lm #1543 asked for ``--preserve-mtp`` and
was closed unmerged), so a user switching from ``mlx_lm.convert`` changes one word and gets the
same folder plus the head: the real ``mlx_lm.convert.convert`` runs with the user's flags, then
add-mtp (``pipeline.add``) puts the head back from the same source with ``--precision match``
(the quantization the converter just chose), then ``inspect`` validates. The head's flags are
add-mtp's own (``HeadOptions`` fields), so they mean the same in both commands.

The source is read once. A local folder is read in place. For a Hub repo, ``mlx_lm.convert``
downloads the snapshot into the ordinary HF cache; add-mtp then names the commit of that
snapshot, and its Hub store reads files found in the cache instead of asking the server again,
so no tensor byte travels twice.

Both steps write into a staging folder beside the destination, renamed into place when the
whole folder passed validation: the destination appears complete or not at all.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator, get_args

from .errors import InputError, MtpforgeError, RefusedError
from .interrupts import caused_by_interrupt, settle
from .layouts.table import LAYOUTS
from .options import AddOptions, GgmlPrecision, HeadOptions, choices
from .progress import Progress
from .results import AddResult

#: ``mlx_lm.convert``'s own choices (its argparse ``choices``), repeated here so ``--help`` lists
#: them without importing mlx-lm; a test checks they match the installed mlx-lm.
Q_MODES = ("affine", "mxfp4", "nvfp4", "mxfp8")
QUANT_RECIPES = ("mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6")
DTYPES = ("float16", "bfloat16", "float32")


@contextlib.contextmanager
def _quiet_converter(progress: bool) -> Iterator[None]:
    """mlx-lm prints ``[INFO]`` lines on stdout and huggingface_hub draws tqdm bars: stdout
    belongs to our JSON, so its lines go to stderr, and the bars go away when progress is off."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    if not progress:
        disable_progress_bars()
    sink = sys.stderr if progress else open(os.devnull, "w")
    try:
        with contextlib.redirect_stdout(sink):
            yield
    finally:
        if sink is not sys.stderr:
            sink.close()
        if not progress and not was_disabled:
            enable_progress_bars()


def _check_source(hf_path: str) -> bool:
    """True for a local folder; a repo id is left to mlx-lm's download (one clear line if neither)."""
    p = Path(hf_path).expanduser()
    if p.exists():
        if not p.is_dir():
            raise InputError(f"--hf-path {hf_path} is a file, not a model folder", "pass the Hugging Face model folder")
        if not (p / "config.json").is_file():
            raise InputError(f"--hf-path {hf_path} has no config.json", "pass a Hugging Face model folder (config.json and *.safetensors)")
        return True
    from .localpath import looks_local, no_such_path

    if looks_local(hf_path):
        raise InputError(no_such_path(hf_path, "--hf-path"), "pass the model's folder, or a repo id such as Qwen/Qwen3.5-27B")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(hf_path)
    except HFValidationError as e:
        raise InputError(f"--hf-path {hf_path!r} is not a valid Hugging Face repo id ({e})",
                         "pass a local folder or a repo id such as Qwen/Qwen3.5-27B") from None
    return False


def _downloaded_commit(repo_id: str, revision: str | None) -> str:
    """The commit ``mlx_lm.convert`` just downloaded: the HF cache's snapshot for ``revision``.

    Resolving the revision before the converter runs would not do: mlx-lm (0.32) looks the
    snapshot up again by the default branch when it saves, so it must be given the user's
    revision as is; the head then comes from exactly the commit the converter read."""
    from huggingface_hub import try_to_load_from_cache

    p = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    if not isinstance(p, str):
        raise RefusedError(f"mlx_lm.convert left no snapshot of {repo_id} in the Hugging Face cache",
                           "check HF_HOME / HF_HUB_CACHE and re-run")
    return Path(p).parent.name


def _staging(dst: Path) -> Path:
    return dst.parent / f".{dst.name}.mtpforge-convert-{uuid.uuid4().hex[:8]}"


#: add-mtp's option fields that convert takes as its own flags, with the same names and meaning
#: (the CLI builds them from ``HeadOptions``). ``fetch`` and ``force`` mean nothing here: the
#: head is read from the converter's own download, into a folder that did not exist.
HEAD_FIELDS = tuple(n for n in HeadOptions.model_fields if n not in ("fetch", "force"))
#: the layouts convert can write: those that keep the head in the converted folder
FOLDER_LAYOUTS = tuple(n for n, row in LAYOUTS.items() if not row.separate_folder)
#: ``--precision`` values for an MLX folder (the ggml types are for GGUF targets)
MLX_PRECISIONS = tuple(v for v in choices("precision") if v not in get_args(GgmlPrecision))


#: help for the head flags whose add-mtp help speaks of GGUF targets, which convert never writes
HEAD_HELP = {
    "layout": "Where the head goes in the converted folder; default: the sidecar plain add-mtp writes (--runtime picks what a runtime reads).",
    "precision": "match (the quantization the conversion chose), bf16, float16, or bits (2, 3, 4, 5, 6, 8).",
}


def head_choices(field: str) -> tuple[str, ...]:
    """The values convert accepts for one of its head flags (``--help`` lists these)."""
    return {"layout": FOLDER_LAYOUTS, "precision": MLX_PRECISIONS}.get(field) or choices(field)


def validation_runtime(head: HeadOptions) -> str | None:
    """The runtime whose compatibility findings the converted folder is validated for.

    Hook for issue #15's "``--runtime`` as in add-mtp": add-mtp has no runtime option yet.
    When ``HeadOptions`` gains a ``runtime`` field, convert's CLI grows the flag (its head flags
    are generated from ``HEAD_FIELDS``), add-mtp receives it through ``AddOptions``, and this
    returns it, so the validation below checks that runtime. Until then: None (released mlx-lm).
    """
    return getattr(head, "runtime", None)


def _head_options(head: HeadOptions | None, head_kw: dict[str, Any]) -> HeadOptions:
    """The head's options, validated (one line naming the flag), restricted to convert's."""
    stray = sorted(set(head_kw) - set(HEAD_FIELDS))
    if stray:
        raise InputError(f"convert takes no --{stray[0].replace('_', '-')}",
                         f"its head options are {', '.join('--' + n.replace('_', '-') for n in HEAD_FIELDS)}")
    opts = head if head is not None else HeadOptions.parse(**{k: v for k, v in head_kw.items() if v is not None})
    for name in ("layout", "precision"):
        v = getattr(opts, name)
        if v is not None and str(v) not in head_choices(name):
            raise InputError(f"--{name} {v} is not one convert can write (an MLX folder that keeps its head)",
                             f"use one of: {', '.join(head_choices(name))}; for another, run add-mtp on the result")
    return opts


def _check_mlx_flags(*, quantize: bool, q_group_size: int | None, q_bits: int | None, q_mode: str,
                     dtype: str | None, quant_predicate: str | None) -> None:
    """mlx_lm.convert's own flags, refused before anything runs (its argparse choices and rules)."""
    if q_mode not in Q_MODES:
        raise InputError(f"--q-mode must be one of {', '.join(Q_MODES)}, not {q_mode!r}", "use --q-mode affine")
    if dtype is not None and dtype not in DTYPES:
        raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}", "use --dtype bfloat16")
    if quant_predicate is not None and quant_predicate not in QUANT_RECIPES:
        raise InputError(f"--quant-predicate must be one of {', '.join(QUANT_RECIPES)}, not {quant_predicate!r}",
                         "use --quant-predicate mixed_4_6, or leave it out")
    if quant_predicate is not None and q_mode != "affine":
        raise InputError("--quant-predicate works only with --q-mode affine (mlx-lm's rule)", "drop --q-mode or --quant-predicate")
    if (q_bits is not None or q_group_size is not None or quant_predicate is not None) and not quantize:
        raise InputError("--q-bits, --q-group-size and --quant-predicate need -q/--quantize", "add -q")


def _check_destination(mlx_path: str) -> Path:
    dst = Path(mlx_path).expanduser()
    if dst.is_symlink() or (dst.exists() and (not dst.is_dir() or any(dst.iterdir()))):
        raise InputError(f"--mlx-path {mlx_path} already exists", "delete it or pass a new --mlx-path")
    if not dst.parent.is_dir():
        raise InputError(f"the parent of --mlx-path {mlx_path} does not exist", "create the parent folder first")
    return dst


def convert(
    hf_path: str,
    mlx_path: str = "mlx_model",
    *,
    quantize: bool = False,
    q_group_size: int | None = None,
    q_bits: int | None = None,
    q_mode: str = "affine",
    dtype: str | None = None,
    quant_predicate: str | None = None,
    trust_remote_code: bool = False,
    head: HeadOptions | None = None,
    progress: bool = True,
    **head_kw: Any,
) -> dict[str, Any]:
    """``mlx_lm.convert.convert(hf_path, mlx_path, ...)`` followed by add-mtp from the same
    source and ``inspect`` of the result. The keyword arguments up to ``trust_remote_code`` are
    mlx-lm's, with its names and meanings; the head's options (``revision``, ``layout``,
    ``precision``, ...) are add-mtp's: a :class:`HeadOptions` as ``head``, or its fields as
    keywords. ``revision`` is the source's, for both steps."""
    _check_mlx_flags(quantize=quantize, q_group_size=q_group_size, q_bits=q_bits, q_mode=q_mode, dtype=dtype,
                     quant_predicate=quant_predicate)
    opts = _head_options(head, head_kw)
    dst = _check_destination(mlx_path)
    prog = Progress(enabled=progress)
    local = _check_source(hf_path)
    stage = _staging(dst)
    from .writer.atomic import COMMITTED

    mark = len(COMMITTED)
    try:
        prog.step(f"mlx_lm.convert {hf_path}" + (f"@{opts.revision}" if opts.revision else ""))
        _run_converter(hf_path, stage, local, progress, opts.revision, quantize=quantize, q_group_size=q_group_size,
                       q_bits=q_bits, q_mode=q_mode, dtype=dtype, quant_predicate=quant_predicate,
                       trust_remote_code=trust_remote_code)
        commit = None if local else _downloaded_commit(hf_path, opts.revision)
        prog.step("putting the MTP head back from the same source")
        added = _add_head(hf_path, stage, commit, opts)
        prog.step("validating the converted folder")
        check = _validate(stage, validation_runtime(opts))
        if dst.is_dir():
            dst.rmdir()  # an empty folder: replaced, as a new one would be
        os.replace(stage, dst)
    except BaseException as e:
        try:  # the handler of a Ctrl-C on its way runs at the first call here: inside this try
            interrupted = not isinstance(e, MtpforgeError) and (caused_by_interrupt(e) or settle())
        except KeyboardInterrupt:
            interrupted = True
        if interrupted:
            raise _interrupted(stage, dst, mark) from None
        raise
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
    prog.done(f"converted {hf_path} to {dst} with its MTP head ({added.layout} layout)")
    return {
        "source": hf_path, "revision": commit, "local_source": local, "mlx_path": str(dst),
        "quantization": check.get("quantization"), "layout": added.layout, "family": added.family,
        "expert_format": added.expert_format, "mtp_tensors": added.mtp_tensors, "mtp_bytes": added.mtp_bytes,
        "fetched_bytes": added.fetched_bytes,
        "files_written": sorted(str(p) for p in dst.rglob("*") if p.is_file()),
        "manifest": str(dst / Path(added.manifest).name),
        "notes": list(added.notes), "runtime": validation_runtime(opts), "findings": check["findings"],
        "exit_code": 0,
    }


def _interrupted(stage: Path, dst: Path, mark: int) -> MtpforgeError:
    """What a Ctrl-C left, said truly: add-mtp's commit went into the staging folder, which is
    removed now, so only the rename into ``dst`` makes anything the user's."""
    from .errors import Interrupted
    from .interrupts import shielded
    from .writer.atomic import COMMITTED

    del COMMITTED[mark:]
    with shielded():
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
    if (dst / "mtpforge.json").is_file():
        return Interrupted(f"interrupted after the conversion was complete: {dst} holds the model with its head",
                           f"nothing to undo; `mtpforge inspect {dst}` shows it")
    return Interrupted(f"interrupted: nothing was written to {dst} (the partial conversion was removed)",
                       "re-run the command")


def _run_converter(hf_path: str, stage: Path, local: bool, progress: bool, revision: str | None, **flags: Any) -> None:
    """The real ``mlx_lm.convert.convert`` into the staging folder; its refusals are one line."""
    from mlx_lm.convert import convert as mlx_convert

    from .checkpoint.hub import hub_errors

    errors_of_the_hub = contextlib.nullcontext() if local else hub_errors(hf_path, revision)
    try:
        with errors_of_the_hub, _quiet_converter(progress):
            mlx_convert(hf_path=hf_path, mlx_path=str(stage), revision=revision, **flags)
    except MtpforgeError:
        raise
    except (ValueError, NotImplementedError) as e:  # mlx-lm's own refusals (bad bits for a mode, ...)
        raise InputError(f"mlx_lm.convert refused: {e}", "fix the quantization flags as mlx_lm.convert says") from None


def _add_head(source: str, stage: Path, commit: str | None, opts: HeadOptions) -> AddResult:
    """add-mtp into the staging folder, from the commit the converter read (a Hub source) with
    ``--precision match`` by default: the quantization the converter just chose. Its own
    steps stay quiet: they would name the staging folder; convert's say what happens."""
    from .pipeline import add

    fields = opts.model_dump(include=set(HEAD_FIELDS) - {"revision"})
    result = add(AddOptions(source=source, target=str(stage), revision=commit, **fields), progress=False)
    assert isinstance(result, AddResult)  # an MLX folder (GGUF layouts were refused up front)
    return result


def _validate(stage: Path, runtime: str | None) -> dict[str, Any]:
    """inspect of the whole converted folder; an error finding refuses (nothing is written)."""
    from .inspect import inspect_checkpoint

    check = inspect_checkpoint(str(stage), runtime=runtime)
    errors = [f for f in check["findings"] if f["severity"] == "error"]
    if errors:
        e = errors[0]
        raise RefusedError(f"the converted folder failed validation, nothing was written: {e['code']}: {e['message']}",
                           e.get("fix") or "report this with `mtpforge env` output")
    return check


__all__ = ["convert", "head_choices", "HEAD_HELP", "validation_runtime", "HEAD_FIELDS", "Q_MODES", "QUANT_RECIPES", "DTYPES"]
