"""Ctrl-C as a person at a terminal presses it: each long command runs in a pseudo-terminal
and SIGINT goes to its process group (what the terminal sends) at several points, by progress
stage and by delay. Each time: exit 130, one line, no traceback (nor "Exception ignored"), the
line's statement about the disk true of the folder, and its advice, followed, succeeds."""

from __future__ import annotations

import hashlib
import os
import pty
import re
import select
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


class Run(NamedTuple):
    rc: int
    text: str  # what the terminal showed
    before_signal: str  # what it had shown when Ctrl-C was pressed ("" if never pressed)


def clean(raw: bytes) -> str:
    return ANSI.sub("", raw.decode(errors="replace")).replace("\r\n", "\n").replace("\r", "\n")


def drive(args: list[str], cwd: Path, *, stage: str | None = None, delay: float = 0.0,
          timeout: float = 600, hub: str | None = None) -> Run:
    """Run ``mtpforge ARGS`` on a pseudo-terminal; once ``stage`` was printed (or at once),
    wait ``delay`` seconds and press Ctrl-C. A stage is words no path holds (the test's own
    folder is named after its parameters: "decoding" alone is found in the first path printed).
    Offline, unless ``hub`` names an endpoint to download from."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_HOME": str(cwd / "hf-home"),
           "COLUMNS": "120", "NO_COLOR": "1", "TMPDIR": str(cwd / "tmp")}
    if hub:
        env.update(HF_HUB_OFFLINE="0", HF_ENDPOINT=hub, HF_HUB_DISABLE_TELEMETRY="1", HF_TOKEN="")
    (cwd / "tmp").mkdir(exist_ok=True)
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session of its own with the pty as its terminal
        os.chdir(cwd)
        os.execvpe(sys.executable, [sys.executable, "-m", "mtpforge", *args], env)
    out, sent, t0, at_signal = b"", False, time.monotonic(), b""
    seen_at: float | None = t0 if stage is None else None
    while True:
        now = time.monotonic()
        if seen_at is None and stage is not None and stage in clean(out):  # rich styles numbers
            seen_at = now
        if not sent and seen_at is not None and now - seen_at >= delay:
            out += _drain(fd)  # what the command printed up to the press, not what was read in time
            try:
                os.killpg(pid, signal.SIGINT)  # the whole foreground group, as the terminal does
            except ProcessLookupError:  # not yet its own group
                os.kill(pid, signal.SIGINT)
            sent, at_signal = True, out
        assert now - t0 < timeout, ANSI.sub("", out.decode(errors="replace"))
        r, _, _ = select.select([fd], [], [], 0.01)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    if not sent:  # the command ended before the press was due: everything came before it
        at_signal = out
    return Run(os.waitstatus_to_exitcode(status), clean(out), clean(at_signal))


def _drain(fd: int) -> bytes:
    """Everything the terminal holds now: on a busy machine this loop may not have read for a
    while, and a line the command printed before the press would count as printed after it."""
    got = b""
    while select.select([fd], [], [], 0)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    return got


def too_late(run: Run, done: str) -> bool:
    """True when Ctrl-C was pressed only after the command had printed its last line ``done``
    (a short last stage on a busy machine: the test reads the terminal late). Such a press
    interrupts nothing; the command's exit 0 is then the truth, not a missed interrupt."""
    return run.rc == 0 and done in run.before_signal

def interrupted_line(rc: int, text: str) -> str:
    assert rc == 130, (rc, text[-3000:])
    for bad in ("Traceback", "Exception ignored", "KeyboardInterrupt"):
        assert bad not in text, text[-3000:]
    lines = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "interrupted" in lines[0], text[-3000:]
    return lines[0]


def state(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))} if folder.exists() else {}


