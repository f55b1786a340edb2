"""add-mtp and inspect on llama.cpp GGUF trunks made by llama.cpp's own converter.

What llama-server does with the result is tested in test_gguf_llama.py; here: the files
mtpforge writes equal what llama.cpp's converter writes (tensors after dequantization, norms
included, and the metadata keys), the trunk is never modified, only the head's bytes are
fetched, and inspect finds each defect.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from mtpforge.gguf.gguffile import KV, read_local, tensor_array
from mtpforge.gguf.names import block_of
from mtpforge.gguf.write import OutTensor, copy_chunks, write_gguf
from tests.support.synth import build_hf_variant
from tests.gguf_env import XDIST_GROUP, MODELS, mtpforge, official, sha256, trunk_copy

KINDS = ("dense", "moe")

pytestmark = pytest.mark.xdist_group(XDIST_GROUP)


def _add(trunk: Path, source: Path | str, *extra: str, env: dict[str, str] | None = None) -> dict:
    r = mtpforge("add-mtp", "--source", str(source), "--target", str(trunk), "--json", *extra, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _mtp_block(g) -> dict[str, np.ndarray]:
    n = g.block_count - g.nextn_layers
    return {k: tensor_array(g, t) for k, t in g.tensors.items() if block_of(k) == n}


def _kv(g, skip: tuple[str, ...] = ()) -> list[tuple[str, object, int]]:
    return [(k, v.value, int(v.type)) for k, v in g.kv.items() if k not in skip]


@pytest.mark.parametrize("kind", KINDS)
def test_mtp_only_file_equals_llama_cpp_converter_f32(kind: str, tmp_path: Path) -> None:
    """Same tensors (names, ggml types, shapes, values), same metadata keys in the same order,
    same file name: everything llama.cpp's ``--mtp`` writes, from the trunk + range reads."""
    trunk = trunk_copy(MODELS[kind], tmp_path)
    before = sha256(trunk)
    r = _add(trunk, MODELS[kind], "--precision", "f32")
    ours, ref = read_local(r["output"]), read_local(official(MODELS[kind], "mtp", "f32"))
    assert Path(r["output"]).name == ("mtp-Tiny-Qwen3_5-F32.gguf" if kind == "dense" else "mtp-Tiny-Qwen3_5_Moe-F32.gguf")
    assert {k: (t.type, t.shape) for k, t in ours.tensors.items()} == {k: (t.type, t.shape) for k, t in ref.tensors.items()}
    for k, t in ref.tensors.items():
        assert np.array_equal(tensor_array(ours, ours.tensors[k]), tensor_array(ref, t)), k
    assert _kv(ours) == _kv(ref)
    assert sha256(trunk) == before  # the user's GGUF is only read


@pytest.mark.parametrize("precision", ["f16", "bf16"])
@pytest.mark.parametrize("kind", KINDS)
def test_half_precision_mtp_block_equals_converter(kind: str, precision: str, tmp_path: Path) -> None:
    """An f16/bf16 head is the converter's, bit for bit (norms F32, +1), while token_embd/output
    are the trunk's own bytes."""
    trunk = trunk_copy(MODELS[kind], tmp_path, "f32")
    r = _add(trunk, MODELS[kind], "--precision", precision)
    ours, ref = read_local(r["output"]), read_local(official(MODELS[kind], "mtp", precision))
    a, b = _mtp_block(ours), _mtp_block(ref)
    assert a.keys() == b.keys() and len(a) >= 15
    for k in b:
        assert ours.tensors[k].type == ref.tensors[k].type, k
        assert np.array_equal(a[k], b[k]), k
    tr = read_local(trunk)
    for k in ("token_embd.weight", "output_norm.weight", "output.weight"):
        with open(trunk, "rb") as f1, open(r["output"], "rb") as f2:
            f1.seek(tr.tensors[k].offset)
            f2.seek(ours.tensors[k].offset)
            assert f1.read(tr.tensors[k].nbytes) == f2.read(ours.tensors[k].nbytes), k
    norms = [k for k in a if k.endswith("norm.weight")]
    assert len(norms) == 7 and all(ours.tensors[k].type == gguf.GGMLQuantizationType.F32 for k in norms)


