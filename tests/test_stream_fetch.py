"""``--fetch stream``: the head's bytes held in memory in the conversion's order, nothing cached.

What the tests prove: a weight and its block scale are one request and the order is the reader's;
the memory held stays within the window while a reader walks the tensors, a tensor is dropped once
read whole and downloaded again (and counted) if read once more; from the loopback Hub, add-mtp
writes the same bytes as with ``--fetch ranges`` for an MLX and a GGUF head, fetches ≤ 1.02× the
head, leaves no range cache behind and makes the requests ``--dry-run`` said it would; a server
that ignores Range, or a body cut short, fails in one line with nothing written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mtpforge.checkpoint.safetensors_header import TensorInfo
from mtpforge.checkpoint.hub import READ_SIZE
from mtpforge.checkpoint.stream_fetch import stream_groups
from mtpforge.writer.ahead import WORKERS
from tests.checkers import folder_state
from tests.test_hub import local_reference, mtp_source_bytes


def _info(name: str, file: str, begin: int, end: int) -> TensorInfo:
    return TensorInfo(name=name, file=file, dtype="F32", shape=((end - begin) // 4,), begin=begin, end=end)


def test_a_tensor_and_its_scale_are_one_request_in_the_readers_order() -> None:
    w1, s1 = _info("e1.weight", "a", 100, 200), _info("e1.weight_scale_inv", "a", 200, 208)
    w0, s0 = _info("e0.weight", "a", 0, 92), _info("e0.weight_scale_inv", "a", 92, 100)
    other = _info("x", "b", 0, 40)
    groups = stream_groups([s1, w1, other, s0, w0])
    assert [(g.run.file, g.run.start, g.run.end) for g in groups] == [("a", 100, 208), ("b", 0, 40), ("a", 0, 100)]
    assert [[t.name for t in g.tensors] for g in groups] == [["e1.weight_scale_inv", "e1.weight"], ["x"],
                                                            ["e0.weight_scale_inv", "e0.weight"]]
    # neighbours in the file but not in the reader's order stay apart; a cap cuts a join
    assert len(stream_groups([w0, other, s0])) == 3
    assert len(stream_groups([s1, w1], cap=100)) == 2


_READER = r"""
import json, sys, threading
import numpy as np
from mtpforge.checkpoint.catalogue import load_catalogue
from mtpforge.checkpoint.hub import open_store
from mtpforge.checkpoint import stream_fetch
store = open_store(sys.argv[1])
cat = load_catalogue(store)
infos = [cat.tensors[f"w{i}"] for i in range(6)]
window = 5 * infos[0].nbytes // 2
sf = stream_fetch.StreamFetch(store, infos, window=window)
peak = 0
def watch(stop):
    global peak
    while not stop.is_set():
        peak = max(peak, sf._held_bytes)
