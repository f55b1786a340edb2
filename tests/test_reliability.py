"""The data-loss classes of the second reliability round, through the real CLI: one run per
folder from the first read to the commit, a drafter folder mtpforge did not write is never
replaced behind the user's back, the folder's mode, group and setgid survive (a read-only folder
stays read-only and leaves nothing undeletable), "already present" means the same bytes, NaN in
the source is refused before quantization can hide it, and Ctrl-C tells the truth."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import pytest

from mtpforge.pipeline import add_mtp, remove_mtp
from tests.checkers import folder_state, rewrite
from tests.hostile.corpus import split_st
from tests.crash_harness import cli_env, leftovers, run_cli
from tests.test_hostile import error_lines, tree_state


def one_line(r: subprocess.CompletedProcess, code: int, says: str) -> str:
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = error_lines(r.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: ") and " — fix: " in lines[0], lines
    assert says.lower() in lines[0].lower(), lines[0]
    return lines[0]


# ----------------------------------------------------------------------------- concurrency

def test_a_second_run_while_the_first_downloads_is_refused_and_the_original_survives(hub, synth, make_target, tmp_path):
    """Two runs on one target while one downloads: the lock covers read -> fetch -> stage ->
    commit, so the second is refused at once and remove-mtp restores the original exactly."""
    repo, _ = hub.source(synth, "qwen3_5")
    tgt = make_target("qwen3_5")
    pristine = folder_state(tgt)
    hub.fault("slow", repo=repo, delay=3.0, times=-1)
    env = hub.env(tmp_path / "hf-a")
    first = subprocess.Popen([sys.executable, "-m", "mtpforge", "add-mtp", "--source", repo, "--target", str(tgt),
                              "--layout", "embedded"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert first.stderr is not None
    for line in first.stderr:
        if "fetching" in line:
            break
    second = hub.run("add-mtp", "--source", repo, "--target", str(tgt), "--layout", "sidecar", "--force",
                     hf_home=tmp_path / "hf-b")
    assert first.wait(timeout=120) == 0, first.stderr.read()
    first.stderr.close()
    assert second.code == 1 and "another mtpforge run is changing" in second.stderr, second.stderr
    assert json.loads(second.stdout)["error"]["code"] == "BUSY"
    assert (tgt / "model-mtp.safetensors").is_file() and not (tgt / "mtp.safetensors").exists()
    remove_mtp(str(tgt), progress=False)
    assert folder_state(tgt) == pristine


def test_a_held_folder_refuses_remove_too(synth, make_target, tmp_path):
    tgt = make_target("qwen3_5")
    add_mtp(source=str(synth.hf("qwen3_5")), target=str(tgt), progress=False)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
                               "from mtpforge.writer.lock import folder_lock\n"
                               "with folder_lock(Path(sys.argv[1])):\n print('held', flush=True); time.sleep(60)", str(tgt)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = tree_state(tmp_path)
        one_line(run_cli(["remove-mtp", str(tgt)]), 1, "another mtpforge run is changing")
        assert tree_state(tmp_path) == before
    finally:
        holder.kill()
        holder.wait()
    assert run_cli(["remove-mtp", str(tgt)]).returncode == 0  # a dead holder's lock died with it


# ----------------------------------------------------------------------------- drafter folders

@pytest.mark.parametrize("what", ["file", "user-folder", "foreign-drafter", "symlink"])
def test_a_drafter_folder_mtpforge_did_not_write_is_never_replaced_without_force(synth, make_target, tmp_path, what):
    tgt = make_target("qwen3_5")
    dest = tgt.parent / f"{tgt.name}-mtp-drafter"
    if what == "file":
        dest.write_text("my notes")
    elif what == "symlink":
        (tmp_path / "elsewhere").mkdir()
        dest.symlink_to(tmp_path / "elsewhere")
    else:
        dest.mkdir()
        (dest / "notes.txt").write_text("mine")
        if what == "foreign-drafter":
            (dest / "config.json").write_text(json.dumps({"model_type": "qwen3_5_mtp", "text_config": {}}))
    src = str(synth.hf("qwen3_5"))
    args = ["add-mtp", "--source", src, "--target", str(tgt), "--layout", "mlx-vlm-drafter"]
    before = tree_state(tmp_path)
    one_line(run_cli(args), 1, "did not write" if what == "foreign-drafter" else "not")
    assert tree_state(tmp_path) == before
    r = run_cli(args + ["--force"])
    if what == "foreign-drafter":  # --force replaces another tool's drafter, as asked
        assert r.returncode == 0, r.stderr
        assert json.loads((dest / "config.json").read_text())["model_type"] == "qwen3_5_mtp" and (dest / "mtpforge.json").is_file()
    else:  # never a file, a link, or a folder of other files, even with --force
        one_line(r, 1, "not")
        assert tree_state(tmp_path) == before


def test_mtpforges_own_drafter_is_already_present_then_replaced_with_force(synth, make_target):
    tgt = make_target("qwen3_5")
    src = str(synth.hf("qwen3_5"))
    args = ["add-mtp", "--source", src, "--target", str(tgt), "--layout", "mlx-vlm-drafter"]
    assert run_cli(args).returncode == 0
    r = run_cli(args)
    assert r.returncode == 0 and "already" in r.stdout + r.stderr
    one_line(run_cli(args + ["--precision", "bf16"]), 1, "already has")
    assert run_cli(args + ["--precision", "bf16", "--force"]).returncode == 0


# ----------------------------------------------------------------------------- permissions

def _other_gid() -> int:
    """A group other than this process's: root can give any; others use a supplementary group."""
    if os.geteuid() == 0:
        return 4242
    others = [g for g in os.getgroups() if g != os.getegid()]
    if not others:
        pytest.skip("needs a second group")
    return others[0]


