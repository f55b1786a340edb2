"""Reliability, round four: the promises of the MLX path held on the GGUF path and by the
non-Qwen families, through the real CLI. Each test asserts the documented exit code, one line
of error, nothing half-written, and the state on disk."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mtpforge.families import FAMILIES
from tests.checkers import folder_state
from tests.crash_harness import run_cli
from tests.support.families import GGUF_LAYOUTS, MLX_LAYOUTS, mlx_trunk, tiny_source
from tests.test_hostile import error_lines

#: every family mtpforge writes into MLX folders, from the registry (a hand-kept list here missed
#: DeepSeek-V3 when it gained an MLX layout)
MLX_FAMILIES = tuple(MLX_LAYOUTS)


def one_line(r: subprocess.CompletedProcess, code: int, says: str) -> str:
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = error_lines(r.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: ") and " — fix: " in lines[0], lines
    assert says.lower() in lines[0].lower(), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory):
    """``fam(family) -> (its tiny Hugging Face checkpoint, its mlx_lm.convert at 4 bits)``, built
    once, on first use."""
    root = tmp_path_factory.mktemp("families")
    built: dict[str, tuple[Path, Path]] = {}

    def get(family: str) -> tuple[Path, Path]:
        if family not in built:
            src = tiny_source(family, root / f"{family}-hf")
            built[family] = (src, mlx_trunk(family, src, root / f"{family}-4bit"))
        return built[family]

    return get


def _copy(folder: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(folder, dst)
    return dst


# ----------------------------------------------------------------------------- repair-norms

@pytest.mark.parametrize("family", MLX_FAMILIES)
def test_repair_norms_on_a_head_add_mtp_wrote_has_nothing_to_repair(fam, family: str, tmp_path: Path) -> None:
    """A head add-mtp wrote, for every family with an MLX layout, needs no repair (GLM, GLM-Flash
    and Nemotron-H heads, raw norms as stored, stopped with `internal error: ValueError: min()
    arg is an empty sequence`), with or without --source: the evidence is exact (mtpforge's
    record, or the source) and the folder is left as it was."""
    src, mlx = fam(family)
    tgt = _copy(mlx, tmp_path / "t")
    add = run_cli(["add-mtp", "--source", str(src), "--target", str(tgt)])
    assert add.returncode == 0, add.stderr
    before = folder_state(tgt)
    for extra in ([], ["--source", str(src)]):
        r = run_cli(["repair-norms", str(tgt), "--json", *extra])
        assert r.returncode == 0 and "Traceback" not in r.stderr and not error_lines(r.stderr), r.stderr
        rep = json.loads(r.stdout)
        assert rep["status"] == "nothing-to-repair" and rep["files_written"] == []
        assert rep["evidence"] == ("source" if extra else "manifest"), rep
        assert folder_state(tgt) == before


# ----------------------------------------------------------------------------- remove-mtp
# (every add-mtp undone byte for byte: tests/test_remove_every_add.py)

def test_a_nextn_record_cannot_make_a_backbone_layer_count_as_the_head(fam, tmp_path: Path) -> None:
    """The NextN prefix comes from the folder's config (N = its layer count), not from the record:
    a sidecar whose tensors are renamed to a backbone layer, hashes rewritten to match, is refused."""
    import hashlib

    from tests.checkers import rewrite

    src, mlx = fam("glm4_moe")
    tgt = _copy(mlx, tmp_path / "m")
    assert run_cli(["add-mtp", "--source", str(src), "--target", str(tgt)]).returncode == 0
    rewrite(tgt / "mtp.safetensors", lambda t: {k.replace("model.layers.2.", "model.layers.1."): v for k, v in t.items()})
    man = json.loads((tgt / "mtpforge.json").read_text())
    man["file_sha256"]["mtp.safetensors"] = hashlib.sha256((tgt / "mtp.safetensors").read_bytes()).hexdigest()
    (tgt / "mtpforge.json").write_text(json.dumps(man))
    before = folder_state(tgt)
    one_line(run_cli(["remove-mtp", str(tgt)]), 1, "not the MTP head")
    assert folder_state(tgt) == before


def test_remove_mtp_gguf_refuses_a_head_changed_since_and_keeps_later_card_edits(synth, tmp_path: Path) -> None:
    """Only what the record proves is undone: a head whose bytes changed is refused with nothing
    changed; a card edited outside the section keeps the edit and loses only the section."""
    from tests.support.synth.gguf_trunk import synthetic_trunk

    src = synth.hf("qwen3_5")
    trunk = synthetic_trunk(src, tmp_path / "trunk.gguf")
    add = run_cli(["add-mtp", "--source", str(src), "--target", str(trunk), "--json"])
    assert add.returncode == 0, add.stderr
    head = Path(json.loads(add.stdout)["output"])
    data = head.read_bytes()
    head.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    before = folder_state(tmp_path)
    one_line(run_cli(["remove-mtp", str(trunk)]), 1, "its bytes changed since")
    assert folder_state(tmp_path) == before
    head.write_bytes(data)
    card = tmp_path / "README.md"
    card.write_text("my own words\n" + card.read_text())
    r = run_cli(["remove-mtp", str(trunk), "--json"])
    assert r.returncode == 0 and json.loads(r.stdout)["kept_edits"] == ["README.md"], r.stderr
    assert card.read_text() == "my own words\n" and sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "trunk.gguf"]


# ----------------------------------------------------------------------------- hostile GGUF headers

def _s(b: bytes) -> bytes:
    import struct

    return struct.pack("<Q", len(b)) + b


def _header(n_tensors: int, kvs: bytes, n_kv: int, tensors: bytes = b"", pad: int = 164) -> bytes:
    import struct

    h = b"GGUF" + struct.pack("<I", 3) + struct.pack("<QQ", n_tensors, n_kv)
    h += _s(b"general.architecture") + struct.pack("<I", 8) + _s(b"qwen35") + kvs + tensors
    return h + b"\0" * max(0, pad - len(h))


def _kv_array(et: int, count: int, key: bytes = b"tokenizer.ggml.tokens") -> bytes:
    import struct

    return _s(key) + struct.pack("<I", 9) + struct.pack("<IQ", et, count)


def _hostile_headers() -> dict[str, bytes]:
    """GGUF headers that declare what they do not hold: counts and lengths up to 2^64 - 1."""
    import struct

    big = (2**31, 2**40, 2**62, 2**63, 2**64 - 1)
    out: dict[str, bytes] = {}
    for n in big:
        out[f"uint8-array-{n}"] = _header(0, _kv_array(0, n), 2)
        out[f"uint64-array-{n}"] = _header(0, _kv_array(10, n), 2)
        out[f"string-array-{n}"] = _header(0, _kv_array(8, n), 2)
        out[f"string-value-{n}"] = _header(0, _s(b"general.name") + struct.pack("<I", 8) + struct.pack("<Q", n), 2)
        out[f"key-length-{n}"] = _header(0, struct.pack("<Q", n), 2)
        out[f"tensor-count-{n}"] = _header(n, b"", 1)
        out[f"kv-count-{n}"] = _header(0, b"", n)
        out[f"tensor-name-{n}"] = _header(1, b"", 1, struct.pack("<Q", n))
    out["tensor-dims-2^32-1"] = _header(1, b"", 1, _s(b"token_embd.weight") + struct.pack("<I", 2**32 - 1))
    out["array-past-the-end"] = _header(0, _kv_array(4, 1 << 20), 2)
    out["array-of-arrays"] = _header(0, _kv_array(9, 4), 2)
    out["unknown-value-type"] = _header(0, _s(b"general.x") + struct.pack("<I", 2**31), 2)
    out["truncated"] = _header(0, _kv_array(0, 1000), 2, pad=0)
    out["empty"] = b""
    out["magic-only"] = b"GGUF"
    return out


HOSTILE = _hostile_headers()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_gguf_header_is_refused_fast_without_allocating(name: str, tmp_path: Path) -> None:
    """The local reader walks the header as the Hub reader does, every count and length held to a
    per-value limit and to the file's size before gguf-py allocates what it declares (a 164-byte
    file declaring 2^62 UINT8 grew inspect past 9 GB)."""
    import time
    import tracemalloc

    from mtpforge.errors import CorruptFileError
    from mtpforge.gguf.gguffile import read_local

    p = tmp_path / "x.gguf"
    p.write_bytes(HOSTILE[name])
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(CorruptFileError) as e:
            read_local(p)
        took = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "\n" not in e.value.message and "x.gguf" in e.value.message and e.value.fix
    assert took < 2.0 and peak < 16 << 20, (took, peak)


@pytest.mark.parametrize("name", ["uint8-array-4611686018427387904", "string-array-9223372036854775808",
                                  "tensor-dims-2^32-1"])
def test_a_hostile_gguf_is_one_line_as_target_and_a_finding_as_a_sibling(name: str, synth, tmp_path: Path) -> None:
    """Through the CLI: inspect and add-mtp on the file say so in one line (exit 2, nothing
    written); planted as an ``mtp-*.gguf`` beside a good trunk, inspect of the trunk reports it as
    a CORRUPT_FILE finding (it hung)."""
    from tests.support.synth.gguf_trunk import synthetic_trunk

    bad = tmp_path / "bad" / "x.gguf"
    bad.parent.mkdir()
    bad.write_bytes(HOSTILE[name])
    before = folder_state(tmp_path)
    one_line(run_cli(["inspect", str(bad)], timeout=60), 2, "not a readable GGUF")
    one_line(run_cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(bad)], timeout=60), 2,
             "not a readable GGUF")
    assert folder_state(tmp_path) == before
    trunk = synthetic_trunk(synth.hf("qwen3_5"), tmp_path / "good" / "trunk.gguf")
    (trunk.parent / "mtp-planted.gguf").write_bytes(HOSTILE[name])
    r = run_cli(["inspect", str(trunk), "--json"], timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "CORRUPT_FILE" in {f["code"] for f in json.loads(r.stdout)["findings"]}


# ----------------------------------------------------------------------------- GGUF commit order, sweep, lock

#: runs the CLI, SIGKILLing itself at the Nth rename (or fsync) in the folder given: a kill at
#: every stage of the GGUF write, through the operating system's calls only (nothing of mtpforge's
#: is replaced)
_KILLER = r"""
import os, signal, sys
folder, what, nth = sys.argv[1], sys.argv[2], int(sys.argv[3])
seen = [0]
real = getattr(os, what)
def hit(*a, **k):
    target = a[1] if what == "replace" else None
    if what == "fsync" or os.path.dirname(os.path.abspath(target)) == folder:
        seen[0] += 1
        if seen[0] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
    return real(*a, **k)
