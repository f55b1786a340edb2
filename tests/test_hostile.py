"""Hostile and malformed inputs through the real CLI: one clear line, exit 1 or 2, no traceback,
nothing written; fuzzing of the index reader and catalogue; nothing from a checkpoint is ever
executed; tokens never leak; the disk-space check says how much is needed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtpforge.checkpoint.catalogue import INDEX_FILE, load_catalogue
from mtpforge.checkpoint.store import LocalStore
from mtpforge.errors import MtpforgeError, RefusedError
from tests.checkers import folder_state
from tests.hostile.corpus import CASES, INSPECT, Case, Ctx

PKG = Path(__file__).resolve().parents[1] / "mtpforge"


def tree_state(root: Path) -> dict[str, str]:
    """folder_state plus every directory (an empty folder made or removed counts as a write)."""
    out = folder_state(root)
    for dirpath, dirnames, _ in os.walk(root):
        for d in dirnames:
            p = Path(dirpath, d)
            if not p.is_symlink():
                out.setdefault(p.relative_to(root).as_posix(), "dir")
    return out


def cli(argv: list[str], root: Path, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="1000", HF_HOME=str(root / "hf-home"), HF_HUB_OFFLINE="1", **(extra_env or {}))
    env.pop("MTPFORGE_NO_EXCHANGE", None)
    return subprocess.run([sys.executable, "-m", "mtpforge", *argv], capture_output=True, text=True, env=env,
                          timeout=120, cwd=root)


def make_ctx(synth, tmp_path: Path, variant: str = "qwen3_5") -> Ctx:
    root = tmp_path / "case"
    root.mkdir()
    shutil.copytree(synth.hf(variant), root / "src")
    shutil.copytree(synth.target(variant), root / "tgt")
    return Ctx(root, root / "src", root / "tgt")


def error_lines(stderr: str) -> list[str]:
    """stderr without progress lines (which start with a bullet or a tick)."""
    return [ln for ln in stderr.splitlines() if ln.strip() and not ln.lstrip().startswith(("•", "✓"))]


def test_corpus_is_big_and_names_are_unique():
    names = [c.name for c in CASES]
    assert len(names) >= 30 and len(set(names)) == len(names)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hostile_input_is_refused_in_one_line_and_nothing_is_written(case: Case, synth, tmp_path):
    c = make_ctx(synth, tmp_path)
    case.build(c)
    before = tree_state(tmp_path)
    argv = [a.format(src=c.src, tgt=c.tgt, root=c.root, recipe=c.recipe) for a in case.argv]
    r = cli(argv, c.root)
    assert tree_state(tmp_path) == before, "something was written"
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert "internal error" not in r.stderr, r.stderr
    assert r.returncode in case.exits, (r.returncode, r.stderr[-2000:])
    lines = error_lines(r.stderr)
    if case.argv == INSPECT and r.returncode == 1:
        report = json.loads(r.stdout)
        codes = {f["code"] for f in report["findings"] if f["severity"] == "error"}
        assert codes, report
        assert not case.says or case.says in codes, codes
        return
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("error: ") and " — fix: " in line, line
    assert len(line) < 600, f"not one clear line ({len(line)} chars): {line[:300]}…"
    assert case.says.lower() in line.lower(), line


# ----------------------------------------------------------------------------- fuzzing

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
    max_leaves=20,
)
_names = st.sampled_from(["model.safetensors", "model-00001-of-00002.safetensors", "../x.safetensors",
                          "/etc/passwd", "", "a//b.safetensors", "sub/model.safetensors", "C:\\x", ".", "..",
                          "model.safetensors/", "nul\x00.safetensors"]) | st.text(max_size=30)
_index = st.one_of(
    _json,
    st.fixed_dictionaries({"weight_map": st.dictionaries(st.text(max_size=20), _names | _json, max_size=6)}),
    st.fixed_dictionaries({"metadata": _json, "weight_map": st.dictionaries(st.text(max_size=8), _names, max_size=6)}),
)
_files = st.dictionaries(
    st.sampled_from(["model.safetensors", "model-00001-of-00002.safetensors", "model-mtp.safetensors", "mtp.safetensors"]),
    st.binary(max_size=300) | st.builds(lambda n, body: n.to_bytes(8, "little") + body,
                                        st.integers(0, 2**64 - 1) | st.integers(0, 400), st.binary(max_size=300)),
    max_size=3,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(index=_index, files=_files, config=_json)
def test_catalogue_fuzz_only_mtpforge_errors_escape(index, files, config):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "config.json").write_text(json.dumps(config if isinstance(config, dict) else {"model_type": config}))
        try:
            (root / INDEX_FILE).write_text(json.dumps(index))
        except ValueError:
            return
        for name, data in files.items():
            (root / name).write_bytes(data)
        try:
            cat = load_catalogue(LocalStore(root))
        except MtpforgeError:
            return
        assert set(cat.headers) | set(cat.corrupt) >= {f for f in files}
        for f, h in cat.headers.items():
            for info in h.tensors.values():
                assert 0 <= info.begin <= info.end <= h.file_size


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=400) | st.text(max_size=200).map(str.encode) | _json.map(lambda o: json.dumps(o).encode()))
def test_index_bytes_fuzz_only_mtpforge_errors_escape(raw):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "config.json").write_text("{}")
        (root / INDEX_FILE).write_bytes(raw)
        try:
            load_catalogue(LocalStore(root))
        except MtpforgeError:
            pass


# ----------------------------------------------------------------------------- security

#: what must never appear in the package: remote code, pickle, eval of checkpoint strings
FORBIDDEN = [
    r"trust_remote_code\s*=\s*True", r"\bimport pickle\b", r"\bpickle\.load", r"torch\.load", r"\bdill\b",
    r"yaml\.load\((?![^)]*SafeLoader)", r"yaml\.unsafe_load", r"(?<![\w.])eval\(", r"(?<![\w.])exec\(", r"allow_pickle\s*=\s*True",
    r"np\.load\(", r"joblib", r"importlib\.import_module\((?!f?[\"']mlx_lm\.models\.)", r"runpy", r"__import__\(", r"AutoModel\w*\.from_pretrained",
    r"AutoConfig\.from_pretrained", r"AutoTokenizer\.from_pretrained", r"from_pretrained\(",
]


def test_package_source_never_executes_checkpoint_content():
    hits = []
    for p in sorted(PKG.rglob("*.py")):
        for n, line in enumerate(p.read_text("utf-8").splitlines(), 1):
            for pat in FORBIDDEN:
                if re.search(pat, line):
                    hits.append(f"{p.relative_to(PKG.parent)}:{n}: {line.strip()}")
    assert hits == []


def _plant_remote_code(folder: Path, marker: Path) -> None:
    """An ``auto_map`` pointing at Python that would leave a marker if anything imported it."""
    code = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('executed')\n"
    for name in ("configuration_evil.py", "modeling_evil.py", "tokenization_evil.py"):
        (folder / name).write_text(code)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilModel",
                       "AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (folder / "config.json").unlink()
    (folder / "config.json").write_text(json.dumps(cfg))
    tok = folder / "tokenizer_config.json"
    if tok.is_file():
        t = json.loads(tok.read_text())
        t["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
        tok.unlink()
        tok.write_text(json.dumps(t))


def test_auto_map_code_in_a_checkpoint_is_never_run(synth, tmp_path):
    c = make_ctx(synth, tmp_path)
    marker = tmp_path / "PWNED"
    _plant_remote_code(c.src, marker)
    _plant_remote_code(c.tgt, marker)
    for argv in (["inspect", str(c.tgt), "--json"], ["inspect", str(c.src), "--json"],
                 ["add-mtp", "--source", str(c.src), "--target", str(c.tgt), "--dry-run"],
                 ["inspect", str(c.tgt), "--source", str(c.src), "--json"],
                 ["add-mtp", "--source", str(c.src), "--target", str(c.tgt), "--precision", "bf16"],
                 ["inspect", str(c.tgt), "--source", str(c.src), "--json"],
                 ["remove-mtp", str(c.tgt)]):
        r = cli(argv, c.root)
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode in (0, 1), (argv, r.stderr)
        assert not marker.exists(), f"{argv[0]} executed code from the checkpoint"
    assert r.returncode == 0


def test_hf_token_never_appears_in_output_manifest_or_files(synth, tmp_path):
    token = "hf_SeCrEtToKeN1234567890abcdefXYZ"
    c = make_ctx(synth, tmp_path)
    env = {"HF_TOKEN": token, "HUGGING_FACE_HUB_TOKEN": token}
    seen = []
    for argv in (["add-mtp", "--source", str(c.src), "--target", str(c.tgt), "--output", str(c.root / "out"),
                  "--layout", "sidecar", "--debug"],
                 ["add-mtp", "--source", str(c.src), "--target", str(c.tgt), "--json"],
                 ["inspect", str(c.tgt), "--json", "--debug"], ["env", "--json"],
                 ["add-mtp", "--source", str(c.root / "missing"), "--target", str(c.tgt), "--json", "--debug"],
                 ["remove-mtp", str(c.tgt), "--json"]):
        r = cli(argv, c.root, env)
        seen.append(r.stdout + r.stderr)
    assert (c.root / "out" / "mtpforge.json").is_file()
    for dirpath, _, files in os.walk(tmp_path):
        for f in files:
            p = Path(dirpath, f)
            if not p.is_symlink():
                assert token.encode() not in p.read_bytes(), p
    assert all(token not in s for s in seen)
    assert all(token[3:12] not in s for s in seen)  # not even a prefix


def test_disk_space_check_says_how_much_is_needed_and_writes_nothing(synth, tmp_path, monkeypatch):
    """The free-space query is the one OS boundary replaced here; the check itself is real."""
    from mtpforge.pipeline import add_mtp
    from mtpforge.writer import atomic

    c = make_ctx(synth, tmp_path)
    before = tree_state(tmp_path)
    asked: list[Path] = []

    def tiny_disk(path: Path) -> int:
        asked.append(Path(path))
        return 4096

    monkeypatch.setattr(atomic, "free_bytes", tiny_disk)
    with pytest.raises(RefusedError) as e:
        add_mtp(source=str(c.src), target=str(c.tgt), progress=False)
    assert re.search(r"[\d,]{6,} bytes .* needed beside", e.value.message), e.value.message
    assert "4,096 bytes free" in e.value.message and e.value.fix
    assert asked and tree_state(tmp_path) == before


def test_a_gguf_head_that_cannot_fit_beside_its_trunk_is_refused_before_it_converts(synth, tmp_path, monkeypatch):
    """The GGUF output's room is asked before anything is read or converted (a giant's 24 GB head
    had failed only at the disk's end): NO_SPACE, the bytes needed and free, the advice fitting a
    .gguf output, the folder as it was. The free-space query is the one OS boundary replaced."""
    from mtpforge.gguf.addmtp import add_mtp_gguf
    from mtpforge.writer import atomic
    from tests.support.synth.gguf_trunk import synthetic_trunk

    trunk = synthetic_trunk(synth.hf("qwen3_5"), tmp_path / "g" / "trunk.gguf")
    before = folder_state(trunk.parent)
    monkeypatch.setattr(atomic, "free_bytes", lambda path: 4096)
    with pytest.raises(RefusedError) as e:
        add_mtp_gguf(source=str(synth.hf("qwen3_5")), target=str(trunk), progress=False)
    assert e.value.code == "NO_SPACE" and "4,096 bytes free" in e.value.message and ".gguf path" in e.value.fix
    assert folder_state(trunk.parent) == before


def test_the_download_room_counts_the_head_where_they_share_a_disk(tmp_path, monkeypatch):
    """check_download_room: the download alone against the cache's disk; the head's size added
    only where the head's folder is on that same disk (a real second filesystem, a tmpfs, where
    this process may mount one). The free-space query is the one OS boundary replaced."""
    from mtpforge.writer import atomic

    monkeypatch.setattr(atomic, "free_bytes", lambda path: 1000)
    cache, same = tmp_path / "hf" / "not-yet", tmp_path / "model"
    same.mkdir()
    atomic.check_download_room(cache, 900)
    with pytest.raises(RefusedError) as e:
        atomic.check_download_room(cache, 1100)
    assert e.value.code == "NO_SPACE" and "1,100 bytes" in e.value.message and "needed under" in e.value.message
    with pytest.raises(RefusedError) as e:
        atomic.check_download_room(cache, 900, beside=(same, 500))
    assert "1,400 bytes" in e.value.message and "on one disk" in e.value.message and str(same) in e.value.message
    other = tmp_path / "other"
    other.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(other)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root on Linux)")
    try:
        atomic.check_download_room(cache, 900, beside=(other, 500))  # another disk: the download alone counts
    finally:
        subprocess.run(["umount", str(other)], capture_output=True)


def test_disk_space_check_on_a_real_full_filesystem(synth, tmp_path):
    """A real 1 MiB tmpfs (when this process may mount one): the refusal comes before any write."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root on Linux)")
    try:
        shutil.copytree(synth.target("qwen3_5"), mnt / "tgt")  # ~0.5 MB of the 1 MiB
        before = tree_state(mnt)
        r = cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(mnt / "tgt")], tmp_path)
        assert r.returncode == 1, r.stderr
        line = error_lines(r.stderr)[0]
        assert "not enough disk space" in line and "needed" in line, line
        assert tree_state(mnt) == before
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_disk_filling_up_while_staging_is_one_line_and_changes_nothing(synth, tmp_path, monkeypatch):
    """A real ENOSPC: the target sits on a tmpfs with room for less than the head, and the free-
    space query is told there is plenty (another process filled the disk after the check)."""
    from mtpforge.pipeline import add_mtp
    from mtpforge.writer import atomic

    src_tgt = synth.target("qwen3_5")
    size = sum(p.stat().st_size for p in src_tgt.iterdir())
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size + 96 * 1024}", "tmpfs", str(mnt)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root on Linux)")
    try:
        shutil.copytree(src_tgt, mnt / "tgt")
        before = tree_state(mnt)
        monkeypatch.setattr(atomic, "free_bytes", lambda path: 1 << 40)
        with pytest.raises(RefusedError) as e:
            add_mtp(source=str(synth.hf("qwen3_5")), target=str(mnt / "tgt"), precision="bf16", progress=False)
        assert e.value.code == "NO_SPACE" and "nothing was changed" in e.value.message, e.value.message
        assert tree_state(mnt) == before
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