@pytest.mark.parametrize("cmd", ["add", "remove", "output"])
def test_mode_group_and_setgid_of_the_folder_and_its_files_are_kept(synth, make_target, tmp_path, cmd):
    tgt = make_target("qwen3_5")
    src = str(synth.hf("qwen3_5"))
    if cmd == "remove":
        add_mtp(source=src, target=str(tgt), progress=False)
    gid = _other_gid()
    for p in [tgt, *tgt.rglob("*")]:
        if not p.is_symlink():
            os.chown(p, -1, gid)
            if p.is_file():
                os.chmod(p, 0o640)
    os.chmod(tgt, 0o2750)
    want_dir = stat.S_IMODE(os.stat(tgt).st_mode)
    assert want_dir & stat.S_ISGID
    out = tmp_path / "out"
    r = run_cli(["remove-mtp", str(tgt)] if cmd == "remove" else
                ["add-mtp", "--source", src, "--target", str(tgt)] + (["--output", str(out)] if cmd == "output" else []))
    assert r.returncode == 0, r.stderr
    folder = out if cmd == "output" else tgt
    st = os.stat(folder)
    assert (stat.S_IMODE(st.st_mode), st.st_gid) == (want_dir, gid), (oct(st.st_mode), st.st_gid)
    for p in folder.rglob("*"):
        s = os.lstat(p)
        if stat.S_ISREG(s.st_mode):
            assert s.st_gid == gid, p
            assert stat.S_IMODE(s.st_mode) == 0o640, (p, oct(s.st_mode))  # as the folder's files were
    assert stat.S_IMODE(os.stat(folder / "config.json").st_mode) == 0o640
    assert leftovers(tgt.parent) == []


def test_a_read_only_folder_stays_read_only_and_leaves_nothing_behind(synth, make_target):
    tgt = make_target("qwen3_5")
    os.chmod(tgt, 0o555)
    try:
        r = run_cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(tgt)])
        assert r.returncode == 0, r.stderr
        assert stat.S_IMODE(os.stat(tgt).st_mode) == 0o555
        assert leftovers(tgt.parent) == [], "the old copy was left beside the folder"
        r = run_cli(["remove-mtp", str(tgt)])
        assert r.returncode == 0, r.stderr
        assert stat.S_IMODE(os.stat(tgt).st_mode) == 0o555 and leftovers(tgt.parent) == []
    finally:
        os.chmod(tgt, 0o755)


# ----------------------------------------------------------------------------- provenance and data

