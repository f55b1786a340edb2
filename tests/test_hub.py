"""``inspect`` and ``add-mtp`` on Hub repo ids, against the loopback hub with the real
huggingface_hub client (mtpforge runs in a subprocess with HF_ENDPOINT pointing at it).

What the server log proves: inspect reads no tensor data, add-mtp fetches at most 1.02x the
head's bytes (and reports exactly what it fetched), a second run fetches nothing, dry runs fetch
nothing, and the token travels to the server but nowhere else.
"""

from __future__ import annotations


import json
import os
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from mtpforge.checkpoint.catalogue import load_catalogue
from mtpforge.checkpoint.fetch import SLACK, plan_runs
from mtpforge.checkpoint.safetensors_header import TensorInfo
from mtpforge.checkpoint.store import LocalStore
from mtpforge import model_card
from mtpforge.layouts.table import MANIFEST
from mtpforge.pipeline import add_mtp
from tests.checkers import folder_state, written_state

VARIANTS = ["qwen3_5", "qwen3_5_moe", "qwen3_6_moe", "qwen3_next"]


def mtp_source_bytes(src: Path) -> int:
    return sum(i.nbytes for k, i in load_catalogue(LocalStore(src)).tensors.items() if k.startswith("mtp."))


def local_reference(hf: Path, tgt: Path, **kw) -> dict[str, str]:
    add_mtp(source=str(hf), target=str(tgt), progress=False, **kw)
    return written_state(tgt)


# ----------------------------------------------------------------------------- inspect

@pytest.mark.parametrize("variant", VARIANTS)
def test_inspect_repo_reads_only_headers(hub, synth, variant):
    """An MLX conversion on the Hub: same findings as the local folder, zero tensor bytes."""
    from mtpforge.inspect import inspect_checkpoint

    tgt = synth.target(variant)
    repo, _ = hub.publish(tgt)
    r = hub.run("inspect", repo)
    local = inspect_checkpoint(str(tgt))
    rep = r.json
    assert r.code == local["exit_code"], r.stderr
    for k in ("family", "layout", "config_mtp_layers", "mtp_tensors", "mtp_bytes", "norm_convention", "expert_format"):
        assert rep[k] == local[k], k
    assert [f["code"] for f in rep["findings"]] == [f["code"] for f in local["findings"]]
    assert hub.tensor_bytes(repo) == 0
    data_gets = [e for e in hub.log(repo) if e.method == "GET" and e.file and e.file.endswith(".safetensors")]
    assert data_gets and all(e.status == 206 and e.sent <= 1 << 20 for e in data_gets)


def test_inspect_raw_source_repo_reads_only_norm_tensors(hub, synth):
    """A raw HF repo: its norm convention is checked from norm tensors (a few KB), never from
    projections or experts."""
    src = synth.hf("qwen3_6_moe")
    repo, _ = hub.publish(src)
    r = hub.run("inspect", repo)
    assert r.code == 0, r.stderr
    assert r.json["layout"] == "hf" and r.json["norm_convention"] == "raw"
    spans = {(i.file, i.begin, i.end): i for i in load_catalogue(LocalStore(src)).tensors.values()}
    for e in hub.log(repo):
        if e.tensor_bytes:
            a, b = (int(x) for x in e.range.removeprefix("bytes=").split("-"))
            info = spans[(e.file, a, b + 1)]
            assert len(info.shape) == 1, info.name
    assert 0 < hub.tensor_bytes(repo) < 64 * 1024


def test_inspect_with_a_hub_source_fetches_only_its_norms(hub, synth, make_target):
    """``inspect --source org/name`` decides the norm convention exactly, from the source's norm
    tensors only (a few KB), never from its projections or experts."""
    variant = "qwen3_6_moe"
    src = synth.hf(variant)
    repo, _ = hub.publish(src)
    tgt = make_target(variant)
    add_mtp(source=str(src), target=str(tgt), precision="bf16", progress=False)
    (tgt / MANIFEST).unlink()  # no manifest: the convention must come from the source
    r = hub.run("inspect", str(tgt), "--source", repo)
    assert r.json["norm_convention"] == "shifted" and r.json["norm_convention_from"] == "source", r.stdout
    infos = {(i.file, i.begin, i.end): i for i in load_catalogue(LocalStore(src)).tensors.values()}
    got = [infos[(e.file, *(int(x) + k for k, x in enumerate(e.range.removeprefix("bytes=").split("-"))))]
           for e in hub.log(repo) if e.tensor_bytes]
    assert got and all(len(i.shape) == 1 and i.name.startswith("mtp.") for i in got), [i.name for i in got]


