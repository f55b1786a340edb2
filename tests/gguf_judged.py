"""The checks every family's GGUF head is held to, with llama.cpp's own programs as the judge.

A family's test module builds its tiny checkpoint and calls these: the MTP-only file equals the
converter's ``--mtp`` export, its MTP block is byte-identical at a half / 8-bit precision, the
appended tail equals the full conversion, ``llama-server`` drafts with it as with the official
file, and only the head's bytes come from the Hub. The last three need nothing of the family but
its source and pre-tokenizer: the module subclasses ``ConverterJudged`` and gets them as tests.
Family-specific assertions stay in the family's module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from mtpforge.gguf.gguffile import GgufFile, read_local, tensor_array
from mtpforge.gguf.names import SHARED_TENSORS, block_of
from tests import gguf_env
from tests.gguf_env import mtpforge, official, sha256


def add_mtp(trunk: Path, source: Path | str, *extra: str) -> dict[str, Any]:
    """``mtpforge add-mtp --json`` into ``trunk``; its report (the run must succeed)."""
    r = mtpforge("add-mtp", "--source", str(source), "--target", str(trunk), "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def inspect_json(target: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    r = mtpforge("inspect", str(target), "--json", *extra)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


def tensor_table(g: GgufFile) -> dict[str, tuple[object, tuple[int, ...]]]:
    return {k: (t.type, t.shape) for k, t in g.tensors.items()}


def kv_list(g: GgufFile, skip: tuple[str, ...] = ()) -> list[tuple[str, object, int]]:
    return [(k, v.value, int(v.type)) for k, v in g.kv.items() if k not in skip]


def _same_values(ours: GgufFile, ref: GgufFile) -> None:
    assert tensor_table(ours) == tensor_table(ref)
    for k, t in ref.tensors.items():
        assert np.array_equal(tensor_array(ours, ours.tensors[k]), tensor_array(ref, t)), k


def equals_mtp_export(src: Path, trunk: Path, pre: str) -> tuple[dict[str, Any], GgufFile]:
    """f32: names, ggml types, shapes, values and metadata (keys, order, types) of ``--mtp``,
    from the trunk and the head's bytes; the trunk is only read. Returns the report and the
    converter's file for the family's own assertions."""
    before = sha256(trunk)
    r = add_mtp(trunk, src, "--precision", "f32")
    ours, ref = read_local(r["output"]), read_local(official(src, "mtp", "f32", pre=pre))
    _same_values(ours, ref)
    assert kv_list(ours) == kv_list(ref)
    assert sha256(trunk) == before
    return r, ref


def block_equals_converters(src: Path, trunk: Path, pre: str, precision: str, n: int, size: int) -> None:
    """The ``size`` tensors of MTP block ``n`` are the converter's byte for byte at
    ``precision``; token_embd / output_norm / output are the user's trunk's own values."""
    r = add_mtp(trunk, src, "--precision", precision)
    ours, ref = read_local(r["output"]), read_local(official(src, "mtp", precision, pre=pre))
    block = [k for k in ref.tensors if block_of(k) == n]
    assert len(block) == size and {k for k in ours.tensors if block_of(k) == n} == set(block)
    with open(r["output"], "rb") as a, open(ref.path, "rb") as b:
        for k in block:
            ta, tb = ours.tensors[k], ref.tensors[k]
            assert (ta.type, ta.shape) == (tb.type, tb.shape), k
            a.seek(ta.offset)
            b.seek(tb.offset)
            assert a.read(ta.nbytes) == b.read(tb.nbytes), k
    tr = read_local(trunk)
    for k in SHARED_TENSORS:
        assert np.array_equal(tensor_array(ours, ours.tensors[k]), tensor_array(tr, tr.tensors[k])), k
    assert kv_list(ours) == kv_list(ref)


def tail_equals_full(src: Path, trunk: Path, pre: str, out: Path) -> None:
    """``--layout gguf-tail`` is the converter's full conversion (its size label aside)."""
    add_mtp(trunk, src, "--precision", "f32", "--layout", "gguf-tail", "--output", str(out))
    ours, ref = read_local(out), read_local(official(src, "full", "f32", pre=pre))
    _same_values(ours, ref)
    assert kv_list(ours, ("general.size_label",)) == kv_list(ref, ("general.size_label",))