def test_already_present_compares_the_local_sources_head_bytes(make_hf, make_target):
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    assert add_mtp(source=str(hf), target=str(tgt), precision="bf16", progress=False)["status"] == "written"
    shard = next(f for f in sorted(hf.glob("*.safetensors")) if any(k.startswith("mtp.fc") for k in mx.load(str(f))))
    header, _ = split_st(shard)
    begin = 8 + len(header) + json.loads(header)["mtp.fc.weight"]["data_offsets"][0]
    raw = bytearray(shard.read_bytes())
    raw[begin + 1] ^= 0x80  # the sign of the first value: same names, shapes and sizes
    tmp = shard.with_name("tmp")
    tmp.write_bytes(bytes(raw))
    os.replace(tmp, shard)
    one_line(run_cli(["add-mtp", "--source", str(hf), "--target", str(tgt), "--precision", "bf16"]), 1, "other source bytes")
    r = add_mtp(source=str(hf), target=str(tgt), precision="bf16", force=True, progress=False)
    assert r["status"] == "written"


@pytest.mark.parametrize("precision", ["match", "bf16"])
def test_nan_in_the_source_head_is_refused_before_quantization(make_hf, make_target, tmp_path, precision):
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    shard = next(f for f in sorted(hf.glob("*.safetensors")) if any(k.startswith("mtp.fc") for k in mx.load(str(f))))

    def poison(t: dict) -> dict:
        w = t["mtp.fc.weight"]
        flat = w.reshape(-1)
        flat = mx.concatenate([mx.array([float("nan")], dtype=w.dtype), flat[1:]])
        return dict(t, **{"mtp.fc.weight": flat.reshape(w.shape)})

    rewrite(shard, poison)
    before = tree_state(tmp_path)
    line = one_line(run_cli(["add-mtp", "--source", str(hf), "--target", str(tgt), "--precision", precision]), 1, "NaN")
    assert "source" in line and "report this" not in line
    assert tree_state(tmp_path) == before


# ----------------------------------------------------------------------------- Ctrl-C

def _sigint_after(args: list[str], anchor: str, delay: float) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, "-m", "mtpforge", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=cli_env())
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if anchor in line:
            break
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    rc = proc.wait()
    return rc, "".join(seen) + rest


def test_ctrl_c_around_the_swap_tells_the_truth_and_never_a_traceback(synth, make_target, tmp_path):
    src = str(synth.hf("qwen3_5"))
    pristine = None
    outcomes = {"before": 0, "after": 0}
    for i, delay in enumerate([0.0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.3]):
        tgt = tmp_path / f"m{i}"
        shutil.copytree(make_target("qwen3_5"), tgt)
        pristine = pristine or folder_state(tgt)
        rc, err = _sigint_after(["add-mtp", "--source", src, "--target", str(tgt)], "committing", delay)
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        done = (tgt / "mtpforge.json").is_file()
        assert folder_state(tgt) == pristine or done, "neither as before nor as after"
        if rc == 130:
            lines = error_lines(err)
            assert len(lines) == 1, lines
            if done:
                assert "committed" in lines[0] and "left as it was" not in lines[0], lines[0]
            else:
                assert "left as it was" in lines[0], lines[0]
        else:
            assert rc == 0 and done, (rc, err)
        outcomes["after" if done else "before"] += 1
        assert leftovers(tmp_path) == []
    assert outcomes["after"] >= 1, outcomes


#: a Ctrl-C that lands while validation imports a module, made deterministic: the staged
#: check raises it inside exec() (as a dataclass being defined does), or wrapped by Python.
#: Run with ``-m`` as ``python -m mtpforge`` runs: CPython checks its "unhandled interrupt"
#: flag on that path (a script's SystemExit leaves by another one)
_INTERRUPT_IN_IMPORT = """
import io
import sys

import mtpforge.inspect as ins
from mtpforge import cli

HOW = sys.argv[3]


def interrupted(*a, **k):
    if HOW == "wrapped":
        try:
            exec("raise KeyboardInterrupt")
        except KeyboardInterrupt as e:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance 'report'") from e
    exec("raise KeyboardInterrupt")


# the error path once, quietly: what runs after the real interrupt then defines no new class
err, sys.stderr = sys.stderr, io.StringIO()
try:
    cli.run_command(lambda: (_ for _ in ()).throw(KeyboardInterrupt()), as_json=False, debug=False)
except BaseException:
    pass
sys.stderr = err
getattr(cli, "_INTERRUPTED", []).clear()
ins.inspect_checkpoint = interrupted
sys.argv = ["mtpforge", "add-mtp", "--source", sys.argv[1], "--target", sys.argv[2]]
cli.main()
"""