setattr(os, what, hit)
sys.argv = ["mtpforge", *sys.argv[4:]]
from mtpforge.cli import main
main()
"""


def _gguf_state(folder: Path) -> dict[str, str]:
    """Names -> sha256 of every file in the folder (temporary files included)."""
    return folder_state(folder)


def _consistent(folder: Path) -> None:
    """No record without the head it describes, no card section without a record."""
    import hashlib

    records = sorted(folder.glob("*.gguf.mtpforge.json"))
    for rec in records:
        head = rec.with_name(rec.name[: -len(".mtpforge.json")])
        assert head.is_file(), f"{rec.name} records a head that does not exist"
        assert hashlib.sha256(head.read_bytes()).hexdigest() == json.loads(rec.read_text())["file_sha256"]
    card = folder / "README.md"
    if card.is_file() and "mtpforge:mtp-head" in card.read_text():
        assert records, "the card has a section no record vouches for"


@pytest.fixture(scope="module")
def gguf_reference(synth, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """(source, a pristine trunk folder, the folder's state after one clean add-mtp)."""
    import shutil

    from tests.support.synth.gguf_trunk import synthetic_trunk

    root = tmp_path_factory.mktemp("gguf-ref")
    src = synth.hf("qwen3_5")
    pristine = synthetic_trunk(src, root / "pristine" / "trunk.gguf").parent
    done = root / "done"
    shutil.copytree(pristine, done)
    assert run_cli(["add-mtp", "--source", str(src), "--target", str(done / "trunk.gguf")]).returncode == 0
    return src, pristine, _gguf_state(done)


@pytest.mark.parametrize("stage", [("fsync", 1), ("replace", 1), ("replace", 2), ("replace", 3)],
                         ids=["writing-the-head", "renaming-the-head", "renaming-the-record", "renaming-the-card"])
def test_a_kill_at_every_stage_of_the_gguf_write_leaves_no_record_without_its_head(gguf_reference, stage,
                                                                                   tmp_path: Path) -> None:
    """The head is renamed in first, then its record, then the card (a record and a card section
    were written before the head and outlived a kill in 6 of 11 runs); the next run sweeps every
    temporary file the killed one left (the card's and the record's too) and ends exactly as a
    clean run does."""
    import shutil
    import sys

    src, pristine, want = gguf_reference
    folder = tmp_path / "g"
    shutil.copytree(pristine, folder)
    what, nth = stage
    killed = subprocess.run([sys.executable, "-c", _KILLER, str(folder), what, str(nth), "add-mtp", "--source", str(src),
                             "--target", str(folder / "trunk.gguf")], capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    _consistent(folder)
    again = run_cli(["add-mtp", "--source", str(src), "--target", str(folder / "trunk.gguf"), "--json"])
    assert again.returncode == 0, again.stderr
    assert _gguf_state(folder) == want
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]


def test_leftover_temporary_files_of_a_killed_run_are_swept(gguf_reference, tmp_path: Path) -> None:
    """Temporary files of the head, its record and the card (named as a killed run leaves them)
    are removed by the next run in the folder, remove-mtp included; a staged record whose head
    is in place is renamed in, so the head stays removable."""
    import shutil

    src, pristine, want = gguf_reference
    folder = tmp_path / "g"
    shutil.copytree(pristine, folder)
    junk = [".mtp-Tiny-Qwen3_5-F16.gguf.mtpforge-tmp-999999-deadbeef", ".mtpforge-abc123.md.tmp",
            ".mtp-Tiny-Qwen3_5-F16.gguf.mtpforge.json.tmp-999999",
            ".mtp-Tiny-Qwen3_5-BF16.gguf.mtpforge.json.mtpforge-tmp-999999-cafe0000"]
    for n in junk:
        (folder / n).write_text("{}")
    assert run_cli(["add-mtp", "--source", str(src), "--target", str(folder / "trunk.gguf")]).returncode == 0
    assert _gguf_state(folder) == want
    for n in junk:
        (folder / n).write_text("{}")
    assert run_cli(["remove-mtp", str(folder / "trunk.gguf")]).returncode == 0
    assert _gguf_state(folder) == _gguf_state(pristine)


def test_two_add_mtp_runs_on_one_trunk_at_once_the_second_is_busy(gguf_reference, tmp_path: Path) -> None:
    """One lock per GGUF target folder (the head, its record and the card live there): a second
    run while the first holds it is refused with BUSY, exit 1, in one line, and touches nothing
    (it died with an internal error, or one head's record named a card section the other
    overwrote). Held from the first read of the folder to the last write."""
    import shutil
    import sys

    src, pristine, want = gguf_reference
    folder = tmp_path / "g"
    shutil.copytree(pristine, folder)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
                               "from mtpforge.writer.lock import folder_lock\n"
                               "with folder_lock(Path(sys.argv[1])):\n print('held', flush=True); time.sleep(60)",
                               str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = _gguf_state(folder)
        for args in (["add-mtp", "--source", str(src), "--target", str(folder / "trunk.gguf"), "--json"],
                     ["add-mtp", "--source", str(src), "--target", str(folder / "trunk.gguf"), "--precision", "q8_0",
                      "--json"]):
            r = run_cli(args)
            one_line(r, 1, "another mtpforge run is changing")
            assert json.loads(r.stdout)["error"]["code"] == "BUSY"
        assert _gguf_state(folder) == before
    finally:
        holder.kill()
        holder.wait()
    assert run_cli(["add-mtp", "--source", str(src), "--target", str(folder / "trunk.gguf")]).returncode == 0
    assert _gguf_state(folder) == want


def test_two_real_add_mtp_runs_at_the_same_moment_end_consistent(gguf_reference, tmp_path: Path) -> None:
    """Two add-mtp runs started together on one trunk, at two precisions (one died with `internal
    error: FileNotFoundError`, or one head's record named a card section the other overwrote):
    each either writes its head or is BUSY in one line, and the folder ends with a record for
    every head written, one record owning the card, no temporary file, and remove-mtp brings
    back the folder byte for byte."""
    import shutil
    import sys

    from tests.crash_harness import cli_env

    src, pristine, _ = gguf_reference
    for attempt in range(1):  # without the lock one attempt fails (FileNotFoundError) every time seen
        folder = tmp_path / f"g{attempt}"
        shutil.copytree(pristine, folder)
        runs = {prec: subprocess.Popen([sys.executable, "-m", "mtpforge", "add-mtp", "--source", str(src), "--target",
                                        str(folder / "trunk.gguf"), "--precision", prec, "--json"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
                for prec in ("f16", "q8_0")}
        done = {prec: (p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for prec, p in runs.items()}  # type: ignore[union-attr]
        written = set()
        for prec, (code, out, err) in done.items():
            r = subprocess.CompletedProcess([], code, out, err)
            if code == 0:
                written.add(prec.upper())
            else:
                one_line(r, 1, "another mtpforge run is changing")
                assert json.loads(out)["error"]["code"] == "BUSY"
        _consistent(folder)
        heads = {p.name.split("-")[-1].removesuffix(".gguf") for p in folder.glob("mtp-*.gguf")}
        records = {p.name.split("-")[-1].removesuffix(".gguf.mtpforge.json") for p in folder.glob("mtp-*.gguf.mtpforge.json")}
        assert written and heads == records == written, (heads, records, done)
        card = (folder / "README.md").read_text()
        assert any(f"-{w}.gguf" in card for w in written), card  # the card describes the head written last
        owners = [r for r in folder.glob("*.mtpforge.json") if json.loads(r.read_text()).get("model_card")]
        assert len(owners) == 1, owners  # one record proves the card's change, the first run's
        assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]
        r = run_cli(["remove-mtp", str(folder / "trunk.gguf")])
        assert r.returncode == 0 and _gguf_state(folder) == _gguf_state(pristine), r.stderr


@pytest.mark.parametrize("stage", [("fsync", 1), ("replace", 1), ("replace", 2), ("replace", 3)],
                         ids=["writing-the-tail", "renaming-the-tail", "renaming-the-record", "renaming-the-card"])
def test_a_kill_at_every_stage_of_the_gguf_tail_write_leaves_nothing_half_written(gguf_reference, stage,
                                                                                  tmp_path: Path) -> None:
    """The same for a ``gguf-tail`` output (trunk and head in one new file, in its own folder):
    after a SIGKILL at any stage there is no record without its file, and the next run ends as a
    clean one, with no temporary file left."""
    import shutil
    import sys

    src, pristine, _ = gguf_reference
    trunk = Path(shutil.copytree(pristine, tmp_path / "g")) / "trunk.gguf"
    out = tmp_path / "tail"
    out.mkdir()
    args = ["add-mtp", "--source", str(src), "--target", str(trunk), "--layout", "gguf-tail", "--output", str(out / "t.gguf")]
    clean = tmp_path / "clean"
    clean.mkdir()
    assert run_cli([*args[:-1], str(clean / "t.gguf")]).returncode == 0
    what, nth = stage
    killed = subprocess.run([sys.executable, "-c", _KILLER, str(out), what, str(nth), *args], capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    _consistent(out)
    assert run_cli(args).returncode == 0
    assert _gguf_state(out)["t.gguf"] == _gguf_state(clean)["t.gguf"]
    assert sorted(_gguf_state(out)) == sorted(_gguf_state(clean))
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


# ----------------------------------------------------------------------------- full disks, modes

@pytest.mark.parametrize("how", ["enospc", "efbig"])
def test_a_full_disk_while_writing_the_gguf_head_is_no_space_and_leaves_nothing(synth, how: str, tmp_path: Path) -> None:
    """A real ENOSPC (a tmpfs with room for less than the head; skipped where one cannot be
    mounted) and EFBIG (RLIMIT_FSIZE) while the head is written: NO_SPACE, exit 1, one line, the
    folder as it was, no temporary head left (it was `internal error: OSError`, exit 2, and the
    temporary file stayed: the writer's close raised again before the unlink). The free-space
    query, asked before anything is converted, is told there is room (the disk filled after it:
    the up-front refusal is test_hostile's)."""
    import os
    import resource
    import sys

    from tests.crash_harness import cli_env
    from tests.support.synth.gguf_trunk import synthetic_trunk

    src = synth.hf("qwen3_5")
    folder = tmp_path / "g"
    folder.mkdir()
    pre = None
    if how == "enospc":
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=800k", "tmpfs", str(folder)],
                                               capture_output=True).returncode:
            pytest.skip("cannot mount a tmpfs here (needs root on Linux)")
    else:
        def pre() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (600 << 10, 600 << 10))
    try:
        trunk = synthetic_trunk(src, folder / "trunk.gguf")
        before = folder_state(folder)
        room = ("import sys, mtpforge.writer.atomic as a; a.free_bytes = lambda p: 1 << 50\n"
                "from mtpforge.cli import app; app(sys.argv[1:])")
        r = subprocess.run([sys.executable, "-c", room, "add-mtp", "--source", str(src), "--target", str(trunk),
                            "--json"], capture_output=True, text=True, env=cli_env(), timeout=300, preexec_fn=pre)
        one_line(r, 1, "nothing was changed")
        assert json.loads(r.stdout)["error"]["code"] == "NO_SPACE"
        assert folder_state(folder) == before and sorted(p.name for p in folder.iterdir()) == ["trunk.gguf"]
    finally:
        if how == "enospc":
            subprocess.run(["umount", str(folder)], capture_output=True)


def test_a_card_add_mtp_creates_beside_a_trunk_gets_a_new_files_mode(synth, tmp_path: Path) -> None:
    """README.md created beside a trunk is 0644 under umask 022 (it was 0600, mkstemp's mode)."""
    import os
    import stat

    from tests.support.synth.gguf_trunk import synthetic_trunk

    src = synth.hf("qwen3_5")
    trunk = synthetic_trunk(src, tmp_path / "trunk.gguf")
    old = os.umask(0o022)
    try:
        assert run_cli(["add-mtp", "--source", str(src), "--target", str(trunk)]).returncode == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "README.md").stat().st_mode) == 0o644


