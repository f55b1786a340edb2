"""A GGUF head already holding NaN or Inf (written by another tool, or damaged on disk) is found
whatever its encoding: inspect's NONFINITE_WEIGHTS, and verify refuses before any decoding.

inspect read only F32/F16 tensors under 4 MB, so a q8_0 or bf16 head holding NaN had no finding,
and verify decoded with it and exited 0 (llama.cpp's drafts are all rejected and the output stays
identical). The value is planted in the file's bytes, in a tensor chosen per case, as damage
would put it there."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from tests.crash_harness import run_cli
from tests.test_reliability_gguf import one_line

#: the bytes of a non-finite value in each encoding (Q8_0: its block's f16 scale)
BAD = {"F32": (b"\x00\x00\x80\x7f", b"\x00\x00\xc0\x7f"), "F16": (b"\x00\x7c", b"\x00\x7e"),
       "BF16": (b"\x80\x7f", b"\xc0\x7f"), "Q8_0": (b"\x00\x7c", b"\x00\x7e")}
#: bytes per value (per block for Q8_0)
STEP = {"F32": 4, "F16": 2, "BF16": 2, "Q8_0": 34}


def _plant(path: Path, name: str, rng: random.Random) -> None:
    """NaN or Inf at a random value (block) of tensor ``name`` of ``path``."""
    from mtpforge.gguf.gguffile import read_local

    t = read_local(path).tensors[name]
    step = STEP[t.type_name]
    at = t.offset + rng.randrange(t.nbytes // step) * step
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(rng.choice(BAD[t.type_name]))


@pytest.fixture(scope="module")
def heads(synth, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """layout/precision -> a clean folder holding the trunk and add-mtp's head."""
    from tests.support.synth.gguf_trunk import synthetic_trunk

    src, out = synth.hf("qwen3_5"), {}
    root = tmp_path_factory.mktemp("nf-heads")
    for case in ("f16", "q8_0", "bf16", "tail"):
        trunk = synthetic_trunk(src, root / case / "trunk.gguf")
        args = ["add-mtp", "--source", str(src), "--target", str(trunk)]
        args += ["--layout", "gguf-tail", "--output", str(root / case / "t.gguf")] if case == "tail" else ["--precision", case]
        assert run_cli(args).returncode == 0
        target = root / case / ("t.gguf" if case == "tail" else "trunk.gguf")
        clean = run_cli(["inspect", str(target), "--json"])
        assert clean.returncode == 0 and json.loads(clean.stdout)["findings"] == [], clean.stdout[-2000:]
        out[case] = root / case
    return out


def _head(folder: Path) -> Path:
    return folder / "t.gguf" if (folder / "t.gguf").is_file() else next(folder.glob("mtp-*.gguf"))


def test_every_tensor_of_a_head_in_every_encoding_is_checked(heads, tmp_path: Path) -> None:
    """Property: whichever tensor of the MTP block holds the bad value, and wherever in it, the
    check names exactly that tensor (each encoding add-mtp writes: F32 norms and routers, F16,
    BF16 and Q8_0 matrices)."""
    from mtpforge.gguf.finite import nonfinite_tensors
    from mtpforge.gguf.gguffile import read_local
    from mtpforge.gguf.names import block_of

    rng = random.Random(30)
    seen: set[str] = set()
    for case, folder in heads.items():
        clean = _head(folder)
        g = read_local(clean)
        blocks = {block_of(n) for n in g.tensors if ".nextn." in n}
        names = [n for n in g.tensors if block_of(n) in blocks]
        assert names and nonfinite_tensors(g, names) == []
        for name in names:
            p = tmp_path / f"{case}.gguf"
            shutil.copyfile(clean, p)
            _plant(p, name, rng)
            assert nonfinite_tensors(read_local(p), names) == [name], (case, name)
            seen.add(g.tensors[name].type_name)
    assert seen == set(BAD), seen


@pytest.mark.parametrize("case", ["f16", "q8_0", "bf16", "tail"])
def test_inspect_and_verify_find_a_head_holding_nan_in_any_encoding(heads, case: str, tmp_path: Path) -> None:
    """inspect: NONFINITE_WEIGHTS, exit 1; verify: one line, exit 1, ``NONFINITE_WEIGHTS``,
    before llama-server is started or even looked for; the files are left as they are."""
    from mtpforge.gguf.gguffile import read_local
    from tests.checkers import folder_state

    folder = Path(shutil.copytree(heads[case], tmp_path / case))
    head = _head(folder)
    g = read_local(head)
    from mtpforge.gguf.names import block_of

    blocks = {block_of(n) for n in g.tensors if ".nextn." in n}
    name = next(n for n, t in sorted(g.tensors.items()) if block_of(n) in blocks and len(t.shape) >= 2)
    assert case == "tail" or g.tensors[name].type_name == case.upper(), (name, g.tensors[name].type_name)
    _plant(head, name, random.Random(case))
    target = head if case == "tail" else folder / "trunk.gguf"
    before = folder_state(folder)
    r = run_cli(["inspect", str(target), "--json"])
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    bad = [f for f in json.loads(r.stdout)["findings"] if f["code"] == "NONFINITE_WEIGHTS"]
    assert bad and name in bad[0]["message"], json.loads(r.stdout)["findings"]
    v = run_cli(["verify", str(target), "--llama-server", "/nonexistent/llama-server", "--json"])
    line = one_line(v, 1, "NaN or Inf")
    assert name in line and json.loads(v.stdout)["error"]["code"] == "NONFINITE_WEIGHTS"
    assert folder_state(folder) == before


def test_integer_and_double_tensors_are_judged_and_never_crash_the_check(tmp_path: Path) -> None:
    """An I32 tensor (llama.cpp stores some in heads and trunks) holds no NaN and is passed; an
    F64 one is judged by its exponent bits (the check raised NotImplementedError on I32 before it
    was released)."""
    import gguf
    import numpy as np

    from mtpforge.gguf.finite import nonfinite_tensors
    from mtpforge.gguf.gguffile import read_local

    p = tmp_path / "x.gguf"
    w = gguf.GGUFWriter(str(p), "qwen35")
    w.add_tensor("blk.0.ints.weight", np.arange(64, dtype=np.int32))
    w.add_tensor("blk.0.dbl.weight", np.array([1.0, float("nan"), 2.0], dtype=np.float64))
    w.add_tensor("blk.0.ok.weight", np.ones(8, dtype=np.float64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = read_local(p)
    assert nonfinite_tensors(g, list(g.tensors)) == ["blk.0.dbl.weight"]
