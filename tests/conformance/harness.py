"""Conformance harness: mtpforge writes a head with its CLI, the runtime loads and decodes it in its
own virtualenv, and the result is one row of the runtime matrix.

One subprocess per cell does every check of that cell (load, head tensors consumed, plain vs MTP
greedy output, backbone vs the same folder without a head, the runtime's acceptance), so a cell
costs one interpreter start and one import of the runtime.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DRIVERS = Path(__file__).resolve().parent / "drivers"
sys.path.insert(0, str(REPO / "scripts"))
import setup_runtimes  # noqa: E402  (a script, not a package: standard library only)

DATA = REPO / "mtpforge" / "data"
FAMILIES = ("dense", "moe", "next")
FAMILY_NAMES = {"dense": "Qwen3.5 dense (trained)", "moe": "Qwen3.5 MoE (trained)", "next": "Qwen3-Next (fixture)"}
PRECISIONS = ("default", "bf16")
MAX_TOKENS = 48

#: runtimes that cannot be installed here, with what was measured of them elsewhere (SPEC §5.1)
NOT_INSTALLABLE: dict[str, str] = {
    "mlx-lm-mtp": "mlx-lm #990 is pull-request code, not on PyPI, and its repository is unreachable from "
                  "here. SPEC §5.1: loads the embedded layout (model*.safetensors glob); MoE experts only "
                  "in the source layout, unquantized; 75-97% acceptance, identical output.",
    "exo": "exo #2110 (PR head 2c33a38f) is not on PyPI, and its repository is unreachable from here. "
           "SPEC §5.1: probes mtp_file, index language_model.mtp.*, index mtp.*, bare mtp.safetensors "
           "(never mtp/weights.safetensors); experts switch_mlp only; one precision for the whole head; "
           "pins a 0.31.3 mlx-lm fork (embedded heads corrupt its backbone); mean<0.5 norm rule.",
}


@dataclass(frozen=True)
class Cell:
    runtime: str
    family: str
    precision: str
    #: extra add-mtp arguments (layout, experts, precision overrides) measured for this cell
    args: tuple[str, ...] = ()
    #: "default" = the folder plain `add-mtp` writes, checked for backbone safety only
    kind: str = "runtime"

    @property
    def id(self) -> str:
        extra = {"default": "-default-layout", "candidate": "-candidate"}.get(self.kind, "")
        return f"{self.runtime}-{self.family}-{self.precision}{extra}"


@dataclass
class Models:
    """Sources and their real ``mlx_lm.convert`` targets, built once per session."""

    root: Path
    sources: dict[str, Path] = field(default_factory=dict)
    targets: dict[str, Path] = field(default_factory=dict)
    _prompts: dict[str, list[list[int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def source(self, family: str) -> Path:
        if family not in self.sources:
            if family == "next":
                from tests.support.synth import build_hf_variant

                self.sources[family] = build_hf_variant("qwen3_next", self.root / "hf-qwen3_next")
            else:
                self.sources[family] = DATA / ("tiny-qwen3_5" if family == "dense" else "tiny-qwen3_5_moe")
        return self.sources[family]

    def prompts(self, family: str) -> list[list[int]]:
        if family not in self._prompts:
            self._prompts[family] = prompts_ids(self.target(family))
        return self._prompts[family]

    def target(self, family: str) -> Path:
        if family not in self.targets:
            from tests.support.synth import convert_to_mlx

            self.targets[family] = convert_to_mlx(self.source(family), self.root / f"mlx-{family}-4bit")
        return self.targets[family]


def prompts_ids(folder: Path) -> list[list[int]]:
    """verify's default prompts, encoded once by the folder's tokenizer so every runtime decodes
    exactly the same token ids."""
    from transformers import AutoTokenizer

    from mtpforge.verify import DEFAULT_PROMPTS

    tok = AutoTokenizer.from_pretrained(str(folder))
    return [list(map(int, tok.encode(p))) for p in DEFAULT_PROMPTS]


def mtpforge_cli(*args: str) -> dict[str, Any]:
    """The real CLI in a subprocess (as a user runs it); its --json report."""
    r = subprocess.run([sys.executable, "-m", "mtpforge", *args, "--json"], capture_output=True, text=True)
    try:
        report = json.loads(r.stdout) if r.stdout.strip() else {}
    except json.JSONDecodeError:
        report = {}
    report["_exit"] = r.returncode
    if r.returncode not in (0, 1):
        report.setdefault("error", {"message": (r.stderr or r.stdout)[-800:]})
    return report


def make_folder(models: Models, cell: Cell, work: Path) -> tuple[Path, Path | None, dict[str, Any]]:
    """Copy the shared target, add the head with the CLI; return (model folder, drafter folder, report)."""
    folder = work / "model"
    if folder.exists():
        shutil.rmtree(folder)
    drafter = work / "model-mtp-drafter"
    if drafter.exists():
        shutil.rmtree(drafter)
    shutil.copytree(models.target(cell.family), folder, symlinks=True)
    args = ["add-mtp", "--source", str(models.source(cell.family)), "--target", str(folder)]
    if cell.precision != "default":
        args += ["--precision", cell.precision]
    args += list(cell.args)
    report = mtpforge_cli(*args)
    return folder, (drafter if drafter.is_dir() else None), report


def run_driver(runtime: str, spec: dict[str, Any], work: Path, timeout: float = 900) -> dict[str, Any]:
    """The runtime's own python runs ``drivers/drive_<runtime>.py`` on ``spec``; its JSON result
    (``{"cells": {id: result}, "bare": result}``)."""
    py = setup_runtimes.venv_python(runtime)
    spec_file, out_file = work / "spec.json", work / "result.json"
    spec_file.write_text(json.dumps(spec))
    out_file.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "HF_ENDPOINT")}
    env["PYTHONPATH"] = str(DRIVERS)
    env["HF_HUB_OFFLINE"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    r = subprocess.run([str(py), str(DRIVERS / f"drive_{runtime.replace('-', '_')}.py"), str(spec_file), str(out_file)],
                       capture_output=True, text=True, timeout=timeout, env=env, cwd=work)
    if r.returncode != 0 or not out_file.is_file():
        raise AssertionError(f"driver for {runtime} broke (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(out_file.read_text())


def verify_acceptance(folder: Path) -> float | None:
    """mtpforge verify's acceptance on the same folder (bundled reference decoder, best hidden
    variant); None when mtpforge cannot decode the folder either."""
    from mtpforge.errors import MtpforgeError
    from mtpforge.verify import verify

    try:
        rep = verify(str(folder), generate=True, max_tokens=MAX_TOKENS, hidden="auto", progress=False)
    except MtpforgeError:
        return None
    return rep.get("acceptance")


#: the rows of this session's matrix, in run order (printed and written by conftest)
RESULTS: list[dict[str, Any]] = []


def summarize(res: dict[str, Any], bare_tokens: list[list[int]] | None) -> dict[str, Any]:
    """A driver's raw result for one folder (and the bare folder's tokens) -> the row's verdicts."""
    load = res.get("load") or {}
    values = res.get("values") or {}
    loaded = "stage" not in res or res["stage"] not in ("load",)
    row: dict[str, Any] = {
        "loads": bool(loaded and res.get("mtp_enabled")),
        "tensors_consumed": bool(load.get("calls")) and not (load.get("missing") or load.get("unexpected")
                                                            or load.get("misshaped")),
        "load_report": {k: load.get(k) for k in ("offered", "params", "missing", "unexpected", "misshaped",
                                                 "patched_afterwards")} if load else None,
        "values_as_written": (not values.get("differ")) and values.get("norms_as_written") is not False
        if values else None,
        "values_differ": [d["key"] for d in values.get("differ", [])],
        "identical": (res.get("mtp") == res.get("plain")) if res.get("mtp") is not None else None,
        "backbone_unchanged": (res.get("plain") == bare_tokens) if res.get("plain") is not None
        and bare_tokens is not None else None,
        "drafted": res.get("drafted"), "accepted": res.get("accepted"),
        "acceptance_runtime": (res["accepted"] / res["drafted"]) if res.get("drafted") else None,
        "error": res.get("error"), "failed_stage": res.get("stage"), "notes": res.get("notes", []),
        "standins": res.get("standins", []), "driver_seconds": res.get("seconds"),
    }
    if row["identical"] is False:
        row["first_divergence"] = _first_divergence(res["plain"], res["mtp"])
    if row["backbone_unchanged"] is False:
        row["backbone_divergence"] = _first_divergence(bare_tokens, res["plain"])
    row["passes"] = bool(row["loads"] and row["tensors_consumed"] and row["values_as_written"]
                         and row["identical"] and row["backbone_unchanged"] and (row["drafted"] or 0) > 0)
    return row


