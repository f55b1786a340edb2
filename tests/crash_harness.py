"""Kill real ``mtpforge add-mtp`` / ``remove-mtp`` processes with SIGKILL and judge what is left.

Shared by ``tests/test_crash_safety.py`` (a seeded couple of dozen kills) and
``scripts/soak_kill.py`` (hundreds). Nothing is simulated: each kill is a real ``python -m
mtpforge`` subprocess, a real ``SIGKILL``, and the folder is then judged byte for byte against
the states a clean run starts from and ends with, by ``inspect`` and by released ``mlx_lm.load``.

Kill moments come in two kinds, so that every phase is hit even on a loaded machine: *timed*
(a delay drawn over the measured duration of a clean run) and *anchored* (a short delay after a
progress line such as ``committing`` appears on stderr — the commit is a millisecond window that
timed kills alone would almost never hit).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.checkers import folder_state

#: progress lines (stderr) a kill may be anchored to, in the order a run prints them; the delay
#: after each is drawn over that phase's duration as measured in the clean run
ANCHORS: tuple[str, ...] = ("fetching", "staging", "converting", "validating", "committing")
#: how each anchor's line reads: a local source's tensors are "reading N MTP tensors", a Hub
#: source's "fetching N MTP tensors" (the same phase)
ANCHOR_LINES: dict[str, "re.Pattern[str]"] = {
    a: re.compile(r"(fetching|reading) \d+ MTP tensors" if a == "fetching" else re.escape(a)) for a in ANCHORS}
#: every scenario's first kills go to the phases nearest the commit, where a bug would hide,
#: then one timed kill (None), then the earlier phases
FIRST_ANCHORS: tuple[str | None, ...] = ("validating", "committing", None, "staging", "converting", "fetching")
#: share of kills that are anchored (the rest are timed over the clean run's duration)
ANCHORED_SHARE = 0.6

#: scenario -> (command, symlinked Hub-cache folder, --output run, force the two-rename swap)
SCENARIOS: dict[str, dict[str, Any]] = {
    "add": {"cmd": "add", "symlinks": False, "output": False},
    "add-symlinked": {"cmd": "add", "symlinks": True, "output": False},
    "add-output": {"cmd": "add", "symlinks": False, "output": True},
    # an empty --output folder the user made: swapped out in one step, never absent
    "add-output-empty": {"cmd": "add", "symlinks": False, "output": True, "output_exists": True},
    # --force over a head in another layout: the old head's files go, the new ones come, at once
    "replace-force": {"cmd": "add", "symlinks": False, "output": False, "has_head": True, "head_layout": "embedded",
                      "extra": ["--force", "--layout", "sidecar"]},
    "remove": {"cmd": "remove", "symlinks": False, "output": False},
    "remove-symlinked": {"cmd": "remove", "symlinks": True, "output": False},
    "add-rename-fallback": {"cmd": "add", "symlinks": False, "output": False, "no_exchange": True},
}
LEFTOVER = re.compile(r"^\..+\.mtpforge-(stage|old)-\d+$")


def run_cli(args: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtpforge", *args], capture_output=True, text=True,
                          env=env or cli_env(), timeout=timeout)


def cli_env(no_exchange: bool = False) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    env.pop("MTPFORGE_NO_EXCHANGE", None)
    if no_exchange:
        env["MTPFORGE_NO_EXCHANGE"] = "1"
    return env


def hub_cache(folder: Path, cache: Path, commit: str = "0" * 40) -> Path:
    """A Hub-cache-like copy of ``folder``: ``snapshots/<sha>/f -> ../../blobs/<sha256 of f>``."""
    blobs, snap = cache / "blobs", cache / "snapshots" / commit
    blobs.mkdir(parents=True)
    for p in sorted(folder.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(folder)
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        if not (blobs / digest).exists():
            shutil.copy2(p, blobs / digest)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blobs / digest, link.parent), link)
    return snap


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if LEFTOVER.match(p.name))


@dataclass
class Bench:
    """One scenario's fixed inputs: a template to copy per kill, and the two legal end states."""

    name: str
    source: Path
    template: Path  # folder (or cache) copied fresh for every kill
    rel_target: str  # the target inside the copy
    before: dict[str, str]
    after: dict[str, str]
    blobs: dict[str, str] | None
    clean_seconds: float
    anchor_seconds: dict[str, float]
    spec: dict[str, Any] = field(default_factory=dict)

    def args(self, target: Path) -> list[str]:
        if self.spec["cmd"] == "remove":
            return ["remove-mtp", str(target)]
        args = ["add-mtp", "--source", str(self.source), "--target", str(target)]
        if self.spec["output"]:
            args += ["--output", str(self.output_of(target))]
        return args + list(self.spec.get("extra", []))

    @staticmethod
    def output_of(target: Path) -> Path:
        return target.parent / "out"

    def fresh(self, work: Path) -> Path:
        """A new copy of the template under ``work``; returns the folder the command changes."""
        if work.exists():
            shutil.rmtree(work)
        shutil.copytree(self.template, work, symlinks=True)
        if self.spec.get("output_exists"):
            self.output_of(work / self.rel_target).mkdir()
        return work / self.rel_target

    def judged(self, target: Path) -> Path:
        """The folder whose state is judged: the output for --output runs, else the target."""
        return self.output_of(target) if self.spec["output"] else target