# ----------------------------------------------------------------------------- hostile names and sizes

@pytest.mark.parametrize("name", ["Q" * 300, "Tiny\x00Qwen", "Tiny\nQwen", "../../Tiny/Qwen", "Ünïcødé " * 40],
                         ids=["300-chars", "nul", "newline", "slashes", "long-unicode"])
def test_a_hostile_general_name_gives_a_safe_head_file_name(synth, name: str, tmp_path: Path) -> None:
    """The head is named after the trunk's ``general.name`` as llama.cpp's converter names it,
    made one safe file name: no control character, no separator, at most 255 bytes with its
    record's and temporary suffixes (300 characters or a NUL were internal errors; a newline ended
    up in the file's name). inspect then finds the head, and remove-mtp takes it back."""
    from tests.support.synth.gguf_trunk import synthetic_trunk

    src = synth.hf("qwen3_5")
    folder = tmp_path / "g"
    trunk = synthetic_trunk(src, folder / "trunk.gguf", name=name)
    pristine = folder_state(tmp_path)
    add = run_cli(["add-mtp", "--source", str(src), "--target", str(trunk), "--json"])
    assert add.returncode == 0, add.stderr
    head = Path(json.loads(add.stdout)["output"])
    assert head.parent == folder and head.is_file() and head.name.startswith("mtp-")
    assert not any(ord(c) < 32 or c in "/\\" for c in head.name) and len((head.name + ".mtpforge.json").encode()) <= 200
    r = run_cli(["inspect", str(trunk), "--json"])
    assert r.returncode == 0 and json.loads(r.stdout)["layout"] == "gguf-mtp", r.stdout[-2000:]
    assert run_cli(["remove-mtp", str(trunk)]).returncode == 0
    assert folder_state(tmp_path) == pristine