# ----------------------------------------------------------------------------- add-mtp

@pytest.mark.parametrize("variant", VARIANTS)
def test_add_mtp_from_hub_matches_local_and_fetches_only_the_head(hub, synth, make_target, variant):
    src = synth.hf(variant)
    repo, sha = hub.source(synth, variant)
    want = local_reference(src, make_target(variant), precision="bf16")
    tgt = make_target(variant)

    hub.server.clear_log()
    r = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--precision", "bf16")
    assert r.code == 0, r.stderr
    out = r.json
    assert written_state(tgt) == want
    assert f"[`{repo}`](https://huggingface.co/{repo}) at revision `{sha[:12]}`" in (tgt / model_card.CARD).read_text()
    head = mtp_source_bytes(src)
    fetched = hub.tensor_bytes(repo)
    assert 0 < fetched <= 1.02 * head, (fetched, head)
    assert out["fetched_bytes"] == fetched and out["fetch_mode"] == "ranges"
    assert out["revision"] == sha
    manifest = json.loads((tgt / MANIFEST).read_text())
    assert manifest["source"]["repo"] == repo and manifest["source"]["revision"] == sha
    assert all(f"/resolve/{sha}/" in e.path for e in hub.log(repo) if e.file)

    # a second run: nothing fetched, every file byte-identical
    once = folder_state(tgt)
    hub.server.clear_log()
    r2 = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--precision", "bf16")
    assert r2.code == 0 and r2.json["status"] == "already-present" and r2.json["fetched_bytes"] == 0
    assert hub.tensor_bytes(repo) == 0 and folder_state(tgt) == once

    # a fresh target with the warm cache: nothing downloaded, the same bytes written
    tgt2 = make_target(variant)
    hub.server.clear_log()
    r3 = hub.run("add-mtp", "--source", repo, "--target", str(tgt2), "--precision", "bf16")
    assert r3.code == 0 and r3.json["fetched_bytes"] == 0 and r3.json["fetch_mode"] == "cached"
    assert hub.tensor_bytes(repo) == 0
    assert folder_state(tgt2) == once


def test_add_mtp_reads_only_the_headers_of_shards_it_needs(hub, synth, make_target):
    """Of a 5-shard source with the head in the last shard, only that shard and one that shows
    the checkpoint is raw (a conv1d) are read: 2 x 2 header requests, not 5 x 2."""
    src = synth.hf("qwen3_5", n_shards=5, mtp_shards=1)
    repo, _ = hub.publish(src)
    want = local_reference(src, make_target("qwen3_5"), precision="bf16")
    tgt = make_target("qwen3_5")
    r = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--precision", "bf16")
    assert r.code == 0, r.stderr
    assert written_state(tgt) == want
    touched = {e.file for e in hub.log(repo) if e.file and e.file.endswith(".safetensors")}
    assert len(touched) == 2 and "model-00005-of-00005.safetensors" in touched, touched


def test_fetch_shards_downloads_whole_shards_into_the_hf_cache(hub, synth, make_target):
    variant = "qwen3_6_moe"
    src = synth.hf(variant)
    repo, sha = hub.source(synth, variant)
    want = local_reference(src, make_target(variant), precision="bf16")
    tgt = make_target(variant)
    r = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--precision", "bf16", "--fetch", "shards")
    assert r.code == 0, r.stderr
    assert r.json["fetch_mode"] == "shards" and written_state(tgt) == want
    assert r.json["fetched_bytes"] == hub.tensor_bytes(repo) > 1.02 * mtp_source_bytes(src)
    snap = hub.home / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / sha
    shards = {i.file for k, i in load_catalogue(LocalStore(src)).tensors.items() if k.startswith("mtp.")}
    assert sorted(p.name for p in snap.iterdir()) == sorted(shards)
    assert all(e.range is None for e in hub.log(repo) if e.method == "GET" and e.tensor_bytes)


