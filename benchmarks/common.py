"""Shared helpers for the benchmark scripts: measured child processes, synthetic sources that
are too large to build in memory, MLX targets, tables and JSON results.

Every figure comes from a real child process (``os.wait4`` gives that child's own peak RSS and
CPU time, so measurements never mix), real files and the real mlx-lm; nothing is mocked.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# the synthetic-checkpoint builders live with the tests (tests/support/synth), not in the package
sys.path.insert(0, str(REPO))
RESULTS = HERE / "results"
PY = sys.executable

#: Modules ``add-mtp`` imports; the idle interpreter imports the same ones, so "peak RSS minus
#: idle" is what the conversion itself costs, not Python + MLX + numpy.
ADD_MTP_IMPORTS = (
    "mtpforge.cli", "mtpforge.pipeline", "mtpforge.convert", "mtpforge.inspect", "mtpforge.render",
    "mtpforge.writer.atomic", "numpy", "mlx.core",
)
#: what baseline_extract.py imports
BASELINE_IMPORTS = ("json", "argparse", "mlx.core", "huggingface_hub")


def settle_disk() -> None:
    """Write back every dirty page before a timed step, so that a step is not charged for the
    disk still flushing what an earlier one wrote (a giant source just built, the previous
    output just deleted): measured, the first run after building an 8-expert source took 1.4-1.8x
    as long as the same run after it."""
    if hasattr(os, "sync"):
        os.sync()


def workdir(name: str) -> Path:
    """Scratch space for generated checkpoints (large: kept out of the repo, reused across runs)."""
    root = Path(os.environ.get("MTPFORGE_BENCH_DIR", Path(tempfile.gettempdir()) / "mtpforge-bench"))
    p = root / name
    p.mkdir(parents=True, exist_ok=True)
    return p


# ----------------------------------------------------------------------------- child processes

@dataclass
class Measured:
    cmd: list[str]
    returncode: int
    wall_s: float
    maxrss_bytes: int
    cpu_s: float
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def _maxrss_bytes(ru_maxrss: int) -> int:
    # getrusage/wait4 report KiB on Linux and bytes on macOS
    return int(ru_maxrss) if sys.platform == "darwin" else int(ru_maxrss) * 1024


#: Runs in a small interpreter between us and the measured command. On Linux a child's
#: ru_maxrss starts at its parent's RSS at fork time (it survives exec), so a command forked
#: straight from this (large) benchmark process would report at least our own RSS.
_LAUNCHER = """
import json, os, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[2:])
_, status, ru = os.wait4(p.pid, 0)
wall = time.perf_counter() - t0
with open(sys.argv[1], "w") as f:
    json.dump({"status": os.waitstatus_to_exitcode(status), "wall": wall, "maxrss": ru.ru_maxrss,
               "cpu": ru.ru_utime + ru.ru_stime}, f)
"""


def run_measured(cmd: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
                 check: bool = True) -> Measured:
    """Run ``cmd`` and return its wall time, peak RSS and CPU time (``os.wait4`` in a small
    launcher: that child's own figures, portable to macOS, no psutil)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r", suffix=".json") as res:
        subprocess.run([PY, "-S", "-c", _LAUNCHER, res.name, *map(str, cmd)], stdout=out, stderr=err, env=env, cwd=cwd)
        r = json.loads(Path(res.name).read_text())
        out.seek(0)
        err.seek(0)
        m = Measured(list(map(str, cmd)), r["status"], r["wall"], _maxrss_bytes(r["maxrss"]), r["cpu"],
                     out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"))
    if check and m.returncode != 0:
        raise RuntimeError(f"{' '.join(m.cmd)} exited {m.returncode}:\n{m.stderr[-3000:]}\n{m.stdout[-2000:]}")
    return m


def idle_interpreter(modules: Iterable[str] = ADD_MTP_IMPORTS, env: dict[str, str] | None = None) -> Measured:
    """An interpreter that imports ``modules`` and initialises MLX, then exits: the RSS floor."""
    code = "".join(f"import {m}\n" for m in modules) + "import mlx.core as mx\nmx.eval(mx.ones((4,)) + 1)\n"
    return run_measured([PY, "-c", code], env=env)


def mtpforge_cmd(*args: str) -> list[str]:
    return [PY, "-m", "mtpforge", *args]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(REPO))
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") and env["PYTHONPATH"] != str(REPO) else "")
    env.update(extra)
    return env


def drop_file_cache_hint() -> str:
    return "warm page cache (files were just written or read; cp measured the same way)"


# ----------------------------------------------------------------------------- stats / output

def median_spread(xs: Sequence[float]) -> dict[str, float]:
    xs = list(xs)
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def mib(n: float) -> float:
    return n / (1 << 20)


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain fixed-width table (copy-pastes into Markdown as a code block)."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
    out = [title, line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]]
    return "\n".join(out)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(map(str, headers)) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _fmt(c: Any) -> str:
    if isinstance(c, float):
        return f"{c:,.3f}" if abs(c) < 10 else f"{c:,.1f}"
    if isinstance(c, int) and not isinstance(c, bool):
        return f"{c:,}"
    return str(c)


