"""A small Hugging Face Hub look-alike on 127.0.0.1, for tests and benchmarks.

It serves repos published from local folders to the *real* ``huggingface_hub`` client (point
``HF_ENDPOINT`` at it), answering exactly the requests that client makes: ``model_info``
(``GET /api/models/{repo}[/revision/{rev}]``), ``list_repo_tree`` (``/api/models/{repo}/tree/{rev}``,
for ``snapshot_download``), file metadata (``HEAD /{repo}/resolve/{rev}/{file}``)
and downloads (``GET`` of the same URL, honouring ``Range`` with ``206`` + ``Content-Range``), with
the headers the real Hub sends (``ETag``, ``X-Repo-Commit``, ``Content-Length``, ``Accept-Ranges``)
and its typed errors (``X-Error-Code: RepoNotFound | RevisionNotFound | EntryNotFound | GatedRepo``).

Why it exists: the claims mtpforge makes about the network ("inspect reads zero tensor bytes",
"add-mtp fetches at most 1.02x the head", "a dropped connection is resumed") can only be proved
by counting what a server actually sent. Every request is logged (method, path, range, status,
body bytes sent, and how many of those bytes were safetensors tensor data), and faults can be
injected per repo or per file: a connection dropped mid-body, 5xx or 429 (with ``Retry-After``),
a truncated body, a server that ignores ``Range``, slow responses. An optional token makes repos
private (``Authorization: Bearer``); ``lfs_redirect`` answers weight files with a 302 to a
"CDN" path (``/_lfs/...``, no token needed) as the real Hub does for LFS/Xet files. Only loopback
addresses are ever bound.

Run standalone: ``python -m tests.support.synth.hub_server --repo org/name=PATH [--repo ...]``.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import socket
import struct
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote, unquote, urlsplit

LOOPBACK = "127.0.0.1"
CHUNK = 64 * 1024
FAULT_KINDS = ("drop", "status", "429", "truncate", "ignore_range", "slow", "html")

#: what a sign-in portal or SSO proxy between a user and the Hub answers instead of a file
SIGN_IN_PAGE = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body><form>Sign in to continue</form></body></html>"
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_SHA = re.compile(r"^[0-9a-f]{40}$")
#: the ``files`` value of a fault that hits ``model_info`` (with ``data_only=False``)
API = "@api"


@dataclass
class Fault:
    """One injected failure. It hits matching requests ``times`` times (-1: every time).

    kinds: ``drop`` (send ``fraction`` of the body, then close the connection), ``status``
    (answer ``status``, a 5xx by default), ``429`` (rate limited, ``Retry-After: retry_after``),
    ``truncate`` (a shorter body with a consistent ``Content-Length``: only a client that checks
    lengths notices), ``ignore_range`` (answer 200 with the whole file), ``slow`` (wait ``delay``
    seconds before answering), ``html`` (a 200 answer with a sign-in page, ``text/html``, as a
    portal or proxy sends it). ``files=API, data_only=False`` aims a fault at ``model_info``
    (``status``, ``429`` and ``slow`` apply there).
    """

    kind: str
    repo: str | None = None
    files: str = "*.safetensors"
    methods: tuple[str, ...] = ("GET",)
    times: int = 1
    #: only requests whose bytes reach past the safetensors header (tensor data), so header reads
    #: by ``inspect`` and the planner are not disturbed unless asked
    data_only: bool = True
    status: int = 503
    retry_after: int = 1
    delay: float = 2.0
    fraction: float = 0.5
    fired: int = 0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {', '.join(FAULT_KINDS)}")


@dataclass
class LogEntry:
    method: str
    path: str
    repo: str | None
    file: str | None
    revision: str | None
    range: str | None
    status: int
    #: body bytes written to the socket (what left the server)
    sent: int = 0
    #: of those, bytes inside a safetensors file's data region (after its header)
    tensor_bytes: int = 0
    authorization: str | None = None
    fault: str | None = None
    aborted: bool = False
    t: float = field(default_factory=time.time)


@dataclass
class _File:
    path: Path
    size: int
    etag: str
    data_start: int | None  # first tensor-data byte of a safetensors file; None for other files


@dataclass
class _Commit:
    sha: str
    root: Path
    files: dict[str, _File]


@dataclass
class _Repo:
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> sha
    commits: dict[str, _Commit] = field(default_factory=dict)
    gated: bool = False
    token: str | None = None  # per-repo token (private repo); falls back to the server's
    #: answer resolve of weight files with a 302 to a "CDN" path, as the real Hub does for LFS
    lfs_redirect: bool = False


def _data_start(path: Path, size: int) -> int | None:
    if path.name.endswith(".gguf"):  # llama.cpp files: tensor data starts after the header
        from mtpforge.gguf.gguffile import header_length

        with open(path, "rb") as f:
            def read(a: int, b: int) -> bytes:
                f.seek(a)
                return f.read(b - a)

            try:
                return header_length(read, size)[0]
            except Exception:  # noqa: BLE001 - a damaged file is served as is
                return None
    if not path.name.endswith(".safetensors") or size < 8:
        return None
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    return min(8 + n, size)


def _etag(path: Path, st: os.stat_result) -> str:
    """Content-derived enough for a cache key (the HF cache stores blobs by ETag): the real Hub
    uses the file's sha256; hashing multi-GB benchmark shards on publish would be slow, so small
    files are hashed and big ones keyed by identity and mtime."""
    if st.st_size <= 64 * 1024 * 1024:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    return hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}".encode()).hexdigest()


def _scan(root: Path) -> dict[str, _File]:
    out: dict[str, _File] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for fn in sorted(filenames):
            p = Path(dirpath, fn)
            st = p.stat()
            rel = p.relative_to(root).as_posix()
            out[rel] = _File(p, st.st_size, _etag(p, st), _data_start(p, st.st_size))
    return out


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (ConnectionError, socket.timeout)):
            return  # a client that hung up (timeouts, fallbacks) is part of the tests, not an error
        super().handle_error(request, client_address)


class HubServer:
    """A threaded hub-compatible server bound to 127.0.0.1 (free port unless given)."""

    def __init__(self, *, port: int = 0, token: str | None = None, log_file: str | os.PathLike[str] | None = None,
                 rate: float | None = None) -> None:
        self.token = token
        #: bytes a second each file answer is paced to (a link's speed; None: as fast as loopback)
        self.rate = rate
        self.repos: dict[str, _Repo] = {}
        self.faults: list[Fault] = []
        self.log: list[LogEntry] = []
        self._log_file = Path(log_file) if log_file else None
        self._lock = threading.Lock()
        self._httpd = _Server((LOOPBACK, port), _Handler)
        self._httpd.hub = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> "HubServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hub-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ repos
    def publish(
        self, repo_id: str, folder: str | os.PathLike[str], *, revision: str = "main", sha: str | None = None,
        gated: bool = False, token: str | None = None, lfs_redirect: bool = False,
    ) -> str:
        """Serve ``folder`` as ``repo_id`` at branch ``revision``; returns the commit sha (given,
        or derived from the files so that the same content always gets the same sha)."""
        root = Path(folder)
        files = _scan(root)
        if sha is None:
            h = hashlib.sha1(repo_id.encode())
            for rel, f in sorted(files.items()):
                h.update(f"{rel}|{f.etag}\n".encode())
            sha = h.hexdigest()
        if not _SHA.match(sha):
            raise ValueError(f"commit sha must be 40 lowercase hex digits, not {sha!r}")
        with self._lock:
            repo = self.repos.setdefault(repo_id, _Repo())
            repo.commits[sha] = _Commit(sha, root, files)
            repo.refs[revision] = sha
            repo.gated = repo.gated or gated
            repo.lfs_redirect = repo.lfs_redirect or lfs_redirect
            if token is not None:
                repo.token = token
        return sha

    # ------------------------------------------------------------------ faults and log
    def add_fault(self, fault: Fault | None = None, **kw: Any) -> Fault:
        f = fault or Fault(**kw)
        with self._lock:
            self.faults.append(f)
        return f

    def clear_faults(self) -> None:
        with self._lock:
            self.faults.clear()

    def clear_log(self) -> None:
        with self._lock:
            self.log.clear()

    def entries(self, *, repo: str | None = None, method: str | None = None) -> list[LogEntry]:
        with self._lock:
            return [e for e in self.log if (repo is None or e.repo == repo) and (method is None or e.method == method)]

    def tensor_bytes(self, repo: str | None = None) -> int:
        """Tensor-data bytes sent (header bytes of safetensors files and other files excluded)."""
        return sum(e.tensor_bytes for e in self.entries(repo=repo))

    def sent_bytes(self, repo: str | None = None) -> int:
        return sum(e.sent for e in self.entries(repo=repo))

    def _record(self, e: LogEntry) -> None:
        with self._lock:
            self.log.append(e)
            if self._log_file is not None:
                with open(self._log_file, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(asdict(e)) + "\n")

    def _take_fault(self, repo: str, file: str, method: str, first: int, last: int, f: _File) -> Fault | None:
        reaches_data = f.data_start is not None and last >= f.data_start
        with self._lock:
            for fault in self.faults:
                if fault.times != -1 and fault.fired >= fault.times:
                    continue
                if fault.repo not in (None, repo) or method not in fault.methods:
                    continue
                if not fnmatch.fnmatchcase(file, fault.files) or (fault.data_only and not reaches_data):
                    continue
                fault.fired += 1
                return fault
        return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mtpforge-test-hub/1"

    @property
    def hub(self) -> HubServer:
        return self.server.hub  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # the structured log is the record

    def do_HEAD(self) -> None:
        self._route("HEAD")

    def do_GET(self) -> None:
        self._route("GET")

    # ------------------------------------------------------------------ routing
    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        entry = LogEntry(method, url.path, None, None, None, self.headers.get("Range"), 0,
                         authorization=self.headers.get("Authorization"))
        try:
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
                entry.repo, entry.revision, entry.file = f"{parts[2]}/{parts[3]}", parts[5], "/".join(parts[6:]) or None
                self._tree(entry, method, "recursive=true" in (url.query or "").lower())
            elif parts[:2] == ["api", "models"] and len(parts) >= 4:
                entry.repo = f"{parts[2]}/{parts[3]}"
                rev = parts[5] if len(parts) == 6 and parts[4] == "revision" else None
                if len(parts) not in (4, 6) or (len(parts) == 6 and rev is None):
                    self._error(entry, 404, "EntryNotFound", "Not found")
                    return
                entry.revision = rev
                self._model_info(entry, method, rev or "main")
            elif len(parts) >= 5 and parts[2] == "resolve":
                entry.repo, entry.revision, entry.file = f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])
                self._resolve(entry, method)
            elif parts[0] == "_lfs" and len(parts) >= 5:
                entry.repo, entry.revision, entry.file = f"{parts[1]}/{parts[2]}", parts[3], "/".join(parts[4:])
                self._resolve(entry, method, cdn=True)
            elif parts == ["api", "agent-harnesses"]:
                # huggingface_hub 2.x fetches this registry (best effort) to tag agent traffic
                body = json.dumps({"standardEnvVars": [], "harnesses": {}}).encode()
                self._send(entry, 200, {"Content-Type": "application/json"}, body, method)
            elif parts == ["_mtpforge", "log"]:
                body = json.dumps([asdict(e) for e in self.hub.entries()]).encode()
                self._send(entry, 200, {"Content-Type": "application/json"}, body, method)
            else:
                self._error(entry, 404, None, "Not found")
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            entry.aborted = True
            self.close_connection = True
        finally:
            self.hub._record(entry)

    def _authorized(self, repo: _Repo) -> bool:
        want = repo.token or self.hub.token
        return want is None or self.headers.get("Authorization") == f"Bearer {want}"

    def _lookup(self, entry: LogEntry, rev: str, cdn: bool = False) -> _Commit | None:
        repo = self.hub.repos.get(entry.repo or "")
        if cdn and repo is not None and rev in repo.commits:  # a signed CDN URL needs no token
            return repo.commits[rev]
        if repo is None or cdn or not self._authorized(repo):
            self._error(entry, 401, "RepoNotFound", "Repository not found")
            return None
        if repo.gated:
            self._error(entry, 403, "GatedRepo", "Access to this model is restricted")
            return None
        sha = repo.refs.get(rev) or (rev if rev in repo.commits else None)
        if sha is None:
            self._error(entry, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return repo.commits[sha]

    # ------------------------------------------------------------------ endpoints
    def _failed_by(self, entry: LogEntry, fault: Fault | None) -> bool:
        """Apply the faults that act before a body is sent (a delay, an error status); True when
        the request was answered with the error. Body faults are left to the caller."""
        if fault is None:
            return False
        entry.fault = fault.kind
        if fault.kind == "slow":
            time.sleep(fault.delay)
        elif fault.kind in ("status", "429"):
            code = 429 if fault.kind == "429" else fault.status
            self._error(entry, code, None, "Injected failure", {"Retry-After": str(fault.retry_after)} if code == 429 else {})
            return True
        elif fault.kind == "html":
            self._send(entry, 200, {"Content-Type": "text/html; charset=utf-8"}, SIGN_IN_PAGE, entry.method)
            return True
        return False

    def _model_info(self, entry: LogEntry, method: str, rev: str) -> None:
        commit = self._lookup(entry, rev)
        if commit is None:
            return
        fault = self.hub._take_fault(entry.repo or "", API, method, 0, 0, _File(Path(), 0, "", None))
        if self._failed_by(entry, fault):
            return
        siblings = []
        for rel, f in sorted(commit.files.items()):
            s: dict[str, Any] = {"rfilename": rel, "size": f.size, "blobId": hashlib.sha1(f.etag.encode()).hexdigest()}
            if rel.endswith(".safetensors"):
                s["lfs"] = {"size": f.size, "sha256": f.etag, "pointerSize": 134}
            siblings.append(s)
        body = json.dumps({
            "_id": entry.repo, "id": entry.repo, "modelId": entry.repo, "sha": commit.sha, "private": False,
            "gated": False, "disabled": False, "downloads": 0, "likes": 0, "tags": [], "library_name": "mlx",
            "siblings": siblings,
        }).encode()
        self._send(entry, 200, {"Content-Type": "application/json"}, body, method)

    def _tree(self, entry: LogEntry, method: str, recursive: bool) -> None:
        """``list_repo_tree`` (what ``snapshot_download`` lists a commit with): one page."""
        commit = self._lookup(entry, entry.revision or "main")
        if commit is None:
            return
        base = (entry.file or "").strip("/")
        prefix = base + "/" if base else ""
        items: dict[str, dict[str, Any]] = {}
        for rel, f in sorted(commit.files.items()):
            if not rel.startswith(prefix):
                continue
            rest = rel[len(prefix):].split("/")
            for depth in range(1, len(rest)):  # the folders on the way
                d = prefix + "/".join(rest[:depth])
                if recursive or depth == 1:
                    items.setdefault(d, {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d})
            if recursive or len(rest) == 1:
                item: dict[str, Any] = {"type": "file", "oid": hashlib.sha1(f.etag.encode()).hexdigest(), "size": f.size, "path": rel}
                if rel.endswith(".safetensors"):
                    item["lfs"] = {"oid": f.etag, "size": f.size, "pointerSize": 134}
                items[rel] = item
        if base and not items:
            self._error(entry, 404, "EntryNotFound", f"{base} does not exist", {"X-Repo-Commit": commit.sha})
            return
        body = json.dumps([items[k] for k in sorted(items)]).encode()
        self._send(entry, 200, {"Content-Type": "application/json"}, body, method)

    def _resolve(self, entry: LogEntry, method: str, cdn: bool = False) -> None:
        commit = self._lookup(entry, entry.revision or "main", cdn)
        if commit is None:
            return
        f = commit.files.get(entry.file or "")
        if f is None:
            self._error(entry, 404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": commit.sha})
            return
        headers = {
            "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes", "ETag": f'"{f.etag}"',
            "X-Repo-Commit": commit.sha, "X-Linked-Size": str(f.size), "X-Linked-Etag": f'"{f.etag}"',
        }
        repo = self.hub.repos[entry.repo or ""]
        if not cdn and repo.lfs_redirect and f.data_start is not None:
            location = f"/_lfs/{entry.repo}/{commit.sha}/{quote(entry.file or '')}"
            self._send(entry, 302, {**headers, "Location": location}, b"", method)
            return
        first, last, partial = 0, f.size - 1, False
        rng = self.headers.get("Range")
        if rng is not None:
            m = _RANGE.match(rng.strip())
            if m is None or (not m.group(1) and not m.group(2)):
                self._error(entry, 416, None, "Bad range", {"Content-Range": f"bytes */{f.size}"})
                return
            a, b = m.group(1), m.group(2)
            if a:
                first, last = int(a), min(int(b), f.size - 1) if b else f.size - 1
            else:
                first, last = max(f.size - int(b), 0), f.size - 1
            if first > last or first >= f.size:
                self._error(entry, 416, None, "Range not satisfiable", {"Content-Range": f"bytes */{f.size}"})
                return
            partial = True
        fault = self.hub._take_fault(entry.repo or "", entry.file or "", method, first, last, f)
        if self._failed_by(entry, fault):
            return
        if fault is not None and fault.kind == "ignore_range":
            first, last, partial = 0, f.size - 1, False
        n = last - first + 1
        status = 206 if partial else 200
        if partial:
            headers["Content-Range"] = f"bytes {first}-{last}/{f.size}"
        send_n = n
        if fault is not None and fault.kind == "truncate" and method == "GET":
            send_n = max(0, int(n * fault.fraction))
            headers["Content-Length"] = str(send_n)
        else:
            headers["Content-Length"] = str(n)
        entry.status = status
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if method == "HEAD":
            return
        if fault is not None and fault.kind == "drop":
            send_n = int(n * fault.fraction)
        def sent(off: int, k: int) -> None:
            entry.sent += k
            if f.data_start is not None:
                entry.tensor_bytes += max(0, off + k - max(off, f.data_start))

        if not self.hub.rate and send_n == n and hasattr(os, "sendfile"):
            # the kernel's own copy: the Hub's server is not on the user's machine, and in a
            # benchmark its reads through the page cache took CPU from the client it measures
            _sendfile(self.connection, f.path, first, n, sent)
            return
        t0, paced = time.monotonic(), 0
        for off, chunk in _read(f.path, first, send_n):
            if self.hub.rate:  # the link's speed: this chunk leaves no sooner than the rate allows
                paced += len(chunk)
                time.sleep(max(0.0, t0 + paced / self.hub.rate - time.monotonic()))
            self.wfile.write(chunk)
            sent(off, len(chunk))
        self.wfile.flush()
        if fault is not None and fault.kind == "drop" and send_n < n:
            entry.aborted = True
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ------------------------------------------------------------------ responses
    def _send(self, entry: LogEntry, status: int, headers: dict[str, str], body: bytes, method: str) -> None:
        entry.status = status
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(body)
            entry.sent += len(body)

    def _error(self, entry: LogEntry, status: int, code: str | None, message: str,
               extra: dict[str, str] | None = None) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message, **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        self._send(entry, status, headers, json.dumps({"error": message}).encode(), self.command)


def _sendfile(conn: socket.socket, path: Path, start: int, n: int, sent: Callable[[int, int], None]) -> None:
    """``n`` bytes of ``path`` from ``start`` onto the connection with ``os.sendfile``, each piece
    counted as it leaves (a client that hangs up midway has received what was counted)."""
    with open(path, "rb") as fh:
        off, end = start, start + n
        while off < end:
            k = os.sendfile(conn.fileno(), fh.fileno(), off, min(end - off, CHUNK * 16))
            if k == 0:
                break
            sent(off, k)
            off += k


def _read(path: Path, start: int, n: int) -> Iterator[tuple[int, bytes]]:
    """(offset, chunk) pairs of ``n`` bytes from ``start``, never the whole file in memory."""
    with open(path, "rb") as fh:
        fh.seek(start)
        off, left = start, n
        while left > 0:
            chunk = fh.read(min(CHUNK, left))
            if not chunk:
                break
            yield off, chunk
            off += len(chunk)
            left -= len(chunk)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Serve local folders as Hugging Face Hub repos on 127.0.0.1.")
    ap.add_argument("--repo", action="append", default=[], metavar="ORG/NAME[@REV]=PATH",
                    help="publish PATH as ORG/NAME (at branch REV, default main); repeatable")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--token", default=None, help="require `Authorization: Bearer TOKEN`")
    ap.add_argument("--log", default=None, help="append one JSON line per request to this file")
    ap.add_argument("--fault", action="append", default=[], metavar="KIND[:KEY=VALUE,...]",
                    help="inject a fault, e.g. slow:delay=0.2,times=-1 or drop:fraction=0.5,files=model-0000[23]*")
    args = ap.parse_args(argv)
    server = HubServer(port=args.port, token=args.token, log_file=args.log)
    for spec in args.fault:
        kind, _, rest = spec.partition(":")
        kw: dict[str, Any] = {}
        for item in filter(None, rest.split(",")):
            key, _, value = item.partition("=")
            kw[key] = value if key in ("repo", "files") else (value.lower() == "true" if key == "data_only" else float(value))
        for key in ("times", "status", "retry_after"):
            if key in kw:
                kw[key] = int(kw[key])
        try:
            server.add_fault(Fault(kind, **kw))
        except (TypeError, ValueError) as e:
            ap.error(f"--fault {spec!r}: {e}")
    for spec in args.repo:
        name, _, path = spec.partition("=")
        repo, _, rev = name.partition("@")
        if not path or repo.count("/") != 1:
            ap.error(f"--repo wants ORG/NAME[@REV]=PATH, got {spec!r}")
        sha = server.publish(repo, path, revision=rev or "main")
        print(f"published {repo}@{rev or 'main'} = {sha} from {path}", flush=True)
    print(f"HF_ENDPOINT={server.endpoint}", flush=True)
    try:
        server._httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server._httpd.server_close()


if __name__ == "__main__":
    main()
