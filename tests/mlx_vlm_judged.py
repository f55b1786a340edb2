"""mlx-vlm's own convert, loader and decode loop, run in its virtualenv: the judge of the
drafters mtpforge writes for mlx-vlm (Nemotron-H's ``nemotron_h_mtp``, Qwen3.8-Flash-Next's
``qwen4_exp_mtp``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests import external
from tests import mlx_judged as judged

#: mlx-vlm 0.7.10's own convert, in its virtualenv (argv: source, output)
VLM_CONVERT = """
import contextlib, io, sys
from mlx_vlm.convert import convert
with contextlib.redirect_stdout(io.StringIO()):
    convert(sys.argv[1], sys.argv[2], quantize=True, q_group_size=32, q_bits=4, dtype="float32")
"""

#: mlx-vlm 0.7.10's loader and decode loop on a drafter folder: ``load_drafter(kind="mtp")``
#: (every parameter of its drafter against the tensor the folder stores for it), then
#: ``stream_generate`` greedy, plain and with the drafter, on the prompts of ``PROBE_PROMPTS``
#: (JSON) x ``PROBE_TOKENS`` tokens; with a fourth argument, the drafter mlx-vlm's own splitter
#: builds from that source folder too
VLM_PROBE = """
import json, os, sys
sys.path.insert(0, sys.argv[3])
import standins
from pathlib import Path
import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_vlm import load
from mlx_vlm.generate import stream_generate
from mlx_vlm.speculative.drafters import load_drafter
model, processor = load(sys.argv[1])
standins.float32_expert_stacks(model)
draft, kind = load_drafter(sys.argv[2], kind="mtp")
stored = mx.load(str(Path(sys.argv[2]) / "model.safetensors"))
params = dict(tree_flatten(draft.parameters()))
same = lambda a, b: a.dtype == b.dtype and a.shape == b.shape and bool(mx.array_equal(a, b).item())
out = {"kind": kind, "drafter": type(draft).__name__, "params": len(params), "stored": len(stored),
       "missing": sorted(k for k in params if k not in stored), "unused": sorted(k for k in stored if k not in params),
       "unequal": sorted(k for k, v in params.items() if k in stored and not same(v, stored[k]))}
if len(sys.argv) > 4:
    theirs = dict(tree_flatten(load_drafter(sys.argv[4], kind="mtp")[0].parameters()))
    out["theirs"] = len(theirs)
    out["vs_theirs"] = sorted(k for k in set(params) | set(theirs) if k not in params or k not in theirs
                              or not same(params[k], theirs[k]))
standins.float32_expert_stacks(draft)
prompts = json.loads(os.environ["PROBE_PROMPTS"])
dec = lambda ids, **kw: [int(r.token) for r in stream_generate(model, processor, "", input_ids=mx.array([ids]),
                                                               max_tokens=int(os.environ["PROBE_TOKENS"]), temperature=0.0, **kw)]
plain, mtp, drafted, accepted = [dec(p) for p in prompts], [], 0, 0
for p in prompts:
    mtp.append(dec(p, draft_model=draft, draft_kind="mtp"))
    drafted, accepted = drafted + sum(draft.draft_lens), accepted + sum(draft.accept_lens)
print(json.dumps({**out, "drafted": drafted, "accepted": accepted, "identical": mtp == plain,
                  "tokens": sum(map(len, plain)), "differ": [i for i, (a, b) in enumerate(zip(mtp, plain)) if a != b]}))
"""


#: four short prompts of the synthetic vocabulary
PROMPTS = [[15, 17, 99, 230, 12], [300, 301, 7, 8, 9, 10], [40, 41, 42, 43], [200, 100, 50, 25, 12, 6, 3]]


def run(script: str, *args: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``script`` in mlx-vlm's virtualenv (skips, or fails under MTPFORGE_CI=1, where there is none)."""
    external.require("mlx-vlm", judged.setup_runtimes.is_ready("mlx-vlm"),
                     f"no virtualenv at {judged.setup_runtimes.venv_dir('mlx-vlm')}")
    env = {**os.environ, **(env or {})}
    return subprocess.run([str(judged.setup_runtimes.venv_python("mlx-vlm")), "-c", script, *map(str, args)],
                          capture_output=True, text=True, timeout=600, env=env)


def convert(src: Path, out: Path) -> Path:
    """mlx-vlm's ``convert`` of ``src`` into ``out`` (4-bit, group 32; it drops ``mtp.*``)."""
    r = run(VLM_CONVERT, src, out)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def split(src: Path, out: Path) -> Path:
    """mlx-vlm's own drafter for ``src``: its ``Qwen4ExpMTPSplitter`` reading the whole source."""
    r = run("import sys\nfrom mlx_vlm.speculative.drafters.qwen4_exp_mtp.split import split_qwen4_exp_mtp\n"
            "split_qwen4_exp_mtp(sys.argv[1], sys.argv[2])\n", src, out)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def probe(target: Path, drafter: Path, *theirs: Path, prompts: list[list[int]] = PROMPTS, tokens: int = 32) -> dict:
    """mlx-vlm's loader and decode loop on ``drafter`` beside ``target`` (``VLM_PROBE``)."""
    r = run(VLM_PROBE, target, drafter, judged.DRIVERS, *theirs,
            env={"PROBE_PROMPTS": json.dumps(prompts), "PROBE_TOKENS": str(tokens)})
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
