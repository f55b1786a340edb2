"""Conformance harness: mtpforge writes a head with its CLI, the runtime loads and decodes it in its
own virtualenv, and the result is one row of the runtime matrix.

One driver subprocess per (runtime, family) loads and decodes every folder of that group (load,
head tensors consumed, plain vs MTP greedy output, backbone vs the same folder without a head,
the runtime's acceptance), so a group costs one interpreter start and one import of the runtime.
``mtpforge inspect --runtime R`` runs on the same folders, and each row says whether its
prediction agrees with what the runtime did.
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

from tests.checkers import cli_in_process  # noqa: E402
from tests.conformance.facts import HEADLESS, LANES, UNSUPPORTED, VARIANTS  # noqa: E402

DATA = REPO / "mtpforge" / "data"
FAMILIES = ("dense", "moe", "next")
#: the non-Qwen families (named as ``mtpforge.families.FAMILIES`` names them): tiny models,
#: a few cells each (docs/RUNTIMES.md)
OTHER_FAMILIES = ("glm4_moe", "glm4_moe_lite", "nemotron_h", "step3p5")
FAMILY_NAMES = {"dense": "Qwen3.5 dense (trained)", "moe": "Qwen3.5 MoE (trained, fused experts)",
                "next": "Qwen3-Next (fixture)", "moepe": "Qwen3.5 MoE (fixture, per-expert experts)",
                "glm4_moe": "GLM-4.5 (trained)", "glm4_moe_lite": "GLM-4.7-Flash (trained, MLA)",
                "nemotron_h": "Nemotron-H (trained, hybrid head)", "step3p5": "Step-3.5 (random, 3 MTP layers)"}
#: the synthetic variant each fixture family is built from
FIXTURES = {"next": "qwen3_next", "moepe": "qwen3_5_moe"}
#: the non-Qwen sources: the trained tiny models (tests/data), so that a runtime's acceptance
#: is compared with verify's on heads that draft (random fixtures built by
#: ``tests.support.synth.<family>`` for a family without one)
TRAINED_OTHER = {"glm4_moe": REPO / "tests" / "data" / "tiny-glm4_moe-trained",
                 "glm4_moe_lite": REPO / "tests" / "data" / "tiny-glm4_moe_lite-trained",
                 "nemotron_h": REPO / "tests" / "data" / "tiny-nemotron_h-trained"}
#: the mlx_lm.convert arguments of each non-Qwen family's own test module (tests/test_family_*.py)
OTHER_FIXTURES: dict[str, dict[str, Any]] = {
    "glm4_moe": {"q_bits": 4, "q_group_size": 32, "dtype": "float32"},
    "glm4_moe_lite": {"q_bits": 4, "q_group_size": 64, "dtype": "float32"},
    "nemotron_h": {"q_bits": 4, "q_group_size": 32, "dtype": "float32"},
    "step3p5": {"q_bits": 4, "q_group_size": 32, "dtype": "float32"},
}
#: a fixture family's builder arguments (Step-3.5: the three MTP layers the release ships)
OTHER_BUILD: dict[str, dict[str, Any]] = {"step3p5": {"num_nextn_predict_layers": 3}}
PRECISIONS = ("default", "bf16")
#: verify's default, so the runtimes' acceptance and verify's count the same prompts and tokens
MAX_TOKENS = 64

#: runtimes that cannot be installed here, with what was measured of them elsewhere (docs/SPEC.md §5.1)
NOT_INSTALLABLE: dict[str, str] = {
    "mlx-lm-mtp": "mlx-lm #990 is pull-request code, not on PyPI, and its repository is unreachable from "
                  "here. docs/SPEC.md §5.1: loads the embedded layout (model*.safetensors glob); MoE experts only "
                  "in the source layout, unquantized; 75-97% acceptance, identical output.",
    "exo": "exo #2110 (PR head 2c33a38f) is not on PyPI, and its repository is unreachable from here. "
           "docs/SPEC.md §5.1: probes mtp_file, index language_model.mtp.*, index mtp.*, bare mtp.safetensors "
           "(never mtp/weights.safetensors); experts switch_mlp only; one precision for the whole head; "
           "pins a 0.31.3 mlx-lm fork (embedded heads corrupt its backbone); mean<0.5 norm rule.",
}


@dataclass(frozen=True)
class Cell:
    runtime: str
    family: str
    precision: str
    #: add-mtp arguments besides --source/--target (--runtime, overrides)
    args: tuple[str, ...] = ()
    #: "runtime": add-mtp --runtime R; "default": plain add-mtp; "variant": a hand-picked folder
    kind: str = "runtime"
    #: a change made by hand after add-mtp (``EDITS``), for variants
    edit: str | None = None
    #: a variant's own id
    name: str | None = None

    @property
    def id(self) -> str:
        if self.name:
            return self.name
        return f"{self.runtime}-{self.family}-{'default-output' if self.kind == 'default' else self.precision}"

    @property
    def add_args(self) -> tuple[str, ...]:
        return (("--precision", self.precision) if self.precision not in ("default", "-") else ()) + self.args


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
            if family in TRAINED_OTHER:
                self.sources[family] = TRAINED_OTHER[family]
            elif family in OTHER_FIXTURES:
                import importlib

                build = getattr(importlib.import_module(f"tests.support.synth.{family}"), f"build_{family}")
                self.sources[family] = build(self.root / f"hf-{family}", **OTHER_BUILD.get(family, {}))
            elif family in FIXTURES:
                from tests.support.synth import build_hf_variant

                self.sources[family] = build_hf_variant(FIXTURES[family], self.root / f"hf-{FIXTURES[family]}")
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

            self.targets[family] = convert_to_mlx(self.source(family), self.root / f"mlx-{family}-4bit",
                                                  **OTHER_FIXTURES.get(family, {}))
        return self.targets[family]


def head_spec(folder: Path) -> dict[str, Any]:
    """How the folder's family spells its head, from the family spec (the drivers cannot import
    mtpforge): the prefixes of its stored keys, the bare key of its hidden-state norm (the mark
    of a head), its norms' key endings and the backbone embedding's module name
    (``drivers/common.Head``)."""
    from mtpforge.families import FAMILIES as SPECS
    from mtpforge.families import Role
    from mtpforge.families.detect import detect_family
    from mtpforge.families.spec import NORM_ROLES

    cfg = json.loads((folder / "config.json").read_text())
    spec = SPECS[detect_family(cfg)]
    # a head of appended layers (Step-3.5): ``stem{N+i}.rest`` is read back as ``{i}.rest``
    steps = [spec.hf_head_prefix.split("{N}")[0], int(spec.fill("{N}", cfg))] if spec.topology.appended_steps else None
    return {"prefixes": list(spec.head_prefixes(cfg)), "mark": spec.key(Role.PRE_FC_NORM_HIDDEN),
            "norms": sorted({".".join(r.key.split(".")[-2:]) for r in spec.rows() if r.role in NORM_ROLES}),
            "embed": spec.mlx_backbone.embed, "steps": steps}


def prompts_ids(folder: Path) -> list[list[int]]:
    """verify's default prompts, encoded once by the folder's tokenizer so every runtime decodes
    exactly the same token ids."""
    from transformers import AutoTokenizer

    from mtpforge.verify import DEFAULT_PROMPTS

    tok = AutoTokenizer.from_pretrained(str(folder))
    return [list(map(int, tok.encode(p))) for p in DEFAULT_PROMPTS]


def mtpforge_cli(*args: str) -> dict[str, Any]:
    """The real CLI (argument parsing, the command, its rendering) in this process; its --json
    report. Not a second interpreter a cell: importing MLX there cost more than a tiny add-mtp
    (the command line as a user types it is tests/test_add_mtp.py's subject)."""
    code, out, err, exc = cli_in_process([*args, "--json"], 600)
    try:
        report = json.loads(out) if out.strip() else {}
    except json.JSONDecodeError:
        report = {}
    report["_exit"] = code
    if code not in (0, 1):
        report.setdefault("error", {"message": (f"{exc!r} " if exc else "") + (err or out)[-800:]})
    return report


def _drop_sidecar_reference(folder: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("mlx_lm_extra_tensors")
    (folder / "config.json").write_text(json.dumps(cfg, indent=4))


def _drop_vllm_manifest(folder: Path) -> None:
    (folder / "mtp" / "manifest.json").unlink()


#: hand edits a variant makes after add-mtp wrote the folder
EDITS = {"drop-sidecar-reference": _drop_sidecar_reference, "drop-vllm-manifest": _drop_vllm_manifest}


def make_folder(models: Models, cell: Cell, work: Path) -> tuple[Path, Path | None, dict[str, Any]]:
    """Copy the shared target, add the head with the CLI; return (model folder, drafter folder, report)."""
    folder = work / "model"
    if folder.exists():
        shutil.rmtree(folder)
    drafter = work / "model-mtp-drafter"
    if drafter.exists():
        shutil.rmtree(drafter)
    shutil.copytree(models.target(cell.family), folder, symlinks=True)
    args = ["add-mtp", "--source", str(models.source(cell.family)), "--target", str(folder), *cell.add_args]
    report = mtpforge_cli(*args)
    if cell.edit and report["_exit"] == 0:
        EDITS[cell.edit](folder)
    return folder, (drafter if drafter.is_dir() else None), report


def runtime_python(runtime: str) -> Path:
    """Released mlx-lm runs in mtpforge's own environment; the others in their own venvs."""
    return Path(sys.executable) if runtime in HEADLESS else setup_runtimes.venv_python(runtime)


def run_driver(runtime: str, spec: dict[str, Any], work: Path, timeout: float = 900) -> dict[str, Any]:
    """The runtime's own python runs ``drivers/drive_<runtime>.py`` on ``spec``; its JSON result
    (``{"cells": {id: result}, "bare": result}``)."""
    py = runtime_python(runtime)
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


def verify_figures(folder: Path) -> dict[str, Any]:
    """mtpforge verify on the same folder (bundled reference decoder, best hidden variant): its
    acceptance, its (accepted, drafted) counts and whether its MTP decode equals its plain one;
    all None when mtpforge cannot decode the folder either."""
    from mtpforge.errors import MtpforgeError
    from mtpforge.verify import verify

    try:
        rep = verify(str(folder), generate=True, max_tokens=MAX_TOKENS, hidden="auto", progress=False)
    except MtpforgeError:
        rep = {}
    return {"acceptance_verify": rep.get("acceptance"), "verify_counts": [rep.get("accepted"), rep.get("drafted")],
            "verify_identical": rep.get("identical")}


def summarize(res: dict[str, Any], bare_tokens: list[list[int]] | None) -> dict[str, Any]:
    """A driver's raw result for one folder (and the bare folder's tokens) -> the row's checks."""
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
        "values_differ": [d["key"] for d in values.get("differ", [])], "values_compared": values.get("compared"),
        "identical": (res.get("mtp") == res.get("plain")) if res.get("mtp") is not None else None,
        "backbone_unchanged": (res.get("plain") == bare_tokens) if res.get("plain") is not None
        and bare_tokens is not None else None,
        "drafted": res.get("drafted"), "accepted": res.get("accepted"), "depth1_counts": res.get("depth1"),
        "acceptance_runtime": (res["accepted"] / res["drafted"]) if res.get("drafted") else None,
        "error": res.get("error"), "failed_stage": res.get("stage"), "notes": res.get("notes", []),
        "standins": res.get("standins", []), "driver_seconds": res.get("seconds"),
    }
    if row["identical"] is False:
        row["first_divergence"] = _first_divergence(res["plain"], res["mtp"])
    if row["backbone_unchanged"] is False:
        row["backbone_divergence"] = _first_divergence(bare_tokens, res["plain"])
    return row


def runtime_verdict(row: dict[str, Any]) -> str:
    """What the runtime did with the folder: ``works`` (loads every tensor as written, drafts,
    backbone unchanged), ``costs`` (works, but re-shifted values: lower acceptance) or ``fails``.
    A runtime that reads no head works when its backbone is unchanged. Greedy identity is not
    part of it: verification makes it hold for any head, so a difference is the runtime's."""
    backbone = row.get("backbone_unchanged") is True and not row.get("error")
    if row["runtime"] in HEADLESS:
        return "works" if backbone else "fails"
    if not (backbone and row.get("loads") and row.get("tensors_consumed") and (row.get("drafted") or 0) > 0):
        return "fails"
    return "works" if row.get("values_as_written") else "costs"


def inspect_verdict(report: dict[str, Any]) -> str:
    """What ``inspect --runtime R`` predicts, in the same three words."""
    findings = report.get("findings", [])
    if any(f["severity"] == "error" for f in findings):
        return "fails"
    return "costs" if any(f["code"] == "RUNTIME_RESHIFTS_NORMS" for f in findings) else "works"


def inspect_for(folder: Path, runtime: str) -> dict[str, Any]:
    """``mtpforge inspect --runtime R`` (in process) on the folder the runtime was given."""
    from mtpforge.inspect import inspect_checkpoint

    rep = inspect_checkpoint(str(folder), runtime=runtime)
    return {"verdict": inspect_verdict(rep),
            "findings": [f"{f['code']} ({f['severity']})" for f in rep["findings"] if f["severity"] != "info"]}


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
    checks = ("backbone_unchanged",) if row["runtime"] in HEADLESS else \
        ("loads", "tensors_consumed", "values_as_written", "identical", "backbone_unchanged")
    bad = [k for k in checks if row.get(k) is not True]
    if row["runtime"] not in HEADLESS and not (row.get("drafted") or 0):
        bad.append("drafted nothing")
    return f"failed checks {bad}; load {row.get('load_report')}; values differ {row.get('values_differ')}; " \
           f"notes {row.get('notes')}; divergence {row.get('first_divergence') or row.get('backbone_divergence')}"


def cell_text(row: dict[str, Any]) -> str:
    """One matrix cell: what the runtime did, its acceptance (and verify's), inspect's agreement."""
    agree = row.get("inspect") or {}
    tail = f" | inspect: {agree.get('verdict')}{' (agrees)' if agree.get('verdict') == row.get('verdict') else ' (DISAGREES)'}" \
        if agree else ""
    if row.get("outcome") == "add-mtp refused":
        plain = row.get("inspect_plain")
        said = f" | inspect on plain add-mtp: {', '.join(plain['findings']) or 'nothing'}" if plain else ""
        return f"add-mtp refused: {(row.get('error') or '')[:110]}{said}"
    if row.get("error") and row.get("failed_stage") in ("load", "load without head"):
        return f"LOAD FAILS: {row['error'][:100]}{tail}"
    if row["runtime"] in HEADLESS:
        return ("loads, backbone unchanged" if row.get("backbone_unchanged") else f"FAIL {why_not(row)[:100]}") + tail
    if not row.get("loads") or not (row.get("drafted") or 0):
        b = {True: "backbone unchanged", False: "BACKBONE CHANGED"}.get(row.get("backbone_unchanged"), "backbone ?")
        what = "head not read" if not row.get("loads") else "head loaded, never drafts"
        return f"{b}, {what}{tail}"
    a, v = row.get("acceptance_runtime"), row.get("acceptance_verify")
    head = "ok" if row.get("passes") else f"FAIL {why_not(row)[:80]}"
    if row.get("verdict") == "works" and row.get("identical") is False:  # loads and drafts as written
        head = f"ok, but its MTP output differs from its own plain output at {row['first_divergence']}"
    return f"{head}, runtime {a:.1%}" + (f" (verify {v:.1%})" if v is not None else "") + tail


def expected_verdict(row: dict[str, Any]) -> str:
    """What the suite's tables say this cell does: a hand-broken variant's measured verdict, a
    family the runtime does not support fails, every other cell works."""
    if row.get("kind") == "variant" and row["cell"] in VARIANTS:
        return VARIANTS[row["cell"]][-1]
    if row.get("kind") == "runtime" and (row["runtime"], row["family"]) in UNSUPPORTED:
        return "fails"
    return "works"


def matrix_lines(rows: list[dict[str, Any]], seconds: float) -> list[str]:
    """The printed matrix. A cell meant to fail or cost acceptance (a hand-broken variant, a family
    the runtime lacks) that does so reads "expected:", so only a surprise reads as a failure."""
    lines = [f"runtime conformance matrix ({len(rows)} cells, {seconds:.0f} s)",
             f"{'cell':34} {'add-mtp':46} result"]
    for r in rows:
        want = expected_verdict(r)
        mark = f"expected ({want}): " if want != "works" and r.get("verdict") == want else ""
        lines.append(f"{r['cell']:34} {r['add_mtp'][:46]:46} {mark}{cell_text(r)}")
    for rt, lane in LANES.items():
        lines.append(f"{rt:34} {'(lane)':46} {lane}")
    for rt, facts in NOT_INSTALLABLE.items():
        lines.append(f"{rt:34} {'(all)':46} not installable here: {facts}")
    return lines


def matrix_path() -> Path:
    return Path(os.environ.get("MTPFORGE_CONFORMANCE_JSON") or REPO / "build" / "conformance-matrix.json")


def _groups_dir() -> Path:
    return matrix_path().with_name(matrix_path().stem + "-groups")


def record_group(runtime: str, family: str, rows: list[dict[str, Any]], seconds: float) -> None:
    """One (runtime, family) group's rows, written the moment its driver run ends, by whichever
    pytest-xdist worker ran it: the run's summary (in the controller, which runs no cells) reads
    every group file of this run, so no process's copy of the matrix overwrites another's."""
    out = _groups_dir() / f"{runtime}--{family}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"seconds": round(seconds, 1), "cells": rows}, indent=1, default=str))
    os.replace(tmp, out)


def matrix_summary(since: float) -> list[str]:
    """The matrix of the cells this run decoded (the group files written after ``since``, in the
    order they were written), also written whole to ``matrix_path()``."""
    folder = _groups_dir()
    files = sorted((f for f in folder.glob("*.json") if f.stat().st_mtime >= since),
                   key=lambda f: f.stat().st_mtime) if folder.is_dir() else []
    if not files:
        return []
    groups = [json.loads(f.read_text()) for f in files]
    cells = [row for g in groups for row in g["cells"]]
    seconds = sum(g["seconds"] for g in groups)
    out = matrix_path()
    out.write_text(json.dumps({"seconds": round(seconds, 1), "cells": cells, "not_installable": NOT_INSTALLABLE},
                              indent=1, default=str))
    return [*matrix_lines(cells, seconds), f"matrix written to {out}"]


def _write_all(models: Models, cells: list[Cell], work: Path) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]],
                                                                      dict[str, Path]]:
    """Every cell's folder written with the CLI: (rows, driver entries, folder inspect reads)."""
    rows: dict[str, dict[str, Any]] = {}
    entries, folders = [], {}
    for cell in cells:
        cw = work / cell.id
        cw.mkdir(parents=True, exist_ok=True)
        folder, drafter, report = make_folder(models, cell, cw)
        row: dict[str, Any] = {
            "cell": cell.id, "runtime": cell.runtime, "family": cell.family, "precision": cell.precision,
            "kind": cell.kind, "add_mtp": " ".join(["add-mtp", *cell.add_args]) + (f" + {cell.edit}" if cell.edit else ""),
            "add_mtp_exit": report["_exit"], "layout": report.get("layout"), "add_mtp_notes": report.get("notes", []),
        }
        rows[cell.id] = row
        if report["_exit"] != 0:
            row.update(outcome="add-mtp refused", passes=False, verdict="fails",
                       error=(report.get("error") or {}).get("message") or str(report)[:300])
            row["inspect_plain"] = _inspect_plain(models, cell, cw)
            continue
        folders[cell.id] = drafter or folder
        entries.append({"id": cell.id, "folder": str(folder), "drafter": str(drafter) if drafter else None})
    return rows, entries, folders