def test_a_trunk_declaring_a_nextn_layer_it_does_not_hold_gets_the_head_inspect_asks_for(synth, tmp_path: Path) -> None:
    """``nextn_predict_layers = 1`` without NextN tensors: inspect says to add the head, and
    add-mtp now does (it said the trunk "already carries an MTP block — use it as is", even with
    --force); the tensors decide for both."""
    import gguf

    from mtpforge.gguf.gguffile import KV
    from tests.support.synth.gguf_trunk import synthetic_trunk

    src = synth.hf("qwen3_5")
    trunk = synthetic_trunk(src, tmp_path / "trunk.gguf",
                            kv_edit={"qwen35.nextn_predict_layers": KV(1, gguf.GGUFValueType.UINT32)})
    r = run_cli(["inspect", str(trunk), "--json"])
    rep = json.loads(r.stdout)
    missing = [f for f in rep["findings"] if f["code"] == "MTP_CONFIG_WITHOUT_WEIGHTS"]
    assert missing and "add-mtp" in missing[0]["fix"], rep["findings"]
    add = run_cli(["add-mtp", "--source", str(src), "--target", str(trunk), "--json"])
    assert add.returncode == 0 and json.loads(add.stdout)["status"] == "written", add.stderr
    after = json.loads(run_cli(["inspect", str(trunk), "--json"]).stdout)
    assert after["layout"] == "gguf-mtp" and "MTP_CONFIG_WITHOUT_WEIGHTS" not in {f["code"] for f in after["findings"]}


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_fifo_or_a_folder_named_gguf_is_said_to_be_what_it_is(synth, kind: str, tmp_path: Path) -> None:
    """inspect and add-mtp on a FIFO or a folder named ``x.gguf``: one line that says what the
    path is (it said the path does not exist), exit 2, nothing read from a pipe, nothing written."""
    import os

    p = tmp_path / "x.gguf"
    if kind == "fifo":
        os.mkfifo(p)
    else:
        p.mkdir()
    before = folder_state(tmp_path)
    says = "FIFO" if kind == "fifo" else "is a folder"
    one_line(run_cli(["inspect", str(p)], timeout=60), 2, says)
    one_line(run_cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(p)], timeout=60), 2, says)
    assert folder_state(tmp_path) == before


