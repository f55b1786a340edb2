"""The byte-identical guard: sha256 of every file add-mtp writes, for the bundled models and a
Qwen3-Next fixture, in every layout and precision add-mtp supports, for plain add-mtp
("default") and for every ``--runtime``.

``add_mtp_hashes.json``: the per-layout cases were recorded by the code before the
architecture refactor (main at 6004dfb; against a241ded only ``mtpforge.json`` differs, by the
manifest's second version with file hashes) and are unchanged since; the "default" and
"runtime=" cases were added when plain add-mtp became the portable sidecar and ``--runtime``
arrived (issue #11). The ten ``bf16/*/precision=8`` cases changed once, on purpose: their
config.json gained the top-level ``group_size``/``bits`` without which mlx-lm's loader could not
load the folder (a quantized head in an unquantized model); the tensors are unchanged. The test
compares today's outputs with it. Regenerate (only when an output
change is intended, and say why in the commit) with::

    python -m tests.golden.cases --write

Nothing is normalised: the manifest's fields are deterministic (no timestamps; the source is
named by its folder name, which the cases keep fixed). The recording names the mlx / mlx-lm
versions it was made with, because the targets are made by the real ``mlx_lm.convert``; the test
skips (and says so) under other versions, e.g. the lowest-dependencies CI run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Iterator

GOLDEN = Path(__file__).with_name("add_mtp_hashes.json")

#: model -> (family layouts, MoE)
MODELS: dict[str, tuple[tuple[str, ...], bool]] = {
    "tiny-qwen3_5": (("embedded", "sidecar", "vllm-mlx", "mlx-vlm-drafter"), False),
    "tiny-qwen3_5_moe": (("embedded", "sidecar", "vllm-mlx", "mlx-vlm-drafter"), True),
    "qwen3_next": (("sidecar", "vllm-mlx"), True),
}
#: MLX targets made from each model: name -> q_bits (None: unquantized bf16)
TARGETS: dict[str, int | None] = {"q4": 4, "bf16": None}
PRECISIONS = ("match", "bf16", "float16", "8")


def versions() -> dict[str, str]:
    return {p: metadata.version(p) for p in ("mlx", "mlx-lm")}


#: runtimes with an MLX-folder write rule that have an MTP path for each model
RUNTIME_CASES: dict[str, tuple[str, ...]] = {
    "tiny-qwen3_5": ("mlx-lm", "mlx-lm-mtp", "mtplx", "vllm-mlx", "exo", "mlx-vlm", "omlx"),
    "tiny-qwen3_5_moe": ("mlx-lm", "mlx-lm-mtp", "mtplx", "vllm-mlx", "exo", "mlx-vlm", "omlx"),
    "qwen3_next": ("mlx-lm", "mtplx", "vllm-mlx", "exo"),
}


def cases() -> Iterator[tuple[str, dict[str, Any]]]:
    """(case id, add-mtp keyword options) for every combination recorded: each layout alone,
    plain add-mtp ("default"), and each --runtime."""
    for model, (layouts, moe) in MODELS.items():
        for tname in TARGETS:
            for opts in [{}, *({"precision": p} for p in PRECISIONS)]:
                yield "/".join([model, tname, "default"] + [f"{k}={v}" for k, v in opts.items()]), \
                    {"model": model, "target": tname, **opts}
            for rt in RUNTIME_CASES[model]:
                for opts in ({}, {"precision": "bf16"}):
                    yield "/".join([model, tname, f"runtime={rt}"] + [f"{k}={v}" for k, v in opts.items()]), \
                        {"model": model, "target": tname, "runtime": rt, **opts}
            for layout in layouts:
                combos: list[dict[str, Any]] = [{"precision": p} for p in PRECISIONS]
                combos.append({"precision": "match", "keep_fc_full_precision": True})
                if moe:
                    combos += [{"precision": "match", "experts": e} for e in ("source", "switch_mlp")]
                    combos.append({"precision": "bf16", "experts": "switch_mlp"})
                for opts in combos:
                    cid = "/".join([model, tname, layout] + [f"{k}={v}" for k, v in sorted(opts.items())])
                    yield cid, {"model": model, "target": tname, "layout": layout, **opts}


def _bundled(name: str) -> Path:
    return Path(str(resources.files("mtpforge").joinpath("data", name)))


def build_inputs(root: Path) -> dict[str, Path]:
    """Sources and converted targets under ``root``: ``{model}`` and ``{model}-{target}``."""
    from tests.support.synth import build_hf_variant, convert_to_mlx

    out: dict[str, Path] = {}
    for model in MODELS:
        src = root / "src" / model
        if model.startswith("tiny-"):
            shutil.copytree(_bundled(model), src)
        else:
            build_hf_variant(model, src, seed=0)
        out[model] = src
        for tname, bits in TARGETS.items():
            out[f"{model}-{tname}"] = convert_to_mlx(src, root / "tgt" / f"{model}-{tname}", q_bits=bits)
    return out


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_case(root: Path, inputs: dict[str, Path], cid: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Run add-mtp for one case in a fresh copy of the target; hashes of what it wrote."""
    from mtpforge.pipeline import add_mtp

    spec = dict(spec)
    model, tname = spec.pop("model"), spec.pop("target")
    work = root / "work" / cid.replace("/", "_").replace("=", "-")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    # the target folder's name is fixed: the drafter layout names its sibling after it
    tgt = work / "target"
    shutil.copytree(inputs[f"{model}-{tname}"], tgt, symlinks=True)
    r = add_mtp(source=str(inputs[model]), target=str(tgt), progress=False, **spec)
    files: dict[str, str] = {}
    for p in sorted(work.rglob("*")):
        if p.is_file():
            files[p.relative_to(work).as_posix()] = _sha(p)
    written = sorted(Path(f).relative_to(work).as_posix() for f in r["files_written"])
    return {
        "files_written": written,
        "sha256": {k: v for k, v in files.items() if k in written},
        "all_files": sorted(files),
        "report": {k: r[k] for k in ("layout", "family", "expert_format", "mtp_tensors", "mtp_bytes", "status")},
    }


def record(root: Path) -> dict[str, Any]:
    inputs = build_inputs(root)
    return {"versions": versions(), "cases": {cid: run_case(root, inputs, cid, spec) for cid, spec in cases()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {GOLDEN.name} (else compare and print differences)")
    ap.add_argument("--work", default=None, help="work folder (default: a temporary one)")
    args = ap.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mtpforge-golden-") as tmp:
        got = record(Path(args.work or tmp))
    if args.write:
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(got['cases'])} cases to {GOLDEN}")
        return 0
    want = json.loads(GOLDEN.read_text())
    bad = [c for c in want["cases"] if want["cases"][c] != got["cases"].get(c)]
    print(f"{len(bad)} of {len(want['cases'])} cases differ", *bad[:20], sep="\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