def environment() -> dict[str, Any]:
    import importlib.metadata as md

    def v(p: str) -> str | None:
        try:
            return md.version(p)
        except md.PackageNotFoundError:
            return None

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = None
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "mlx": v("mlx"), "mlx_lm": v("mlx-lm"),
        "huggingface_hub": v("huggingface_hub"), "safetensors": v("safetensors"), "git_commit": commit,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "environment": environment(), **payload}, indent=2, default=str) + "\n")
    return path


# ----------------------------------------------------------------------------- synthetic sources

class _Pool:
    """A fixed block of N(0, 0.02) bf16 values; large tensors are windows into it (offset from
    the tensor's name). Drawing 1e9 fresh normals would take a minute of CPU the other
    engineers need; the conversion's cost does not depend on the values."""

    def __init__(self, n: int = 1 << 23, seed: int = 1234) -> None:
        import numpy as np

        rng = np.random.default_rng(seed)
        f = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(np.float32)
        self.raw = ((f.view(np.uint32) + 0x8000) >> 16).astype("<u2").tobytes()  # round to bf16
        self.raw2 = self.raw * 2

    def take(self, name: str, nbytes: int) -> Iterable[bytes]:
        n = len(self.raw)
        off = (zlib.crc32(name.encode()) * 2) % n
        while nbytes > 0:
            k = min(nbytes, n)
            yield self.raw2[off: off + k]
            nbytes -= k


def stream_hf_source(folder: Path, config: dict[str, Any], shard_of: dict[str, int], n_shards: int,
                     tokenizer_dir: Path | None = None, seed: int = 0) -> Path:
    """Write an HF checkpoint of ``config`` tensor by tensor (never more than one tensor in
    memory): names and shapes from ``tests.support.synth.hf_tensor_specs``; tensors under 1M elements
    drawn exactly as ``random_hf_tensors`` draws them (norm means matter to inspect), larger ones
    from a shared value pool. ``shard_of`` maps name -> 0-based shard."""
    import mlx.core as mx
    import numpy as np

    from tests.support.synth import hf_tensor_specs
    from tests.support.synth.config import VARIANT_KEY, text_config
    from tests.support.synth.tokenizer import build_tokenizer
    from tests.support.synth.write import natural_key, shard_name
    from mtpforge.writer.safetensors_stream import SafetensorsWriter, TensorSpec

    folder.mkdir(parents=True, exist_ok=True)
    specs = hf_tensor_specs(config)
    pool = _Pool()
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(n_shards):
        names = sorted((k for k in specs if shard_of[k] == s), key=natural_key)
        fname = shard_name(s, n_shards) if n_shards > 1 else "model.safetensors"
        tspecs = [TensorSpec(k, "F32" if specs[k][1] == "a_log" else "BF16", specs[k][0]) for k in sorted(names)]
        path = folder / fname
        path.unlink(missing_ok=True)
        with SafetensorsWriter(path, tspecs, {"format": "pt"}) as w:
            for t in tspecs:
                shape, kind, loc, scale = specs[t.key]
                n = int(np.prod(shape))
                if n < (1 << 20) or kind == "a_log":
                    key = mx.random.key((int(seed) * 0x9E3779B1 + zlib.crc32(t.key.encode())) % (1 << 63))
                    if kind == "a_log":
                        a = mx.log(mx.random.uniform(1.0, 16.0, shape, key=key)).astype(mx.float32)
                        w.write(t.key, bytes(memoryview(np.array(a, copy=False))))
                    else:
                        a = mx.random.normal(shape, mx.float32, loc=loc, scale=scale, key=key).astype(mx.bfloat16)
                        w.write(t.key, bytes(memoryview(np.array(a.view(mx.uint16), copy=False))))
                else:
                    w.write(t.key, b"".join(pool.take(t.key, t.nbytes)))
                weight_map[t.key] = fname
                total += t.nbytes
    if n_shards > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != VARIANT_KEY}, indent=2, sort_keys=True) + "\n")
    tc = text_config(config)
    if tokenizer_dir is not None:
        for f in tokenizer_dir.iterdir():
            if f.is_file() and f.suffix in (".json", ".jinja", ".txt") and f.name not in ("config.json", "model.safetensors.index.json"):
                shutil.copyfile(f, folder / f.name)
    else:
        build_tokenizer(None, int(tc["vocab_size"]), folder)
    return folder


