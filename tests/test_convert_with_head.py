"""``mtpforge convert``: the folder equals ``mlx_lm.convert`` + ``add-mtp`` run separately, and
the source's tensors are read once (the loopback hub's log)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mtpforge.checkpoint.safetensors_header import read_local_header
from mtpforge.convert_with_head import DTYPES, Q_MODES, QUANT_RECIPES, convert
from mtpforge.pipeline import add_mtp
from mtpforge.community import convert_to_mlx
from mtpforge.errors import InputError, RefusedError

from tests.checkers import folder_state

DATA = Path(__file__).resolve().parent.parent / "mtpforge" / "data"
MODELS = {"dense": DATA / "tiny-qwen3_5", "moe": DATA / "tiny-qwen3_5_moe"}


def _data_bytes(folder: Path) -> int:
    """Bytes of tensor data (headers excluded) in every safetensors file of ``folder``."""
    total = 0
    for f in folder.glob("*.safetensors"):
        h = read_local_header(f, f.name)
        total += sum(i.nbytes for i in h.tensors.values())
    return total


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_local_equals_mlx_lm_convert_then_add_mtp(kind: str, tmp_path: Path) -> None:
    src = MODELS[kind]
    mine = tmp_path / "convert"
    res = convert(str(src), str(mine), quantize=True, q_bits=4, q_group_size=64, progress=False)
    apart = convert_to_mlx(src, tmp_path / "apart", q_bits=4, q_group_size=64)
    add_mtp(source=str(src), target=str(apart), progress=False)
    assert folder_state(mine) == folder_state(apart)
    assert res["mtp_tensors"] > 0 and res["fetched_bytes"] == 0 and res["quantization"]["default"]["bits"] == 4
    # the plain default (no --runtime, no --layout): the sidecar no runtime's pinned mlx-lm sees
    assert res["layout"] == "sidecar" and "mtp.safetensors" in {Path(f).name for f in res["files_written"]}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left


def _mlx_lm_convert_subprocess(hub, repo: str, dst: Path, hf_home: Path, *flags: str) -> None:
    code = ("import sys; from mlx_lm.convert import main; sys.argv = ['mlx_lm.convert'] + sys.argv[1:]; main()")
    p = subprocess.run([sys.executable, "-c", code, "--hf-path", repo, "--mlx-path", str(dst), *flags],
                       env=hub.env(hf_home), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_hub_reads_source_once_and_equals_separate_runs(kind: str, hub, tmp_path: Path) -> None:
    repo, sha = hub.publish(MODELS[kind])
    flags = ("-q", "--q-bits", "4", "--q-group-size", "64")
    hub.server.clear_log()
    r = hub.run("convert", "--hf-path", repo, "--mlx-path", str(tmp_path / "convert"), *flags,
                hf_home=tmp_path / "home-a", timeout=300)
    assert r.code == 0, r.stderr
    out = r.json
    assert out["revision"] == sha and out["fetched_bytes"] == 0
    # every tensor byte of the source crossed the wire exactly once (mlx_lm.convert's download),
    # and the head came from that download: no range request reached a safetensors data region
    log = hub.log(repo)
    assert hub.tensor_bytes(repo) == _data_bytes(MODELS[kind])
    per_file: dict[str, int] = {}
    for e in log:
        if e.tensor_bytes:
            per_file[e.file] = per_file.get(e.file, 0) + 1
            assert e.range is None, e
    assert per_file and all(n == 1 for n in per_file.values()), per_file

    # the same two steps run apart, in another cache: mlx_lm.convert's CLI, then add-mtp
    apart = tmp_path / "apart"
    _mlx_lm_convert_subprocess(hub, repo, apart, tmp_path / "home-b", *flags)
    r2 = hub.run("add-mtp", "--source", repo, "--target", str(apart), hf_home=tmp_path / "home-b")
    assert r2.code == 0, r2.stderr
    assert folder_state(tmp_path / "convert") == folder_state(apart)
    manifest = json.loads((apart / "mtpforge.json").read_text())
    assert manifest["source"]["repo"] == repo and manifest["source"]["revision"] == sha


def test_refuses_existing_destination_and_leaves_it(tmp_path: Path) -> None:
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    p = subprocess.run([sys.executable, "-m", "mtpforge", "convert", "--hf-path", str(MODELS["dense"]),
                        "--mlx-path", str(dst), "--json"], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert p.returncode == 2 and "already exists" in json.loads(p.stdout)["error"]["message"]
    assert [x.name for x in dst.iterdir()] == ["keep.txt"]


def test_refusal_after_the_converter_ran_leaves_nothing(make_hf, tmp_path: Path) -> None:
    """mlx_lm.convert succeeds (it drops mtp.*), then add-mtp refuses the source's NaN head:
    no destination, no staging folder left."""
    src = make_hf("qwen3_5")
    hdr = next(read_local_header(f, f.name) for f in sorted(src.glob("*.safetensors"))
               if any(k.startswith("mtp.") for k in read_local_header(f, f.name).tensors))
    info = next(i for k, i in hdr.tensors.items() if k.startswith("mtp.") and i.dtype in ("BF16", "F32", "F16"))
    with open(src / info.file, "r+b") as f:
        f.seek(info.begin)
        f.write(b"\xff" * info.nbytes)  # all-ones: NaN in every float format
    before = set(tmp_path.iterdir())
    dst = tmp_path / "out"
    with pytest.raises(RefusedError):
        convert(str(src), str(dst), progress=False)
    assert not dst.exists() and set(tmp_path.iterdir()) == before


@pytest.mark.parametrize("flag", [{"layout": "mlx-vlm-drafter"}, {"layout": "gguf-mtp"}, {"precision": "q8_0"},
                                  {"layout": "no-such-layout"}, {"fetch": "ranges"}])
def test_head_options_convert_cannot_write_are_refused_first(flag: dict[str, str], tmp_path: Path) -> None:
    """The head's flags are add-mtp's; the ones that need another folder or a GGUF file, and
    those that mean nothing for a new folder, are one line before the converter runs."""
    dst = tmp_path / "out"
    with pytest.raises(InputError):
        convert(str(MODELS["dense"]), str(dst), progress=False, **flag)
    assert list(tmp_path.iterdir()) == []


def test_choices_match_the_installed_mlx_lm() -> None:
    import importlib

    mc = importlib.import_module("mlx_lm.convert")

    parser = mc.configure_parser()
    choices = {a.dest: tuple(a.choices or ()) for a in parser._actions}
    assert choices["q_mode"] == Q_MODES and choices["dtype"] == DTYPES and choices["quant_predicate"] == QUANT_RECIPES