@pytest.mark.parametrize("how", ["in-exec", "wrapped"])
def test_ctrl_c_inside_an_import_exits_130_with_one_truthful_line(synth, make_target, tmp_path, how):
    """Python 3.11 marks a KeyboardInterrupt raised inside exec() as unhandled even when it is
    handled, and then ends the process with SIGINT (status -2); a Ctrl-C while a class is being
    defined arrives as a RuntimeError. Both are an interrupted run: exit 130, one line."""
    tgt = make_target("qwen3_5")
    before = folder_state(tgt)
    drv = tmp_path / "drv"
    drv.mkdir()
    (drv / "interrupt_driver.py").write_text(_INTERRUPT_IN_IMPORT)
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(drv), str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-m", "interrupt_driver", str(synth.hf("qwen3_5")), str(tgt), how],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 130, (r.returncode, r.stderr[-1500:])
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    lines = error_lines(r.stderr)
    assert len(lines) == 1 and "interrupted" in lines[0] and "left as it was" in lines[0], lines
    assert folder_state(tgt) == before and leftovers(tgt.parent) == []


# ----------------------------------------------------------------------------- paths

def test_hub_cache_snapshot_with_output_elsewhere_carries_the_files(synth, make_target, tmp_path):
    """The combination the README recommends: the snapshot's relative links into blobs/ would
    dangle in a new folder, so the files come along (hard links), and no blob changes."""
    from tests.crash_harness import hub_cache
    from mtpforge.inspect import inspect_checkpoint

    snap = hub_cache(make_target("qwen3_5"), tmp_path / "models--t")
    blobs = folder_state(tmp_path / "models--t" / "blobs")
    snap_before = folder_state(snap)
    out = tmp_path / "elsewhere" / "model"
    out.parent.mkdir()
    r = run_cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(snap), "--output", str(out)])
    assert r.returncode == 0, r.stderr
    assert not any(p.is_symlink() and not p.exists() for p in out.rglob("*")), "a dangling link in the new folder"
    assert [f for f in inspect_checkpoint(str(out))["findings"] if f["severity"] == "error"] == []
    assert folder_state(tmp_path / "models--t" / "blobs") == blobs and folder_state(snap) == snap_before


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_mount_point_as_target_is_one_line(synth, make_target, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        shutil.copytree(make_target("qwen3_5"), mnt, dirs_exist_ok=True)
        before = folder_state(mnt)
        one_line(run_cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(mnt)]), 1, "mount point")
        assert folder_state(mnt) == before
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_folder_name_too_long_for_the_stage_is_one_line(synth, make_target, tmp_path):
    tgt = tmp_path / ("m" * 240)
    shutil.copytree(make_target("qwen3_5"), tgt)
    before = tree_state(tmp_path)
    one_line(run_cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(tgt)]), 2, "too long")
    assert tree_state(tmp_path) == before


@pytest.mark.skipif(sys.platform == "darwin", reason="APFS refuses names that are not UTF-8")
def test_non_utf8_names_work_and_print(synth, make_target, tmp_path):
    root = os.fsencode(tmp_path)
    src, tgt = root + b"/src-\xff", root + b"/model-\xfe"
    shutil.copytree(synth.hf("qwen3_5"), os.fsdecode(src))
    shutil.copytree(make_target("qwen3_5"), os.fsdecode(tgt))
    env = cli_env()
    for argv in (["add-mtp", "--source", os.fsdecode(src), "--target", os.fsdecode(tgt)], ["remove-mtp", os.fsdecode(tgt)]):
        r = subprocess.run([sys.executable, "-m", "mtpforge", *argv], capture_output=True, env=env, timeout=120)
        assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr[-1500:]


# ----------------------------------------------------------------------------- messages that were false or unclear

def test_verify_generate_fails_a_head_full_of_nan(synth, make_target):
    from mtpforge.verify import verify

    tgt = make_target("qwen3_5")
    add_mtp(source=str(synth.hf("qwen3_5")), target=str(tgt), layout="embedded", precision="bf16", progress=False)
    rewrite(tgt / "model-mtp.safetensors", lambda t: {k: (mx.full(v.shape, float("nan"), v.dtype) if k.endswith("fc.weight") else v)
                                                      for k, v in t.items()})
    r = verify(str(tgt), generate=True, prompts=["Count: 1, 2, 3,"], max_tokens=6, hidden="post", progress=False)
    assert r["ok"] is False and r["exit_code"] == 1
    assert any("not finite" in p for p in r["problems"]), r["problems"]