def make_bench(scenario: str, source: Path, pristine: Path, root: Path, variant: str = "") -> Bench:
    """Build the scenario's template under ``root`` and measure one clean run on a copy."""
    from mtpforge.pipeline import add_mtp

    spec = SCENARIOS[scenario]
    name = f"{scenario}/{variant}" if variant else scenario
    template = root / f"template-{name.replace('/', '-')}"
    if spec["symlinks"]:
        target = hub_cache(pristine, template / "models--t")
    else:
        shutil.copytree(pristine, template / "model", symlinks=True)
        target = template / "model"
    if spec["cmd"] == "remove" or spec.get("has_head"):
        add_mtp(source=str(source), target=str(target), layout=spec.get("head_layout"), progress=False)
    rel = target.relative_to(template).as_posix()
    bench = Bench(name, source, template, rel, {}, {}, None, 0.0, {}, spec)
    blobs = template / "models--t" / "blobs"
    bench.blobs = folder_state(blobs) if blobs.is_dir() else None

    clean = root / f"clean-{name.replace('/', '-')}"
    t = bench.fresh(clean)
    bench.before = folder_state(bench.judged(t)) if bench.judged(t).exists() else {}
    env = cli_env(spec.get("no_exchange", False))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "mtpforge", *bench.args(t)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    for line in proc.stderr:
        for a in ANCHORS:
            if ANCHOR_LINES[a].search(line) and a not in bench.anchor_seconds:
                bench.anchor_seconds[a] = time.monotonic() - t0
    rc = proc.wait()
    bench.clean_seconds = time.monotonic() - t0
    if rc != 0:
        raise RuntimeError(f"clean {name} run failed with exit {rc}")
    bench.after = folder_state(bench.judged(t))
    shutil.rmtree(clean)
    return bench


def phase_seconds(bench: Bench, anchor: str) -> float:
    """How long the phase that starts at ``anchor`` lasted in the clean run (at least 2 ms)."""
    t = bench.anchor_seconds[anchor]
    later = [v for a, v in bench.anchor_seconds.items() if v > t]
    end = min(later) if later else bench.clean_seconds
    return max(end - t, 0.002)


@dataclass
class KillPlan:
    anchor: str | None  # None: timed from the start
    delay: float


#: an "early" anchored kill lands within this long after its progress line: where a phase
#: imports the modules it needs (a Ctrl-C inside an import is the hardest one to report right)
EARLY_SECONDS = 0.01