stop = threading.Event(); t = threading.Thread(target=watch, args=(stop,), daemon=True); t.start()
seen = []
for i in (0, 1, 2, 3, 4, 5):
    n = infos[i].nbytes
    step = (n // 3 // 4 + 1) * 4  # three reads, the last shorter
    parts = [np.frombuffer(sf.read(infos[i], a, min(a + step, n)), np.float32) for a in range(0, n, step)]
    seen.append(float(np.concatenate(parts).mean()))
again = float(np.frombuffer(sf.read(infos[2], 0, 16), np.float32).mean())
res = sf.result(); stop.set(); t.join(); sf.close()
from httpcore2._sync.http11 import HTTP11Connection
print(json.dumps({"seen": seen, "again": again, "peak": peak, "window": window, "one": infos[0].nbytes,
                  "read_size": HTTP11Connection.READ_NUM_BYTES,
                  "fetched": res.fetched_bytes, "mode": res.mode, "requests": res.requests}))
"""


def test_the_memory_held_stays_within_the_window_and_a_dropped_tensor_comes_again(hub, tmp_path: Path) -> None:
    from safetensors.numpy import save_file
    import numpy as np

    folder = tmp_path / "six"
    folder.mkdir()
    save_file({f"w{i}": np.full((256, 1024), i, np.float32) for i in range(6)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    repo, _ = hub.publish(folder)
    hub.server.clear_log()
    p = subprocess.run([sys.executable, "-c", _READER, repo], env=hub.env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["seen"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and out["again"] == 2.0
    # the HTTP client reads its socket in hub.READ_SIZE pieces (a client version without the
    # attribute would read 64 KiB again: this says so the day it changes)
    assert out["read_size"] == READ_SIZE
    # the window and at most the one tensor past it a waiting reader asks for
    assert 0 < out["peak"] <= out["window"] + out["one"], out
    assert out["mode"] == "stream" and out["requests"] == 7
    assert out["fetched"] == hub.tensor_bytes(repo) == 6 * out["one"] + 16
    assert not list(hub.home.rglob("ranges"))  # the range cache's folder: nothing downloaded went to disk


def test_add_mtp_streams_the_same_head_and_caches_nothing(hub, synth, make_target) -> None:
    src = synth.hf("qwen3_5_moe")
    repo, _ = hub.source(synth, "qwen3_5_moe")
    want = local_reference(src, make_target("qwen3_5_moe"), precision="bf16")
    tgt = make_target("qwen3_5_moe")
    dry = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--precision", "bf16", "--fetch", "stream", "--dry-run")
    assert dry.code == 0, dry.stderr
    hub.server.clear_log()
    r = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--precision", "bf16", "--fetch", "stream")
    assert r.code == 0, r.stderr
    assert r.json["fetch_mode"] == "stream"
    head = mtp_source_bytes(src)
    assert 0 < r.json["fetched_bytes"] == hub.tensor_bytes(repo) <= 1.02 * head
    requests = [e for e in hub.log(repo) if e.tensor_bytes]
    assert len(requests) == dry.json["fetch_requests"] > 1
    assert not list(hub.home.rglob("ranges")) and not list(hub.home.rglob("*.part"))
    from tests.checkers import written_state

    assert written_state(tgt) == want
    # the same run again: the head is there already, nothing is downloaded
    once = folder_state(tgt)
    hub.server.clear_log()
    again = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--precision", "bf16", "--fetch", "stream")
    assert again.code == 0 and again.json["status"] == "already-present" and hub.tensor_bytes(repo) == 0
    assert folder_state(tgt) == once


@pytest.mark.parametrize("fault", ["ignore_range", "truncate"])
def test_a_stream_that_cannot_complete_fails_in_one_line_and_writes_nothing(hub, synth, make_target, fault) -> None:
    repo, _ = hub.publish(synth.hf("qwen3_5"))
    tgt = make_target("qwen3_5")
    before = folder_state(tgt)
    hub.fault(fault, times=99)
    r = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--fetch", "stream")
    err = r.assert_one_line_error(r.code)
    assert r.code != 0 and err["code"] == "NETWORK"
    if fault == "ignore_range":
        assert "--fetch shards" in err["fix"]
    assert folder_state(tgt) == before


@pytest.mark.parametrize("fmt", ["mlx", "gguf"])
def test_the_conversion_reads_the_source_in_the_order_the_stream_downloads_it(tmp_path: Path, fmt: str, monkeypatch) -> None:
    """The window bounds memory only while the conversion reads in the fetch list's order (a read
    far out of order is downloaded past the window): each format's conversion of a block-FP8 MoE
    head (DeepSeek-V3.2's) first reads every source tensor within a few places of where
    ``to_fetch`` has it (the conversion's jobs run a few row blocks ahead, each slice's block scale
    read as its job is queued), each block scale listed just before its weight."""
    from mtpforge import source as source_module
    from mtpforge.options import AddOptions
    from mtpforge.pipeline import execute, plan_add_mtp
    from tests.support.families import mlx_trunk, tiny_source
    from tests.support.synth.deepseek_v32 import build_deepseek_v32_fp8
    from tests.support.synth.gguf_trunk import synthetic_trunk

    fp8 = build_deepseek_v32_fp8(tmp_path / "fp8")
    if fmt == "mlx":
        target = mlx_trunk("deepseek_v32", tiny_source("deepseek_v32", tmp_path / "src"), tmp_path / "mlx")
    else:
        target = synthetic_trunk(fp8, tmp_path / "g" / "trunk.gguf", name="Tiny-DeepSeek-V3.2")
    seen: list[str] = []
    real = source_module.SourceBytes.read

    def recorded(self, info, a, b):  # the real read, its tensor's name noted on the way
        if info.name not in seen:
            seen.append(info.name)
        return real(self, info, a, b)

    monkeypatch.setattr(source_module.SourceBytes, "read", recorded)
    plan = plan_add_mtp(AddOptions(source=str(fp8), target=str(target)), progress=False)
    execute(plan, progress=False)
    order = [i.name for i in plan.to_fetch]
    assert sorted(seen) == sorted(order) and len(order) > 20 and any(n.endswith("weight_scale_inv") for n in order)
    ahead = max(abs(seen.index(n) - k) for k, n in enumerate(order))
    assert ahead <= 2 * (WORKERS + 1), (ahead, seen, order)
    scales = [k for k, n in enumerate(order) if n.endswith("_scale_inv")]
    assert all(order[k + 1] == order[k].removesuffix("_scale_inv") for k in scales)


_CONNECTIONS = r"""
import json, sys
from mtpforge.checkpoint.catalogue import load_catalogue
from mtpforge.checkpoint.hub import open_store
from mtpforge.checkpoint import stream_fetch
store = open_store(sys.argv[1])
cat = load_catalogue(store)
infos = [cat.tensors[f"w{i}"] for i in range(16)]
sf = stream_fetch.StreamFetch(store, infos, window=4 * infos[0].nbytes)  # a request a tensor
ok = all(bytes(sf.read(i, 0, 4)) == bytes(sf.read(i, 0, 4)) for i in infos)
res = sf.result(); sf.close()
print(json.dumps({"connections": sf.connections, "requests": res.requests, "ok": ok}))
"""


@pytest.mark.parametrize("slow", [False, True])
def test_a_second_connection_opens_only_where_requests_wait_for_their_first_byte(hub, tmp_path: Path, slow: bool) -> None:
    """One connection where the first byte comes at once (each connection more costs CPU); more,
    up to ``CONNECTIONS``, where every answer waits (a CDN round trip) — what hides the wait: one
    more after each ``SLOW_STARTS`` slow answers in a row."""
    import numpy as np
    from safetensors.numpy import save_file

    from mtpforge.checkpoint.stream_fetch import CONNECTIONS

    folder = tmp_path / "sixteen"
    folder.mkdir()
    save_file({f"w{i}": np.full((64, 1024), i, np.float32) for i in range(16)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    repo, _ = hub.publish(folder)
    if slow:
        hub.fault("slow", repo=repo, delay=0.3, times=-1)
    p = subprocess.run([sys.executable, "-c", _CONNECTIONS, repo], env=hub.env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] and out["requests"] == 16
    assert out["connections"] == (CONNECTIONS if slow else 1), out


def test_a_request_buffer_is_used_again_only_once_no_view_of_it_lives() -> None:
    """A conversion job's array over a tensor's bytes keeps its buffer from the next request (the
    bytes would change under it); once the array is gone, the buffer is taken again."""
    import numpy as np

    from mtpforge.checkpoint.stream_fetch import _Buffers

    pool = _Buffers(keep=2)
    buf = pool.take(1000)
    buf[:] = bytes(range(250)) * 4
    held = np.frombuffer(memoryview(buf)[:1000][8:16], np.uint8)
    pool.give(buf)
    other = pool.take(1000)
    assert other is not buf and held.tolist() == list(range(8, 16))
    del held
    assert pool.take(900) is buf and len(buf) == 1000 and bytes(buf[:4]) == bytes(range(4))
    pool.give(other)
    assert pool.take(400) is not other and pool.take(600) is other  # none over twice the size asked