def test_verify_record_refuses_a_head_replaced_meanwhile(synth, make_target):
    from mtpforge.errors import RefusedError
    from mtpforge.manifest import record_measurement
    from mtpforge.verify import verify

    tgt = make_target("qwen3_5")
    src = str(synth.hf("qwen3_5"))
    add_mtp(source=src, target=str(tgt), progress=False)
    measured_manifest = (tgt / "mtpforge.json").read_bytes()
    r = verify(str(tgt), generate=True, prompts=["Count: 1, 2, 3,"], max_tokens=6, hidden="post", progress=False)
    add_mtp(source=src, target=str(tgt), precision="bf16", force=True, progress=False)  # replaced meanwhile
    now = (tgt / "mtpforge.json").read_bytes()
    with pytest.raises(RefusedError, match="changed while verify ran"):
        record_measurement(tgt, r, expect=measured_manifest)
    assert (tgt / "mtpforge.json").read_bytes() == now


def test_inspect_source_of_another_model_says_so(synth, make_target):
    from mtpforge.errors import InputError
    from mtpforge.inspect import inspect_checkpoint

    tgt = make_target("qwen3_5")
    add_mtp(source=str(synth.hf("qwen3_5")), target=str(tgt), precision="bf16", progress=False)
    rep = inspect_checkpoint(str(tgt), source=str(synth.hf("qwen3_5", seed=5)))
    assert "SOURCE_MISMATCH" in {f["code"] for f in rep["findings"]}, rep["findings"]
    with pytest.raises(InputError, match="not this model's original"):
        inspect_checkpoint(str(tgt), source=str(synth.hf("qwen3_5_moe")))
    assert "SOURCE_MISMATCH" not in {f["code"] for f in inspect_checkpoint(str(tgt), source=str(synth.hf("qwen3_5")))["findings"]}


def test_a_target_defect_is_reported_as_the_targets_not_as_a_conversion_bug(synth, make_target, tmp_path):
    """The staged check fails on the target's own defect (its index lists a tensor its shard
    lacks): say so, and never "the converted head failed validation … report this"."""
    tgt = make_target("qwen3_5")
    idx = json.loads((tgt / "model.safetensors.index.json").read_text())
    idx["weight_map"]["language_model.model.layers.0.ghost.weight"] = "model.safetensors"
    (tgt / "model.safetensors.index.json").write_text(json.dumps(idx))
    before = tree_state(tmp_path)
    r = run_cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(tgt)])
    assert tree_state(tmp_path) == before
    line = one_line(r, 1, "")
    assert "report this" not in line and "failed validation" not in line, line
    assert "ghost" in line or "INDEX_INCONSISTENT" in line, line


# ----------------------------------------------------------------------------- full disks

def test_efbig_is_one_line_and_nothing_changes(synth, make_target, tmp_path):
    """A file larger than the filesystem allows (FAT32's 4 GiB, a quota, RLIMIT_FSIZE here)."""
    import resource

    tgt = make_target("qwen3_5")
    before = tree_state(tmp_path)
    r = subprocess.run([sys.executable, "-m", "mtpforge", "add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(tgt)],
                       capture_output=True, text=True, env=cli_env(), timeout=120,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10)))
    one_line(r, 1, "EFBIG")
    assert tree_state(tmp_path) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_no_free_inodes_is_reported_as_a_full_disk(synth, make_target, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=1000", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        tgt = mnt / "model"
        shutil.copytree(make_target("qwen3_5"), tgt)
        st = os.statvfs(mnt)
        used = st.f_files - st.f_ffree
        # room for the staged folder itself, none for the files written into it
        subprocess.run(["mount", "-o", f"remount,nr_inodes={used + 1}", str(mnt)], check=True)
        before = folder_state(tgt)
        line = one_line(run_cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(tgt)]), 1, "filled up")
        assert "inodes" in line and "hard links" not in line, line
        assert folder_state(tgt) == before and leftovers(mnt) == []
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_root_keeps_the_owner_of_another_users_folder(synth, make_target):
    tgt = make_target("qwen3_5")
    for p in [tgt, *tgt.rglob("*")]:
        os.lchown(p, 4243, 4243)
    r = run_cli(["add-mtp", "--source", str(synth.hf("qwen3_5")), "--target", str(tgt)])
    assert r.returncode == 0, r.stderr
    assert {(os.lstat(p).st_uid, os.lstat(p).st_gid) for p in [tgt, *tgt.rglob("*")]} == {(4243, 4243)}