@pytest.mark.parametrize("stage,delay", [(None, 1.0), ("3/5", 0.3), ("5/5", 1.0)])
def test_ctrl_c_in_the_demo(tmp_path: Path, stage: str | None, delay: float) -> None:
    work, keep = tmp_path / "work", tmp_path / "tour"
    keep.mkdir()  # one folder that existed (empty) and one the demo makes
    rc, text, _ = drive(["demo", str(work), "--keep", str(keep)], tmp_path, stage=stage, delay=delay)
    line = interrupted_line(rc, text)
    assert "re-run" in line, line
    if "before anything was written" not in line:  # the demo had begun: it names what it removed
        assert f"{keep} is empty again" in line and f"{work} was removed" in line, line
    assert not work.exists() and list(keep.iterdir()) == [] and not list((tmp_path / "tmp").glob("mtpforge-demo-*"))
    if stage == "3/5":  # the advice, followed
        rc, text, _ = drive(["demo", str(work), "--keep", str(keep)], tmp_path, stage="no such stage", timeout=900)
        assert rc == 0 and "demo passed" in text, text[-3000:]


def test_ctrl_c_in_a_demo_without_a_folder_leaves_no_temporary_folder(tmp_path: Path) -> None:
    rc, text, _ = drive(["demo"], tmp_path, stage="2/5", delay=0.2)
    line = interrupted_line(rc, text)
    assert "was removed" in line and not list((tmp_path / "tmp").glob("mtpforge-demo-*")), line


#: the lines each command prints once its work is done and committed (after them a Ctrl-C is ignored:
#: the result stands and is printed)
CONVERTED, ADDED = "with its MTP head (", "added the MTP head to"


#: runs of a case whose press interrupted nothing before its last one is judged
TRIES = 3


def press(args: list[str], cwd: Path, *, stage: str | None, delay: float, undo: Callable[[], None]) -> Run:
    """``drive``, pressed again (three tries) while the press interrupted nothing (exit 0);
    ``undo`` puts the folder back between tries. A stage of a few milliseconds is hit only when
    the machine lets the test read the terminal in time: the press may come after the command's
    last line, or as that line is being written (the terminal read late on busy cores,
    so that line is not yet among what was read before the press). After three such tries the
    caller checks the last one: a finished command's exit 0 when the press came after its last line,
    an interrupted run's one line otherwise — so a command that ignored Ctrl-C still fails. Each
    try after a late one waits half as long (a fast machine finishes a tiny convert before a
    press 1.5 s in)."""
    for attempt in range(TRIES):
        run = drive(args, cwd, stage=stage, delay=delay / 2 ** attempt)
        if run.rc != 0 or attempt == TRIES - 1:
            return run
        undo()
    raise AssertionError("unreachable")


@pytest.mark.parametrize("stage,delay", [("mlx_lm.convert", 0.3), ("putting the MTP head back", 0.0),
                                         ("validating the converted folder", 0.0), (None, 1.5)])
def test_ctrl_c_in_convert(tmp_path: Path, make_hf, stage: str | None, delay: float) -> None:
    src, out = make_hf("qwen3_5"), tmp_path / "out"
    args = ["convert", "--hf-path", str(src), "--mlx-path", str(out), "-q"]

    def undo() -> None:
        assert (out / "mtpforge.json").is_file()  # a finished run: the folder is complete
        shutil.rmtree(out)

    run = press(args, tmp_path, stage=stage, delay=delay, undo=undo)
    if too_late(run, CONVERTED):
        assert (out / "mtpforge.json").is_file() and "Traceback" not in run.text, run.text[-3000:]
        return
    line = interrupted_line(run.rc, run.text)
    assert not [p for p in tmp_path.iterdir() if ".mtpforge-convert-" in p.name], "a staging folder left behind"
    if "nothing was written" in line or "before anything was written" in line:
        assert not out.exists(), line
        assert "re-run" in line
        rc, text, _ = drive(args, tmp_path, stage="no such stage")
        assert rc == 0 and (out / "mtpforge.json").is_file(), text[-3000:]
    else:
        assert "holds the model with its head" in line and (out / "mtpforge.json").is_file(), line
        assert ".mtpforge-convert-" not in line


