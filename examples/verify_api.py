"""``verify`` from Python — the function ``mtpforge verify`` calls.

Offline, on the bundled tiny model with its head added: decode greedily with the MTP head on the
model's own backbone (the output must equal plain greedy decoding token for token), measure
acceptance for both hidden-state variants, then try depth 2 and a sampled run.

    python examples/verify_api.py [WORK_DIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from mtpforge.demo import make_community_target, tiny_model_path
from mtpforge.errors import MtpforgeError
from mtpforge.pipeline import add_mtp
from mtpforge.verify import verify


def main(work: Path) -> int:
    source = tiny_model_path()
    target = make_community_target(source, work / "tiny-qwen3_5-4bit")
    add_mtp(source=str(source), target=str(target), progress=False)

    greedy = verify(str(target), generate=True, hidden="auto", min_acceptance=0.3, progress=False)
    print(f"greedy: identical={greedy['identical']} acceptance={greedy['acceptance']:.1%} "
          f"hidden={greedy['hidden']} variants={greedy['hidden_variants']} "
          f"tokens/verify={greedy['accepted_per_verify']:.2f} speedup={greedy['speedup']:.2f}x")

    # depth 2: acceptance per draft position falls; whether it pays depends on the machine
    deep = verify(str(target), generate=True, depth=2, hidden=greedy["hidden"], progress=False)
    print(f"depth 2: acceptance by position {[round(a, 3) for a in deep['acceptance_by_position']]}")

    # sampling: speculative acceptance min(1, p/q); identity is not defined, so it is None
    sampled = verify(str(target), generate=True, temp=0.7, seed=0, hidden=greedy["hidden"], progress=False)
    print(f"temp 0.7: identical={sampled['identical']} acceptance={sampled['acceptance']:.1%}")
    return 0 if greedy["ok"] and deep["ok"] and sampled["ok"] else 1


if __name__ == "__main__":
    work_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="mtpforge-example-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        sys.exit(main(work_dir))
    except MtpforgeError as e:
        print(f"error: {e.message} — fix: {e.fix}", file=sys.stderr)
        sys.exit(e.exit_code)