def drafts_as_official(src: Path, trunk: Path, pre: str, work: Path) -> dict[str, Any]:
    """Greedy output with mtpforge's MTP file is the trunk's plain output, and llama.cpp drafts
    and accepts exactly as many tokens as with the converter's own file beside the same trunk."""
    gguf_env.need("server")
    ours = Path(add_mtp(trunk, src, "--precision", "f32")["output"])
    theirs = gguf_env.graft(official(src, "mtp", "f32", pre=pre), trunk, work / "official" / "mtp-official.gguf")
    texts = gguf_env.prompts()[:4]
    plain = gguf_env.measure(trunk, texts=texts)
    with_ours = gguf_env.measure(trunk, draft=ours, texts=texts)
    with_theirs = gguf_env.measure(trunk, draft=theirs, texts=texts)
    assert with_ours["drafted"] > 0 and with_ours["tokens"] == plain["tokens"]
    assert (with_ours["drafted"], with_ours["accepted"]) == (with_theirs["drafted"], with_theirs["accepted"])
    return with_ours


def fetches_only_the_head(hub: Any, src: Path, trunk_in: Callable[[Path], Path], work: Path, fetch: str = "auto") -> None:
    """From the loopback Hub: ≤ 1.01 × the planned head bytes fetched (by mtpforge's count and
    by the hub's log), and the file written equals the one from the local source."""
    repo, _ = hub.publish(src)
    trunk = trunk_in(work)
    dry = hub.run("add-mtp", "--source", repo, "--target", str(trunk), "--dry-run", "--fetch", fetch)
    assert dry.code == 0, dry.stderr
    head_bytes = dry.json["fetch_bytes"]
    hub.server.clear_log()
    r = hub.run("add-mtp", "--source", repo, "--target", str(trunk), "--fetch", fetch)
    assert r.code == 0, r.stderr
    assert 0 < r.json["fetched_bytes"] <= 1.01 * head_bytes and hub.tensor_bytes(repo) <= 1.01 * head_bytes, \
        (head_bytes, r.json["fetched_bytes"], [(e.range, e.tensor_bytes) for e in hub.log(repo) if e.tensor_bytes])
    assert r.json["fetch_mode"] == ("stream" if fetch == "stream" else "ranges")
    assert dry.json["fetch_requests"] == len([e for e in hub.log(repo) if e.tensor_bytes])
    local = add_mtp(trunk_in(work / "local"), src)
    assert sha256(Path(r.json["output"])) == sha256(Path(local["output"]))


class ConverterJudged:
    """The tests every family's GGUF head passes unchanged: a module subclasses this as
    ``TestConverterJudged``, sets ``pre`` (the converter's pre-tokenizer for its tiny source) and
    provides a ``src`` fixture (the source checkpoint, per variant where it has several)."""

    pre: str = ""

    def trunk(self, src: Path, dst: Path, qtype: str = "f32") -> Path:
        return gguf_env.trunk_copy(src, dst, qtype, pre=self.pre)

    def test_the_tail_equals_the_converters_full_file(self, src: Path, tmp_path: Path) -> None:
        tail_equals_full(src, self.trunk(src, tmp_path), self.pre, tmp_path / "with-tail.gguf")

    @pytest.mark.parametrize("qtype", ["f32", "Q8_0", "Q4_K_M"])
    def test_llama_server_drafts_with_mtpforges_file_exactly_as_plain_and_as_with_the_official_one(
            self, src: Path, qtype: str, tmp_path: Path) -> None:
        """On the f32, Q8_0 and Q4_K_M trunks: plain output, and the official file's counts."""
        drafts_as_official(src, self.trunk(src, tmp_path, qtype), self.pre, tmp_path)

    def test_only_the_heads_bytes_come_from_the_hub(self, src: Path, hub: Any, tmp_path: Path) -> None:
        fetches_only_the_head(hub, src, lambda d: self.trunk(src, d), tmp_path)


def drafts_with_eh_proj_halves_swapped(trunk: Path, ours: Path, work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """llama-server's measurement (4 prompts) with ``ours`` and with a copy whose ``eh_proj``
    embedding and hidden halves are read the other way round: a drafting tiny head makes equal
    accepted counts mean something only if the second accepts a small fraction of the first."""
    from tests.test_gguf import _rewrite

    def swap(k: str, a: np.ndarray) -> np.ndarray | None:
        if k.endswith("nextn.eh_proj.weight"):
            h = a.shape[0]
            return a[:, list(range(h, 2 * h)) + list(range(h))]
        return None

    (work / "swapped").mkdir()
    bad = _rewrite(ours, work / "swapped" / ours.name, edit=swap)
    texts = gguf_env.prompts()[:4]
    return gguf_env.measure(trunk, draft=ours, texts=texts), gguf_env.measure(trunk, draft=bad, texts=texts)