def test_a_hub_gguf_reporting_two_to_the_fifty_bytes_is_refused_before_any_sparse_file(synth, tmp_path: Path) -> None:
    """The Hub's reported size is the sparse file's size the header is parsed in: 2^50 bytes was
    `internal error: OSError: [Errno 27] File too large`; now one CORRUPT_FILE line before any
    request or file (the reader is given a real trunk's bytes, as the Hub serves them)."""
    import os
    import tempfile

    from mtpforge.errors import CorruptFileError
    from mtpforge.gguf.gguffile import MAX_REMOTE_SIZE, read_remote
    from tests.support.synth.gguf_trunk import synthetic_trunk

    data = synthetic_trunk(synth.hf("qwen3_5"), tmp_path / "trunk.gguf").read_bytes()
    asked: list[tuple[int, int]] = []

    def read_range(a: int, b: int) -> bytes:
        asked.append((a, b))
        return data[a:b]

    def ours() -> set[str]:
        return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("mtpforge-gguf-")}

    temp_before = ours()
    for size in (2**50, MAX_REMOTE_SIZE + 1, 2**63):
        with pytest.raises(CorruptFileError) as e:
            read_remote("big.gguf", size, read_range)
        assert "big.gguf" in e.value.message and "\n" not in e.value.message and e.value.fix
    assert asked == [] and ours() <= temp_before
    g, _ = read_remote("trunk.gguf", len(data), read_range)  # the same bytes at their true size read
    assert "token_embd.weight" in g.tensors


