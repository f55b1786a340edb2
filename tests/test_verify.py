"""`mtpforge verify` (API and CLI): every layout add-mtp writes, the JSON contract, exit codes,
guidance for a target without a head, and --record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtpforge.errors import InputError, RefusedError
from mtpforge.layouts.table import MANIFEST
from mtpforge.pipeline import add_mtp
from mtpforge.verify import verify

from .checkers import folder_state

PROMPT = ["The cat sees the red ball in the garden."]
CONTRACT_KEYS = {"identical", "tokens", "drafted", "accepted", "acceptance", "acceptance_by_position", "hidden",
                 "hidden_variants", "accepted_per_verify", "baseline_tok_s", "mtp_tok_s", "speedup", "ok"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "mtpforge", *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.parametrize(("variant", "layout"), [
    ("qwen3_5", "embedded"), ("qwen3_5", "sidecar"), ("qwen3_5", "vllm-mlx"), ("qwen3_5", "mlx-vlm-drafter"),
    ("qwen3_6_moe", "embedded"), ("qwen3_5_moe", "vllm-mlx"), ("qwen3_next", "sidecar"), ("qwen3_next", "vllm-mlx"),
])
def test_verify_reads_every_layout_add_mtp_writes(make_hf, make_target, variant: str, layout: str) -> None:
    hf, target = make_hf(variant), make_target(variant)
    add_mtp(source=str(hf), target=str(target), layout=layout, progress=False)
    before = folder_state(target.parent)
    r = verify(str(target), generate=True, prompts=PROMPT, max_tokens=12, depth=2, progress=False)
    assert r["layout"] == layout and r["identical"] is True and r["ok"] is True
    assert r["tokens"] > 0 and r["drafted"] > 0 and len(r["acceptance_by_position"]) == 2
    assert set(r["hidden_variants"]) == {"pre", "post"} and r["hidden"] in ("pre", "post")
    assert folder_state(target.parent) == before, "verify is read-only"


def test_verify_reads_a_raw_hugging_face_folder(make_hf) -> None:
    """A raw source folder (zero-centred norms, mlx-lm shifts on load) decodes as well."""
    r = verify(str(make_hf("qwen3_5")), generate=True, prompts=PROMPT, max_tokens=8, hidden="post", progress=False)
    assert r["layout"] == "hf" and r["identical"] is True and r["hidden_variants"].keys() == {"post"}


def test_cli_json_contract_and_exit_codes(make_hf, make_target) -> None:
    target = make_target("qwen3_5_moe")
    add_mtp(source=str(make_hf("qwen3_5_moe")), target=str(target), progress=False)

    ok = cli("verify", str(target), "--generate", "--json", "--max-tokens", "10", "--prompt", PROMPT[0], "--depth", "2")
    assert ok.returncode == 0, ok.stderr
    r = json.loads(ok.stdout)
    assert CONTRACT_KEYS <= set(r) and r["identical"] is True and r["ok"] is True
    assert r["accepted"] <= r["drafted"] and len(r["acceptance_by_position"]) == 2
    assert r["identical"] is True and r["divergences"] == []
    assert 0.0 <= r["acceptance"] <= 1.0 and r["baseline_tok_s"] > 0 and r["mtp_tok_s"] > 0

    # a random-weight head drafts ~nothing: a 50% floor fails the check (exit 1), output still identical
    low = cli("verify", str(target), "--generate", "--json", "--max-tokens", "10", "--prompt", PROMPT[0],
              "--hidden", "post", "--min-acceptance", "0.5")
    assert low.returncode == 1 and "Traceback" not in low.stderr
    r = json.loads(low.stdout)
    assert r["ok"] is False and r["identical"] is True and r["hidden_variants"].keys() == {"post"}
    assert any("below --min-acceptance" in p for p in r["problems"])

    quick = cli("verify", str(target), "--json")
    assert quick.returncode == 0, quick.stderr
    q = json.loads(quick.stdout)
    assert q["generate"] is False and q["draft_logits_finite"] is True and isinstance(q["draft_token"], int)


def test_cli_target_without_a_head_gets_guidance_not_a_traceback(make_target, tmp_path: Path) -> None:
    target = make_target("qwen3_5")  # what mlx_lm.convert leaves: config declares the head, no tensors
    proc = cli("verify", str(target), "--generate")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and proc.stderr.rstrip().endswith(errors[0].rstrip())
    assert "MTP_CONFIG_WITHOUT_WEIGHTS" in errors[0] and "fix: mtpforge add-mtp --source" in errors[0]

    missing = cli("verify", str(tmp_path / "nope"), "--json")
    assert missing.returncode == 2 and json.loads(missing.stdout)["error"]["code"] == "BAD_INPUT"


def test_api_errors_are_typed(make_target, tmp_path: Path) -> None:
    with pytest.raises(RefusedError) as e:
        verify(str(make_target("qwen3_next")), progress=False)
    assert e.value.code == "MTP_HEAD_MISSING"
    with pytest.raises(InputError):
        verify(str(tmp_path), progress=False)


def test_drafter_folder_itself_is_refused_with_a_pointer(make_hf, make_target) -> None:
    target = make_target("qwen3_5")
    add_mtp(source=str(make_hf("qwen3_5")), target=str(target), layout="mlx-vlm-drafter", progress=False)
    with pytest.raises(InputError, match="drafter"):
        verify(str(target.parent / f"{target.name}-mtp-drafter"), progress=False)


def test_greedy_hidden_auto_and_sampling_reproducible(make_hf, make_target) -> None:
    target = make_target("qwen3_5")
    add_mtp(source=str(make_hf("qwen3_5")), target=str(target), progress=False)
    auto = verify(str(target), generate=True, prompts=PROMPT, max_tokens=12, depth=3, progress=False)
    assert auto["identical"] is True and set(auto["hidden_variants"]) == {"pre", "post"}
    assert auto["acceptance"] == auto["hidden_variants"][auto["hidden"]] == max(auto["hidden_variants"].values())
    assert len(auto["acceptance_by_position"]) == 3

    runs = [verify(str(target), generate=True, prompts=PROMPT, max_tokens=16, temp=0.7, seed=1, hidden="post",
                   progress=False) for _ in range(2)]
    assert runs[0]["identical"] is None and runs[0]["ok"] is True
    keys = ("tokens", "drafted", "accepted", "acceptance_by_position", "verify_passes")
    assert {k: runs[0][k] for k in keys} == {k: runs[1][k] for k in keys}


def test_record_writes_the_manifest_atomically_and_never_through_a_symlink(make_hf, make_target, tmp_path: Path) -> None:
    target = make_target("qwen3_5")
    add_mtp(source=str(make_hf("qwen3_5")), target=str(target), progress=False)
    manifest = target / MANIFEST
    original = json.loads(manifest.read_text())
    r = verify(str(target), generate=True, prompts=PROMPT, max_tokens=8, record=True, progress=False)
    assert r["recorded"] == str(manifest)
    m = json.loads(manifest.read_text())
    assert m["verify"]["hidden_state"] == r["hidden"] and m["verify"]["acceptance"] == round(r["acceptance"], 4)
    assert set(m["verify"]["hidden_variants"]) == {"pre", "post"}
    # nothing else in the manifest changes but its record of the model card, whose section now
    # shows the figures
    def rest(x: dict) -> dict:
        return {k: ({f: e for f, e in v.items() if f != "README.md"} if k in ("changed", "file_sha256") else v)
                for k, v in x.items() if k not in ("verify", "model_card")}

    assert rest(m) == rest(original), "nothing else in the manifest changes"
    assert "acceptance" in (target / "README.md").read_text("utf-8")
    assert sorted(p.name for p in target.iterdir() if p.name.endswith(".tmp")) == []

    # a symlinked manifest: the link is replaced by a file; what it pointed to stays as it was
    elsewhere = tmp_path / "shared-manifest.json"
    elsewhere.write_text(json.dumps(original))
    manifest.unlink()
    manifest.symlink_to(elsewhere)
    verify(str(target), generate=True, prompts=PROMPT, max_tokens=8, record=True, progress=False)
    assert json.loads(elsewhere.read_text()) == original
    assert not manifest.is_symlink() and "verify" in json.loads(manifest.read_text())


def test_record_without_a_manifest_records_nothing(make_hf) -> None:
    hf = make_hf("qwen3_5")
    before = folder_state(hf)
    r = verify(str(hf), generate=True, prompts=PROMPT, max_tokens=6, hidden="post", record=True, progress=False)
    assert r["recorded"] is None and any("nothing recorded" in n for n in r["notes"])
    assert folder_state(hf) == before
