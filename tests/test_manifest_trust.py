"""mtpforge.json travels with the folder (folders are shared and uploaded whole), so remove-mtp
and add-mtp --force undo only what add-mtp provably wrote: a planted or stale manifest is refused
in one line with nothing changed, a link never leaves the folder, and the user's later edits to
config.json survive. The property: for any manifest content, remove-mtp either restores exactly
what add-mtp changed or refuses without changing anything."""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mtpforge.errors import MtpforgeError
from mtpforge.layouts.write import dump_json
from mtpforge.pipeline import add_mtp, remove_mtp
from tests.checkers import folder_state
from tests.crash_harness import hub_cache, run_cli
from tests.test_hostile import error_lines, tree_state

MANIFEST = "mtpforge.json"


def _manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


def _plant(folder: Path, m: dict) -> None:
    (folder / MANIFEST).write_bytes(dump_json(m))


def _refused_in_one_line(r, says: str = "cannot be trusted") -> None:
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    lines = error_lines(r.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: ") and " — fix: " in lines[0], lines
    assert says in lines[0], lines[0]
    assert "Traceback" not in r.stderr


def _config_before(tgt: Path) -> str:
    return (tgt / "config.json").read_text()


# ----------------------------------------------------------------------------- planted manifests

def _planted(tgt: Path, *, added=None, changed=None) -> dict:
    """A manifest as a hostile or stale folder could carry it, on a folder without a head."""
    return {"mtpforge_manifest": 2, "layout": "embedded", "added": added or [MANIFEST],
            "changed": changed or {}, "file_sha256": {}}


@pytest.mark.parametrize("case", ["delete-weights", "delete-weights-hashed", "replace-config", "link-tokenizer",
                                  "link-config-absolute", "link-config-parent", "edit-backbone-key"])
def test_planted_manifest_is_refused_and_nothing_changes(make_target, tmp_path, case):
    tgt = make_target("qwen3_5")
    from mtpforge.manifest import file_sha

    cfg = json.loads(_config_before(tgt))
    evil = dict(cfg, planted=True)
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps(cfg))
    m = {
        "delete-weights": _planted(tgt, added=["model.safetensors", MANIFEST]),
        "delete-weights-hashed": dict(_planted(tgt, added=["model.safetensors", MANIFEST]),
                                      file_sha256={"model.safetensors": file_sha(tgt / "model.safetensors")}),
        "replace-config": _planted(tgt, changed={"config.json": {"kind": "file", "text": json.dumps(evil)}}),
        "link-tokenizer": _planted(tgt, changed={"tokenizer.json": {"kind": "symlink", "target": "/etc/passwd"}}),
        "link-config-absolute": _planted(tgt, changed={"config.json": {"kind": "symlink", "target": str(secret)}}),
        "link-config-parent": _planted(tgt, changed={"config.json": {"kind": "symlink", "target": "../secret.json"}}),
        "edit-backbone-key": _planted(tgt, changed={"config.json": {"kind": "file", "text": json.dumps(evil)}}),
    }[case]
    _plant(tgt, m)
    before = tree_state(tmp_path)
    r = run_cli(["remove-mtp", str(tgt)])
    _refused_in_one_line(r)
    assert tree_state(tmp_path) == before
    # --force treats the head as foreign: the manifest's entries are never applied
    r = run_cli(["add-mtp", "--source", str(make_hf_path(tmp_path)), "--target", str(tgt), "--force"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tgt / "model.safetensors").is_file() and not (tgt / "tokenizer.json").is_symlink()
    assert not (tgt / "config.json").is_symlink() and "planted" not in json.loads(_config_before(tgt))


_HF: dict[str, Path] = {}


def make_hf_path(tmp_path: Path) -> Path:
    return _HF["qwen3_5"]


@pytest.fixture(autouse=True)
def _hf_source(synth):
    _HF["qwen3_5"] = synth.hf("qwen3_5")


def test_stale_manifest_of_a_replaced_head_is_refused(make_hf, make_target, tmp_path):
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    add_mtp(source=str(hf), target=str(tgt), layout="embedded", progress=False)
    (tgt / "model-mtp.safetensors").write_bytes((tgt / "model-mtp.safetensors").read_bytes()[:-8] + b"\1" * 8)
    before = tree_state(tmp_path)
    _refused_in_one_line(run_cli(["remove-mtp", str(tgt)]), "changed since")
    assert tree_state(tmp_path) == before


def test_a_manifest_claiming_a_weight_file_of_head_name_with_backbone_tensors_is_refused(make_target, tmp_path):
    from mtpforge.manifest import file_sha

    tgt = make_target("qwen3_5")
    os.rename(tgt / "model.safetensors", tgt / "model-mtp.safetensors")
    _plant(tgt, _planted(tgt, added=["model-mtp.safetensors", MANIFEST],
                         changed={"config.json": {"kind": "file", "text": _config_before(tgt)}}) |
           {"file_sha256": {"model-mtp.safetensors": file_sha(tgt / "model-mtp.safetensors")}})
    before = tree_state(tmp_path)
    _refused_in_one_line(run_cli(["remove-mtp", str(tgt)]), "not the MTP head")
    assert tree_state(tmp_path) == before


# ----------------------------------------------------------------------------- the user's later edits

def test_remove_keeps_the_users_later_config_edits(make_hf, make_target):
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    original = json.loads(_config_before(tgt))
    add_mtp(source=str(hf), target=str(tgt), progress=False)
    cfg = json.loads(_config_before(tgt))
    cfg["eos_token_id"] = 12345
    cfg["my_note"] = "tuned"
    (tgt / "config.json").write_text(json.dumps(cfg, indent=2))
    r = remove_mtp(str(tgt), progress=False)
    assert r["kept_edits"] == ["config.json"]
    got = json.loads(_config_before(tgt))
    assert got == dict(original, eos_token_id=12345, my_note="tuned")
    assert not (tgt / "model-mtp.safetensors").exists() and not (tgt / MANIFEST).exists()


def test_force_keeps_the_users_later_config_edits(make_hf, make_target):
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    add_mtp(source=str(hf), target=str(tgt), progress=False)
    cfg = json.loads(_config_before(tgt))
    cfg["my_note"] = "tuned"
    (tgt / "config.json").write_text(json.dumps(cfg, indent=2))
    add_mtp(source=str(hf), target=str(tgt), layout="sidecar", force=True, progress=False)
    assert json.loads(_config_before(tgt))["my_note"] == "tuned"
    remove_mtp(str(tgt), progress=False)
    assert json.loads(_config_before(tgt))["my_note"] == "tuned"


def test_an_edit_of_a_key_add_mtp_wrote_is_refused_not_discarded(make_hf, make_target, tmp_path):
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    add_mtp(source=str(hf), target=str(tgt), precision="bf16", layout="sidecar", progress=False)
    cfg = json.loads(_config_before(tgt))
    cfg["mlx_lm_extra_tensors"]["mtp_tensor_count"] = 7
    (tgt / "config.json").write_text(json.dumps(cfg, indent=2))
    before = tree_state(tmp_path)
    _refused_in_one_line(run_cli(["remove-mtp", str(tgt)]), "was changed after add-mtp")
    assert tree_state(tmp_path) == before


def test_hub_cache_snapshot_links_come_back_and_never_leave_the_repo(make_hf, make_target, tmp_path):
    hf, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    snap = hub_cache(tgt, tmp_path / "models--t")
    before = folder_state(snap)
    add_mtp(source=str(hf), target=str(snap), progress=False)
    assert not (snap / "config.json").is_symlink()
    remove_mtp(str(snap), progress=False)
    assert folder_state(snap) == before


# ----------------------------------------------------------------------------- the property

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=10), kids, max_size=3),
    max_leaves=12,
)
_rels = st.sampled_from(["model.safetensors", "model-mtp.safetensors", "config.json", "tokenizer.json", "README.md",
                         "model.safetensors.index.json", "mtp/weights.safetensors", "mtp/manifest.json",
                         "mtpforge.json", "../x", "/etc/passwd", "sub/y.json"])