def test_auto_falls_back_to_shards_when_range_is_ignored(hub, synth, make_target):
    variant = "qwen3_5"
    src = synth.hf(variant)
    repo, _ = hub.publish(src)
    want = local_reference(src, make_target(variant), precision="bf16")
    hub.fault("ignore_range", repo=repo, times=-1)
    tgt = make_target(variant)
    r = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--precision", "bf16")
    assert r.code == 0, r.stderr
    assert r.json["fetch_mode"] == "shards" and written_state(tgt) == want
    # the first ignored Range was noticed from its status line: the shard went over the wire
    # at most once more than the whole-shard downloads themselves
    full = [e for e in hub.log(repo) if e.method == "GET" and e.status == 200 and e.tensor_bytes]
    assert len(full) >= 2


@pytest.mark.parametrize("fetch", ["ranges", "stream", "shards"])
def test_weight_files_behind_a_redirect_as_on_the_real_hub(hub, synth, make_target, fetch):
    """The real Hub answers /resolve/ of LFS files with a 302 to a CDN URL: Range and the
    length checks must survive the redirect, in both fetch modes."""
    src = synth.hf("qwen3_5")
    repo, _ = hub.publish(src, lfs_redirect=True)
    want = local_reference(src, make_target("qwen3_5"), precision="bf16")
    tgt = make_target("qwen3_5")
    r = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--precision", "bf16", "--fetch", fetch)
    assert r.code == 0, r.stderr
    assert written_state(tgt) == want and r.json["fetch_mode"] == fetch
    log = hub.log(repo)
    assert any(e.status == 302 for e in log)
    assert all(e.path.startswith("/_lfs/") for e in log if e.tensor_bytes)
    assert r.json["fetched_bytes"] == hub.tensor_bytes(repo)
    if fetch != "shards":
        assert hub.tensor_bytes(repo) <= 1.02 * mtp_source_bytes(src)


def test_dry_run_downloads_no_tensor_data(hub, synth, make_target):
    repo, _ = hub.source(synth, "qwen3_5_moe")
    tgt = make_target("qwen3_5_moe")
    before = folder_state(tgt)
    hub.server.clear_log()
    r = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--dry-run")
    assert r.code == 0, r.stderr
    assert r.json["dry_run"] and r.json["fetch_bytes"] == mtp_source_bytes(synth.hf("qwen3_5_moe"))
    assert hub.tensor_bytes(repo) == 0 and folder_state(tgt) == before
    # the plan's request count is what the real run then makes
    planned = r.json["fetch_requests"]
    hub.server.clear_log()
    assert hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--fetch", "ranges").code == 0
    data_requests = [e for e in hub.log(repo) if e.method == "GET" and e.tensor_bytes > 0]
    assert planned == len(data_requests) > 0


def test_revision_branch_resolves_to_its_commit(hub, synth, make_hf, make_target):
    main_src, v2_src = synth.hf("qwen3_5"), synth.hf("qwen3_5", seed=7)
    repo, main_sha = hub.publish(main_src)
    _, v2_sha = hub.publish(v2_src, repo, revision="v2")
    assert main_sha != v2_sha
    want = local_reference(v2_src, make_target("qwen3_5"), precision="bf16")
    tgt = make_target("qwen3_5")
    r = hub.run("add-mtp", "--source", repo, "--revision", "v2", "--target", str(tgt), "--precision", "bf16")
    assert r.code == 0, r.stderr
    assert r.json["revision"] == v2_sha and written_state(tgt) == want
    assert json.loads((tgt / MANIFEST).read_text())["source"]["revision"] == v2_sha
    assert all(f"/resolve/{v2_sha}/" in e.path for e in hub.log(repo) if e.file)

    bad = hub.run("add-mtp", "--source", repo, "--revision", "no-such-branch", "--target", str(tgt))
    assert "no-such-branch" in bad.assert_one_line_error(2)["message"]


# ----------------------------------------------------------------------------- failures

