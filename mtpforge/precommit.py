"""The pre-commit hook (``.pre-commit-hooks.yaml``): inspect every model folder a commit touches.

pre-commit passes the changed files; a model folder is the nearest parent holding a
``config.json``. Each folder is inspected once, whatever number of its files changed, and the
commit is refused (exit 1) when a folder has an ``error`` finding (``--strict``: a warning too).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence


def model_folders(files: Sequence[str]) -> list[Path]:
    """The model folders the files belong to, in first-seen order."""
    seen: dict[Path, None] = {}
    for f in files:
        p = Path(f)
        for d in (p.parent, *p.parent.parents):
            if (d / "config.json").is_file():
                seen.setdefault(d, None)
                break
    return list(seen)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mtpforge-pre-commit", description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--runtime", default=None, help="add this runtime's compatibility findings")
    ap.add_argument("--strict", action="store_true", help="warnings fail too")
    args = ap.parse_args(argv)

    from .errors import MtpforgeError
    from .inspect import inspect_checkpoint

    failed = False
    for folder in model_folders(args.files):
        try:
            r = inspect_checkpoint(str(folder), runtime=args.runtime, strict=args.strict)
        except MtpforgeError as e:
            print(f"{folder}: error: {e.message} (fix: {e.fix})")
            failed = True
            continue
        bad = {"error", "warning"} if args.strict else {"error"}
        for f in r["findings"]:
            if f["severity"] in ("error", "warning"):
                print(f"{folder}: {f['severity']} {f['code']}: {f['message']} (fix: {f['fix']})")
            failed |= f["severity"] in bad
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
