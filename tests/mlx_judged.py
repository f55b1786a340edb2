"""The checks a non-Qwen family's MLX head is held to, with MTPLX's own backend for the family
(``glm_mtp``, ``nemotron_h_mtp``) as the judge.

GLM-4.5 (``glm4_moe``), GLM-4.7-Flash (``glm4_moe_lite``) and Nemotron-H (``nemotron_h``) heads
go into an ``mlx_lm.convert`` folder as the sidecar MTPLX 2.12.2 reads; each family's test
module builds its tiny checkpoint and calls these: MTPLX loads what add-mtp writes (MTP
enabled), drafts, and decodes exactly as its plain decode; inspect finds nothing; ``verify
--generate`` decodes as plain greedy decoding; the converted folder's missing head is found
with the add-mtp command; the runtimes that do not draft the family say so; from the
(loopback) Hub only the sidecar's tensors are fetched. Plain add-mtp and ``--runtime mtplx``
on each family's tiny model are also cells of the runtime conformance matrix (tests/conformance:
MTPLX loads every tensor as written, drafts, decodes as its plain decode, inspect agrees), so
the family modules drive MTPLX only for what the matrix does not hold.
Family-specific assertions stay in the family's module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tests import external

DRIVERS = Path(__file__).resolve().parent / "conformance" / "drivers"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import setup_runtimes  # noqa: E402  (a script: standard library only)

ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}

MTPLX_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[2])
import standins
standins.libsystem()
from mtplx import runtime as R
from mtplx.generation import generate_ar, generate_mtpk
from mtplx.sampling import SamplerConfig
greedy = dict(sampler=SamplerConfig(temperature=0.0, top_p=1.0, top_k=0), stop_token_ids=set())
rt = R.load(sys.argv[1], mtp=True)
import hashlib
from mlx.utils import tree_flatten
params = {k: [str(v.dtype), list(v.shape), hashlib.sha256(bytes(memoryview(v))).hexdigest()]
          for k, v in tree_flatten(rt.model.mtp.parameters()) if any(w in k for w in sys.argv[3:])}
standins.float32_expert_stacks(rt.model)
prompts = [[5, 17, 99, 230, 12], [40, 41, 42], [300, 301, 7, 8, 9, 10]]
plain = [generate_ar(rt, p, max_tokens=24, **greedy).tokens for p in prompts]
res = [generate_mtpk(rt, p, max_tokens=24, speculative_depth=1, mtp_hidden_variant="post_norm",
                     mtp_cache_policy="persistent", mtp_history_policy="committed", **greedy) for p in prompts]
print(json.dumps({"mtp_enabled": bool(getattr(rt, "mtp_enabled", False)), "model": type(rt.model).__name__,
                  "identical": [r.tokens for r in res] == plain,
                  "drafted": sum(int(r.stats.drafted_tokens) for r in res),
                  "accepted": sum(int(r.stats.accepted_drafts) for r in res), "params": params}))
"""


def require_mtplx() -> None:
    external.require("mtplx", setup_runtimes.is_ready("mtplx"), f"no virtualenv at {setup_runtimes.venv_dir('mtplx')}")


