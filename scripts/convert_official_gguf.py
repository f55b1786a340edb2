#!/usr/bin/env python3
"""Run llama.cpp's own converter (convert_hf_to_gguf.py) on a checkpoint, with the pre-tokenizer
declared instead of detected.

llama.cpp's converter recognises a BPE pre-tokenizer by hashing how it splits a fixed text; the
bundled tiny models' byte-level vocabulary has no registered hash, so the converter stops
("BPE pre-tokenizer was not recognized"). Declaring it (``--pre qwen35``, what real Qwen3.5
checkpoints are recognised as) is the only change: every tensor and every other key is the
converter's own. Run it with the tools virtualenv that scripts/setup_llama_cpp.sh makes:

    ~/.cache/mtpforge/tools-llama-cpp/bin/python scripts/convert_official_gguf.py \\
        --tree ~/.cache/mtpforge/llama_cpp_python-0.3.36/vendor/llama.cpp --pre qwen35 -- \\
        mtpforge/data/tiny-qwen3_5 --outtype f32 --no-mtp --outfile trunk-f32.gguf

``--serve`` (Linux) imports once for many conversions (the test suite's): importing torch,
transformers and the converter was ~3 s of each ~4 s call on a tiny model, and the suite makes
about 120. It reads one JSON job a line on stdin (``{"args": [...], "pre": ..., "raw_config":
..., "log": PATH}``), runs each in a forked child with its output and errors in ``log``, and
answers ``{"rc": N}`` on stdout.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path


def _patch(pre: str | None, raw_config: bool) -> None:
    """Declare the pre-tokenizer (``pre``) and read config.json as stored (``raw_config``); once
    a process (``--serve`` patches each job's own forked child)."""
    from conversion import base  # llama.cpp's converter package, from the tree

    if pre:
        base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre  # type: ignore[method-assign]
    if raw_config:
        base.AutoConfig = _RawConfig  # type: ignore[attr-defined,misc]


class _RawConfig:
    @staticmethod
    def from_pretrained(*args: object, **kwargs: object) -> None:
        raise ValueError("--raw-config: config.json is read as stored")


def _convert(script: Path, args: list[str]) -> int:
    """The converter's own ``__main__`` on ``args``; its exit code."""
    sys.argv = [str(script), *args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def _serve(script: Path) -> None:
    """Conversions one after another, each in a child forked from this interpreter once torch,
    transformers and the converter are imported: the import is paid once, and no conversion sees
    what another left in the converter's classes (run in one process, a MiMo-V2-Flash export
    came out with another model's size label and chat template)."""
    import json
    import os
    import traceback

    import convert_hf_to_gguf  # noqa: F401 - imported once, before the forks
    from conversion import base  # noqa: F401

    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            try:
                _patch(job.get("pre"), bool(job.get("raw_config")))
                rc = _convert(script, job["args"])
            except BaseException:  # the converter's own failure: this job fails, the next one runs
                traceback.print_exc()
                rc = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
        rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        sys.stdout.write(json.dumps({"rc": rc}) + "\n")
        sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", required=True, type=Path, help="llama.cpp source tree (holds convert_hf_to_gguf.py)")
    ap.add_argument("--pre", default=None, help="declare the BPE pre-tokenizer (e.g. qwen35)")
    ap.add_argument("--raw-config", action="store_true",
                    help="read config.json as stored (the converter's own fallback when transformers cannot load "
                         "the config): for model types the installed transformers maps to a config class that "
                         "renames the keys the converter reads (step3p5 -> Step3p7TextConfig)")
    ap.add_argument("--serve", action="store_true", help="run JSON jobs from stdin in this one interpreter")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="arguments for convert_hf_to_gguf.py (after --)")
    a = ap.parse_args()
    script = a.tree / "convert_hf_to_gguf.py"
    sys.path.insert(0, str(a.tree))
    sys.path.insert(1, str(a.tree / "gguf-py"))
    if a.serve:
        _serve(script)
        return
    _patch(a.pre, a.raw_config)
    rest = a.args[1:] if a.args[:1] == ["--"] else a.args
    sys.exit(_convert(script, rest))


if __name__ == "__main__":
    main()