def test_offline_with_an_empty_cache_fails_in_one_line(hub, synth, make_target):
    repo, _ = hub.source(synth, "qwen3_5")
    tgt = make_target("qwen3_5")
    before = folder_state(tgt)
    r = hub.run("add-mtp", "--source", repo, "--target", str(tgt), HF_HUB_OFFLINE="1")
    err = r.assert_one_line_error(2)
    assert err["code"] == "NETWORK" and "HF_HUB_OFFLINE" in err["message"]
    assert hub.log(repo) == [] and folder_state(tgt) == before


#: the CLI with the free-space query (the one OS boundary replaced) saying the disk of argv[1]'s
#: folder has argv[2] bytes free, every other disk plenty
_SMALL_DISK = ("import sys, mtpforge.writer.atomic as a\n"
               "small, n = sys.argv[1], int(sys.argv[2])\n"
               "a.free_bytes = lambda p: n if str(p).startswith(small) else 1 << 50\n"
               "from mtpforge.cli import app\n"
               "app(sys.argv[3:])")


@pytest.mark.parametrize("fmt", ["mlx", "gguf"])
def test_a_download_that_cannot_fit_in_the_cache_is_refused_before_it_starts(hub, synth, make_target, tmp_path, fmt):
    """A giant's download (~12 GB) and head (12-24 GB) that do not fit together on the one disk
    they share (the common case: one internal disk) are refused up front by ``--fetch ranges``,
    though the download alone would fit: NO_SPACE, one line naming the cache and the head's
    folder, the bytes needed and free; no tensor data requested, the target as it was, whichever
    format is written. ``auto`` streams instead, caching nothing: the head is written."""
    import subprocess
    import sys

    from tests.fixtures_hub import Run
    from tests.support.synth.gguf_trunk import synthetic_trunk

    repo, _ = hub.source(synth, "qwen3_5")
    if fmt == "mlx":
        tgt = make_target("qwen3_5")
    else:
        tgt = synthetic_trunk(synth.hf("qwen3_5"), tmp_path / "g" / "trunk.gguf")
    assert os.stat(tgt).st_dev == os.stat(tmp_path).st_dev  # the cache (under tmp_path) shares the target's disk
    free = mtp_source_bytes(synth.hf("qwen3_5")) + 1024  # room for the download alone
    before = folder_state(tgt.parent if fmt == "gguf" else tgt)
    small = [sys.executable, "-c", _SMALL_DISK, str(hub.home), str(free), "add-mtp", "--source", repo, "--target", str(tgt)]
    p = subprocess.run([*small, "--fetch", "ranges", "--json"], capture_output=True, text=True, env=hub.env(), timeout=300)
    err = Run(p.returncode, p.stdout, p.stderr).assert_one_line_error(1)
    assert err["code"] == "NO_SPACE" and "for the download" in err["message"] and f"{free:,} bytes free" in err["message"]
    assert "on one disk" in err["message"] and str(tgt.parent if fmt == "gguf" else tgt) in err["message"]
    assert "HF_HOME" in err["fix"] and hub.tensor_bytes(repo) == 0
    assert folder_state(tgt.parent if fmt == "gguf" else tgt) == before

    p = subprocess.run([*small, "--json"], capture_output=True, text=True, env=hub.env(), timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["status"] == "written" and out["fetch_mode"] == "stream" and out["fetched_bytes"] == hub.tensor_bytes(repo) > 0
    assert not list(hub.home.rglob("ranges")) and folder_state(tgt.parent if fmt == "gguf" else tgt) != before


def test_offline_after_one_online_run_needs_no_server(hub, synth, make_target):
    repo, _ = hub.source(synth, "qwen3_5")
    first = make_target("qwen3_5")
    assert hub.run("add-mtp", "--source", repo, "--target", str(first), "--precision", "bf16").code == 0
    hub.server.clear_log()
    tgt = make_target("qwen3_5")
    r = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--precision", "bf16", HF_HUB_OFFLINE="1")
    assert r.code == 0, r.stderr
    assert hub.log() == [] and folder_state(tgt) == folder_state(first)


def test_offline_from_a_snapshot_download_cache(hub, synth, make_target):
    """A repo fetched earlier by other HF tools (``snapshot_download``) is enough offline: the
    HF cache's snapshot stands in for the Hub, read in place."""
    import subprocess
    import sys

    src = synth.hf("qwen3_6_moe")
    repo, _ = hub.publish(src)
    p = subprocess.run([sys.executable, "-c", f"from huggingface_hub import snapshot_download; snapshot_download({repo!r})"],
                       env=hub.env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    want = local_reference(src, make_target("qwen3_6_moe"), precision="bf16")
    hub.server.clear_log()
    tgt = make_target("qwen3_6_moe")
    r = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--precision", "bf16", HF_HUB_OFFLINE="1")
    assert r.code == 0, r.stderr
    assert r.json["fetch_mode"] == "cached" and r.json["fetched_bytes"] == 0
    assert hub.log() == [] and written_state(tgt) == want


def test_unknown_repo_fails_in_one_line(hub, make_target):
    tgt = make_target("qwen3_5")
    before = folder_state(tgt)
    err = hub.run("add-mtp", "--source", "org/no-such-model", "--target", str(tgt)).assert_one_line_error(2)
    assert "org/no-such-model" in err["message"] and "not found" in err["message"]
    err = hub.run("inspect", "org/no-such-model").assert_one_line_error(2)
    assert "not found" in err["message"]
    assert folder_state(tgt) == before


def test_unreachable_endpoint_fails_in_one_line(hub, make_target):
    with socket.socket() as s:  # a loopback port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tgt = make_target("qwen3_5")
    before = folder_state(tgt)
    r = hub.run("add-mtp", "--source", "org/anything", "--target", str(tgt), HF_ENDPOINT=f"http://127.0.0.1:{port}")
    assert r.assert_one_line_error(2)["code"] == "NETWORK"
    assert folder_state(tgt) == before


def test_token_is_sent_and_never_written_or_printed(hub, synth, make_target):
    token = "hf_loopbackSECRETtoken0123456789"
    repo, _ = hub.publish(synth.hf("qwen3_5"), token=token)
    tgt = make_target("qwen3_5")

    denied = hub.run("add-mtp", "--source", repo, "--target", str(tgt))
    denied.assert_one_line_error(2)
    assert token not in denied.stdout + denied.stderr

    hub.server.clear_log()
    r = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--precision", "bf16", HF_TOKEN=token)
    assert r.code == 0, r.stderr
    entries = hub.log(repo)
    assert entries and all(e.authorization == f"Bearer {token}" for e in entries)
    assert token not in r.stdout + r.stderr
    for root in (tgt, hub.home):
        for p in root.rglob("*"):
            if p.is_file() and not p.is_symlink():
                assert token.encode() not in p.read_bytes(), p


def test_single_file_repo_without_index(hub, synth, make_target):
    """Small releases ship one model.safetensors and no index: the head is found in its header."""
    src = synth.hf("qwen3_5", n_shards=1, mtp_shards=1)
    assert not (src / "model.safetensors.index.json").exists()
    repo, _ = hub.publish(src)
    want = local_reference(src, make_target("qwen3_5"), precision="bf16")
    tgt = make_target("qwen3_5")
    r = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--precision", "bf16")
    assert r.code == 0, r.stderr
    assert written_state(tgt) == want
    assert r.json["fetched_bytes"] == hub.tensor_bytes(repo) <= 1.02 * mtp_source_bytes(src)


def test_gated_repo_fails_in_one_line(hub, synth, make_target):
    repo, _ = hub.publish(synth.hf("qwen3_5"), gated=True)
    err = hub.run("add-mtp", "--source", repo, "--target", str(make_target("qwen3_5"))).assert_one_line_error(2)
    assert "gated" in err["message"] and "HF_TOKEN" in err["fix"]


# ----------------------------------------------------------------------------- coalescing


@st.composite
def _spans(draw):
    """Wanted tensors in a few files: non-overlapping spans with random gaps (some zero)."""
    infos, n = [], 0
    for f in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(0, 100))
        for _ in range(draw(st.integers(1, 12))):
            pos += draw(st.sampled_from([0, 0, 1, 7, 300, 5000]))
            size = draw(st.integers(1, 4000))
            infos.append(TensorInfo(f"t{n}", f"f{f}", "U8", (size,), pos, pos + size))
            pos += size
            n += 1
    return infos


@settings(max_examples=200, deadline=None)
@given(_spans())
def test_runs_cover_every_tensor_within_the_slack(infos):
    runs = plan_runs(infos)
    wanted = sum(i.nbytes for i in infos)
    assert sum(r.nbytes for r in runs) <= wanted * (1 + SLACK)
    for i in infos:
        assert sum(1 for r in runs if r.file == i.file and r.start <= i.begin and i.end <= r.end) == 1, i
    for f in {r.file for r in runs}:
        mine = sorted((r.start, r.end) for r in runs if r.file == f)
        # disjoint and never touching: touching spans always share one request
        assert all(a[1] < b[0] for a, b in zip(mine, mine[1:])), mine


@settings(max_examples=200, deadline=None)
@given(_spans(), st.integers(1, 9000))
def test_runs_are_cut_between_tensors_at_the_cap(infos, cap):
    """A giant head lies in runs of gigabytes, and a run cut short is downloaded again whole, so
    runs are cut at ``cap`` bytes: every piece within it but a single larger tensor, cut only where
    a tensor begins (each tensor still in exactly one), and no byte more than without the cap."""
    runs, uncut = plan_runs(infos, cap=cap), plan_runs(infos, cap=1 << 60)
    assert sum(r.nbytes for r in runs) <= sum(r.nbytes for r in uncut)
    for i in infos:
        assert sum(1 for r in runs if r.file == i.file and r.start <= i.begin and i.end <= r.end) == 1, i
    for r in runs:
        inside = [i for i in infos if i.file == r.file and r.start <= i.begin and i.end <= r.end]
        assert r.nbytes <= cap or len(inside) == 1, (r, cap)
        assert r.start == min(i.begin for i in inside) and r.end == max(i.end for i in inside)


def test_a_background_fetch_downloads_next_what_the_conversion_waits_for(hub, tmp_path):
    """The conversion reads while the fetch downloads (checkpoint.fetch.BackgroundFetch): asked
    first for the tensor of the last shard, the fetch takes that shard's run first (or next,
    behind a first run already on its way, slowed down here), not in file order; every tensor is
    read whole and the result counts each byte once."""
    import subprocess
    import sys

    import numpy as np
    from safetensors.numpy import save_file

    folder = tmp_path / "four"
    folder.mkdir()
    names = {f"w{i}": f"model-0000{i + 1}-of-00004.safetensors" for i in range(4)}
    for i, (name, shard) in enumerate(names.items()):
        save_file({name: np.full((256, 1024), i, np.float32)}, str(folder / shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": names}))
    (folder / "config.json").write_text("{}")
    repo, _ = hub.publish(folder)
    hub.fault("slow", repo=repo, files=names["w0"], delay=1.0)
    code = (
        "import json, sys\n"
        "import numpy as np\n"
        "from mtpforge.checkpoint.catalogue import load_catalogue\n"
        "from mtpforge.checkpoint.fetch import BackgroundFetch\n"
        "from mtpforge.checkpoint.hub import open_store\n"
        "store = open_store(sys.argv[1])\n"
        "cat = load_catalogue(store)\n"
        "infos = [cat.tensors[f'w{i}'] for i in range(4)]\n"
        "bg = BackgroundFetch(store, infos, 'ranges')\n"
        "seen = []\n"
        "for i in (3, 0, 1, 2):\n"
        "    path, off, n = bg.locate(f'w{i}')\n"
        "    with open(path, 'rb') as f:\n"
        "        f.seek(off)\n"
        "        seen.append(float(np.frombuffer(f.read(n), np.float32).mean()))\n"
        "res = bg.result()\n"
        "bg.close()\n"
        "print(json.dumps({'seen': seen, 'fetched': res.fetched_bytes, 'mode': res.mode}))\n")
    hub.server.clear_log()
    p = subprocess.run([sys.executable, "-c", code, repo], env=hub.env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["seen"] == [3.0, 0.0, 1.0, 2.0] and out["mode"] == "ranges"
    assert out["fetched"] == hub.tensor_bytes(repo) == 4 * 256 * 1024 * 4
    order = [e.file for e in hub.log(repo) if e.file in names.values() and e.tensor_bytes]
    # first, or second behind a first run begun before the read asked (slow, so it cannot be more)
    assert sorted(order) == sorted(names.values()) and order.index(names["w3"]) <= 1, order