@pytest.mark.parametrize("size", [2**50, 2**63 - 1])
def test_inspect_of_a_hub_gguf_repo_reporting_an_impossible_size_is_one_line(hub, synth, size: int, tmp_path: Path) -> None:
    """The same through the CLI and the real huggingface_hub client: a repo whose GGUF the Hub
    lists at 2^50 bytes (the loopback hub's table says so; the file itself is a real trunk) is
    CORRUPT_FILE in one line, exit 2, with no request for the file's bytes and no temporary file
    left (it was `internal error: OSError: [Errno 27] File too large`)."""
    import os
    import tempfile

    from tests.support.synth.gguf_trunk import synthetic_trunk

    folder = tmp_path / "repo"
    synthetic_trunk(synth.hf("qwen3_5"), folder / "trunk.gguf")
    repo, sha = hub.publish(folder)
    hub.server.repos[repo].commits[sha].files["trunk.gguf"].size = size
    temp_before = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("mtpforge-gguf-")}
    r = hub.run("inspect", repo, hf_home=tmp_path / "hf")
    err = r.assert_one_line_error(2)
    assert err["code"] == "CORRUPT_FILE" and "trunk.gguf" in err["message"] and "Hub reports" in err["message"], err
    assert not [e for e in hub.log(repo) if e.file == "trunk.gguf" and e.method == "GET"]
    assert {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("mtpforge-gguf-")} <= temp_before