def plan_kills(bench: Bench, n: int, seed: int, early_share: float = 0.0, only: str | None = None) -> list[KillPlan]:
    """Seeded kill moments: timed ones spread over the clean run, anchored ones after each
    progress line that the clean run printed; ``early_share`` of the anchored ones land in the
    first milliseconds of their phase; ``only``: every kill anchored to that progress line."""
    rng = random.Random(f"{seed}-{bench.name}")
    anchors = [a for a in ANCHORS if a in bench.anchor_seconds and (only is None or a == only)]
    if only is not None and not anchors:
        return []
    plans = []
    first = [a for a in FIRST_ANCHORS if (a is None and only is None) or a in anchors]
    for i in range(n):
        if only is not None and i >= len(first):
            span = phase_seconds(bench, only)
            if early_share and rng.random() < early_share:
                span = min(span, EARLY_SECONDS)
            plans.append(KillPlan(only, rng.uniform(0.0, span)))
        elif i < len(first) and first[i] is None:
            plans.append(KillPlan(None, rng.uniform(0.0, bench.clean_seconds)))
        elif i < len(first) or (anchors and rng.random() < ANCHORED_SHARE):
            a = first[i] if i < len(first) else rng.choice(anchors)
            assert a is not None
            span = phase_seconds(bench, a)
            if early_share and rng.random() < early_share:
                span = min(span, EARLY_SECONDS)
            plans.append(KillPlan(a, rng.uniform(0.0, span)))
        else:
            plans.append(KillPlan(None, rng.uniform(0.0, bench.clean_seconds)))
    return plans


@dataclass
class Outcome:
    scenario: str
    anchor: str | None
    delay: float
    killed: bool  # False when the process ended before the signal
    state: str  # before | after | missing | other
    phase: str
    leftovers: list[str]
    problems: list[str]
    signal: str = "SIGKILL"
    #: the process's exit status (negative: killed by that signal)
    rc: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def _phase(bench: Bench, state: str, target_parent: Path, lo: list[str], out_exists: bool) -> str:
    """Which phase the kill interrupted, read from what it left behind."""
    stage_states = [folder_state(target_parent / n) for n in lo]
    if state == "before":
        if not lo:
            return "before staging (start-up, reading, fetching)"
        if any(s == bench.after for s in stage_states):
            return "staged and validated, before the swap"
        return "staging (mirror / convert / manifest)"
    if state == "after":
        if lo:
            return "after the swap, removing the old folder"
        return "after the commit, finished"
    if state == "missing":
        return "between the two renames of the fallback swap"
    return "?"