@pytest.fixture(scope="session")
def next_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen3-Next checkpoint (random weights; per-expert MTP experts), as its source ships."""
    return build_hf_variant("qwen3_next", tmp_path_factory.mktemp("next") / "tiny-qwen3_next")


@pytest.mark.parametrize("kind", (*KINDS, "qwen3_next"))
def test_gguf_tail_equals_converter_full_file(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """``--layout gguf-tail``: the trunk with its MTP layer appended is llama.cpp's own full
    conversion, tensor for tensor and key for key (its size label aside) — fused (Qwen3.5 MoE)
    and per-expert (Qwen3-Next) experts stacked as llama.cpp stacks them."""
    model = request.getfixturevalue("next_hf") if kind == "qwen3_next" else MODELS[kind]
    trunk = trunk_copy(model, tmp_path)
    before = sha256(trunk)
    out = tmp_path / "with-tail.gguf"
    r = _add(trunk, model, "--precision", "f32", "--layout", "gguf-tail", "--output", str(out))
    assert r["layout"] == "gguf-tail" and out.is_file()
    ours, ref = read_local(out), read_local(official(model, "full", "f32"))
    assert {k: (t.type, t.shape) for k, t in ours.tensors.items()} == {k: (t.type, t.shape) for k, t in ref.tensors.items()}
    for k, t in ref.tensors.items():
        assert np.array_equal(tensor_array(ours, ours.tensors[k]), tensor_array(ref, t)), k
    assert _kv(ours, ("general.size_label",)) == _kv(ref, ("general.size_label",))
    assert sha256(trunk) == before


def test_q8_0_head_is_q8_0_with_f32_norms(tmp_path: Path) -> None:
    trunk = trunk_copy(MODELS["dense"], tmp_path)
    r = _add(trunk, MODELS["dense"], "--precision", "q8_0")
    ours, ref = read_local(r["output"]), read_local(official(MODELS["dense"], "mtp", "f32"))
    a, b = _mtp_block(ours), _mtp_block(ref)
    for k in b:
        t = ours.tensors[k].type
        if k.endswith("norm.weight"):
            assert t == gguf.GGMLQuantizationType.F32 and np.array_equal(a[k], b[k]), k
        else:
            assert t == gguf.GGMLQuantizationType.Q8_0, k
            assert np.abs(a[k] - b[k]).max() <= np.abs(b[k]).max() / 127 + 1e-6, k


def test_add_mtp_gguf_guarantees(tmp_path: Path) -> None:
    """Dry run writes nothing; a second run is a no-op; foreign files and wrong heads are refused
    with one line; gguf-tail needs --output; the trunk is never modified."""
    trunk = trunk_copy(MODELS["dense"], tmp_path)
    before = sha256(trunk)
    dry = _add(trunk, MODELS["dense"], "--dry-run")
    assert dry["status"] == "planned" and dry["fetch_bytes"] > 0 and sorted(p.name for p in tmp_path.iterdir()) == [trunk.name]
    first = _add(trunk, MODELS["dense"])
    out = Path(first["output"])
    assert out.name == "mtp-Tiny-Qwen3_5-F16.gguf" and Path(first["manifest"]).is_file()
    manifest = json.loads(Path(first["manifest"]).read_text())
    assert manifest["file_sha256"] == sha256(out) and manifest["trunk"]["file"] == trunk.name
    assert _add(trunk, MODELS["dense"])["status"] == "already-present"

    moe = mtpforge("add-mtp", "--source", str(MODELS["moe"]), "--target", str(trunk))
    assert moe.returncode == 1 and moe.stderr.count("error:") == 1 and "Traceback" not in moe.stderr
    tail = mtpforge("add-mtp", "--source", str(MODELS["dense"]), "--target", str(trunk), "--layout", "gguf-tail")
    assert tail.returncode == 2 and "--output" in tail.stderr
    self_out = mtpforge("add-mtp", "--source", str(MODELS["dense"]), "--target", str(trunk), "--output", str(trunk))
    assert self_out.returncode == 2
    # a file llama.cpp would pick up, not written by mtpforge: refused, then replaced with --force
    foreign = tmp_path / "mtp-Tiny-Qwen3_5-BF16.gguf"
    shutil.copyfile(out, foreign)
    ref = mtpforge("add-mtp", "--source", str(MODELS["dense"]), "--target", str(trunk), "--precision", "bf16")
    assert ref.returncode == 1 and "--force" in ref.stderr and sha256(foreign) == sha256(out)
    forced = _add(trunk, MODELS["dense"], "--precision", "bf16", "--force")
    assert forced["status"] == "written" and sha256(foreign) != sha256(out)
    # a trunk that already carries its tail is refused
    with_tail = tmp_path / "tail" / "t.gguf"
    with_tail.parent.mkdir()
    _add(trunk, MODELS["dense"], "--layout", "gguf-tail", "--output", str(with_tail))
    again = mtpforge("add-mtp", "--source", str(MODELS["dense"]), "--target", str(with_tail))
    assert again.returncode == 1 and "already carries" in again.stderr
    assert sha256(trunk) == before
    assert not [p for p in tmp_path.rglob("*") if "mtpforge-tmp" in p.name]


def test_fetches_only_the_heads_bytes_from_the_hub(hub, tmp_path: Path) -> None:
    from tests.gguf_judged import fetches_only_the_head

    fetches_only_the_head(hub, MODELS["moe"], lambda d: trunk_copy(MODELS["moe"], d), tmp_path)


def test_interrupted_download_leaves_nothing(hub, tmp_path: Path) -> None:
    repo, _ = hub.publish(MODELS["dense"])
    trunk = trunk_copy(MODELS["dense"], tmp_path / "m")
    hub.fault("truncate", times=99)
    r = hub.run("add-mtp", "--source", repo, "--target", str(trunk), "--fetch", "ranges")
    assert r.code != 0 and "Traceback" not in r.stderr and r.stderr.count("error:") == 1
    assert sorted(p.name for p in trunk.parent.iterdir()) == [trunk.name]


# ----------------------------------------------------------------------------- inspect

def _inspect(target: Path, *extra: str) -> tuple[int, dict]:
    r = mtpforge("inspect", str(target), "--json", *extra)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


def _codes(rep: dict) -> set[str]:
    return {f["code"] for f in rep["findings"]}


def _rewrite(src: Path, dst: Path, *, kv: dict[str, object] | None = None, edit=None, drop: tuple[str, ...] = (),
             drop_kv: tuple[str, ...] = ()) -> Path:
    """A copy of a GGUF with metadata values replaced or left out and tensors edited (gguf-py
    writes it)."""
    g = read_local(src)
    meta = {k: v for k, v in g.kv.items() if k not in drop_kv}
    for k, v in (kv or {}).items():
        meta[k] = KV(v, g.kv[k].type if k in g.kv else gguf.GGUFValueType.UINT32)
    out = []
    for name, t in g.tensors.items():
        if name in drop:
            continue
        if edit is not None and (a := edit(name, tensor_array(g, t))) is not None:
            out.append(OutTensor(name, gguf.GGMLQuantizationType.F32, tuple(a.shape), a.size * 4,
                                 lambda a=a: iter([a.astype(np.float32).tobytes()])))
        else:
            out.append(OutTensor(name, t.type, t.shape, t.nbytes, copy_chunks(g, t)))
    write_gguf(dst, g.arch, meta, out)
    return dst


def test_inspect_trunk_without_head_names_the_fix(tmp_path: Path) -> None:
    trunk = trunk_copy(MODELS["dense"], tmp_path)
    code, rep = _inspect(trunk)
    assert rep["format"] == "gguf" and rep["architecture"] == "qwen35" and rep["layout"] == "none"
    (f,) = rep["findings"]
    assert f["code"] == "MTP_HEAD_MISSING" and f["fix"].startswith("mtpforge add-mtp --source") and str(trunk) in f["fix"]
    assert code == 0 and _inspect(trunk, "--strict")[0] == 1
    _add(trunk, MODELS["dense"])
    code, rep = _inspect(trunk, "--source", str(MODELS["dense"]))
    assert code == 0 and rep["findings"] == [] and rep["layout"] == "gguf-mtp" and rep["norm_convention"] == "shifted"
    assert rep["mtp_tensors"] == 15
    code, rep = _inspect(Path(official(MODELS["moe"], "full", "f32")), "--source", str(MODELS["moe"]))
    assert code == 0 and rep["layout"] == "gguf-tail" and rep["expert_format"] == "stacked" and rep["norm_convention"] == "shifted"


def test_inspect_finds_each_gguf_defect(tmp_path: Path) -> None:
    src = MODELS["dense"]
    full = official(src, "full", "f32")
    n = read_local(full).block_count - 1
    cases = {
        "MTP_NORMS_RAW": dict(edit=lambda k, a: a - 1 if k.startswith(f"blk.{n}.") and k.endswith("norm.weight") else None),
        "MTP_NORMS_DOUBLE_SHIFTED": dict(edit=lambda k, a: a + 1 if k.startswith(f"blk.{n}.") and k.endswith("norm.weight") else None),
        "MTP_NORMS_MIXED": dict(edit=lambda k, a: a - 1 if k == f"blk.{n}.attn_q_norm.weight" else None),
        "MTP_WEIGHTS_WITHOUT_CONFIG": dict(kv={"qwen35.nextn_predict_layers": 0}),
        "MTP_UNEXPECTED_TENSORS": dict(kv={"qwen35.block_count": n + 2,
                                           "qwen35.attention.recurrent_layers": [True, False, True, False, False, False]}),
        "MTP_MISSING_TENSORS": dict(drop=(f"blk.{n}.attn_k_norm.weight",)),
        "MTP_SHAPE_MISMATCH": dict(edit=lambda k, a: np.zeros((a.shape[0], a.shape[1] // 2), np.float32)
                                   if k == f"blk.{n}.nextn.eh_proj.weight" else None),
    }
    for code_, kw in cases.items():
        (tmp_path / code_).mkdir()
        bad = _rewrite(full, tmp_path / code_ / "m.gguf", **kw)
        code, rep = _inspect(bad, "--source", str(src))
        assert code == 1 and code_ in _codes(rep), (code_, rep["findings"])
    # a trunk declaring a head it does not hold
    t = trunk_copy(src, tmp_path / "decl")
    code, rep = _inspect(_rewrite(t, tmp_path / "decl" / "d.gguf", kv={"qwen35.nextn_predict_layers": 1}))
    assert code == 1 and "MTP_CONFIG_WITHOUT_WEIGHTS" in _codes(rep)
    # an MTP file of another model beside the trunk (the MoE head next to the dense trunk)
    t = trunk_copy(src, tmp_path / "other")
    shutil.copyfile(official(MODELS["moe"], "mtp", "f32"), tmp_path / "other" / "mtp-Other-F32.gguf")
    code, rep = _inspect(t)
    assert code == 1 and "MTP_SHAPE_MISMATCH" in _codes(rep)
    # a damaged MTP file beside the trunk
    t = trunk_copy(src, tmp_path / "dmg")
    (tmp_path / "dmg" / "mtp-X-F16.gguf").write_bytes(official(src, "mtp", "f32").read_bytes()[:20000])
    code, rep = _inspect(t)
    assert code == 1 and "CORRUPT_FILE" in _codes(rep)


def test_inspect_hub_gguf_repo_reads_headers_only(hub, tmp_path: Path) -> None:
    folder = tmp_path / "repo"
    folder.mkdir()
    shutil.copyfile(official(MODELS["dense"], "trunk", "f32"), folder / "Tiny-Qwen3_5-F32.gguf")
    shutil.copyfile(official(MODELS["moe"], "trunk", "f32"), folder / "Other-F32.gguf")
    shutil.copyfile(official(MODELS["dense"], "mtp", "f32"), folder / "mtp-Tiny-Qwen3_5-F32.gguf")
    (folder / "README.md").write_text("tiny\n")
    repo, _ = hub.publish(folder)
    r = hub.run("inspect", repo)
    assert r.code == 1 and "Traceback" not in r.stderr, r.stderr
    rep = r.json
    assert rep["headers_only"] and hub.tensor_bytes(repo) == 0
    assert 0 < rep["header_bytes_read"] < sum(p.stat().st_size for p in folder.glob("*.gguf")) / 10
    by = {f["file"]: f for f in rep["files"]}
    assert by["Tiny-Qwen3_5-F32.gguf"]["layout"] == "gguf-mtp"
    assert "MTP_SHAPE_MISMATCH" in _codes(rep)  # the dense MTP file sits beside the MoE trunk too


def test_a_trunk_split_in_one_part_gets_the_head_its_file_gets(tmp_path: Path) -> None:
    """gguf-split also writes a model that fits in one part as ``-00001-of-00001`` with the split
    keys (count 1): it is read as a file, and the MTP file carries none of those keys (llama-server
    takes a file with them for a part) — byte for byte the head of the same trunk without them."""
    plain = trunk_copy(MODELS["dense"], tmp_path / "plain")
    g = read_local(plain)
    kv = {**g.kv, "split.no": KV(0, gguf.GGUFValueType.UINT16), "split.count": KV(1, gguf.GGUFValueType.UINT16),
          "split.tensors.count": KV(len(g.tensors), gguf.GGUFValueType.INT32)}
    one = tmp_path / "one" / "Tiny-F32-00001-of-00001.gguf"
    one.parent.mkdir()
    write_gguf(one, g.arch, kv, [OutTensor(n, t.type, t.shape, t.nbytes, copy_chunks(g, t)) for n, t in g.tensors.items()])
    assert gguf.GGUFReader(one).fields["split.count"].contents() == 1
    ours, theirs = Path(_add(one, MODELS["dense"])["output"]), Path(_add(plain, MODELS["dense"])["output"])
    assert not any(k.startswith("split.") for k in gguf.GGUFReader(ours).fields)
    assert sha256(ours) == sha256(theirs)


def test_inspect_hub_repo_of_split_ggufs_reads_each_as_one_file(hub, tmp_path: Path) -> None:
    """A Hub repo of a large model holds its GGUFs in parts (Q4_K_M/<name>-00001-of-00009.gguf):
    inspect joins each set's headers into one trunk, named by its first part, so a trunk whose
    NextN tail lies in its last part is found with its head (not every part without one), a
    head-less one gets one MTP_HEAD_MISSING, and a set lacking a part is one CORRUPT_FILE."""
    from tests.gguf_env import convert

    folder = tmp_path / "repo"
    for sub, mode in (("with-head", []), ("no-head", ["--no-mtp"]), ("short", ["--no-mtp"])):
        (folder / sub).mkdir(parents=True)
        rc, log = convert(MODELS["dense"], folder / sub / "Tiny-F32.gguf", "f32", [*mode, "--split-max-tensors", "12"],
                          pre="qwen35")
        assert rc == 0, log[-2000:]
    short = sorted((folder / "short").glob("*.gguf"))
    short[1].unlink()
    repo, _ = hub.publish(folder)
    r = hub.run("inspect", repo)
    assert "Traceback" not in r.stderr, r.stderr
    rep = r.json
    assert rep["headers_only"] and hub.tensor_bytes(repo) == 0
    by = {f["file"]: f for f in rep["files"]}
    first = lambda sub: next(f for f in by if f.startswith(sub + "/") and "-00001-of-" in f)  # noqa: E731
    assert sorted(by) == sorted([first("with-head"), first("no-head")]), by
    assert by[first("with-head")]["layout"] == "gguf-tail" and by[first("no-head")]["layout"] == "none"
    assert [x["code"] for x in rep["findings"]].count("MTP_HEAD_MISSING") == 1
    corrupt = [x for x in rep["findings"] if x["code"] == "CORRUPT_FILE"]
    assert len(corrupt) == 1 and "short/" in corrupt[0]["message"], rep["findings"]


def test_verify_without_llama_cpp_is_one_clear_line(tmp_path: Path) -> None:
    """A trunk with its head, nothing wrong with the file: the missing llama-server is the one
    line (verify reads the GGUF first, so a head-less trunk would be refused for that instead)."""
    trunk = trunk_copy(MODELS["dense"], tmp_path)
    _add(trunk, MODELS["dense"])
    r = mtpforge("verify", str(trunk), "--json", "--llama-server", str(tmp_path / "no-llama-server"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert "llama.cpp" in line and " — fix: " in line
    assert json.loads(r.stdout)["error"]["code"] == "BAD_INPUT"


# ----------------------------------------------------------------------------- several trunks, the card


def test_a_second_quantization_of_the_trunk_is_served_by_the_same_head(tmp_path: Path) -> None:
    """The MTP-only file does not depend on the trunk's type: beside the f32 trunk's head, the
    Q8_0 trunk of the same model finds it already present, and inspect pairs it with both."""
    f32 = trunk_copy(MODELS["dense"], tmp_path, "f32")
    q8 = trunk_copy(MODELS["dense"], tmp_path, "Q8_0")
    first = _add(f32, MODELS["dense"])
    head = Path(first["output"])
    sha = sha256(head)
    second = _add(q8, MODELS["dense"])
    assert second["status"] == "already-present" and q8.name in second["notes"][0] and sha256(head) == sha
    again = _add(q8, MODELS["dense"])
    assert again["status"] == "already-present" and again["files_written"] == []
    for trunk in (f32, q8):
        code, rep = _inspect(trunk)
        assert code == 0 and rep["layout"] == "gguf-mtp" and rep["findings"] == [], rep
    # a head made for the MoE model is still another model's, whatever its name
    moe = mtpforge("add-mtp", "--source", str(MODELS["moe"]), "--target", str(q8), "--output", str(head))
    assert moe.returncode == 1 and moe.stderr.count("error:") == 1


def test_add_mtp_writes_the_gguf_repos_model_card(tmp_path: Path) -> None:
    """A GGUF repo's README is its card: the section says what was added and how to run it,
    and the head's record proves it (how the card was before, the section's and the card's
    hashes), as for an MLX folder."""
    import hashlib

    from mtpforge.model_card import find, section_sha

    trunk = trunk_copy(MODELS["dense"], tmp_path)
    card = tmp_path / "README.md"
    r = _add(trunk, MODELS["dense"])
    assert str(card) in r["files_written"]
    text = card.read_text()
    assert find(text) is not None and f"llama-server -m {trunk.name} -md" in text and "gguf-mtp" in text
    rec = json.loads(Path(r["manifest"]).read_text())["model_card"]
    assert rec["before"] == {"kind": "absent"} and rec["separator"] == ""
    assert rec["after_sha256"] == hashlib.sha256(card.read_bytes()).hexdigest() and section_sha(text) in rec["section_sha256"]
    assert _add(trunk, MODELS["dense"])["status"] == "already-present" and card.read_text() == text