_before = st.one_of(
    st.fixed_dictionaries({"kind": st.just("file"), "text": st.text(max_size=40) | st.just("{}")}),
    st.fixed_dictionaries({"kind": st.just("symlink"),
                           "target": st.sampled_from(["/etc/passwd", "../x", "tokenizer.json", "model.safetensors", ""])}),
    st.fixed_dictionaries({"kind": st.just("absent")}),
    _json,
)


def _mutate(genuine: dict, draw) -> dict:
    m = copy.deepcopy(genuine)
    how = draw(st.sampled_from(["added", "changed-key", "before", "patch", "hash", "drop", "random-field", "layout"]))
    if how == "added":
        m["added"] = draw(st.lists(_rels, max_size=4))
    elif how == "changed-key":
        m["changed"] = {draw(_rels): draw(_before)}
    elif how == "before":
        rel = draw(st.sampled_from(sorted(m["changed"])))
        b = draw(_before)
        m["changed"][rel] = {**m["changed"][rel], **b} if isinstance(b, dict) else b
    elif how == "patch":
        rel = draw(st.sampled_from(sorted(m["changed"])))
        p = m["changed"][rel].get("patch") or []
        p.append({"path": draw(st.lists(st.sampled_from(["vocab_size", "text_config", "quantization",
                                                           "mtp_num_hidden_layers", "weight_map"]), min_size=1, max_size=2)),
                  "before": draw(_json), "after": draw(_json)})
        m["changed"][rel]["patch"] = p
    elif how == "hash":
        m["file_sha256"] = {draw(_rels): draw(st.text(max_size=64))}
    elif how == "drop":
        m.pop(draw(st.sampled_from(sorted(m))))
    elif how == "random-field":
        m[draw(st.text(max_size=8))] = draw(_json)
    else:
        m["layout"] = draw(st.sampled_from(["mlx-vlm-drafter", "sidecar", "", "x"]))
    return m