def test_inspect_of_a_large_hub_gguf_under_a_file_size_limit_is_one_line(hub, synth, tmp_path: Path) -> None:
    """A plausible 128 GiB Hub GGUF whose header is parsed in a sparse temporary file, with
    ``ulimit -f`` (or a TMPDIR filesystem) capping files at 1 GiB: NO_SPACE in one line that names
    TMPDIR, exit 1, no temporary file left (it was `internal error: OSError: [Errno 27]`)."""
    import resource
    import sys

    from tests.support.synth.gguf_trunk import synthetic_trunk

    folder = tmp_path / "repo"
    synthetic_trunk(synth.hf("qwen3_5"), folder / "trunk.gguf")
    repo, sha = hub.publish(folder)
    hub.server.repos[repo].commits[sha].files["trunk.gguf"].size = 1 << 37
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = subprocess.run([sys.executable, "-m", "mtpforge", "inspect", repo, "--json"], capture_output=True, text=True,
                       env=hub.env(tmp_path / "hf", TMPDIR=str(tmp)), timeout=120,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30)))
    line = one_line(r, 1, "TMPDIR")
    assert "trunk.gguf" in line and json.loads(r.stdout)["error"]["code"] == "NO_SPACE"
    assert list(tmp.iterdir()) == []


# ----------------------------------------------------------------------------- inspect --source of another family

def _other(family: str) -> str:
    """The next registered family after ``family`` whose GGUF architecture differs (cyclic)."""
    names = list(FAMILIES)
    i = names.index(family)
    return next(n for n in names[i + 1:] + names[:i] if FAMILIES[n].gguf_arch != FAMILIES[family].gguf_arch)


#: inspect reads a trunk's MTP head (a NextN tail, an ``mtp-*.gguf`` beside it); a drafter that is a
#: model of its own (DeepSeek-V4's DSpark, ``dspark-*.gguf``) it does not read yet
#: (docs/families/deepseek_v4.md §7), so it has no head to compare a source with
SOURCE_CASES = [(f, "gguf") for f in GGUF_LAYOUTS if not FAMILIES[f].gguf_drafter] + [(f, "mlx") for f in MLX_FAMILIES]


#: the README's test command runs these families' cases; the full run (CI) every family's
#: (tests/conftest.py, LONG): each case is three CLI runs
QUICK = ("qwen3_5", "glm4_moe", "nemotron_h")


@pytest.mark.parametrize("family,fmt", [c for c in SOURCE_CASES if c[0] in QUICK], ids=lambda v: str(v))
def test_inspect_source_of_another_family_is_an_error_finding(fam, family: str, fmt: str, tmp_path: Path) -> None:
    _source_of_another_family(fam, family, fmt, tmp_path)


@pytest.mark.parametrize("family,fmt", [c for c in SOURCE_CASES if c[0] not in QUICK], ids=lambda v: str(v))
def test_every_family_inspect_source_of_another_family_is_an_error_finding(fam, family: str, fmt: str,
                                                                          tmp_path: Path) -> None:
    _source_of_another_family(fam, family, fmt, tmp_path)


def _source_of_another_family(fam, family: str, fmt: str, tmp_path: Path) -> None:
    """A --source of another family proves nothing about a head's norms: SOURCE_MISMATCH, an error
    (exit 1), for every family's GGUF head and raw-norm MLX folder (a GGUF head and a GLM MLX
    folder exited 0, no findings, the GGUF's convention "raw" "from source"); a zero-centred
    (Qwen) MLX folder's comparison refuses it in one line; this model's own source raises no such
    finding. Nothing is written."""
    from tests.support.synth.gguf_trunk import synthetic_trunk

    src, mlx = fam(family) if fmt == "mlx" else (tiny_source(family, tmp_path / "src"), None)
    other = fam(_other(family))[0] if _other(family) in MLX_FAMILIES else tiny_source(_other(family), tmp_path / "other")
    target = synthetic_trunk(src, tmp_path / "g" / "trunk.gguf") if mlx is None else _copy(mlx, tmp_path / "m")
    assert run_cli(["add-mtp", "--source", str(src), "--target", str(target)]).returncode == 0
    before = folder_state(tmp_path)
    r = run_cli(["inspect", str(target), "--source", str(other), "--json"])
    if fmt == "mlx" and FAMILIES[family].norm_offset:
        # a zero-centred family's MLX comparison refuses the source in one line (exit 2), as before
        one_line(r, 2, "is not this model's original")
    else:
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        rep = json.loads(r.stdout)
        bad = [f for f in rep["findings"] if f["code"] == "SOURCE_MISMATCH"]
        assert bad and bad[0]["severity"] == "error" and rep["norm_convention_from"] != "source", rep
    ok = run_cli(["inspect", str(target), "--source", str(src), "--json"])
    assert "Traceback" not in ok.stderr and "SOURCE_MISMATCH" not in {f["code"] for f in json.loads(ok.stdout)["findings"]}
    assert folder_state(tmp_path) == before