def _first_divergence(a: list[list[int]], b: list[list[int]]) -> list[dict[str, Any]]:
    """Where two runs' token lists first differ, per prompt that differs."""
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            j = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            out.append({"prompt": i, "token": j, "of": len(x)})
    return out


def why_not(row: dict[str, Any]) -> str:
    """What failed, in the runtime's own words where it raised."""
    if row.get("error"):
        return f"{row.get('failed_stage') or row.get('outcome')}: {row['error']}"
    checks = ("backbone_unchanged",) if row.get("kind") in ("default", "candidate") else \
        ("loads", "tensors_consumed", "values_as_written", "identical", "backbone_unchanged")
    bad = [k for k in checks if row.get(k) is not True]
    if row.get("kind") == "runtime" and not (row.get("drafted") or 0):
        bad.append("drafted nothing")
    return f"failed checks {bad}; load {row.get('load_report')}; values differ {row.get('values_differ')}; " \
           f"notes {row.get('notes')}; divergence {row.get('first_divergence') or row.get('backbone_divergence')}"


def cell_text(row: dict[str, Any]) -> str:
    """One matrix cell: verdict and acceptance (runtime / verify)."""
    if row.get("outcome") == "add-mtp refused":
        return f"add-mtp refused: {(row.get('error') or '')[:80]}"
    if row.get("error") and row.get("failed_stage") == "load":
        return f"LOAD FAILS: {row['error'][:110]}"
    if row.get("kind") in ("default", "candidate"):
        b = row.get("backbone_unchanged")
        head = "head not read"
        if row.get("loads"):
            head = "head loaded"
            if row.get("drafted"):
                head += f", drafts {row['acceptance_runtime']:.1%}, identical {row.get('identical')}"
        return f"backbone unchanged, {head}" if b else ("BACKBONE CHANGED" if b is False else f"FAIL {why_not(row)[:100]}")
    if not row.get("passes"):
        return f"FAIL {why_not(row)[:110]}"
    a, v = row.get("acceptance_runtime"), row.get("acceptance_verify")
    return f"ok, runtime acceptance {a:.1%}" + (f" (mtpforge verify {v:.1%})" if v is not None else "")