@pytest.mark.parametrize("stage", ["reading the source", "validating the staged folder"])
def test_ctrl_c_in_add_mtp(tmp_path: Path, make_hf, make_target, stage: str) -> None:
    src, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    before, spare = state(tgt), tmp_path / "spare"
    shutil.copytree(tgt, spare, symlinks=True)
    args = ["add-mtp", "--source", str(src), "--target", str(tgt)]

    def undo() -> None:
        assert (tgt / "mtpforge.json").is_file()
        shutil.rmtree(tgt)
        shutil.copytree(spare, tgt, symlinks=True)

    run = press(args, tmp_path, stage=stage, delay=0.0, undo=undo)
    if too_late(run, ADDED):
        assert (tgt / "mtpforge.json").is_file() and "Traceback" not in run.text, run.text[-3000:]
        return
    line = interrupted_line(run.rc, run.text)
    if "left as it was" in line:
        assert state(tgt) == before
        rc, text, _ = drive(args, tmp_path, stage="no such stage")
        assert rc == 0 and (tgt / "mtpforge.json").is_file(), text[-3000:]
    else:
        assert "committed" in line and (tgt / "mtpforge.json").is_file(), line


@pytest.mark.parametrize("fetch", ["ranges", "stream"])
def test_ctrl_c_while_a_hub_source_downloads_behind_the_conversion(tmp_path: Path, make_hf, make_target, fetch: str) -> None:
    """add-mtp from the Hub converts while a thread of its own downloads the head (a link paced
    so that the download takes seconds), its bar beside the conversion's: Ctrl-C in the middle of
    the download stops both — exit 130, one line, no traceback nor a thread's "Exception
    ignored", the target as it was — and the re-run the line advises completes, from what the
    download had kept (``ranges``; ``stream`` keeps nothing and downloads again), with the same
    head as an uninterrupted run from the source folder."""
    from mtpforge.checkpoint.catalogue import load_catalogue
    from mtpforge.checkpoint.store import LocalStore
    from tests.support.synth.hub_server import HubServer

    src, tgt, plain = make_hf("qwen3_5"), make_target("qwen3_5"), make_target("qwen3_5")
    before = state(tgt)
    head = sum(t.nbytes for k, t in load_catalogue(LocalStore(src)).tensors.items() if k.startswith("mtp."))
    args = ["add-mtp", "--source", "org/paced", "--target", str(tgt), "--fetch", fetch]
    from mtpforge.checkpoint.stream_fetch import CONNECTIONS

    # the head's bytes take ~6 s, a 64 KiB chunk about every second (the pace is each answer's:
    # the stream has CONNECTIONS of them at once)
    with HubServer(rate=head / 6 / (CONNECTIONS if fetch == "stream" else 1)) as server:
        server.publish("org/paced", src)
        # the download's bar shows beside the conversion's (which waits for it at zero); pressed
        # when two chunks have left and four have not, a second either way from each
        run = drive(args, tmp_path, stage="downloading MTP tensors", delay=2.5, hub=server.endpoint)
        sent_at_exit = server.sent_bytes("org/paced")
        line = interrupted_line(run.rc, run.text)
        assert "left as it was" in line and "re-run" in line, line
        assert state(tgt) == before
        assert 0 < server.tensor_bytes("org/paced") < head, "the press did not come during the download"
        time.sleep(0.5)
        assert server.sent_bytes("org/paced") == sent_at_exit  # nothing downloads after the exit
        rc, text, _ = drive(args, tmp_path, stage="no such stage", hub=server.endpoint)
    assert rc == 0 and (tgt / "mtpforge.json").is_file(), text[-3000:]
    rc, text, _ = drive(["add-mtp", "--source", str(src), "--target", str(plain)], tmp_path, stage="no such stage")
    assert rc == 0, text[-3000:]
    mtp = sorted(p.name for p in tgt.iterdir() if "mtp" in p.name and p.suffix == ".safetensors")
    assert mtp and all((tgt / n).read_bytes() == (plain / n).read_bytes() for n in mtp), mtp