def kill_once(bench: Bench, work: Path, plan: KillPlan, check_load: bool = True, sig: int = signal.SIGKILL) -> Outcome:
    """Run the bench's command, send ``sig`` (SIGKILL, or SIGINT as Ctrl-C does) at the plan's
    moment and judge what is left. A Ctrl-C must also leave one truthful line: "committed"
    when the folder holds the new state, "left as it was" when it does not, never a traceback."""
    target = bench.fresh(work)
    judged = bench.judged(target)
    source_before = folder_state(bench.source)
    env = cli_env(bench.spec.get("no_exchange", False))
    proc = subprocess.Popen([sys.executable, "-m", "mtpforge", *bench.args(target)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    seen: list[str] = []
    if plan.anchor is None and sig == signal.SIGKILL:
        time.sleep(plan.delay)
    else:
        # a Ctrl-C while the interpreter itself starts is Python's business, not mtpforge's:
        # timed interrupts count from mtpforge's first line
        anchor = ANCHOR_LINES[plan.anchor] if plan.anchor else re.compile("")
        for line in proc.stderr:
            seen.append(line)
            if anchor.search(line):
                break
        time.sleep(plan.delay)
    proc.send_signal(sig)
    rest = proc.stderr.read() if sig != signal.SIGKILL else ""
    rc = proc.wait()
    proc.stderr.close()
    killed = rc == (-signal.SIGKILL if sig == signal.SIGKILL else 130)
    problems: list[str] = []
    if sig != signal.SIGKILL:
        err = "".join(seen) + rest
        if "Traceback" in err or "KeyboardInterrupt" in err:
            problems.append(f"a traceback after Ctrl-C: {err[-400:]}")
        if rc not in (0, 130):
            problems.append(f"exit {rc} after Ctrl-C (expected 130, or 0 when it had finished): {err[-300:]}")

    if not judged.exists():
        state = "before" if bench.spec["output"] else "missing"
        if bench.spec.get("output_exists"):
            problems.append(f"the user's empty --output folder {judged} vanished")
        # without an exchange primitive the swap is two renames; between them the target is
        # absent and the old folder waits beside it, for the next run to put back
        if not bench.spec["output"] and not (bench.spec.get("no_exchange") and any("-old-" in n for n in leftovers(judged.parent))):
            problems.append(f"{judged} is missing after the kill")
    else:
        st = folder_state(judged)
        state = "before" if st == bench.before else "after" if st == bench.after else "other"
        if state == "other":
            changed = sorted(k for k in set(st) | set(bench.before) if st.get(k) != bench.before.get(k))
            problems.append(f"folder is neither as before nor as after: {changed[:6]}")
    if sig != signal.SIGKILL and rc == 130:
        lines = [ln for ln in ("".join(seen) + rest).splitlines() if ln.startswith("error:")]
        said = lines[-1] if lines else ""
        if len(lines) != 1:
            problems.append(f"not one error line after Ctrl-C: {lines}")
        elif state == "after" and "committed" not in said:
            problems.append(f"the folder holds the new state, but Ctrl-C said: {said}")
        elif state == "before" and "left as it was" not in said:
            problems.append(f"the folder was left as it was, but Ctrl-C said: {said}")
    lo = leftovers(judged.parent)
    phase = _phase(bench, state, judged.parent, lo, judged.exists())
    if bench.spec["output"] and folder_state(target) != folder_state_of_template(bench):
        problems.append("--output run changed the target")
    if folder_state(bench.source) != source_before:
        problems.append("the source changed")
    if bench.blobs is not None and folder_state(work / "models--t" / "blobs") != bench.blobs:
        problems.append("a blob in the Hub-cache blob store changed")
    if state == "after" and bench.spec["cmd"] == "add":
        problems += _clean_and_loads(judged, check_load)

    # the re-run finishes the job (or, when it was finished, the folder stays as it is)
    if not problems:
        if state in ("before", "missing") or (bench.spec["cmd"] == "add" and not bench.spec["output"]):
            r = run_cli(bench.args(target), env=env)
            if r.returncode != 0:
                problems.append(f"re-run failed ({r.returncode}): {r.stderr.strip()[-300:]}")
            elif folder_state(judged) != bench.after:
                problems.append("re-run did not leave the folder as a clean run does")
            elif leftovers(judged.parent):
                problems.append(f"re-run left {leftovers(judged.parent)}")
            if bench.blobs is not None and folder_state(work / "models--t" / "blobs") != bench.blobs:
                problems.append("a blob changed during the re-run")
    return Outcome(bench.name, plan.anchor, plan.delay, killed, state, phase, lo, problems,
                   "SIGKILL" if sig == signal.SIGKILL else "SIGINT", rc)


_TEMPLATE_STATES: dict[str, dict[str, str]] = {}


def folder_state_of_template(bench: Bench) -> dict[str, str]:
    key = str(bench.template)
    if key not in _TEMPLATE_STATES:
        _TEMPLATE_STATES[key] = folder_state(bench.template / bench.rel_target)
    return _TEMPLATE_STATES[key]


def _clean_and_loads(folder: Path, check_load: bool) -> list[str]:
    from mtpforge.inspect import inspect_checkpoint

    errors = [f["code"] for f in inspect_checkpoint(str(folder))["findings"] if f["severity"] == "error"]
    out = [f"inspect errors after the kill: {errors}"] if errors else []
    if check_load and not out:
        import mlx_lm

        try:
            mlx_lm.load(str(folder))
        except Exception as e:  # the finding is the point: any load failure is a defect
            out.append(f"mlx_lm.load failed: {e.__class__.__name__}: {e}")
    return out


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    killed = [o for o in outcomes if o.killed]
    by_phase: dict[str, int] = {}
    by_state: dict[str, int] = {}
    for o in killed:
        by_phase[o.phase] = by_phase.get(o.phase, 0) + 1
        by_state[o.state] = by_state.get(o.state, 0) + 1
    return {
        "runs": len(outcomes), "killed": len(killed), "intact": sum(o.ok for o in outcomes),
        "by_state": by_state, "by_phase": by_phase,
        "by_scenario": {s: sum(o.scenario == s for o in killed) for s in sorted({o.scenario for o in outcomes})},
        "by_signal": {g: sum(o.signal == g for o in killed) for g in sorted({o.signal for o in outcomes})},
        # every Ctrl-C run's exit status: 130 (interrupted), 0 (it had finished), anything else a bug
        "sigint_exits": {str(rc): sum(o.signal == "SIGINT" and o.rc == rc for o in outcomes)
                         for rc in sorted({o.rc for o in outcomes if o.signal == "SIGINT" and o.rc is not None})},
        "failures": [o.__dict__ for o in outcomes if not o.ok],
    }
