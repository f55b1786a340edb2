"""``add_mtp`` from Python — the function ``mtpforge add-mtp`` (and ``mtpforge run``) calls.

Offline, on the bundled tiny model: make an MLX target without its head the way
``mlx_lm.convert`` makes community conversions; plan; write a variant (sidecar layout, bf16)
into a new folder, leaving the target alone; add the head in place; add it again (a no-op).

    python examples/add_mtp_api.py [WORK_DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from mtpforge.demo import make_community_target, tiny_model_path
from mtpforge.errors import MtpforgeError
from mtpforge.pipeline import add_mtp


def main(work: Path) -> int:
    source = tiny_model_path()  # on a real model: source="Qwen/Qwen3.5-27B" (a Hub repo id)
    target = make_community_target(source, work / "tiny-qwen3_5-4bit")

    # plan first: what would be fetched and written (reads the index and headers only)
    plan = add_mtp(source=str(source), target=str(target), dry_run=True, progress=False)
    print(f"plan: {plan['mtp_tensors']} tensors, {plan['fetch_bytes']:,} source bytes -> {plan['files_to_write']}")

    # another runtime's layout and precision, into a new folder: the target is left untouched
    variant = add_mtp(source=str(source), target=str(target), layout="sidecar", precision="bf16",
                      output=str(work / "tiny-qwen3_5-4bit-sidecar-bf16"), progress=False)
    print(f"variant: {variant['layout']} layout, {variant['mtp_bytes']:,} bytes in {variant['output']}")

    # the defaults, in place: the family's layout (embedded for Qwen3.5) and the target's precision (4-bit)
    done = add_mtp(source=str(source), target=str(target), progress=False)
    print(json.dumps({k: done[k] for k in ("status", "layout", "mtp_tensors", "mtp_bytes", "fetched_bytes", "manifest")}, indent=2))

    # same source and options again: nothing to do, the folder stays byte-identical
    again = add_mtp(source=str(source), target=str(target), progress=False)
    print(f"second run: {again['status']}")

    return 0 if done["status"] == "written" and again["status"] == "already-present" else 1


if __name__ == "__main__":
    work_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="mtpforge-example-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        sys.exit(main(work_dir))
    except MtpforgeError as e:  # every user-facing problem: one line and a fix
        print(f"error: {e.message} — fix: {e.fix}", file=sys.stderr)
        sys.exit(e.exit_code)
