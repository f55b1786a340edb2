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
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", required=True, type=Path, help="llama.cpp source tree (holds convert_hf_to_gguf.py)")
    ap.add_argument("--pre", default=None, help="declare the BPE pre-tokenizer (e.g. qwen35)")
    ap.add_argument("--raw-config", action="store_true",
                    help="read config.json as stored (the converter's own fallback when transformers cannot load "
                         "the config): for model types the installed transformers maps to a config class that "
                         "renames the keys the converter reads (step3p5 -> Step3p7TextConfig)")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="arguments for convert_hf_to_gguf.py (after --)")
    a = ap.parse_args()
    script = a.tree / "convert_hf_to_gguf.py"
    sys.path.insert(0, str(a.tree))
    sys.path.insert(1, str(a.tree / "gguf-py"))
    if a.pre:
        from conversion import base  # llama.cpp's converter package, from the tree

        base.TextModel.get_vocab_base_pre = lambda self, tokenizer: a.pre  # type: ignore[method-assign]
    if a.raw_config:
        from conversion import base  # noqa: F811

        class _RawConfig:
            @staticmethod
            def from_pretrained(*args, **kwargs):
                raise ValueError("--raw-config: config.json is read as stored")

        base.AutoConfig = _RawConfig  # type: ignore[attr-defined,misc]
    rest = a.args[1:] if a.args[:1] == ["--"] else a.args
    sys.argv = [str(script), *rest]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
