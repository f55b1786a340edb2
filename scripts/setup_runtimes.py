#!/usr/bin/env python3
"""Create the pinned runtime virtualenvs the conformance suite drives, once, outside the repo.

Each runtime pins an mlx-lm (< 0.32) that cannot share mtpforge's environment, so each gets its
own virtualenv under ``${MTPFORGE_CACHE:-~/.cache/mtpforge}/runtimes/<name>-<version>/``.
A venv is built in a temporary sibling folder and renamed into place only when complete, so an
interrupted run leaves nothing that looks finished; the next run removes the leftovers.
A finished venv is reused as is (its ``mtpforge-runtime.json`` records the install time, size
and the exact package set).

Standard library only: ``.ci/run`` calls this before mtpforge's own environment exists.

    python scripts/setup_runtimes.py [NAME ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# What each runtime needs on a Linux CPU, pinned to the versions the conformance suite checked.
# torch is installed first from the CPU wheel when a runtime drags it in (other torch builds
# pull gigabytes of CUDA libraries).
RUNTIMES: dict[str, dict] = {
    "mtplx": {
        "version": "2.12.2",
        # On macOS MTPLX pins mlx==0.32.2, mlx-lm>=0.31,<0.32 and transformers<5.17; on Linux
        # its wheel declares none of them, so they are named here to match what a Mac user gets.
        "packages": [
            "mtplx==2.12.2",
            "mlx[cpu]==0.32.2",
            "mlx-lm>=0.31,<0.32",
            "transformers>=5.10.0,<5.17,!=5.13.0",
        ],
        "torch": False,
        "imports": ["mtplx", "mlx_lm", "mlx.core"],
    },
    "vllm-mlx": {
        "version": "0.6.0",
        "packages": ["vllm-mlx==0.6.0", "mlx[cpu]"],
        "torch": True,  # via torchvision
        # PyPI's torchvision is built for the CUDA torch: beside the CPU torch its ops do not
        # register ("operator torchvision::nms does not exist"), which breaks transformers'
        # AutoProcessor and so every mlx-vlm (MLLM) load. Only image preprocessing uses it.
        "remove": ["torchvision"],
        "imports": ["vllm_mlx", "mlx_lm", "mlx.core"],
    },
    "mlx-vlm": {
        "version": "0.7.10",
        "packages": ["mlx-vlm==0.7.10", "mlx[cpu]"],
        "torch": False,
        "imports": ["mlx_vlm", "mlx.core"],
    },
}
TORCH = "torch==2.13.0"
STAMP = "mtpforge-runtime.json"


def cache_root() -> Path:
    base = os.environ.get("MTPFORGE_CACHE") or str(Path.home() / ".cache" / "mtpforge")
    return Path(base) / "runtimes"


def venv_dir(name: str) -> Path:
    return cache_root() / f"{name}-{RUNTIMES[name]['version']}"


def venv_python(name: str) -> Path:
    return venv_dir(name) / "bin" / "python"


def is_ready(name: str) -> bool:
    d = venv_dir(name)
    return (d / STAMP).is_file() and (d / "bin" / "python").exists()


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            p = Path(root, f)
            if not p.is_symlink():
                total += p.stat().st_size
    return total


def _pip(py: Path, *args: str) -> None:
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args], check=True)


def _clean_leftovers(name: str) -> None:
    root = cache_root()
    if not root.is_dir():
        return
    for p in root.glob(f".{venv_dir(name).name}.tmp-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if pid.isdigit() and _alive(int(pid)):
            continue  # another setup run is building it right now
        shutil.rmtree(p, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def build(name: str, log=print) -> dict:
    """Build one runtime venv (or reuse it); return its stamp. Two setup runs at once take turns
    (a lock file per runtime): the second one reuses what the first built."""
    import fcntl

    final = venv_dir(name)
    if is_ready(name):
        return json.loads((final / STAMP).read_text())
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_ready(name):
            return json.loads((final / STAMP).read_text())
        return _build_locked(name, log)


def _build_locked(name: str, log) -> dict:
    final = venv_dir(name)
    _clean_leftovers(name)
    spec = RUNTIMES[name]
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.monotonic()
    log(f"[setup_runtimes] building {final.name} ...")
    subprocess.run([sys.executable, "-m", "venv", str(tmp)], check=True)
    py = tmp / "bin" / "python"
    constraints: list[str] = []
    if spec["torch"]:
        _pip(py, TORCH)
        cfile = tmp / "torch-constraint.txt"
        cfile.write_text(TORCH + "\n")
        constraints = ["-c", str(cfile)]
    _pip(py, *constraints, *spec["packages"])
    if spec.get("remove"):
        subprocess.run([str(py), "-m", "pip", "uninstall", "-q", "-y", *spec["remove"]], check=True)
    code = "import importlib,sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    subprocess.run([str(py), "-c", code, *spec["imports"]], check=True)
    freeze = subprocess.run(
        [str(py), "-m", "pip", "freeze", "--disable-pip-version-check"],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    stamp = {
        "name": name,
        "version": spec["version"],
        "packages": spec["packages"],
        "torch": TORCH if spec["torch"] else None,
        "removed": spec.get("remove", []),
        "install_seconds": round(time.monotonic() - t0, 1),
        "size_bytes": _size(tmp),
        "python": sys.version.split()[0],
        "freeze": freeze,
    }
    (tmp / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    if final.exists():  # a half-written leftover from a tool other than this one
        shutil.rmtree(final)
    os.replace(tmp, final)
    log(f"[setup_runtimes] {final.name}: {stamp['install_seconds']} s, {stamp['size_bytes'] / 2**20:.0f} MiB")
    return stamp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"runtimes to set up (default: all of {', '.join(RUNTIMES)})")
    ap.add_argument("--json", action="store_true", help="print one JSON object with each runtime's stamp")
    args = ap.parse_args(argv)
    names = args.names or list(RUNTIMES)
    unknown = [n for n in names if n not in RUNTIMES]
    if unknown:
        print(f"error: unknown runtime {unknown[0]!r}; known: {', '.join(RUNTIMES)}", file=sys.stderr)
        return 2
    out, failed = {}, []

    def one(n: str) -> None:
        try:
            s = build(n, log=lambda m: print(m, file=sys.stderr))
            out[n] = {k: v for k, v in s.items() if k != "freeze"} | {"path": str(venv_dir(n))}
        except subprocess.CalledProcessError as e:
            failed.append(n)
            out[n] = {"error": f"{' '.join(map(str, e.cmd[:4]))} ... exited {e.returncode}"}
            print(f"[setup_runtimes] {n}: failed ({out[n]['error']})", file=sys.stderr)

    # the virtualenvs are independent (each has its own lock): built side by side, a fresh
    # machine waits for the slowest (vllm-mlx's torch), not for the sum
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        list(pool.map(one, names))
    out = {n: out[n] for n in names}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for n, s in out.items():
            if "error" in s:
                print(f"{n}: FAILED {s['error']}")
            else:
                print(f"{n}-{s['version']}: {s['install_seconds']} s, {s['size_bytes'] / 2**20:.0f} MiB  {s['path']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