def mtplx_run(script: str, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` in MTPLX's own virtualenv, with ``folder`` and the conformance stand-ins."""
    return subprocess.run([str(setup_runtimes.venv_python("mtplx")), "-c", script, str(folder), str(DRIVERS), *args],
                          capture_output=True, text=True, timeout=600)


def mtplx_drafts(folder: Path, *params: str) -> dict[str, Any]:
    """MTPLX loads ``folder`` with MTP and decodes 3 prompts x 24 tokens greedily, with and without
    drafting: whether MTP was enabled, whether the outputs are identical, how many drafts and how
    many of them MTPLX accepted; and each head parameter whose name holds one of ``params`` as it
    loaded it (name -> dtype, shape, sha256 of its bytes), from the same load."""
    r = mtplx_run(MTPLX_PROBE, folder, *params)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def mtpforge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mtpforge", *args], capture_output=True, text=True, env=ENV)


def source_tensors(src: Path, glob: str = "model*.safetensors") -> dict[str, np.ndarray]:
    """Every tensor of the source's shards (``glob``) as numpy; bf16 ones (numpy has no bf16) as
    their uint16 bit patterns: the same bytes."""
    import mlx.core as mx

    out: dict[str, np.ndarray] = {}
    for f in sorted(src.glob(glob)):
        out.update({k: np.array(v.view(mx.uint16) if v.dtype == mx.bfloat16 else v) for k, v in mx.load(str(f)).items()})
    return out


def add_mtp(src: Path | str, folder: Path, *extra: str) -> dict[str, Any]:
    """``mtpforge add-mtp --json`` into ``folder``; its report (the run must succeed)."""
    r = mtpforge("add-mtp", "--source", str(src), "--target", str(folder), "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def mtplx_judges_the_head(src: Path, mlx: Path, folder: Path, extra: list[str], drafts: bool = True,
                          params: tuple[str, ...] = ()) -> dict[str, Any]:
    """add-mtp (``extra``: e.g. ``--runtime mtplx``) into a copy of ``mlx``: MTPLX loads the sidecar
    with MTP enabled, drafts and decodes as its plain decode; inspect --runtime mtplx finds
    nothing; verify --generate decodes as plain greedy decoding. Returns MTPLX's and verify's
    figures and inspect's report. ``drafts=False``: MTPLX is not run (plain add-mtp and ``--runtime
    mtplx`` on the family's own fixture are cells of the runtime conformance matrix,
    tests/conformance); ``params``: as :func:`mtplx_drafts`. inspect and verify run in this
    process (their command lines are tests/test_inspect.py's and tests/test_verify.py's subject):
    a second interpreter importing mlx-lm and transformers cost more than the decode."""
    from mtpforge.inspect import inspect_checkpoint
    from mtpforge.verify import verify

    shutil.copytree(mlx, folder)
    rep = add_mtp(src, folder, *extra)
    assert (folder / "mtp.safetensors").is_file() and rep["layout"] == "sidecar"
    got = mtplx_drafts(folder, *params) if drafts else None
    assert got is None or got["mtp_enabled"] and got["identical"] and got["drafted"] > 0, got
    ins = inspect_checkpoint(str(folder), runtime="mtplx")
    assert ins["exit_code"] == 0 and ins["findings"] == [], ins["findings"]
    v = verify(str(folder), generate=True, max_tokens=24, progress=False)
    assert v["identical"] is True, v
    return {"add": rep, "mtplx": got, "verify": v, "inspect": ins}


#: the absorbed MLA matrices (``kv_b_proj`` split) among a head's parameters
MLA_PARAMS = ("embed_q", "unembed_out")


def mla_of(params: dict[str, Any]) -> dict[str, Any]:
    """The MLA matrices of :func:`mtplx_drafts`' ``params``, named after ``self_attn.``."""
    return {k.split("self_attn.")[1]: v for k, v in params.items() if any(w in k for w in MLA_PARAMS)}


def remove_takes_the_drafter_away(src: Path, mlx: Path, work: Path, family: str, example_repo: str) -> None:
    """add-mtp --runtime mlx-vlm into a copy of ``mlx``, then remove-mtp on the model folder: the
    drafter folder is gone, the model folder is as converted, and inspect finds the missing head
    again."""
    from tests.test_hostile import tree_state

    folder = work / "m"
    shutil.copytree(mlx, folder)
    before = tree_state(folder)
    add_mtp(src, folder, "--runtime", "mlx-vlm")
    drafter = work / "m-mtp-drafter"
    assert drafter.is_dir()
    r = mtpforge("remove-mtp", str(folder), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not drafter.exists() and tree_state(folder) == before, r.stdout
    inspect_finds_the_dropped_head(folder, family, example_repo)


def inspect_finds_the_dropped_head(mlx: Path, family: str, example_repo: str) -> None:
    """The converted folder declares an MTP head and stores none: the one finding, with the
    add-mtp command that fixes it (the family's release as the example source)."""
    r = mtpforge("inspect", str(mlx), "--json")
    rep = json.loads(r.stdout)
    (f,) = rep["findings"]
    assert r.returncode == 1 and rep["family"] == family and f["code"] == "MTP_CONFIG_WITHOUT_WEIGHTS"
    assert f["fix"] == f"mtpforge add-mtp --source <original Hugging Face repo, e.g. {example_repo}> --target {mlx}"


def runtime_says_it_does_not_draft(src: Path, mlx: Path, folder: Path, runtime: str, family: str, name: str) -> None:
    """inspect --runtime on a folder with the head: the runtime's own words (naming the model,
    ``name``) for why it has no MTP path for the family; add-mtp --runtime refuses where the
    runtime's layout is not one the family has, in one line, and touches nothing."""
    from tests.test_hostile import error_lines, tree_state

    if not folder.exists():
        shutil.copytree(mlx, folder)
        add_mtp(src, folder)
    r = mtpforge("inspect", str(folder), "--json", "--runtime", runtime)
    codes = {f["code"]: f for f in json.loads(r.stdout)["findings"]}
    assert "RUNTIME_NO_MTP" in codes and name in codes["RUNTIME_NO_MTP"]["message"], r.stdout
    from mtpforge.families import FAMILIES
    from mtpforge.runtimes.table import RUNTIMES

    # a runtime reading a layout the family has (exo: the sidecar; oMLX: Nemotron-H's embedded
    # form) gets the head written, with a note that it will not draft it
    if not set(RUNTIMES[runtime].layouts_for(family)) & set(FAMILIES[family].layouts):
        before = tree_state(folder)
        r = mtpforge("add-mtp", "--source", str(src), "--target", str(folder), "--runtime", runtime, "--force")
        lines = error_lines(r.stderr)
        assert r.returncode == 2 and len(lines) == 1 and f"no MTP path for {family}" in lines[0], r.stderr
        assert tree_state(folder) == before


def hub_fetches_only_the_sidecars_tensors(hub: Any, src: Path, mlx: Path, tmp_path: Path, prefix: str,
                                          unread: tuple[str, ...]) -> dict[str, int]:
    """From the (loopback) Hub only the tensors under ``prefix`` the sidecar is made of come over
    the wire (those ending in ``unread``, which no MLX runtime reads, not among them): <= 1.01 x
    their bytes; the sidecar equals the one add-mtp writes from the local source, byte for byte.
    Returns the bytes fetched and the head's."""
    repo, _ = hub.publish(src)
    head = sum(v.nbytes for k, v in source_tensors(src).items() if k.startswith(prefix) and not k.endswith(unread))
    folder, local = tmp_path / "hub", tmp_path / "local"
    shutil.copytree(mlx, folder)
    shutil.copytree(mlx, local)
    hub.server.clear_log()
    r = hub.run("add-mtp", "--source", repo, "--target", str(folder))
    assert r.code == 0, r.stderr
    fetched = hub.tensor_bytes(repo)
    assert 0 < fetched <= 1.01 * head and r.json["fetched_bytes"] == fetched
    add_mtp(src, local)
    assert (folder / "mtp.safetensors").read_bytes() == (local / "mtp.safetensors").read_bytes()
    return {"fetched": fetched, "head": head}
