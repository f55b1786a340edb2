"""Errors that name their real cause, with the contract's exit code (issue: what a user meets
between the commands). Each case is one line on stderr, no traceback, nothing written."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(cwd / "hf-home"), "COLUMNS": "200",
         "NO_COLOR": "1", "PYTHONPATH": str(REPO), **env}
    e.pop("HF_HUB_OFFLINE", None)
    e.update(env)
    return subprocess.run([sys.executable, "-m", "mtpforge", *args], cwd=cwd, env=e, capture_output=True, text=True,
                          timeout=300)


def one_line(p: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    return lines[0]


def test_convert_from_an_unreachable_hub_says_so_not_offline_mode(tmp_path: Path) -> None:
    p = cli("convert", "--hf-path", "Qwen/Qwen3.5-27B", "--mlx-path", str(tmp_path / "out"), cwd=tmp_path)
    line = one_line(p)
    assert p.returncode == 2 and "cannot reach http://127.0.0.1:9" in line and "HF_HUB_OFFLINE is set" not in line
    assert not (tmp_path / "out").exists()


def test_convert_offline_mode_still_names_it(tmp_path: Path) -> None:
    p = cli("convert", "--hf-path", "Qwen/Qwen3.5-27B", "--mlx-path", str(tmp_path / "out"), cwd=tmp_path,
            HF_HUB_OFFLINE="1")
    assert p.returncode == 2 and "HF_HUB_OFFLINE is set" in one_line(p)


@pytest.mark.parametrize("argv", [
    ["inspect", "tour/tiny-qwen3_5-4bitt"],
    ["add-mtp", "--source", "tour/tiny-qwen3_5x", "--target", "tour/model", "--dry-run"],
    ["convert", "--hf-path", "tour/tiny-qwen3_5x", "--mlx-path", "out"],
])
def test_a_mistyped_local_path_is_no_such_folder_at_once(tmp_path: Path, make_target, argv: list[str]) -> None:
    """``tour/`` exists here, so ``tour/x`` is a path, never a Hub repo id and a network timeout."""
    (tmp_path / "tour").mkdir()
    make_target("qwen3_5").rename(tmp_path / "tour" / "model")
    with socket.create_server(("127.0.0.1", 0)) as hub:  # a "Hub" that counts who knocks
        hub.setblocking(False)
        p = cli(*argv, cwd=tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{hub.getsockname()[1]}")
        line = one_line(p)
        assert p.returncode == 2 and "cannot reach" not in line and ("no such folder" in line or "does not exist" in line), line
        with pytest.raises(BlockingIOError):  # nobody connected: the Hub was never asked
            hub.accept()


def test_verify_says_a_file_is_not_a_gguf_before_looking_for_llama_server(tmp_path: Path) -> None:
    (tmp_path / "text.gguf").write_text("hello\n")
    p = cli("verify", "text.gguf", "--generate", cwd=tmp_path, PATH="/usr/bin:/bin")
    line = one_line(p)
    assert p.returncode == 2 and "GGUF" in line and "llama-server" not in line, line


def _llama(tmp_path: Path) -> Path:
    d = tmp_path / "llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    return d


@pytest.mark.parametrize("command", ["verify", "inspect", "repair-norms"])
def test_an_unhandled_model_type_is_bad_input_listing_the_registry(tmp_path: Path, command: str) -> None:
    from mtpforge.families import FAMILIES

    _llama(tmp_path)
    p = cli(command, "llama", cwd=tmp_path)
    line = one_line(p)
    assert p.returncode == 2, line
    assert "'llama'" in line and "Qwen3-Next model" not in line
    assert all(t in line for s in FAMILIES.values() for t in s.model_types if not t.endswith("_mtp")), line


def test_a_family_not_written_yet_is_named_with_what_drafts_it_today(tmp_path: Path) -> None:
    """dots3 ships an MTP head that no program drafts yet (docs/families/dots3.md): inspect names
    the family and says so, instead of calling it a model nobody ships a head for."""
    d = tmp_path / "dots3"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "dots3_note", "num_hidden_layers": 2}))
    p = cli("inspect", "dots3", cwd=tmp_path)
    line = one_line(p)
    assert p.returncode == 2 and "is a dots3 model" in line and "no MTP graph for dots3note" in line, line


def test_remove_mtp_on_a_folder_that_is_no_model_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "GUIDE.md").write_text("# guide\n")
    p = cli("remove-mtp", "docs", cwd=tmp_path)
    assert p.returncode == 2 and "no config.json" in one_line(p)


def test_a_second_remove_mtp_says_there_is_no_head(tmp_path: Path, make_hf, make_target) -> None:
    src, tgt = make_hf("qwen3_5"), make_target("qwen3_5")
    assert cli("add-mtp", "--source", str(src), "--target", str(tgt), cwd=tmp_path).returncode == 0
    assert cli("remove-mtp", str(tgt), cwd=tmp_path).returncode == 0
    p = cli("remove-mtp", str(tgt), cwd=tmp_path)
    line = one_line(p)
    assert p.returncode == 1 and "no MTP head" in line and "--force" not in line and "not added by" not in line, line
