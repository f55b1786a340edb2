"""Drive a real llama.cpp ``llama-server``: start it on a free loopback port, decode greedily
through its HTTP API, read its own draft counters, stop it.

The acceptance reported is llama.cpp's: ``timings.draft_n`` / ``timings.draft_n_accepted`` of
each completion, summed. Output identity is checked on token ids (``return_tokens``).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import InputError, RefusedError

START_TIMEOUT = 120.0


def find_llama_server(flag: str | None = None) -> Path | None:
    """``--llama-server PATH``, else ``$LLAMA_SERVER``, else ``llama-server`` on PATH, else the
    build that scripts/setup_llama_cpp.sh makes in mtpforge's cache."""
    for cand in (flag, os.environ.get("LLAMA_SERVER")):
        if cand:
            p = Path(cand).expanduser()
            if p.is_dir():
                p = p / "llama-server"
            return p if p.is_file() and os.access(p, os.X_OK) else None
    w = shutil.which("llama-server")
    if w:
        return Path(w)
    cache = Path(os.environ.get("MTPFORGE_CACHE", Path.home() / ".cache" / "mtpforge"))
    for p in sorted(glob.glob(str(cache / "llama_cpp_python-*" / "vendor" / "llama.cpp" / "build" / "bin" / "llama-server")), reverse=True):
        if os.access(p, os.X_OK):
            return Path(p)
    return None


def require_llama_server(flag: str | None = None) -> Path:
    p = find_llama_server(flag)
    if p is None:
        where = f"{flag} is not an executable llama-server" if flag else "no llama.cpp llama-server found (PATH, $LLAMA_SERVER)"
        raise InputError(f"{where}: verifying a GGUF needs llama.cpp",
                         "install llama.cpp (or run scripts/setup_llama_cpp.sh) and pass --llama-server PATH")
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Completion:
    tokens: list[int]
    text: str
    drafted: int
    accepted: int
    tok_s: float | None


@dataclass
class Server:
    base: str
    proc: subprocess.Popen[bytes]
    log: Path
    args: list[str] = field(default_factory=list)

    def complete(self, prompt: str, n_predict: int, seed: int = 0) -> Completion:
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "seed": seed,
                "cache_prompt": False, "return_tokens": True, "stream": False}
        req = urllib.request.Request(self.base + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                out = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RefusedError(f"llama-server refused the completion: HTTP {e.code} {e.read()[:200]!r}",
                               f"see its log {self.log}") from None
        t = out.get("timings") or {}
        return Completion(list(out.get("tokens") or []), str(out.get("content", "")),
                          int(t.get("draft_n", 0) or 0), int(t.get("draft_n_accepted", 0) or 0),
                          t.get("predicted_per_second"))


def _tail(p: Path, n: int = 600) -> str:
    with contextlib.suppress(OSError):
        return p.read_text("utf-8", "replace")[-n:].strip().replace("\n", " | ")
    return ""


@contextlib.contextmanager
def llama_server(binary: Path, model: Path, *, draft: Path | None = None, mtp: bool = False, n_max: int = 1,
                 ctx: int = 4096, threads: int | None = None, extra: Sequence[str] = (),
                 spec_type: str = "draft-mtp") -> Iterator[Server]:
    """A running llama-server for ``model``; with ``mtp``, speculative decoding with draft-mtp
    (the head from ``draft``, an MTP-only GGUF, or from the model's own NextN tail); a drafter
    llama.cpp loads as a model of its own names its ``spec_type`` (DSpark: ``draft-dspark``)."""
    port = _free_port()
    args = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", str(ctx), "-np", "1",
            "--no-webui", "-t", str(threads or min(4, os.cpu_count() or 1))]
    if draft is not None:
        args += ["-md", str(draft)]
    if mtp or draft is not None:
        args += ["--spec-type", spec_type, "--spec-draft-n-max", str(n_max)]
    args += list(extra)
    with tempfile.NamedTemporaryFile(prefix="mtpforge-llama-server-", suffix=".log", delete=False) as lf:
        log = Path(lf.name)
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    srv = Server(f"http://127.0.0.1:{port}", proc, log, args)
    keep_log = True  # until it served: a failed start keeps its log for the user
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise RefusedError(f"llama-server exited ({proc.returncode}) while loading {model.name}: {_tail(log)}",
                                   "check that the GGUF files belong together (trunk and MTP file of one model)")
            try:
                with urllib.request.urlopen(srv.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RefusedError(f"llama-server did not come up within {START_TIMEOUT:.0f} s: {_tail(log)}", f"see {log}")
            time.sleep(0.2)
        keep_log = False
        yield srv
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if not keep_log and os.environ.get("MTPFORGE_KEEP_SERVER_LOG") is None:
            with contextlib.suppress(OSError):
                log.unlink()


def decode_all(srv: Server, prompts: Sequence[str], n_predict: int) -> list[Completion]:
    return [srv.complete(p, n_predict) for p in prompts]


__all__ = ["find_llama_server", "require_llama_server", "llama_server", "decode_all", "Completion", "Server"]
