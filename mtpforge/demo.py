"""``mtpforge demo``: the whole job, end to end, on the bundled tiny trained model, offline.

A newcomer judges the tool by its first five minutes, so the demo runs the real thing rather
than a show: the real ``mlx_lm.convert`` makes a target that lost its head exactly as community
conversions do, and then the same ``inspect``, ``add_mtp`` and ``verify`` a user runs on a 27B
model find the problem, fix it and prove the fix with a decode.
"""

from __future__ import annotations

import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console

from .errors import InputError, MtpforgeError
from .interrupts import caused_by_interrupt, settle

BUNDLED_MODEL = "tiny-qwen3_5"
TARGET_NAME = "tiny-qwen3_5-4bit"
Q_BITS, Q_GROUP = 4, 64
#: The bundled model drafts at ~86-90% greedy acceptance (4-bit backbone); a head written with the
#: wrong norm convention drafts ~2%, with its fc inputs swapped ~5%. The floor is issue 4's bar.
MIN_ACCEPTANCE = 0.6


def tiny_model_path() -> Path:
    """The bundled tiny Qwen3.5-architecture model in Hugging Face layout (head included)."""
    path = Path(str(resources.files("mtpforge").joinpath("data", BUNDLED_MODEL)))
    if not (path / "config.json").is_file():
        raise InputError(f"the bundled model is missing from this installation ({path})",
                         "reinstall mtpforge (pip install --force-reinstall mtpforge)")
    return path


def make_community_target(source: str | Path, target: str | Path, *, q_bits: int = Q_BITS, q_group_size: int = Q_GROUP) -> Path:
    """An MLX model made from ``source`` the way mlx-community conversions are made: the real
    ``mlx_lm.convert``, which drops the ``mtp.*`` tensors while the config keeps declaring them."""
    from .community import convert_to_mlx

    return convert_to_mlx(source, target, q_bits=q_bits, q_group_size=q_group_size)


def _check_work_dir(directory: str | None) -> None:
    if directory is None:
        return
    d = Path(directory).expanduser()
    if d.exists() and not d.is_dir():
        raise InputError(f"{directory} is a file, not a folder", "pass a new or empty folder, or no folder for a temporary one")
    if d.is_dir() and any(d.iterdir()):
        raise InputError(f"{directory} is not empty", "pass a new or empty folder (the demo never overwrites files), or none for a temporary one")


def _make_work_dir(directory: str | None) -> Path:
    if directory is None:
        return Path(tempfile.mkdtemp(prefix="mtpforge-demo-"))
    d = Path(directory).expanduser()
    d.mkdir(parents=True, exist_ok=True)
    return d.resolve()


