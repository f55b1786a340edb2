"""Every head mtpforge writes, loaded and decoded by the real runtime it is written for.

For each (runtime x family x precision) cell the runtime's own loader and decode loop run in the
runtime's own virtualenv (``scripts/setup_runtimes.py``) on a folder written by the
``mtpforge add-mtp`` CLI from the bundled trained models (and a Qwen3-Next fixture). A cell
passes when the head loads with every tensor consumed (none missing, unexpected or mis-shaped,
values as written), the runtime's greedy MTP output equals its plain output, the backbone decodes
exactly like the same folder without a head, and the runtime drafted. Acceptance is reported as
the runtime counts it, beside ``mtpforge verify``'s.

Cells where the runtime itself refuses a head are listed in ``EXPECTED`` with the runtime's own
words: the test fails if such a cell starts to pass (the table must then change) or fails
differently. The "default-layout" cells check only that plain ``add-mtp`` output leaves the
runtime's backbone unchanged.

Run with ``pytest tests/conformance -s`` to see the matrix; it is also written as JSON to
``$MTPFORGE_CONFORMANCE_JSON`` (default ``build/conformance-matrix.json``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conformance import harness as H
from tests.conformance.harness import Cell

from tests.conformance.facts import EXPECTED, EXPECTED_DEFAULT, LAYOUT_ARGS, UNSUPPORTED  # noqa: E402


def _group(runtime: str, family: str) -> list[Cell]:
    cells = [Cell(runtime, family, prec, LAYOUT_ARGS[runtime]) for prec in H.PRECISIONS
             if (runtime, family) not in UNSUPPORTED]
    return cells + [Cell(runtime, family, "default", (), kind="default"), candidate(runtime, family)]


def candidate(runtime: str, family: str) -> Cell:
    """The default layout proposed from these measurements: a sidecar (outside every
    ``model*.safetensors`` glob, so no pinned mlx-lm sees an ``mtp.`` key), experts stacked, and
    MoE heads in bf16 (the one precision both MTPLX's templates and exo's single-precision rule
    accept)."""
    prec = "default" if family == "dense" else "bf16"
    return Cell(runtime, family, prec, ("--layout", "sidecar"), kind="candidate")


def _params(kind: str) -> list[Any]:
    out = []
    for rt in LAYOUT_ARGS:
        for fam in H.FAMILIES:
            for cell in _group(rt, fam):
                if cell.kind == kind:
                    out.append(pytest.param(cell, id=cell.id))
            if kind == "runtime" and (rt, fam) in UNSUPPORTED:
                for prec in H.PRECISIONS:
                    c = Cell(rt, fam, prec, LAYOUT_ARGS[rt])
                    out.append(pytest.param(c, id=c.id, marks=pytest.mark.skip(
                        reason=f"not supported by the runtime: {UNSUPPORTED[(rt, fam)]}")))
    return out


@pytest.fixture(scope="session")
def rows(models: H.Models, runtime_ready: Any, work_root: Path) -> Any:
    """``rows(cell) -> row``: runs the cell's whole (runtime, family) group once, in one driver."""
    done: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}

    def get(cell: Cell) -> dict[str, Any]:
        key = (cell.runtime, cell.family)
        runtime_ready(cell.runtime)
        if key not in done:
            work = work_root / f"{cell.runtime}-{cell.family}"
            done[key] = H.run_group(models, cell.runtime, cell.family, _group(*key), work)
            H.RESULTS.extend(done[key].values())
        return done[key][cell.id]

    return get


@pytest.mark.parametrize("cell", _params("runtime"))
def test_runtime_cell(cell: Cell, rows: Any) -> None:
    row = rows(cell)
    expected = EXPECTED.get(cell.id)
    if expected is not None:
        assert not row["passes"], f"{cell.id} now passes; EXPECTED says it fails with {expected!r}: update the table"
        assert expected in H.why_not(row), f"{cell.id} fails differently than measured: {H.why_not(row)}"
        return
    assert row["passes"], f"{cell.id}: {H.why_not(row)}"


@pytest.mark.parametrize("cell", _params("candidate"))
def test_candidate_default(cell: Cell, rows: Any) -> None:
    """The proposed default leaves every runtime's backbone as it was, and where the runtime
    reads the head, its MTP output equals its plain output."""
    row = rows(cell)
    assert row["passes"], f"{cell.id}: {H.why_not(row)}"
    if cell.runtime == "mtplx":  # the one installable runtime that reads a sidecar
        assert row["loads"] and row["tensors_consumed"] and (row["drafted"] or 0) > 0, H.why_not(row)


@pytest.mark.parametrize("cell", _params("default"))
def test_default_layout_backbone(cell: Cell, rows: Any) -> None:
    row = rows(cell)
    harm = EXPECTED_DEFAULT.get(cell.id)
    if harm is not None:
        assert row.get("backbone_unchanged") is not True, f"{cell.id}: measured {harm!r}, now unchanged: update the table"
        got = "BACKBONE CHANGED" if row.get("backbone_unchanged") is False else H.why_not(row)
        assert harm in got, f"{cell.id}: measured {harm!r}, now {got}"
        return
    assert row.get("backbone_unchanged") is True, f"{cell.id}: backbone changed or did not load: {H.why_not(row)}"