@pytest.fixture(scope="module")
def property_bench(synth, tmp_path_factory):
    """A target before add-mtp and the same folder after it (default embedded layout: config
    and index both edited), shared by every example."""
    root = tmp_path_factory.mktemp("prop")
    pristine = root / "pristine"
    shutil.copytree(synth.target("qwen3_5"), pristine)
    added = root / "added"
    shutil.copytree(pristine, added)
    add_mtp(source=str(synth.hf("qwen3_5")), target=str(added), progress=False)
    return folder_state(pristine), added, _manifest(added)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_property_remove_restores_exactly_or_refuses_untouched(property_bench, data):
    pristine_state, added, genuine = property_bench
    kind = data.draw(st.sampled_from(["mutated", "mutated", "mutated", "mutated", "random", "genuine"]))
    if kind == "mutated":
        m = _mutate(genuine, data.draw)
    elif kind == "random":
        m = data.draw(_json | st.fixed_dictionaries({"added": st.lists(_rels, max_size=3),
                                                    "changed": st.dictionaries(_rels, _before, max_size=2)}))
    else:
        m = genuine
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "model"
        shutil.copytree(added, folder)
        (folder / MANIFEST).write_text(json.dumps(m))
        before = tree_state(Path(d))
        try:
            remove_mtp(str(folder), progress=False)
        except MtpforgeError:
            event(f"{kind}: refused")
            assert tree_state(Path(d)) == before, "refused, but something changed"
            assert kind != "genuine"
            return
        event(f"{kind}: restored")
        assert folder_state(folder) == pristine_state, f"remove-mtp succeeded with {m!r} but did not restore the folder"
        assert sorted(os.listdir(d)) == ["model"]