def matrix_lines(rows: list[dict[str, Any]], seconds: float) -> list[str]:
    lines = [f"runtime conformance matrix ({len(rows)} cells, {seconds:.0f} s)",
             f"{'runtime':10} {'family':7} {'precision':9} {'kind':8} result"]
    for r in rows:
        lines.append(f"{r['runtime']:10} {r['family']:7} {r['precision']:9} {r['kind']:8} {cell_text(r)}")
    for rt, facts in NOT_INSTALLABLE.items():
        lines.append(f"{rt:10} {'all':7} {'all':9} {'-':8} not installable here: {facts}")
    return lines


def run_group(models: Models, runtime: str, family: str, cells: list[Cell], work: Path) -> dict[str, dict[str, Any]]:
    """Write every cell's folder with the CLI, then one driver subprocess loads and decodes them
    all (plus the folder without a head); rows by cell id."""
    rows: dict[str, dict[str, Any]] = {}
    entries = []
    folders: dict[str, Path] = {}
    for cell in cells:
        cw = work / cell.id
        cw.mkdir(parents=True, exist_ok=True)
        folder, drafter, report = make_folder(models, cell, cw)
        row: dict[str, Any] = {
            "cell": cell.id, "runtime": runtime, "family": family, "precision": cell.precision,
            "kind": cell.kind, "add_mtp": " ".join(["add-mtp", *(["--precision", cell.precision]
                                                               if cell.precision != "default" else []), *cell.args]),
            "add_mtp_exit": report["_exit"], "layout": report.get("layout"),
            "add_mtp_warnings": [f.get("code") for f in report.get("findings", []) if isinstance(f, dict)],
        }
        rows[cell.id] = row
        if report["_exit"] != 0:
            row.update(outcome="add-mtp refused", passes=False,
                       error=(report.get("error") or {}).get("message") or str(report)[:300])
            continue
        folders[cell.id] = folder
        entries.append({"id": cell.id, "folder": str(folder), "drafter": str(drafter) if drafter else None,
                        "mtp": cell.kind != "default"})
    from mtpforge.verify import DEFAULT_PROMPTS

    spec = {"cells": entries, "bare": str(models.target(family)), "prompts": models.prompts(family),
            "texts": list(DEFAULT_PROMPTS), "max_tokens": MAX_TOKENS, "family": family}
    res = run_driver(runtime, spec, work) if entries else {"cells": {}}
    bare = res.get("bare") or {}
    bare_tokens = bare.get("tokens")
    for cell in cells:
        if cell.id not in res["cells"]:
            continue
        row = rows[cell.id]
        row.update(summarize(res["cells"][cell.id], bare_tokens))
        if cell.kind in ("default", "candidate"):
            row["passes"] = bool(row["backbone_unchanged"]) and row["identical"] is not False
        elif row["loads"]:
            row["acceptance_verify"] = verify_acceptance(folders[cell.id])
        if bare_tokens is None:
            row["notes"] = row.get("notes", []) + [f"bare folder failed: {bare.get('error')}"]
    return rows