class _Narrator:
    """Tells the story on stdout; silent under --json, where stdout carries only the result."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.console = Console(highlight=False, soft_wrap=True) if enabled else None
        self.total = total
        self.n = 0

    def say(self, text: str = "") -> None:
        if self.console is not None:
            self.console.print(text)

    def step(self, title: str, command: str) -> None:
        from .interrupts import check

        check()  # a Ctrl-C a library's finalizer swallowed stops the demo here
        self.n += 1
        self.say()
        self.say(f"[bold cyan]{self.n}/{self.total}[/bold cyan] [bold]{title}[/bold]")
        self.say(f"    [dim]$ {command}[/dim]")

    def verdict(self, ok: bool, text: str) -> None:
        self.say(f"    {'[bold green]✓' if ok else '[bold red]✗'}[/] {text}")

    def render(self, fn: Any, result: dict[str, Any]) -> None:
        if self.console is not None:
            fn(result, self.console)


def _backbone_logits(folder: Path) -> Any:
    """Logits of released mlx-lm on a fixed token sequence: the proof that adding the head left
    the backbone as it was (and that mlx-lm still loads the folder at all)."""
    import mlx.core as mx
    from mlx_lm.utils import load_model

    model, _ = load_model(folder)
    out = model(mx.array([[1, 7, 8, 9, 10, 11, 12, 13]])).astype(mx.float32)
    mx.eval(out)
    return out


def _codes(report: dict[str, Any], *severities: str) -> list[str]:
    return [f["code"] for f in report.get("findings", []) if f["severity"] in severities]


def _convert(say: _Narrator, src: Path, target: Path, steps: dict[str, Any]) -> Any:
    from .inspect import inspect_checkpoint

    say.step("Make an MLX model the way community conversions are made",
             f"mlx_lm.convert --hf-path {src} --mlx-path {target} -q --q-bits {Q_BITS} --q-group-size {Q_GROUP}")
    make_community_target(src, target)
    converted = inspect_checkpoint(str(target), data_checks=False)
    ok = converted["mtp_tensors"] == 0 and converted["config_mtp_layers"] >= 1
    logits_before = _backbone_logits(target)
    steps["convert"] = {"ok": ok, "target": str(target), "q_bits": Q_BITS, "q_group_size": Q_GROUP,
                        "config_mtp_layers": converted["config_mtp_layers"], "mtp_tensors": converted["mtp_tensors"]}
    say.verdict(ok, f"the config still declares {converted['config_mtp_layers']} MTP layer(s); "
                    f"mlx_lm.convert wrote {converted['mtp_tensors']} MTP tensors")
    return logits_before


def _inspect_before(say: _Narrator, src: Path, target: Path, steps: dict[str, Any]) -> Any:
    from .inspect import inspect_checkpoint
    from .render import render_inspect

    say.step("Inspect it", f"mtpforge inspect {target}")
    before = inspect_checkpoint(str(target))
    say.render(render_inspect, before)
    ok = "MTP_CONFIG_WITHOUT_WEIGHTS" in _codes(before, "error")
    steps["inspect_before"] = {"ok": ok, "expected": "MTP_CONFIG_WITHOUT_WEIGHTS", "exit_code": before["exit_code"],
                               "findings": before["findings"]}
    say.verdict(ok, "found the missing head (MTP_CONFIG_WITHOUT_WEIGHTS): runtimes would fail to load it or draft at 0%"
                if ok else f"expected MTP_CONFIG_WITHOUT_WEIGHTS, found {_codes(before, 'error', 'warning') or 'nothing'}")
    return before


def _add(say: _Narrator, src: Path, target: Path, steps: dict[str, Any], logits_before: Any, progress: bool) -> Any:
    from .pipeline import add_mtp
    from .render import render_add

    say.step("Add the head from the original checkpoint", f"mtpforge add-mtp --source {src} --target {target}")
    added = add_mtp(source=str(src), target=str(target), progress=progress)
    added.pop("exit_code", None)
    say.render(render_add, added)
    import mlx.core as mx

    unchanged = bool(mx.array_equal(_backbone_logits(target), logits_before).item())
    ok = added.get("status") == "written" and unchanged
    steps["add_mtp"] = {"ok": ok, "mlx_lm_logits_unchanged": unchanged, **{k: added.get(k) for k in ("status", "layout", "expert_format", "mtp_tensors", "mtp_bytes",
                                                               "fetched_bytes", "files_written", "manifest", "notes")}}
    say.verdict(ok, f"wrote {added.get('mtp_tensors')} tensors in the {added.get('layout')} layout (norms shifted +1 for MLX), "
                    "atomically; released mlx-lm still loads the folder and its logits are bit-identical to before"
                if ok else f"status {added.get('status')}; mlx-lm logits unchanged: {unchanged}")
    return added


def _inspect_after(say: _Narrator, src: Path, target: Path, steps: dict[str, Any]) -> Any:
    from .inspect import inspect_checkpoint
    from .render import render_inspect

    say.step("Inspect again, against the source tensors", f"mtpforge inspect {target} --source {src} --strict")
    after = inspect_checkpoint(str(target), source=str(src), strict=True)
    say.render(render_inspect, after)
    ok = after["exit_code"] == 0 and not _codes(after, "error", "warning")
    steps["inspect_after"] = {"ok": ok, "exit_code": after["exit_code"], "layout": after.get("layout"),
                              "norm_convention": after.get("norm_convention"), "mtp_tensors": after.get("mtp_tensors"),
                              "findings": after["findings"]}
    say.verdict(ok, f"clean: {after.get('layout')} layout, norms {after.get('norm_convention')}" if ok
                else f"still reports {_codes(after, 'error', 'warning')}")
    return after


def _verify(say: _Narrator, src: Path, target: Path, steps: dict[str, Any], progress: bool) -> Any:
    from .render import render_verify
    from .verify import verify

    say.step("Decode with the head and prove it", f"mtpforge verify {target} --generate --min-acceptance {MIN_ACCEPTANCE}")
    res = verify(str(target), generate=True, min_acceptance=MIN_ACCEPTANCE, progress=progress)
    res.pop("exit_code", None)
    say.render(render_verify, res)
    ok = bool(res.get("ok")) and res.get("identical") is True
    steps["verify"] = {"ok": ok, **{k: res.get(k) for k in (
        "identical", "tokens", "drafted", "accepted", "acceptance", "acceptance_by_position", "hidden", "hidden_variants",
        "accepted_per_verify", "tokens_per_verify", "baseline_tok_s", "mtp_tok_s", "speedup", "problems")}}
    acc = res.get("acceptance")
    say.verdict(ok, (f"output identical to plain greedy decoding; {acc:.0%} of drafts accepted "
                     f"({res.get('tokens_per_verify', 0):.2f} tokens per backbone pass instead of 1)") if ok and isinstance(acc, (int, float))
                else f"verify failed: {res.get('problems') or res}")
    return res


def _keep_tour_folders(keep: Path, src: Path, converted: Path) -> dict[str, str]:
    """The folders the README's tour starts from: the source (Hugging Face layout, with its head)
    and the conversion as mlx_lm.convert left it (no head), copied before the demo changes it."""
    import shutil

    out = {"source": keep / src.name, "target": keep / TARGET_NAME}
    shutil.copytree(src, out["source"], ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(converted, out["target"], symlinks=True)
    return {k: str(v) for k, v in out.items()}


def run_demo(directory: str | None = None, *, progress: bool = True, source: str | None = None,
             keep: str | None = None) -> dict[str, Any]:
    """Convert, inspect, add the head, inspect again, verify. ``exit_code`` is 1 when any step
    does not show what it should (the result says which). ``source`` replaces the bundled
    model (any HF-layout Qwen3.5/3.6/Qwen3-Next folder with a head). ``keep`` (a new or empty
    folder) also receives the source and the head-less conversion, for following the tour."""
    _check_work_dir(directory)
    _check_work_dir(keep)
    src = Path(source).resolve() if source else tiny_model_path()
    if not (src / "config.json").is_file():
        raise InputError(f"{src} is not a Hugging Face model folder (no config.json)", "pass a folder with config.json and its weights")
    # what each folder was before the demo (absent, or empty): a Ctrl-C puts them back so
    made = [(p, p.exists()) for p in (Path(d).expanduser() for d in (directory, keep) if d is not None)]
    work = _make_work_dir(directory)
    if directory is None:
        made.append((work, False))
    try:
        return _run_steps(work, src, keep, progress, temporary=directory is None)
    except BaseException as e:
        try:  # the handler of a Ctrl-C on its way runs at the first call here: inside this try
            interrupted = not isinstance(e, MtpforgeError) and (caused_by_interrupt(e) or settle())
        except KeyboardInterrupt:
            interrupted = True
        if interrupted:
            raise _interrupted(made) from None
        raise


def _interrupted(made: list[tuple[Path, bool]]) -> MtpforgeError:
    """Ctrl-C: every folder the demo made is removed, every empty folder it filled is emptied
    again (everything in it is the demo's: it refuses a folder that is not empty), so that
    re-running the same command works."""
    import shutil

    from .errors import Interrupted
    from .interrupts import shielded

    with shielded():
        for folder, existed in made:
            if not folder.is_dir():
                continue
            if not existed:
                shutil.rmtree(folder, ignore_errors=True)
                continue
            for child in folder.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
    said = "; ".join(f"{f} is empty again" if existed else f"{f} was removed" for f, existed in made)
    return Interrupted(f"interrupted: the demo removed what it had made ({said})", "re-run the command")


def _run_steps(work: Path, src: Path, keep: str | None, progress: bool, *, temporary: bool) -> dict[str, Any]:
    target = work / TARGET_NAME
    say = _Narrator(progress, 5)
    say.say("[bold]mtpforge demo[/bold]: put the MTP head back into an MLX model that lost it, offline, on a tiny trained model")
    say.say(f"    source (Hugging Face layout, with its head): {src}")
    say.say(f"    work folder: {work}")
    steps: dict[str, Any] = {}
    logits_before = _convert(say, src, target, steps)
    kept = _keep_tour_folders(_make_work_dir(keep), src, target) if keep is not None else None
    before = _inspect_before(say, src, target, steps)
    added = _add(say, src, target, steps, logits_before, progress)
    after = _inspect_after(say, src, target, steps)
    res = _verify(say, src, target, steps, progress)
    acc = res.get("acceptance")

    all_ok = all(s["ok"] for s in steps.values())
    say.say()
    if all_ok:
        say.say("[bold green]Done.[/bold green] On a real model it is the same three commands, e.g.:")
        say.say("    mtpforge inspect ./Qwen3.5-27B-4bit")
        say.say("    mtpforge add-mtp --source Qwen/Qwen3.5-27B --target ./Qwen3.5-27B-4bit")
        say.say("    mtpforge verify ./Qwen3.5-27B-4bit --generate")
        if temporary and kept:  # the tour's folders are what was asked to stay
            import shutil

            shutil.rmtree(work, ignore_errors=True)
            say.say(f"The demo's temporary work folder {work} was removed.")
        else:
            say.say(f"The demo's files stay in {work}; delete the folder when you are done.")
        if kept:
            say.say(f"For the tour: the source is in {kept['source']}, the conversion without its head in "
                    f"{kept['target']}.")
    else:
        failed = [k for k, s in steps.items() if not s["ok"]]
        say.say(f"[bold red]The demo did not go as expected[/bold red] at: {', '.join(failed)}. "
                "Please report it with the output of `mtpforge env`.")
    return {
        "directory": str(work),
        "source": str(src),
        "target": str(target),
        "before": _codes(before, "error", "warning"),
        "after": _codes(after, "error", "warning") or "clean",
        "layout": added.get("layout"),
        "identical": res.get("identical"),
        "acceptance": acc,
        "ok": all_ok,
        "kept": kept,
        "steps": steps,
        "exit_code": 0 if all_ok else 1,
    }


__all__ = ["run_demo", "tiny_model_path", "make_community_target", "MIN_ACCEPTANCE"]
