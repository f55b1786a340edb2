"""The model card section: add-mtp writes it, verify --record fills in the figures, remove-mtp
takes it out leaving the card byte for byte as it was (edits elsewhere kept)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from mtpforge import model_card
from mtpforge.errors import MtpforgeError
from mtpforge.pipeline import add_mtp, remove_mtp
from mtpforge.community import convert_to_mlx
from mtpforge.verify import verify

from tests.checkers import folder_state

DATA = Path(__file__).resolve().parent.parent / "mtpforge" / "data"
SRC = DATA / "tiny-qwen3_5"

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200).filter(lambda t: "<!--" not in t)


@settings(max_examples=200, deadline=None)
@given(card=_text, edit=_text)
def test_put_then_take_out_is_exact(card: str, edit: str) -> None:
    sec = model_card.section({"source": {"repo": "Qwen/Qwen3.5-27B", "revision": "a" * 40}, "layout": "embedded",
                              "mtp_layers": 1, "norm_convention": "shifted", "precision": {}})
    new, sep = model_card.put(card, sec)
    assert sec in new and new.startswith(card)
    assert model_card.take_out(new, sep) == card
    # replacing the section (add-mtp --force) keeps the same separator and the rest
    again, sep2 = model_card.put(new, sec.replace("embedded", "sidecar"), sep)
    assert model_card.take_out(again, sep2) == card
    # an edit above the section survives its removal
    assert model_card.take_out(edit + new, sep) == edit + card


def _card(folder: Path) -> str:
    return (folder / "README.md").read_text("utf-8")


def test_add_verify_record_remove(tmp_path: Path) -> None:
    target = convert_to_mlx(SRC, tmp_path / "tiny-4bit")
    before_state = folder_state(target)
    card_before = _card(target)
    assert card_before.startswith("---\n")  # mlx_lm.convert's card: front matter, then text

    add_mtp(source=str(SRC), target=str(target), progress=False)
    card = _card(target)
    assert card.startswith(card_before) and card.count(model_card.BEGIN) == 1
    sec = card[len(card_before):]
    assert "## MTP head" in sec and "`tiny-qwen3_5` (a local folder)" in sec and "| layout | sidecar |" in sec
    assert "4-bit, group 64, affine" in sec and "verify" not in sec.split("|---|---|")[1]

    r = verify(str(target), generate=True, max_tokens=16, record=True, progress=False)
    card = _card(target)
    row = next(ln for ln in card.splitlines() if ln.startswith("| verify |"))
    assert f"acceptance {r['acceptance']:.1%} at depth 1" in row and "identical to plain greedy: True" in row
    assert card.startswith(card_before) and card.count(model_card.BEGIN) == 1

    remove_mtp(str(target), progress=False)
    assert _card(target) == card_before and folder_state(target) == before_state


def test_card_edits_survive_remove_and_missing_card_is_created_then_removed(tmp_path: Path) -> None:
    target = convert_to_mlx(SRC, tmp_path / "t")
    card_before = _card(target)
    add_mtp(source=str(SRC), target=str(target), progress=False)
    edited = _card(target).replace("# ", "# Edited: ", 1) if "# " in card_before else "note\n" + _card(target)
    (target / "README.md").write_text(edited, "utf-8")
    remove_mtp(str(target), progress=False)
    assert _card(target) == model_card.take_out(edited, "\n") and model_card.BEGIN not in _card(target)

    bare = convert_to_mlx(SRC, tmp_path / "bare")
    (bare / "README.md").unlink()
    state = folder_state(bare)
    res: dict[str, Any] = add_mtp(source=str(SRC), target=str(bare), progress=False)
    assert _card(bare).startswith(model_card.BEGIN) and str(bare / "README.md") in res["files_written"]
    manifest = json.loads((bare / "mtpforge.json").read_text())
    assert "README.md" in manifest["added"]
    remove_mtp(str(bare), progress=False)
    assert folder_state(bare) == state


# ----------------------------------------------------------------------------- the card under the manifest's proof

def _refused(fn: Any, folder: Path, says: str) -> None:
    state = folder_state(folder)
    try:
        fn()
    except MtpforgeError as e:
        assert says in e.message, e.message
    else:
        raise AssertionError("not refused")
    assert folder_state(folder) == state


def test_a_section_edited_by_hand_is_refused_not_discarded(tmp_path: Path) -> None:
    target = convert_to_mlx(SRC, tmp_path / "t")
    add_mtp(source=str(SRC), target=str(target), progress=False)
    card = _card(target)
    (target / "README.md").write_text(card.replace("| layout |", "| where the head is |"), "utf-8")
    _refused(lambda: remove_mtp(str(target), progress=False), target, "section was edited after add-mtp")


def test_crlf_card_comes_back_byte_for_byte(tmp_path: Path) -> None:
    target = convert_to_mlx(SRC, tmp_path / "t")
    (target / "README.md").write_bytes(b"# model\r\n\r\nWindows line ends.\r\n")
    state = folder_state(target)
    add_mtp(source=str(SRC), target=str(target), progress=False)
    assert (target / "README.md").read_bytes().startswith(b"# model\r\n\r\nWindows line ends.\r\n")
    remove_mtp(str(target), progress=False)
    assert folder_state(target) == state


def test_linked_card_is_recorded_and_its_link_restored(tmp_path: Path) -> None:
    target = convert_to_mlx(SRC, tmp_path / "t")
    (target / "README.md").rename(target / "card.md")
    (target / "README.md").symlink_to("card.md")
    state = folder_state(target)
    add_mtp(source=str(SRC), target=str(target), progress=False)
    assert not (target / "README.md").is_symlink() and (target / "card.md").read_text() in _card(target)
    assert json.loads((target / "mtpforge.json").read_text())["changed"]["README.md"]["kind"] == "symlink"
    remove_mtp(str(target), progress=False)
    assert folder_state(target) == state


def test_force_replaces_the_section_once_and_already_present_ignores_card_edits(tmp_path: Path) -> None:
    target = convert_to_mlx(SRC, tmp_path / "t")
    state, card_before = folder_state(target), _card(target)
    add_mtp(source=str(SRC), target=str(target), progress=False)
    (target / "README.md").write_text("# mine\n" + _card(target), "utf-8")  # an edit elsewhere in the card
    again = add_mtp(source=str(SRC), target=str(target), progress=False)
    assert again["status"] == "already-present"  # the card is the user's to edit; the head is intact
    add_mtp(source=str(SRC), target=str(target), precision="bf16", force=True, progress=False)
    card = _card(target)
    assert card.count(model_card.BEGIN) == 1 and card.startswith("# mine\n" + card_before) and "bfloat16" in card
    remove_mtp(str(target), progress=False)
    assert _card(target) == "# mine\n" + card_before
    (target / "README.md").write_text(card_before, "utf-8")
    assert folder_state(target) == state


@pytest.mark.parametrize("planted", ["added", "changed", "changed-link-out"])
def test_a_planted_card_record_never_touches_the_users_card(planted: str, tmp_path: Path) -> None:
    """A manifest that claims the card without proof: the card has no mtpforge section, so
    nothing of it is removed or written; a link record pointing out of the folder is refused."""
    target = convert_to_mlx(SRC, tmp_path / "t")
    add_mtp(source=str(SRC), target=str(target), progress=False)
    m = json.loads((target / "mtpforge.json").read_text())
    users = "# the user's own card\n"
    (target / "README.md").write_text(users, "utf-8")
    rec = m["changed"].pop("README.md")
    if planted == "added":
        m["added"].insert(0, "README.md")
        m["file_sha256"]["README.md"] = hashlib.sha256(users.encode()).hexdigest()
    elif planted == "changed":
        m["changed"]["README.md"] = {**rec, "after_sha256": hashlib.sha256(users.encode()).hexdigest()}
    else:
        (target / "README.md").write_text(_card_with_section(users), "utf-8")
        data = (target / "README.md").read_bytes()
        m["model_card"]["section_sha256"] = [model_card.section_sha(data.decode())]
        m["changed"]["README.md"] = {"kind": "symlink", "target": "../../etc/passwd",
                                     "sha256": hashlib.sha256(users.encode()).hexdigest(),
                                     "after_sha256": hashlib.sha256(data).hexdigest()}
    (target / "mtpforge.json").write_text(json.dumps(m))
    if planted == "changed-link-out":
        _refused(lambda: remove_mtp(str(target), progress=False), target, "cannot be trusted")
        return
    res = remove_mtp(str(target), progress=False)
    assert _card(target) == users and "README.md" in res["kept_edits"]


def _card_with_section(text: str) -> str:
    return model_card.put(text, model_card.section({"source": {"repo": "x/y"}, "layout": "embedded"}))[0]