@pytest.mark.parametrize("head,pre,other", [("deepseek_v3", "deepseek-v3", "glm4_moe_lite"),
                                             ("glm4_moe_lite", "glm4", "deepseek_v3")])
def test_inspect_source_of_another_family_of_the_same_architecture_is_an_error_finding(head: str, pre: str, other: str,
                                                                                       tmp_path: Path) -> None:
    """DeepSeek-V3 and GLM-4.7-Flash are both llama.cpp's deepseek2; the trunk's pre-tokenizer
    (which add-mtp copies into the head) tells them apart. The other one's source is SOURCE_MISMATCH
    (it was compared tensor by tensor and the convention said to come "from source")."""
    import gguf

    from mtpforge.gguf.gguffile import KV
    from tests.support.synth.gguf_trunk import synthetic_trunk

    src, wrong = tiny_source(head, tmp_path / "src"), tiny_source(other, tmp_path / "other")
    trunk = synthetic_trunk(src, tmp_path / "g" / "trunk.gguf",
                            kv_edit={"tokenizer.ggml.pre": KV(pre, gguf.GGUFValueType.STRING)})
    assert run_cli(["add-mtp", "--source", str(src), "--target", str(trunk)]).returncode == 0
    r = run_cli(["inspect", str(trunk), "--source", str(wrong), "--json"])
    rep = json.loads(r.stdout)
    bad = [f for f in rep["findings"] if f["code"] == "SOURCE_MISMATCH"]
    assert r.returncode == 1 and bad and other in bad[0]["message"] and rep["norm_convention_from"] != "source", rep
    ok = json.loads(run_cli(["inspect", str(trunk), "--source", str(src), "--json"]).stdout)
    assert "SOURCE_MISMATCH" not in {f["code"] for f in ok["findings"]} and ok["norm_convention_from"] == "source", ok


@pytest.mark.parametrize("files", ["*.safetensors", "*"])
def test_a_sign_in_page_instead_of_the_file_is_a_permanent_error(hub, synth, files: str, tmp_path: Path) -> None:
    """A portal or proxy answering 200 with an HTML sign-in page for every download: one line
    that says so and how to fix it, not "short body — retry later" after a round of retries;
    nothing written."""
    repo, _ = hub.source(synth, "qwen3_5")
    tgt = _copy(synth.target("qwen3_5"), tmp_path / "t")
    hub.fault("html", repo=repo, files=files, times=-1, data_only=False)
    before = folder_state(tgt)
    r = hub.run("add-mtp", "--source", repo, "--target", str(tgt), hf_home=tmp_path / "hf")
    lines = error_lines(r.stderr)
    assert r.code == 2 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr
    # a page for the file itself says so; a page for the Hub's API too is a server that is not a Hub
    assert ("web page" if files == "*.safetensors" else "HF_ENDPOINT") in lines[0], lines[0]
    assert "retry later" not in lines[0], lines[0]
    assert folder_state(tgt) == before and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_record_beside_a_trunk_hashing_the_trunk_removes_nothing(synth, tmp_path: Path) -> None:
    """remove-mtp removes only a file add-mtp writes (one holding an MTP block): a record named
    after the trunk, with the trunk's own hash, is refused and the trunk stays."""
    import hashlib

    from tests.support.synth.gguf_trunk import synthetic_trunk

    src = synth.hf("qwen3_5")
    trunk = synthetic_trunk(src, tmp_path / "trunk.gguf")
    add = run_cli(["add-mtp", "--source", str(src), "--target", str(trunk), "--json"])
    assert add.returncode == 0, add.stderr
    rec = json.loads(Path(json.loads(add.stdout)["manifest"]).read_text())
    rec["file_sha256"] = hashlib.sha256(trunk.read_bytes()).hexdigest()
    rec.pop("model_card", None)
    (tmp_path / "trunk.gguf.mtpforge.json").write_text(json.dumps(rec))
    before = folder_state(tmp_path)
    one_line(run_cli(["remove-mtp", str(tmp_path)]), 1, "holds no MTP block")
    assert folder_state(tmp_path) == before
