"""``inspect_checkpoint`` from Python — the function ``mtpforge inspect`` calls.

Offline, on the bundled tiny model: inspect a community-style conversion that lost its head
(finds MTP_CONFIG_WITHOUT_WEIGHTS), add the head, then inspect again against the source tensors
and for a named runtime (clean).

    python examples/inspect_api.py [WORK_DIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from mtpforge.demo import make_community_target, tiny_model_path
from mtpforge.errors import MtpforgeError
from mtpforge.inspect import inspect_checkpoint
from mtpforge.pipeline import add_mtp


def show(report: dict) -> None:
    print(f"{report['target']}: family {report['family']}, layout {report['layout']}, "
          f"{report['mtp_tensors']} MTP tensors ({report['mtp_bytes']:,} bytes), norms {report['norm_convention']}")
    for f in report["findings"]:
        print(f"  {f['severity']:7} {f['code']}: {f['message']}\n          fix: {f['fix']}")
    print(f"  exit code: {report['exit_code']}")


def main(work: Path) -> int:
    source = tiny_model_path()
    target = make_community_target(source, work / "tiny-qwen3_5-4bit")

    before = inspect_checkpoint(str(target))  # a local folder; a repo id reads headers over HTTP
    show(before)
    assert "MTP_CONFIG_WITHOUT_WEIGHTS" in [f["code"] for f in before["findings"]]

    add_mtp(source=str(source), target=str(target), runtime="mtplx", progress=False)  # as MTPLX loads it
    # --source: compare with the original tensors (exact norm convention, shapes);
    # --runtime: would that runtime's own loader take the head (and its backbone stay intact)?
    after = inspect_checkpoint(str(target), source=str(source), runtime="mtplx", strict=True)
    show(after)
    return after["exit_code"]


if __name__ == "__main__":
    work_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="mtpforge-example-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        sys.exit(main(work_dir))
    except MtpforgeError as e:
        print(f"error: {e.message} — fix: {e.fix}", file=sys.stderr)
        sys.exit(e.exit_code)