def head_bytes(folder: Path) -> tuple[int, int]:
    """(bytes, tensor count) of the mtp.* tensors in an HF folder, from the headers."""
    from mtpforge.checkpoint.catalogue import load_catalogue
    from mtpforge.checkpoint.store import LocalStore

    cat = load_catalogue(LocalStore(folder))
    infos = [i for k, i in cat.tensors.items() if k.startswith("mtp.")]
    return sum(i.nbytes for i in infos), len(infos)


def folder_fingerprint(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def make_mlx_target(config: dict[str, Any], folder: Path, *, q_bits: int | None, n_layers: int = 4,
                    tokenizer_from: Path | None = None) -> Path:
    """An MLX target whose config matches ``config`` in every dimension add-mtp compares
    (hidden, heads, experts, vocab), written directly with mlx-lm's own model class,
    ``quantize_model`` (g64) and ``save_model`` — what ``mlx_lm.convert`` ends with — for a
    ``n_layers``-deep backbone. Layer count is not compared, so a target for a 2 GiB head stays
    a few MB. (mlx_lm.convert itself cannot be used for a dense-backbone Qwen3-Next: its
    sanitize spots a raw checkpoint only by backbone experts.)"""
    import copy

    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

    from tests.support.synth.config import VARIANT_KEY, layer_types, text_config

    cfg = copy.deepcopy({k: v for k, v in config.items() if k != VARIANT_KEY})
    tc = text_config(cfg)
    tc["num_hidden_layers"] = n_layers
    tc["layer_types"] = layer_types(n_layers, int(tc["full_attention_interval"]))
    if "mlp_only_layers" in tc:
        tc["mlp_only_layers"] = [i for i in tc["mlp_only_layers"] if i < n_layers]
    model_class, args_class = _get_classes(cfg)
    model = model_class(args_class.from_dict(cfg))
    model.set_dtype(mx.bfloat16)
    model.update(tree_unflatten(_converted_norms(tree_flatten(model.parameters()))))
    mx.eval(model.parameters())
    if q_bits is not None:
        model, cfg = quantize_model(model, cfg, 64, q_bits, quant_predicate=getattr(model, "quant_predicate", None))
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    save_model(folder, model)
    save_config(cfg, folder / "config.json")
    if tokenizer_from is not None:
        for f in tokenizer_from.iterdir():
            if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "chat_template.jinja"):
                shutil.copyfile(f, folder / f.name)
    return folder


def _converted_norms(params: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Backbone norms as a converted release holds them: synth's raw zero-centred values + 1
    (mlx-lm's init of all ones would make inspect's backbone comparison meaningless); the
    gated ``linear_attn.norm`` is not zero-centred and keeps ~1."""
    import mlx.core as mx

    from tests.support.synth.tensors import _NORM_DEFAULT, _NORM_LOC_SCALE

    out = []
    for i, (k, v) in enumerate(params):
        if not (k.endswith("norm.weight") and v.ndim == 1):
            continue
        kind = k.split(".")[-2]
        loc, scale = (0.0, 0.05) if "linear_attn.norm" in k else _NORM_LOC_SCALE.get(kind, _NORM_DEFAULT)
        a = mx.random.normal(v.shape, loc=loc + 1.0, scale=scale, key=mx.random.key(zlib.crc32(k.encode())))
        out.append((k, a.astype(v.dtype)))
    return out


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, symlinks=True)
    return dst
