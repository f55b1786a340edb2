#!/usr/bin/env python3
"""Hold a Nemotron-H head that ``add-mtp --runtime mlx-lm-mtp`` wrote to mlx-lm pull request
#1533's own code: its loader, its ``mtp_step`` and its speculative cache rollback.

The pull request cannot be installed from a registry, so this is a check run by hand (CI has no
copy of it), against a checkout of the pull request's ``mlx_lm`` package:

    git -C <mlx-lm clone> archive d620aea7 mlx_lm | tar -x -C /tmp/pr1533
    .venv/bin/python scripts/check_mlx_lm_1533.py --mlx-lm-tree /tmp/pr1533 [--json OUT]

With no folder it builds the tiny Nemotron-H checkpoint (plain and latent MoE), converts it
with released ``mlx_lm.convert`` (4-bit) and adds the head with ``--runtime mlx-lm-mtp``. Then,
in a subprocess whose ``mlx_lm`` is the pull request's: ``mlx_lm.utils.load_model`` (strict) builds
``model.mtp`` and loads every head tensor; each head parameter equals the stored tensor; and a
greedy speculative decode (depth 1) drafting with ``mtp_step`` and rolling back rejected drafts
with ``rollback_speculative_cache`` produces exactly the plain greedy output. The pull request
ships no decode loop of its own (its tests call ``mtp_step`` directly); the loop below is the
plainest one its interface allows: the head re-reads every committed pair each step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROBE = r"""
import json, sys
from pathlib import Path
import mlx.core as mx
from mlx.utils import tree_flatten
import mlx_lm
from mlx_lm.utils import load_model
from mlx_lm.models.cache import KVCache

folder, prompts, n_new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
model, config = load_model(Path(folder), strict=True)
assert getattr(model, "mtp", None) is not None, "the pull request built no mtp module"
stored = {}
for f in sorted(Path(folder).glob("model*.safetensors")):
    stored.update({k: v for k, v in mx.load(str(f)).items() if k.startswith("mtp.")})
params = dict(tree_flatten(model.mtp.parameters()))
missing = sorted(k for k in params if "mtp." + k not in stored)
unequal = sorted(k for k, v in params.items() if "mtp." + k in stored and not mx.array_equal(v, stored["mtp." + k]))


def plain(prompt):
    cache = model.make_cache()
    logits = model(mx.array([prompt]), cache=cache)
    out = []
    for _ in range(n_new):
        t = int(mx.argmax(logits[0, -1]))
        out.append(t)
        logits = model(mx.array([[t]]), cache=cache)
    return out


def speculative(prompt):
    cache = model.make_cache()
    hid = model.backbone(mx.array([prompt]), cache=cache)   # post-norm_f hiddens
    toks = list(prompt)
    t = int(mx.argmax(model.lm_head(hid[:, -1:])[0, -1]))
    out, drafted, accepted = [t], 0, 0
    hiddens = hid                                            # one per fed (committed) token
    while len(out) < n_new:
        seq = toks + out                                     # committed; the last is not yet fed
        # draft: every pair (h_i, x_{i+1}) of the committed sequence, through the head
        logits, _ = model.mtp_step(hiddens, mx.array([seq[1:]]), model.make_mtp_cache())
        d = int(mx.argmax(logits[0, -1]))
        drafted += 1
        sink = []
        hv = model.backbone(mx.array([[seq[-1], d]]), cache=cache, ssm_sink=sink)
        lv = model.lm_head(hv)
        t1 = int(mx.argmax(lv[0, 0]))
        if t1 == d:
            accepted += 1
            t2 = int(mx.argmax(lv[0, 1]))
            out += [d, t2]
            hiddens = mx.concatenate([hiddens, hv], axis=1)
        else:
            model.rollback_speculative_cache(cache, sink, 1, 2)
            out.append(t1)
            hiddens = mx.concatenate([hiddens, hv[:, :1]], axis=1)
    return out[:n_new], drafted, accepted


res = []
for p in prompts:
    ref = plain(p)
    got, d, a = speculative(p)
    res.append({"identical": got == ref, "drafted": d, "accepted": a})
print(json.dumps({"mtp_params": len(params), "missing": missing, "unequal": unequal, "prompts": res}))
"""

PROMPTS = [[5, 17, 99, 230, 12], [40, 41, 42], [300, 301, 7, 8, 9, 10]]


def build(work: Path, latent: bool) -> Path:
    """The tiny checkpoint, converted to 4 bits, with the head added for mlx-lm #1533."""
    from tests.support.synth import convert_to_mlx
    from tests.support.synth.nemotron_h import build_nemotron_h

    name = "tiny-nemotron_h" + ("-latent" if latent else "")
    src = build_nemotron_h(work / name, **({"moe_latent_size": 64} if latent else {}))
    mlx = convert_to_mlx(src, work / f"{name}-4bit", q_bits=4, q_group_size=32, dtype="float32")
    r = subprocess.run([sys.executable, "-m", "mtpforge", "add-mtp", "--source", str(src), "--target", str(mlx),
                        "--runtime", "mlx-lm-mtp", "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"add-mtp failed: {r.stderr.strip()}")
    return mlx


def check(folder: Path, tree: Path, n_new: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    r = subprocess.run([sys.executable, "-c", PROBE, str(folder), json.dumps(PROMPTS), str(n_new)],
                       capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        return {"folder": str(folder), "error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed"}
    return {"folder": str(folder), **json.loads(r.stdout.strip().splitlines()[-1])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mlx-lm-tree", type=Path, required=True,
                    help="a folder holding the pull request's mlx_lm package (git archive d620aea7 mlx_lm)")
    ap.add_argument("folders", nargs="*", type=Path, help="MLX folders with the head (default: build the tiny ones)")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--json", type=Path, help="write the results here")
    a = ap.parse_args()
    if not (a.mlx_lm_tree / "mlx_lm" / "models" / "nemotron_h.py").is_file():
        print(f"error: {a.mlx_lm_tree} holds no mlx_lm package", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        folders = a.folders or [build(Path(tmp), latent) for latent in (False, True)]
        results = [check(f, a.mlx_lm_tree, a.tokens) for f in folders]
    ok = True
    for r in results:
        if "error" in r:
            ok = False
            print(f"{r['folder']}: {r['error']}")
            continue
        good = not r["missing"] and not r["unequal"] and all(p["identical"] for p in r["prompts"])
        ok &= good
        print(f"{Path(r['folder']).name}: {r['mtp_params']} head parameters, missing {len(r['missing'])}, "
              f"unequal {len(r['unequal'])}; identical to plain {[p['identical'] for p in r['prompts']]}; "
              f"drafted {sum(p['drafted'] for p in r['prompts'])}, accepted {sum(p['accepted'] for p in r['prompts'])}")
    if a.json:
        a.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