@pytest.mark.parametrize("stage", ["loading the backbone", "decoding 1 prompt"])
def test_ctrl_c_in_verify(tmp_path: Path, make_hf, make_target, stage: str) -> None:
    src, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    rc, text, _ = drive(["add-mtp", "--source", str(src), "--target", str(tgt)], tmp_path, stage="no such stage")
    assert rc == 0, text[-3000:]
    before = state(tgt)
    args = ["verify", str(tgt), "--generate", "--prompt", "hello", "--max-tokens", "16"]
    run = press(args, tmp_path, stage=stage, delay=0.2, undo=lambda: None)
    assert state(tgt) == before  # verify changes nothing, interrupted or not
    if too_late(run, "identical:"):
        return
    line = interrupted_line(run.rc, run.text)
    assert "left as it was" in line, line
    rc, text, _ = drive(args, tmp_path, stage="no such stage")
    assert rc in (0, 1) and "identical" in text, text[-3000:]  # the advice: re-run (the random head may draft badly)


@pytest.mark.parametrize("stage,delay", [("reading the source", 0.0), ("decoding 4 prompts", 0.2)])
def test_ctrl_c_in_run(tmp_path: Path, make_hf, make_target, stage: str, delay: float) -> None:
    """A recipe: the add step (before its commit the folder is as it was) and the verify check
    after it (the head is in: the line names the committed folder, whose head inspect reads)."""
    src, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    before, recipe = state(tgt), tmp_path / "recipe.yaml"
    recipe.write_text(f"source: {src}\ntarget: {tgt}\nchecks:\n  verify:\n    generate: true\n    max_tokens: 32\n")
    rc, text, _ = drive(["run", str(recipe)], tmp_path, stage=stage, delay=delay)
    line = interrupted_line(rc, text)
    if stage.startswith("decoding"):  # the verify check runs after the head was written
        assert "committed" in line, text[-3000:]
    if "left as it was" in line:
        assert state(tgt) == before, line
        rc, text, _ = drive(["run", str(recipe)], tmp_path, stage="no such stage")
        assert rc == 0 and "every check passed" in text, text[-3000:]
    else:
        assert "committed" in line and str(tgt) in line and (tgt / "mtpforge.json").is_file(), line
        rc, text, _ = drive(["inspect", str(tgt)], tmp_path, stage="no such stage")
        assert rc == 0 and "no problems found" in text, text[-3000:]


#: repair-norms' last line says what it changed and on what evidence
REPAIRED = "(evidence: source)"


@pytest.mark.parametrize("stage", ["comparing the head's norms", "committing"])
def test_ctrl_c_in_repair_norms(tmp_path: Path, make_hf, make_target, stage: str) -> None:
    """A head written by "another tool" with its final norm raw, repaired from the source: before
    the commit the folder is as it was (and the repair, re-run, succeeds); after it, repaired."""
    from mtpforge.pipeline import add_mtp
    from tests.test_norm_behaviour import breakage

    src, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    add_mtp(source=str(src), target=str(tgt), layout="embedded", precision="bf16", progress=False)
    (tgt / "mtpforge.json").unlink()
    breakage(tgt, {"norm.weight": -1})
    before, spare = state(tgt), tmp_path / "spare"
    shutil.copytree(tgt, spare, symlinks=True)
    args = ["repair-norms", str(tgt), "--source", str(src)]

    def undo() -> None:
        shutil.rmtree(tgt)
        shutil.copytree(spare, tgt, symlinks=True)

    run = press(args, tmp_path, stage=stage, delay=0.0, undo=undo)
    if too_late(run, REPAIRED):
        assert state(tgt) != before and "Traceback" not in run.text, run.text[-3000:]
        return
    line = interrupted_line(run.rc, run.text)
    if "left as it was" in line:
        assert state(tgt) == before, line
        rc, text, _ = drive(args, tmp_path, stage="no such stage")
        assert rc == 0 and REPAIRED in text, text[-3000:]
    else:
        assert "committed" in line and state(tgt) != before, line
    rc, text, _ = drive(["inspect", str(tgt), "--source", str(src)], tmp_path, stage="no such stage")
    assert ("shifted" in text) == (state(tgt) != before), text[-3000:]
