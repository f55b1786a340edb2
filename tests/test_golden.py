"""add-mtp's outputs are byte-identical to the recorded ones (tests/golden/cases.py says how they
were recorded and how to regenerate them)."""

from __future__ import annotations

import json

import pytest

from tests.golden import cases as golden

WANT = json.loads(golden.GOLDEN.read_text())
pytestmark = pytest.mark.skipif(
    WANT["versions"] != golden.versions(),
    reason=f"golden hashes were recorded with {WANT['versions']}; the targets come from mlx_lm.convert of other versions",
)


@pytest.fixture(scope="module")
def golden_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    return root, golden.build_inputs(root)


def test_every_recorded_case_is_still_generated():
    assert sorted(WANT["cases"]) == sorted(cid for cid, _ in golden.cases())


@pytest.mark.parametrize("cid,spec", list(golden.cases()), ids=[c for c, _ in golden.cases()])
def test_add_mtp_output_bytes_unchanged(golden_inputs, cid, spec):
    root, inputs = golden_inputs
    assert golden.run_case(root, inputs, cid, spec) == WANT["cases"][cid]
