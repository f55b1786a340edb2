"""Shared pytest fixtures live in their own modules; this file wires them in and ends a run with
one line per separately built program whose tests were skipped (tests/external.py), and with
the runtime conformance matrix when cells ran."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests import external

_STARTED = time.time()

pytest_plugins = ["tests.fixtures_checkpoints", "tests.fixtures_hub"]


#: why this run's xdist groups are not kept together (set by the collection hook below)
_GROUPS_LOST: list[str] = []


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """``--dist loadgroup`` keeps a group's tests on one worker by naming the group in each node id
    (``…@group``). Where that does not happen (pytest 9.2 with pytest-xdist 3.8: the id lives
    where xdist no longer writes) the groups are silently ignored: two llama-server thread pools
    on two cores, every conformance group decoded twice, a matrix missing cells."""
    if not getattr(config.option, "loadgroup", False):
        return
    lost = [i.nodeid for i in items if i.get_closest_marker("xdist_group") is not None and "@" not in i.nodeid]
    if lost:
        import xdist

        _GROUPS_LOST.append(
            f"pytest-xdist {xdist.__version__} could not keep {len(lost)} grouped tests together under pytest "
            f"{pytest.__version__}: install what pyproject.toml's dev extra allows (pip install -e '.[dev]'), or run -n 0")


#: Test modules (or node-id prefixes) that each cost a minute or more of CPU on two cores: the
#: README's test command skips them (one line at the end says how to run them) so that it holds ten
#: minutes on a fresh machine; CI (MTPFORGE_CI=1) and MTPFORGE_FULL=1 run them.
LONG: tuple[str, ...] = ("tests/test_acceptance.py", "tests/test_norm_behaviour.py", "tests/test_norm_truth_families.py",
                         "tests/conformance/", "tests/test_crash_safety.py", "tests/test_action.py",
                         "tests/test_soak_samples.py", "tests/test_remove_every_add.py", "tests/test_align_measured.py",
                         "tests/test_nonfinite_source.py::test_every_family_",
                         "tests/test_reliability_gguf.py::test_every_family_",
                         # a real terminal per case, pressed at each stage of each command (~3 min of CPU)
                         "tests/test_interrupts.py",
                         # the examples/ scripts each in a fresh interpreter; a download raced by a second run
                         "tests/test_demo.py::test_examples_run_offline",
                         "tests/test_reliability.py::test_a_second_run_while_the_first_downloads_is_refused_and_the_original_survives",
                         # mlx-vlm's own decode loop, plain and drafting, on the tiny Qwen3.8-Flash-Next
                         "tests/test_family_qwen4_exp.py::test_mlx_vlm_drafts",
                         "tests/test_family_qwen4_exp.py::test_the_bf16_drafter",
                         # and on the tiny GLM-5's glm_moe_dsa_mtp drafters, with the module's fixture (a
                         # checkpoint, mlx_lm.convert and three add-mtp runs: ~40 s of CPU)
                         "tests/test_family_glm5_mlx_vlm.py",
                         # MTPLX's step3p5_mtp on Step-3.5's MLX head (three MTP layers; a 4-bit one on one) (~1 min)
                         "tests/test_family_step3p5.py::test_add_mtp_writes", "tests/test_family_step3p5.py::test_a_quantized",
                         "tests/test_family_step3p5.py::test_norms_left",
                         # MTPLX's deepseek_mtp on DeepSeek-V3.2's and GLM-5's MLX heads (~20 s each, 6 cases)
                         "tests/test_family_dsa_mlx.py::test_mtplx_drafts",
                         # a margin under ten minutes for the README's command (about 70 s of CPU
                         # measured fresh): three bad quantizations through every command, a pytest
                         # run inside pytest, a server that never answers, a head that never drafts,
                         # the report page in a browser
                         "tests/test_inputs.py::test_a_target_quantization_mlx_cannot_build",
                         "tests/test_xdist_groups.py::test_a_group_runs_on_one_worker",
                         "tests/test_network_faults.py::test_fault_fails_in_one_line_and_leaves_everything_whole[slow forever]",
                         "tests/test_demo.py::test_demo_fails_when_the_head_does_not_draft",
                         "tests/test_verify_report.py::test_html_report_renders_in_chromium")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: Any) -> None:
    if item.nodeid.startswith(LONG) and not external.full_run():
        pytest.skip(f"{external.PREFIX}the full run: `{external.SETUP['the full run']}` runs it")
    _fail_if_groups_lost(item)


def _fail_if_groups_lost(item: Any) -> None:
    """A grouped test fails before its fixtures run when its group could not be kept together
    (an error in a pytest-xdist worker's collection reaches the user only as an internal error)."""
    if _GROUPS_LOST and item.get_closest_marker("xdist_group") is not None:
        pytest.fail(_GROUPS_LOST[0], pytrace=False)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    reasons = []
    for rep in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(rep, "longrepr", None)
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            reasons.append(str(longrepr[2]).removeprefix("Skipped: "))
    for line in external.summary(reasons):
        terminalreporter.write_line(line)
    from tests.conformance.harness import matrix_summary

    for line in matrix_summary(_STARTED):
        terminalreporter.write_line(line)
