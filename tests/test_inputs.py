"""Every file mtpforge reads is parsed once, where it is read, into a validated value: a value
that does not validate is one line naming the file, the key and what was expected (exit 2), or
a finding in inspect — never "internal error" from code that trusted it.

The property test mutates every value of each input file (tests/input_fuzz.py: types, ranges,
shapes, nesting, encodings) and runs the commands that read it through the CLI in this process;
``scripts/fuzz_inputs.py`` runs thousands per file kind. Then the six cases the attack suite of
reliability round three found, and the proof chain and GGUF cases of round two.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.checkers import folder_state
from tests.hostile.corpus import put_st, split_st
from tests.input_fuzz import KINDS, Bench, environment, make_bench, run_example
from tests.test_hostile import cli, error_lines, tree_state

#: examples per file kind in the suite (a few hundred in all); the script runs thousands
EXAMPLES = 30


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Bench:
    root = tmp_path_factory.mktemp("inputs")
    saved = {k: os.environ.get(k) for k in environment(root)}
    os.environ.update(environment(root / "hf-home"))
    yield make_bench(root / "bench")
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.mark.parametrize("kind", KINDS)
def test_every_value_of_every_input_file_is_validated_where_it_is_read(bench: Bench, kind: str, tmp_path_factory) -> None:
    work = tmp_path_factory.mktemp(f"fuzz-{kind}")

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        o = run_example(bench, kind, data, work, fast=True)
        assert o.ok, f"{o.what}\n{' '.join(o.argv)} -> exit {o.exit_code}\n" + "\n".join(o.problems)

    one()


# ----------------------------------------------------------------------------- the six cases


def _one_line(r, code: int, *says: str) -> str:
    assert r.returncode == code, (r.returncode, r.stderr[-1500:])
    assert "Traceback" not in r.stderr + r.stdout and "internal error" not in r.stderr, r.stderr
    lines = error_lines(r.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: ") and " — fix: " in lines[0], lines
    assert not lines[0].endswith(" — fix: "), lines[0]
    for s in says:
        assert s in lines[0], (s, lines[0])
    return lines[0]


def _case(synth, tmp_path: Path, variant: str = "qwen3_5") -> tuple[Path, Path, Path]:
    root = tmp_path / "case"
    shutil.copytree(synth.hf(variant), root / "src")
    shutil.copytree(synth.target(variant), root / "tgt")
    return root, root / "src", root / "tgt"


def _edit(path: Path, fn) -> None:
    obj = json.loads(path.read_text())
    fn(obj)
    path.unlink()
    path.write_text(json.dumps(obj))


def _findings(r) -> dict[str, dict]:
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return {f["code"]: f for f in json.loads(r.stdout)["findings"]}


@pytest.mark.parametrize("bits", ["x", [8]], ids=["string", "list"])
def test_a_per_module_quantization_entry_of_the_wrong_type_is_one_line(synth, tmp_path, bits) -> None:
    root, src, tgt = _case(synth, tmp_path)

    def entry(cfg: dict) -> None:
        for k in ("quantization", "quantization_config"):
            cfg[k]["language_model.mtp.fc"] = {"group_size": 64, "bits": bits}

    _edit(tgt / "config.json", entry)
    before = tree_state(root)
    line = _one_line(cli(["add-mtp", "--source", str(src), "--target", str(tgt)], root), 2,
                     "config.json: quantization.language_model.mtp.fc.bits is", "expected an integer number of bits")
    assert json.dumps(bits) in line
    r = cli(["inspect", str(tgt), "--json"], root)
    assert r.returncode == 1
    f = _findings(r)["INVALID_VALUE"]
    assert "quantization.language_model.mtp.fc.bits" in f["message"] and f["fix"] and f["severity"] == "error"
    assert tree_state(root) == before


@pytest.mark.parametrize("how", ["scale-1d", "scale-block-count", "norm-fp8"])
def test_a_block_fp8_source_with_misshaped_scales_is_one_line(synth, tmp_path, how) -> None:
    from tests.support.synth.fp8 import to_block_fp8

    root = tmp_path / "case"
    src = to_block_fp8(synth.hf("qwen3_5"), root / "src")
    tgt = root / "tgt"
    shutil.copytree(synth.target("qwen3_5"), tgt)
    shard = next(p for p in sorted(src.glob("*.safetensors")) if b"mtp.fc.weight_scale_inv" in p.read_bytes()[:20000])
    header, data = split_st(shard)
    obj = json.loads(header)
    if how == "scale-1d":
        s = obj["mtp.fc.weight_scale_inv"]
        s["shape"] = [s["shape"][0] * s["shape"][1]]
        says = ("mtp.fc.weight_scale_inv", "expected F32/BF16/F16 [1, 2]")
    elif how == "scale-block-count":
        s = obj["mtp.fc.weight_scale_inv"]
        s["shape"] = [s["shape"][1], s["shape"][0]]  # same bytes, the blocks counted the wrong way round
        says = ("mtp.fc.weight_scale_inv", "[2, 1]", "expected F32/BF16/F16 [1, 2]")
    else:
        norm = next(k for k in obj if k.startswith("mtp.") and k.endswith("norm.weight"))
        b = obj[norm]["data_offsets"][0]
        obj[norm]["dtype"] = "F8_E4M3"  # one byte per value: the span shrinks, the shape is the config's
        obj[norm]["data_offsets"] = [b, b + obj[norm]["shape"][0]]
        says = (norm, "is FP8 with shape", "expected a 2-D matrix")
    put_st(shard, json.dumps(obj).encode(), data)
    before = tree_state(root)
    for extra in ([], ["--dry-run"], ["--layout", "embedded"]):
        _one_line(cli(["add-mtp", "--source", str(src), "--target", str(tgt), *extra], root), 2, shard.name, *says)
    assert tree_state(root) == before


def test_verify_on_a_folder_holding_another_models_head_is_one_line(synth, tmp_path) -> None:
    """An MoE head beside a dense backbone (its sidecar copied over): a head of another model,
    said so, never a KeyError from the decoder."""
    from mtpforge.pipeline import add_mtp

    root, src, tgt = _case(synth, tmp_path)
    moe = tmp_path / "moe"
    shutil.copytree(synth.target("qwen3_5_moe"), moe)
    add_mtp(source=str(synth.hf("qwen3_5_moe")), target=str(moe), progress=False)
    shutil.copyfile(moe / "mtp.safetensors", tgt / "mtp.safetensors")
    _edit(tgt / "config.json", lambda c: c.update(mlx_lm_extra_tensors={"mtp_file": "mtp.safetensors", "mtp_tensor_count": 1}))
    before = tree_state(root)
    _one_line(cli(["verify", str(tgt)], root), 1, "does not fit this model's config", "a head of another model")
    r = cli(["inspect", str(tgt), "--json"], root)
    assert r.returncode == 1 and {"MTP_UNEXPECTED_TENSORS", "MTP_MISSING_TENSORS"} & set(_findings(r))
    assert tree_state(root) == before


@pytest.mark.parametrize("command", ["verify", "repair-norms"])
def test_a_head_module_whose_weight_is_gone_but_scales_remain_is_one_line(synth, tmp_path, command) -> None:
    """A quantized module listed by its scales and biases but not its weight (a header edited by
    hand, found by the 2,000-example fuzz run): inspect's quantization check and verify's fit
    check met a module with no weight."""
    from mtpforge.pipeline import add_mtp

    root, src, tgt = _case(synth, tmp_path)
    add_mtp(source=str(src), target=str(tgt), progress=False)
    header, data = split_st(tgt / "mtp.safetensors")
    obj = json.loads(header)
    gone = next(k for k in obj if k.endswith("k_proj.weight"))
    assert gone[: -len("weight")] + "scales" in obj
    del obj[gone]
    put_st(tgt / "mtp.safetensors", json.dumps(obj).encode(), data)
    before = tree_state(root)
    r = cli(["inspect", str(tgt), "--json"], root)
    assert r.returncode == 1 and {"MTP_MISSING_TENSORS", "INDEX_INCONSISTENT"} & set(_findings(r))
    if command == "verify":
        _one_line(cli(["verify", str(tgt)], root), 1, "it lacks", "k_proj")
    else:
        r = cli(["repair-norms", str(tgt)], root)
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert tree_state(root) == before


def test_a_head_tensor_of_an_empty_but_impossible_shape_is_a_damaged_file(synth, tmp_path) -> None:
    """[0, 2^63] spans zero bytes (the header's sizes agree) but no framework can make it."""
    from mtpforge.pipeline import add_mtp

    root, src, tgt = _case(synth, tmp_path)
    add_mtp(source=str(src), target=str(tgt), progress=False)
    header, data = split_st(tgt / "mtp.safetensors")
    obj = json.loads(header)
    obj["mtp.norm.weight"]["shape"] = [0, 2**63]
    b = obj["mtp.norm.weight"]["data_offsets"][0]
    obj["mtp.norm.weight"]["data_offsets"] = [b, b]
    put_st(tgt / "mtp.safetensors", json.dumps(obj).encode(), data)
    before = tree_state(root)
    r = cli(["inspect", str(tgt), "--json"], root)
    assert r.returncode == 1 and "9223372036854775808" in _findings(r)["CORRUPT_FILE"]["message"]
    _one_line(cli(["verify", str(tgt)], root), 1, "mtp.safetensors", "invalid shape")
    assert tree_state(root) == before


def test_a_recipe_seed_out_of_range_fails_validation_as_the_cli_does(synth, tmp_path) -> None:
    root, src, tgt = _case(synth, tmp_path)
    for seed in (-1, 2**32):
        (root / "r.yaml").write_text(f"source: ./src\ntarget: ./tgt\nchecks:\n  verify:\n    generate: false\n    seed: {seed}\n")
        _one_line(cli(["run", str(root / "r.yaml"), "--validate"], root), 2, "r.yaml:6: checks.verify.seed")
    (root / "r.yaml").write_text("source: ./src\ntarget: ./tgt\nchecks:\n  verify:\n    generate: false\n    seed: 0\n")
    assert cli(["run", str(root / "r.yaml"), "--validate"], root).returncode == 0


@pytest.mark.parametrize("q", [{"bits": 7}, {"group_size": 7}, {"mode": "bogus"}], ids=["bits7", "group7", "mode-bogus"])
def test_a_target_quantization_mlx_cannot_build_has_a_message_and_a_fix_everywhere(synth, tmp_path, q) -> None:
    from mtpforge.pipeline import add_mtp

    root, src, tgt = _case(synth, tmp_path)
    add_mtp(source=str(src), target=str(tgt), precision="bf16", progress=False)

    def bad(cfg: dict) -> None:
        for k in ("quantization", "quantization_config"):
            cfg[k].update(q)

    _edit(tgt / "config.json", bad)
    before = tree_state(root)
    for argv in (["add-mtp", "--source", str(src), "--target", str(tgt), "--force"],
                 ["add-mtp", "--source", str(src), "--target", str(tgt), "--precision", "bf16", "--force"],
                 ["verify", str(tgt)], ["repair-norms", str(tgt)]):
        line = _one_line(cli(argv, root), 2, "config.json: quantization is", "expected a quantization MLX builds")
        assert "fix: repair the quantization entry of config.json" in line
        r = cli(argv + ["--json"], root)
        err = json.loads(r.stdout)["error"]
        assert err["code"] == "INVALID_VALUE" and err["fix"], err
    r = cli(["inspect", str(tgt), "--json"], root)
    assert r.returncode == 1
    for f in json.loads(r.stdout)["findings"]:
        assert f["fix"], f
    assert "expected a quantization MLX builds" in _findings(r)["INVALID_VALUE"]["message"]
    assert tree_state(root) == before


def test_inspect_reports_a_damaged_record_and_ignores_it(synth, tmp_path) -> None:
    from mtpforge.pipeline import add_mtp

    root, src, tgt = _case(synth, tmp_path)
    add_mtp(source=str(src), target=str(tgt), progress=False)
    _edit(tgt / "mtpforge.json", lambda m: m.update(source="not an object", tensors=[1]))
    (tgt / "generation_config.json").write_text('{"eos_token_id": "two"}')
    before = tree_state(root)
    r = cli(["inspect", str(tgt), "--json", "--source", str(src)], root)
    msgs = [f["message"] for f in json.loads(r.stdout)["findings"] if f["code"] == "INVALID_VALUE"]
    assert any("mtpforge.json: source is" in m for m in msgs) and any("generation_config.json: eos_token_id" in m for m in msgs)
    assert all(f["severity"] == "warning" for f in json.loads(r.stdout)["findings"] if f["code"] == "INVALID_VALUE")
    _one_line(cli(["remove-mtp", str(tgt)], root), 1, "mtpforge.json cannot be trusted", "source is")
    _one_line(cli(["verify", str(tgt)], root), 2, "generation_config.json: eos_token_id is")
    assert tree_state(root) == before


# ----------------------------------------------------------------------------- the proof chain


def test_add_then_repair_then_remove_restores_the_folder(synth, tmp_path) -> None:
    """repair-norms keeps the record remove-mtp proves the folder by: hashes of the files it did
    not touch stay, and a file it patched back to add-mtp's bytes keeps its proof."""
    import mlx.core as mx

    from mtpforge.checkpoint.safetensors_header import read_local_header
    from mtpforge.checkpoint.tensors import to_bytes, to_mx
    from mtpforge.pipeline import add_mtp, remove_mtp
    from mtpforge.repair import repair_norms

    root, src, tgt = _case(synth, tmp_path)
    pristine = folder_state(tgt)
    add_mtp(source=str(src), target=str(tgt), layout="embedded", progress=False)
    recorded = json.loads((tgt / "mtpforge.json").read_text())["file_sha256"]
    assert "README.md" in json.loads((tgt / "mtpforge.json").read_text())["changed"]
    # another tool's edit of the head's final norm (-1), in place: the file's layout stays add-mtp's
    head = tgt / "model-mtp.safetensors"
    info = read_local_header(head, head.name).tensors["language_model.mtp.norm.weight"]
    raw = bytearray(head.read_bytes())
    v = to_mx(info, bytes(raw[info.begin:info.end]))
    raw[info.begin:info.end] = to_bytes((v.astype(mx.float32) - 1.0).astype(v.dtype))
    head.unlink()
    head.write_bytes(bytes(raw))
    rep = repair_norms(str(tgt), source=str(src), progress=False)
    assert rep["status"] == "repaired" and rep["evidence"] == "source"
    after = json.loads((tgt / "mtpforge.json").read_text())
    assert after["file_sha256"] == recorded and after["repairs"]
    r = remove_mtp(str(tgt), progress=False)
    assert r["status"] == "removed" and r["kept_edits"] == []
    assert folder_state(tgt) == pristine


def test_a_repair_by_behaviour_keeps_the_other_files_proof(synth, tmp_path) -> None:
    """A repair whose bytes are not add-mtp's (decided by behaviour, rounded differently) drops
    that file's proof only: the card and config.json stay provable."""
    from mtpforge.repair import _rehash

    manifest = {"file_sha256": {"model-mtp.safetensors": "a" * 64, "README.md": "b" * 64}}
    folder, stage = tmp_path / "f", tmp_path / "s"
    folder.mkdir()
    stage.mkdir()
    (folder / "model-mtp.safetensors").write_bytes(b"edited by someone")
    (stage / "model-mtp.safetensors").write_bytes(b"edited and repaired")
    _rehash(manifest, folder, stage, ["model-mtp.safetensors"])
    assert manifest["file_sha256"] == {"README.md": "b" * 64}


# ----------------------------------------------------------------------------- GGUF


def _gguf_folder(synth, tmp_path: Path) -> tuple[Path, Path, Path]:
    from tests.support.synth.gguf_trunk import synthetic_trunk

    hf = synth.hf("qwen3_5")
    g = tmp_path / "repo"
    f32 = synthetic_trunk(hf, g / "Tiny-Qwen3_5-F32.gguf")
    q8 = synthetic_trunk(hf, g / "Tiny-Qwen3_5-Q8_0.gguf", "Q8_0")
    return hf, f32, q8


def test_gguf_a_second_quantization_of_the_model_is_served_by_the_same_head(synth, tmp_path) -> None:
    """The MTP-only file does not depend on the trunk's type: for the Q8_0 trunk beside the F32
    one it is already present, and inspect pairs it with both."""
    hf, f32, q8 = _gguf_folder(synth, tmp_path)
    r = cli(["add-mtp", "--source", str(hf), "--target", str(f32), "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    head = Path(json.loads(r.stdout)["output"])
    head_bytes = head.read_bytes()
    r = cli(["add-mtp", "--source", str(hf), "--target", str(q8), "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["status"] == "already-present" and "Tiny-Qwen3_5-Q8_0.gguf" in out["notes"][0]
    assert head.read_bytes() == head_bytes
    before = folder_state(tmp_path / "repo")
    again = json.loads(cli(["add-mtp", "--source", str(hf), "--target", str(q8), "--json"], tmp_path).stdout)
    assert again["status"] == "already-present" and again["files_written"] == [] and folder_state(tmp_path / "repo") == before
    for trunk in (f32, q8):
        rep = json.loads(cli(["inspect", str(trunk), "--json"], tmp_path).stdout)
        assert rep["layout"] == "gguf-mtp" and rep["findings"] == [], rep


def test_gguf_add_mtp_writes_the_model_card_under_the_same_proof(synth, tmp_path) -> None:
    from mtpforge.model_card import BEGIN, find, section_sha

    hf, f32, _ = _gguf_folder(synth, tmp_path)
    card = tmp_path / "repo" / "README.md"
    card.write_text("---\nlibrary_name: gguf\n---\n# Tiny\n")
    before = card.read_bytes()
    r = cli(["add-mtp", "--source", str(hf), "--target", str(f32), "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert str(card) in out["files_written"]
    text = card.read_text()
    assert text.startswith(before.decode()) and find(text) is not None and "llama-server -m Tiny-Qwen3_5-F32.gguf" in text
    m = json.loads(Path(out["manifest"]).read_text())["model_card"]
    import hashlib

    assert m["before"] == {"kind": "file", "sha256": hashlib.sha256(before).hexdigest()}
    assert m["after_sha256"] == hashlib.sha256(card.read_bytes()).hexdigest() and section_sha(text) in m["section_sha256"]
    # a head replaced with --force rewrites its section in place; the record still says how the
    # card was before mtpforge first touched it
    head = Path(out["output"])
    head.write_bytes(head.read_bytes() + b"\0")
    r = cli(["add-mtp", "--source", str(hf), "--target", str(f32), "--force", "--json"], tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "written", r.stderr
    assert card.read_text().count(BEGIN) == 1 and card.read_text().startswith(before.decode())
    assert json.loads(Path(out["manifest"]).read_text())["model_card"]["before"] == m["before"]
    # a section no record vouches for is left alone, and said so
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "repo", other)
    for p in other.glob("*.mtpforge.json"):
        p.unlink()
    for p in other.glob("mtp-*.gguf"):
        p.unlink()
    r = cli(["add-mtp", "--source", str(hf), "--target", str(other / f32.name), "--json"], tmp_path)
    assert r.returncode == 0 and any("left README.md alone" in n for n in json.loads(r.stdout)["notes"])


def test_gguf_metadata_of_the_wrong_type_is_one_line(synth, tmp_path) -> None:
    from mtpforge.gguf.gguffile import KV
    from tests.support.synth.gguf_trunk import STR, synthetic_trunk

    hf = synth.hf("qwen3_5")
    t = synthetic_trunk(hf, tmp_path / "g" / "t.gguf", kv_edit={"qwen35.block_count": KV("four", STR)})
    before = tree_state(tmp_path / "g")
    _one_line(cli(["add-mtp", "--source", str(hf), "--target", str(t)], tmp_path), 2,
              "t.gguf: metadata qwen35.block_count is \"four\", expected an integer")
    _one_line(cli(["inspect", str(t)], tmp_path), 2, "qwen35.block_count")
    assert tree_state(tmp_path / "g") == before


def test_safetensors_header_dimension_cap() -> None:
    from mtpforge.checkpoint.safetensors_header import MAX_TENSOR_DIM, parse_header
    from mtpforge.errors import CorruptFileError

    ok = json.dumps({"t": {"dtype": "BF16", "shape": [0, MAX_TENSOR_DIM], "data_offsets": [0, 0]}}).encode()
    assert parse_header("f", ok, 8 + len(ok)).tensors["t"].shape == (0, MAX_TENSOR_DIM)
    bad = json.dumps({"t": {"dtype": "BF16", "shape": [0, MAX_TENSOR_DIM + 1], "data_offsets": [0, 0]}}).encode()
    with pytest.raises(CorruptFileError, match="invalid shape"):
        parse_header("f", bad, 8 + len(bad))
    with pytest.raises(CorruptFileError, match="unknown dtype"):
        body = json.dumps({"t": {"dtype": ["BF16"], "shape": [1], "data_offsets": [0, 2]}}).encode()
        parse_header("f", body, 8 + len(body) + 2)
    assert struct.calcsize("<Q") == 8
