"""The network fault matrix (issue 7), from the loopback hub with the real huggingface_hub client.

Each fault either heals — ``add-mtp`` finishes with exactly the bytes of a clean run — or fails
with one clear line (exit 2, no traceback) and the target byte-identical. Either way the range
cache holds only complete entries, and a following clean run succeeds fetching only what is
missing. Timeouts and retry waits are shortened through the environment so the file runs fast.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtpforge.checkpoint.catalogue import load_catalogue
from mtpforge.checkpoint.store import LocalStore
from mtpforge.pipeline import add_mtp
from tests.support.synth.hub_server import API
from tests.checkers import folder_state, written_state

VARIANT = "qwen3_5"
FAST = {"HF_HUB_DOWNLOAD_TIMEOUT": "1", "HF_HUB_ETAG_TIMEOUT": "2", "MTPFORGE_HTTP_RETRY_WAIT": "0.02"}
LAST_SHARD = "model-00003-of-00003.safetensors"

#: faults that a run must heal: name -> (fault kwargs, extra CLI args)
HEALS = {
    "dropped mid-body": dict(kind="drop", times=2, fraction=0.5),
    "dropped during a header read": dict(kind="drop", times=1, fraction=0.5, data_only=False),
    "5xx twice": dict(kind="status", status=503, times=2),
    "5xx on model_info": dict(kind="status", status=502, times=2, files=API, data_only=False),
    "429 with Retry-After": dict(kind="429", retry_after=1, times=1),
    "truncated body": dict(kind="truncate", times=2, fraction=0.3),
    "slow past the timeout once": dict(kind="slow", delay=2.5, times=1),
    "Range ignored (auto -> shards)": dict(kind="ignore_range", times=-1),
}
#: faults a run cannot get past: name -> (fault kwargs, extra CLI args)
FAILS = {
    "5xx forever on the last shard": (dict(kind="status", status=503, times=-1, files=LAST_SHARD), ()),
    "slow forever": (dict(kind="slow", delay=2.5, times=-1), ()),
    "truncated to nothing forever": (dict(kind="truncate", times=-1, fraction=0.0, files=LAST_SHARD), ()),
    "Range ignored with --fetch ranges": (dict(kind="ignore_range", times=-1), ("--fetch", "ranges")),
    "5xx forever on model_info": (dict(kind="status", status=500, times=-1, files=API, data_only=False), ()),
}


@pytest.fixture(scope="module")
def clean(synth, tmp_path_factory) -> dict[str, str]:
    """What a clean run writes (from the local source: the bytes must not depend on the network)."""
    import shutil

    tgt = tmp_path_factory.mktemp("clean") / "t"
    shutil.copytree(synth.target(VARIANT), tgt)
    add_mtp(source=str(synth.hf(VARIANT)), target=str(tgt), precision="bf16", progress=False)
    return written_state(tgt)


def head_bytes(synth) -> int:
    return sum(i.nbytes for k, i in load_catalogue(LocalStore(synth.hf(VARIANT))).tensors.items() if k.startswith("mtp."))


def cache_files(home: Path) -> tuple[int, list[Path]]:
    """(bytes of complete cached runs, leftover temp files); asserts every entry is whole."""
    total, parts = 0, []
    for p in (home / "hub" / "mtpforge-ranges").rglob("*"):
        if p.name.endswith(".part"):
            parts.append(p)
        m = re.match(r"^(\d+)-(\d+)\.bin$", p.name)
        if m:
            assert p.stat().st_size == int(m.group(2)) - int(m.group(1)), p
            total += p.stat().st_size
    return total, parts


def add(hub, repo: str, tgt: Path, *extra: str):
    return hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--precision", "bf16", *extra, **FAST)


@pytest.mark.parametrize("name", list(HEALS))
def test_fault_heals_with_the_bytes_of_a_clean_run(hub, synth, make_target, clean, name):
    repo, _ = hub.source(synth, VARIANT)
    fault = hub.fault(repo=repo, **HEALS[name])
    tgt = make_target(VARIANT)
    r = add(hub, repo, tgt)
    assert r.code == 0, r.stderr
    assert fault.fired >= 1, "the fault never hit: the test proves nothing"
    assert written_state(tgt) == clean
    out = r.json
    log = hub.log(repo)
    cached, parts = cache_files(hub.home)
    assert parts == []
    if out["fetch_mode"] == "ranges":
        assert cached == head_bytes(synth)  # every run cached, whole
        assert head_bytes(synth) <= out["fetched_bytes"] <= hub.tensor_bytes(repo)
    if HEALS[name]["kind"] in ("drop", "truncate"):
        # resumed from the bytes already received, not restarted
        def start(e) -> int:
            return int(e.range.split("=")[1].split("-")[0])

        for k, e in enumerate(log):
            if e.fault == HEALS[name]["kind"]:
                nxt = [start(x) for x in log[k + 1:] if x.file == e.file and x.range]
                assert nxt and start(e) < nxt[0] <= start(e) + e.sent, (e, nxt)
    if HEALS[name]["kind"] == "ignore_range":
        assert out["fetch_mode"] == "shards"


@pytest.mark.parametrize("name", list(FAILS))
def test_fault_fails_in_one_line_and_leaves_everything_whole(hub, synth, make_target, clean, name):
    repo, _ = hub.source(synth, VARIANT)
    kw, extra = FAILS[name]
    fault = hub.fault(repo=repo, **kw)
    tgt = make_target(VARIANT)
    before = folder_state(tgt)
    r = add(hub, repo, tgt, *extra)
    err = r.assert_one_line_error(2)
    assert err["code"] == "NETWORK" and err["fix"], err
    assert fault.fired >= 1
    assert folder_state(tgt) == before
    cached, parts = cache_files(hub.home)
    assert parts == [], "a temp file of a failed transfer was left behind"
    assert cached < head_bytes(synth)

    # the network is back: the next run succeeds and fetches only what is missing
    hub.server.clear_faults()
    hub.server.clear_log()
    r2 = add(hub, repo, tgt)
    assert r2.code == 0, r2.stderr
    assert written_state(tgt) == clean
    total, _ = cache_files(hub.home)
    assert r2.json["fetched_bytes"] == hub.tensor_bytes(repo) == total - cached


def test_inspect_reads_headers_even_when_range_is_ignored(hub, synth):
    """A server that answers Range with the whole file: inspect takes the header bytes from the
    start of the stream and hangs up, with the same report as against a well-behaved server."""
    repo, _ = hub.publish(synth.target(VARIANT))
    clean_report = hub.run("inspect", repo, hf_home=hub.home / "a", **FAST)
    fault = hub.fault("ignore_range", repo=repo, times=-1, data_only=False)
    r = hub.run("inspect", repo, hf_home=hub.home / "b", **FAST)
    assert fault.fired >= 2 and r.code == clean_report.code == 1
    assert r.json == clean_report.json