def _inspect_plain(models: Models, cell: Cell, work: Path) -> dict[str, Any] | None:
    """Where add-mtp --runtime R refused: ``inspect --runtime R`` on what plain add-mtp writes
    (the folder such a user has), None when plain add-mtp refuses too."""
    folder, drafter, report = make_folder(models, Cell(cell.runtime, cell.family, "-", (), kind="default"), work)
    return inspect_for(drafter or folder, cell.runtime) if report["_exit"] == 0 else None


def run_group(models: Models, runtime: str, family: str, cells: list[Cell], work: Path) -> dict[str, dict[str, Any]]:
    """Write every cell's folder with the CLI, then one driver subprocess loads and decodes them
    all (plus the folder without a head); inspect --runtime reads each; rows by cell id."""
    from mtpforge.verify import DEFAULT_PROMPTS

    rows, entries, folders = _write_all(models, cells, work)
    spec = {"cells": entries, "bare": str(models.target(family)), "prompts": models.prompts(family),
            "texts": list(DEFAULT_PROMPTS), "max_tokens": MAX_TOKENS, "family": family,
            "head": head_spec(models.target(family))}
    res = run_driver(runtime, spec, work) if entries else {"cells": {}}
    bare = res.get("bare") or {}
    for cell in cells:
        if cell.id not in res["cells"]:
            continue
        row = rows[cell.id]
        row.update(summarize(res["cells"][cell.id], bare.get("tokens")))
        row["passes"] = runtime_verdict(row) != "fails" and (row["identical"] is not False or runtime in HEADLESS)
        row["verdict"] = runtime_verdict(row)
        row["inspect"] = inspect_for(folders[cell.id], runtime)
        # verify beside the non-Qwen families' drafting cells and mlx-vlm's (its one-draft-a-round
        # counts), where the runtime's counts are held to it (test_runtimes); beside the other Qwen
        # cells' only when asked (VERIFY_ALL_ENV): there the figure is shown, not judged —
        # tests/test_acceptance.py holds verify's own
        if (family in OTHER_FAMILIES or row.get("depth1_counts") is not None
                or (cell.kind == "runtime" and os.environ.get(VERIFY_ALL_ENV) == "1")) \
                and row["loads"] and runtime not in HEADLESS:
            row.update(verify_figures(Path(entry_folder(entries, cell.id))))
        if bare.get("tokens") is None:
            row["notes"] = row.get("notes", []) + [f"bare folder failed: {bare.get('error')}"]
    return rows


#: set to 1 for verify's acceptance beside every drafting cell of the matrix (about two minutes
#: more on two cores)
VERIFY_ALL_ENV = "MTPFORGE_CONFORMANCE_VERIFY"


def entry_folder(entries: list[dict[str, Any]], cid: str) -> str:
    return next(e["folder"] for e in entries if e["id"] == cid)
