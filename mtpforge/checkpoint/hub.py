"""A Hugging Face Hub repo as a ``Store``: one resolved commit, read by HTTP range requests.

Everything goes through huggingface_hub's own machinery — its shared session and retry/backoff
helpers (``http_backoff`` / ``http_stream_backoff``), ``build_hf_headers`` (HF_TOKEN and the
token file under HF_HOME), ``hf_hub_url`` (HF_ENDPOINT), ``hf_raise_for_status`` and its typed
errors, ``ModelInfo`` — so auth, endpoints, offline mode and proxies behave as in every other
HF tool. What we add is what the library lacks: reading an exact byte range of a file, resuming
it when the connection drops, checking every length, and noticing (without reading the body)
when a server ignores ``Range``.

A revision is resolved once to its commit sha; every later request names the sha, so a branch
that moves mid-run cannot mix two commits. Small reads (config, index, safetensors headers) are
cached per commit under the HF cache, which makes a second run — and HF_HUB_OFFLINE=1 after a
first one — work without asking the server for them again.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import logging
import os
import re
import time
import uuid
from pathlib import Path
from typing import BinaryIO, Callable, Iterator
from urllib.parse import quote

import httpx2
from huggingface_hub import constants, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import (
    DisabledRepoError,
    EntryNotFoundError,
    FileMetadataError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.hf_api import ModelInfo
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff, http_stream_backoff, validate_repo_id

from ..errors import CorruptFileError, InputError, MtpforgeError, NetworkError, RefusedError

_SHA = re.compile(r"^[0-9a-f]{40}$")
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
CHUNK = 1 << 20
#: a transfer gives up after this many consecutive attempts that received nothing new ...
MAX_FAILURES = 5
#: ... and after this many attempts in all, whatever happened (request loops are bounded)
MAX_ATTEMPTS = 40
#: reads up to this size (config, index, headers, norm tensors) are cached per commit
SMALL_READ = 4 << 20
#: name of our folder inside the HF hub cache
CACHE_DIR = "mtpforge-ranges"


def retry_wait() -> float:
    """Base wait between retries in seconds (doubles per retry). huggingface_hub's default is
    1 s; tests shorten it with MTPFORGE_HTTP_RETRY_WAIT."""
    try:
        return max(0.0, float(os.environ.get("MTPFORGE_HTTP_RETRY_WAIT", "1")))
    except ValueError:
        return 1.0


def cache_root() -> Path:
    """``<HF_HUB_CACHE>/mtpforge-ranges``: beside the HF cache, so HF_HOME / HF_HUB_CACHE move it
    and the usual cache-cleaning habits apply to it."""
    return Path(constants.HF_HUB_CACHE) / CACHE_DIR


def repo_cache_dir(repo_id: str) -> Path:
    return cache_root() / repo_folder_name(repo_id=repo_id, repo_type="model")


def atomic_write(path: Path, data: bytes) -> None:
    """Write a cache file so that it is complete or absent, never partial."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


class RangeIgnoredError(NetworkError):
    """The server answered a Range request with the whole file (200): ``auto`` falls back to
    whole shards; ``ranges`` reports it."""


# ----------------------------------------------------------------------------- errors

@contextlib.contextmanager
def hub_errors(repo_id: str, revision: str | None = None) -> Iterator[None]:
    """Turn huggingface_hub's and the transport's exceptions into one line with a fix.

    huggingface_hub logs a warning per retry; those lines are silenced here because the user
    gets one clear outcome instead (success, or this error)."""
    hf_logger = logging.getLogger("huggingface_hub")
    level = hf_logger.level
    hf_logger.setLevel(logging.ERROR)
    endpoint = constants.ENDPOINT
    rev = f"@{revision[:12] if _SHA.match(revision) else revision}" if revision else ""
    try:
        yield
    except MtpforgeError:
        raise
    except GatedRepoError:
        raise InputError(f"{repo_id} is gated and this token has not been granted access",
                         "accept the model's terms on its Hub page, then set HF_TOKEN (or run `hf auth login`)") from None
    except RepositoryNotFoundError:
        raise InputError(f"repo {repo_id} not found on {endpoint} (or it is private and no valid token was sent)",
                         "check the repo id; for a private repo set HF_TOKEN or run `hf auth login`") from None
    except RevisionNotFoundError:
        raise InputError(f"revision {revision!r} not found in {repo_id}",
                         "pass an existing branch, tag or commit sha with --revision") from None
    except DisabledRepoError:
        raise InputError(f"repo {repo_id} has been disabled on {endpoint}", "use another copy of the model") from None
    except (OfflineModeIsEnabled, LocalEntryNotFoundError):
        if not constants.HF_HUB_OFFLINE:  # huggingface_hub says the same when the Hub cannot be reached
            raise NetworkError(f"cannot reach {endpoint} for {repo_id}{rev}, and it is not in the local cache",
                               "check your connection and HF_ENDPOINT, or pass a local folder") from None
        raise NetworkError(f"HF_HUB_OFFLINE is set and {repo_id}{rev} is not in the local cache",
                           "unset HF_HUB_OFFLINE to download it, or run once online to fill the cache") from None
    except EntryNotFoundError:
        raise InputError(f"{repo_id}{rev} lists a file the server does not serve",
                         "the repo may be changing; retry, or pin --revision to a commit") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        hint = {401: "set HF_TOKEN to a valid token", 403: "check that your token may read this repo",
                429: "you are rate limited; wait a few minutes and retry"}.get(status if isinstance(status, int) else 0,
                                                                            "retry later; check HF_ENDPOINT and your connection")
        retried = " after retries" if status in (408, 429) or (isinstance(status, int) and status >= 500) else ""
        raise NetworkError(f"{endpoint} answered HTTP {status} for {repo_id}{rev}{retried}", hint) from None
    except httpx2.TimeoutException:
        raise NetworkError(
            f"{endpoint} did not answer in time for {repo_id}{rev} (timeout {constants.HF_HUB_DOWNLOAD_TIMEOUT}s, retried)",
            "retry; on a slow link raise HF_HUB_DOWNLOAD_TIMEOUT and HF_HUB_ETAG_TIMEOUT") from None
    except (httpx2.TransportError, FileMetadataError) as e:
        raise NetworkError(f"cannot reach {endpoint} for {repo_id}{rev} ({e.__class__.__name__})",
                           "check your connection and HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use the cache") from None
    except OSError as e:
        if isinstance(e, PermissionError):
            raise RefusedError(f"cannot write the download cache under {constants.HF_HUB_CACHE} ({e.strerror})",
                               "make it writable, or point HF_HOME / HF_HUB_CACHE to a writable folder") from None
        if e.errno == errno.ENOSPC:
            raise RefusedError(f"no space left while caching {repo_id} under {constants.HF_HUB_CACHE}",
                               "free some space or point HF_HOME / HF_HUB_CACHE to a larger disk") from None
        if "Consistency check failed" in str(e):
            raise NetworkError(f"a download from {repo_id}{rev} arrived incomplete", "retry; the partial file was discarded") from None
        raise
    finally:
        hf_logger.setLevel(level)


# ----------------------------------------------------------------------------- transfers

def _check_content_range(value: str | None, first: int, last: int, size: int, what: str) -> None:
    m = _CONTENT_RANGE.match((value or "").strip())
    if m is None:
        raise NetworkError(f"the server sent a partial answer without a valid Content-Range for {what}",
                           "retry, or use --fetch shards")
    a, b, total = int(m.group(1)), int(m.group(2)), m.group(3)
    if (a, b) != (first, last) or (total != "*" and int(total) != size):
        raise NetworkError(f"the server sent bytes {a}-{b}/{total} of {what}, not the {first}-{last}/{size} asked for",
                           "the repo may have changed mid-run; retry, or pin --revision to a commit")


def _refuse_web_page(content_type: str | None, what: str) -> None:
    """A file answered with a web page (a sign-in portal, a proxy's or a login wall's HTML) is not
    the file, and asking again gets the same page: a permanent error naming the cause, never its
    bytes read as the file's (they read as a damaged header) nor "short body — retry later"."""
    if (content_type or "").split(";")[0].strip().lower() in ("text/html", "application/xhtml+xml"):
        raise NetworkError(f"the server answered {what} with a web page (text/html, e.g. a sign-in page), not the file",
                           "check HF_ENDPOINT and HF_TOKEN: a proxy or sign-in portal stands between you and the Hub; "
                           "sign in there (or use a network without it), then run the command again")


#: bytes the HTTP client asks its socket for at a time while a range downloads. httpx2's HTTP/1.1
#: connection reads 64 KiB (``HTTP11Connection.READ_NUM_BYTES``, a class attribute, not a setting
#: huggingface_hub passes on), and each read is a pass through the interpreter — its parser, its
#: buffer, the chunk handed up — holding the lock the converting threads need between their numpy
#: calls. Measured over a full-size head's 11.7 GB from the loopback hub: 9.1 s of CPU at 64 KiB,
#: 4.7 s at 256 KiB, 5.5 s at 1 MiB (a read returns what has arrived, so nothing waits the longer).
READ_SIZE = 256 << 10


@functools.cache
def _larger_reads() -> None:
    """``READ_SIZE`` for every HTTP/1.1 connection of this process, where the client has that
    attribute (another version without it reads as it did)."""
    with contextlib.suppress(ImportError):
        from httpcore2._sync.http11 import HTTP11Connection

        if isinstance(getattr(HTTP11Connection, "READ_NUM_BYTES", None), int) and HTTP11Connection.READ_NUM_BYTES < READ_SIZE:
            HTTP11Connection.READ_NUM_BYTES = READ_SIZE


def stream_range(
    url: str, start: int, end: int, sink: BinaryIO, *, file_size: int, what: str,
    on_bytes: Callable[[int], None] | None = None, full_ok: bool = False,
) -> int:
    """Write bytes ``[start, end)`` of ``url`` to ``sink``; return the body bytes received.

    One Range request; a dropped or short answer is resumed from the bytes already written
    (bounded in attempts). Status retries (429 with Retry-After, 5xx) are huggingface_hub's
    backoff; connection errors are ours, because a resume must change the Range header. A 200
    answer means the server ignored Range: with ``full_ok`` the needed slice is taken from the
    stream and the rest never read, else ``RangeIgnoredError`` is raised before reading the body.
    """
    _larger_reads()
    want = end - start
    got = received = failures = attempts = 0
    last_error = "no data"
    while got < want:
        attempts += 1
        if attempts > MAX_ATTEMPTS:
            raise NetworkError(f"gave up on {what} after {MAX_ATTEMPTS} attempts ({last_error})", "retry later")
        first = start + got
        headers = build_hf_headers(headers={"Range": f"bytes={first}-{end - 1}", "Accept-Encoding": "identity"})
        progressed = False
        try:
            with http_stream_backoff("GET", url, headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
                                     retry_on_exceptions=(), base_wait_time=retry_wait(),
                                     max_wait_time=8 * max(retry_wait(), 0.01)) as r:
                hf_raise_for_status(r)
                _refuse_web_page(r.headers.get("Content-Type"), what)
                if r.status_code == 206:
                    _check_content_range(r.headers.get("Content-Range"), first, end - 1, file_size, what)
                    skip = 0
                    length = r.headers.get("Content-Length")
                    if length is not None and length.isdigit() and int(length) > end - first:
                        raise NetworkError(f"the server announced {length} bytes for {what}, more than the {end - first} asked for",
                                           "retry, or use --fetch shards")
                elif r.status_code == 200:
                    if not (full_ok or (first == 0 and end == file_size)):
                        raise RangeIgnoredError(f"the server ignored the HTTP Range request for {what} (answered 200 with the whole file)",
                                                "use --fetch shards (downloads whole shards) or --fetch auto")
                    skip = first
                else:
                    raise NetworkError(f"unexpected HTTP {r.status_code} for {what}", "retry later")
                # no chunk_size: a buffered chunk would be lost when the connection drops,
                # and resuming is only worth it for bytes that reached the disk
                for chunk in r.iter_bytes():
                    received += len(chunk)
                    if skip:
                        drop = min(skip, len(chunk))
                        chunk, skip = chunk[drop:], skip - drop
                    left = want - got
                    if len(chunk) > left:
                        if r.status_code == 206:
                            raise NetworkError(f"the server sent more bytes than asked for {what}", "retry, or use --fetch shards")
                        chunk = chunk[:left]
                    if chunk:
                        sink.write(chunk)
                        got += len(chunk)
                        progressed = True
                        if on_bytes is not None:
                            on_bytes(len(chunk))
                    if got == want:
                        break
                if got < want:
                    last_error = f"short body: {got - (first - start)} of {end - first} bytes"
        except httpx2.TransportError as e:  # dropped connection, read timeout, refused connect
            last_error = e.__class__.__name__
        if got < want:
            failures = 0 if progressed else failures + 1
            if failures > MAX_FAILURES:
                timeout = "Timeout" in last_error
                raise NetworkError(
                    f"{what}: {'no answer within ' + str(constants.HF_HUB_DOWNLOAD_TIMEOUT) + 's' if timeout else last_error}, "
                    f"{MAX_FAILURES} retries failed",
                    "retry later" + ("; on a slow link raise HF_HUB_DOWNLOAD_TIMEOUT" if timeout else ""))
            time.sleep(min(8.0, retry_wait() * (2 ** max(failures - 1, 0))))
    return received


# ----------------------------------------------------------------------------- metadata cache

class CommitCache:
    """Per-commit cache of a repo's file list and small reads (immutable once written)."""

    def __init__(self, repo_id: str, commit: str) -> None:
        self.dir = repo_cache_dir(repo_id) / commit

    def load_files(self) -> dict[str, int] | None:
        try:
            obj = json.loads((self.dir / "files.json").read_text("utf-8"))
        except (OSError, ValueError):
            return None
        return {str(k): int(v) for k, v in obj.items()} if isinstance(obj, dict) else None

    def save_files(self, files: dict[str, int]) -> None:
        if self.load_files() != files:
            atomic_write(self.dir / "files.json", json.dumps(files, sort_keys=True).encode())

    def _small(self, rel: str, start: int, end: int) -> Path:
        return self.dir / "small" / hashlib.sha256(f"{rel}|{start}|{end}".encode()).hexdigest()

    def get(self, rel: str, start: int, end: int) -> bytes | None:
        p = self._small(rel, start, end)
        try:
            data = p.read_bytes()
        except OSError:
            return None
        return data if len(data) == end - start else None

    def put(self, rel: str, start: int, end: int, data: bytes) -> None:
        with contextlib.suppress(OSError):  # a read-only cache only costs a re-read next time
            atomic_write(self._small(rel, start, end), data)


def _ref_path(repo_id: str, revision: str) -> Path:
    return repo_cache_dir(repo_id) / "refs" / quote(revision, safe="")


# ----------------------------------------------------------------------------- the store

class HubStore:
    """The files of one commit of a Hub repo (the ``Store`` protocol)."""

    def __init__(self, repo_id: str, commit: str, files: dict[str, int], *, revision: str, offline: bool = False) -> None:
        self.repo_id = repo_id
        self.commit = commit
        self.revision = revision
        self.offline = offline
        self._files = files
        self._cache = CommitCache(repo_id, commit)

    @property
    def name(self) -> str:
        return f"{self.repo_id}@{self.commit}"

    @property
    def short_name(self) -> str:
        """For messages: the commit abbreviated as git does."""
        return f"{self.repo_id}@{self.commit[:12]}"

    def list_files(self) -> list[str]:
        return sorted(self._files)

    def exists(self, rel: str) -> bool:
        return rel in self._files

    def size(self, rel: str) -> int:
        try:
            return self._files[rel]
        except KeyError:
            raise FileNotFoundError(rel) from None

    def url(self, rel: str) -> str:
        return hf_hub_url(self.repo_id, rel, revision=self.commit)

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        size = self.size(rel)
        if not 0 <= start <= end <= size:
            raise CorruptFileError(f"{rel} in {self.name}: bytes {start}..{end} lie outside the {size}-byte file",
                                   f"the header of {rel} is inconsistent with its size; pick another revision")
        if start == end:
            return b""
        small = end - start <= SMALL_READ
        if small and (data := self._cache.get(rel, start, end)) is not None:
            return data
        local = snapshot_file(self.repo_id, self.commit, rel, size)
        if local is not None:  # already in the HF cache (an earlier --fetch shards, `hf download`)
            with open(local, "rb") as f:
                f.seek(start)
                data = f.read(end - start)
            if len(data) == end - start:
                return data
        if self.offline:
            raise NetworkError(f"HF_HUB_OFFLINE is set and bytes {start}..{end} of {rel} in {self.name} are not cached",
                               "unset HF_HUB_OFFLINE, or run once online to fill the cache")
        import io

        buf = io.BytesIO()
        with hub_errors(self.repo_id, self.commit):
            stream_range(self.url(rel), start, end, buf, file_size=size, what=f"{rel} of {self.short_name}", full_ok=True)
        data = buf.getvalue()
        if len(data) != end - start:
            raise NetworkError(f"got {len(data)} of {end - start} bytes of {rel} from {self.name}", "retry")
        if small:
            self._cache.put(rel, start, end, data)
        return data

    def read_bytes(self, rel: str) -> bytes:
        return self.read_range(rel, 0, self.size(rel))


def snapshot_file(repo_id: str, commit: str, rel: str, size: int) -> str | None:
    """The complete file in the ordinary HF cache, if it is there."""
    p = try_to_load_from_cache(repo_id, rel, revision=commit)
    try:
        return p if isinstance(p, str) and os.path.getsize(p) == size else None
    except OSError:  # a snapshot link whose blob was cleaned away
        return None


def _snapshot_listing(repo_id: str, revision: str) -> tuple[str | None, dict[str, int] | None]:
    """Offline, a snapshot that ``hf download`` left in the HF cache can stand in for the file
    list — when it is complete enough to trust: every file its index names is present."""
    repo_dir = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")
    commit: str | None = revision if _SHA.match(revision) else None
    if commit is None:
        with contextlib.suppress(OSError):
            commit = (repo_dir / "refs" / revision).read_text("utf-8").strip() or None
    snap = repo_dir / "snapshots" / commit if commit else None
    if snap is None or not (snap / "config.json").is_file():
        return None, None
    files: dict[str, int] = {}
    for dirpath, _, filenames in os.walk(snap):
        for fn in filenames:
            with contextlib.suppress(OSError):
                p = Path(dirpath, fn)
                files[p.relative_to(snap).as_posix()] = p.stat().st_size
    index = snap / "model.safetensors.index.json"
    if index.is_file():
        try:
            wm = json.loads(index.read_text("utf-8")).get("weight_map", {})
        except (OSError, ValueError, AttributeError):
            return None, None
        if not isinstance(wm, dict) or any(f not in files for f in set(wm.values())):
            return None, None
    return commit, files


def _model_info(repo_id: str, revision: str) -> ModelInfo:
    """``HfApi.model_info(files_metadata=True)``'s request, made through ``http_backoff`` so that
    a 5xx or 429 from the API is retried like a download is."""
    url = f"{constants.ENDPOINT}/api/models/{repo_id}/revision/{quote(revision, safe='')}"
    r = http_backoff("GET", url, headers=build_hf_headers(), params={"blobs": True},
                     timeout=constants.HF_HUB_ETAG_TIMEOUT, max_retries=3, base_wait_time=retry_wait(),
                     max_wait_time=8 * max(retry_wait(), 0.01))
    hf_raise_for_status(r)
    try:
        return ModelInfo(**r.json())
    except (ValueError, TypeError, KeyError) as e:  # HTML from a proxy, or not a Hub at all
        raise NetworkError(f"{constants.ENDPOINT} did not answer like a Hugging Face Hub for {repo_id} ({e.__class__.__name__})",
                           "check HF_ENDPOINT (and any proxy): it must point to a Hugging Face Hub compatible server") from None


def open_store(repo_id: str, revision: str | None = None) -> HubStore:
    """Resolve ``revision`` (default ``main``) of ``repo_id`` to its commit and list its files."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise InputError(f"{repo_id!r} is not a valid Hugging Face repo id ({e})",
                         "pass a local folder or a repo id such as Qwen/Qwen3.5-27B") from None
    rev = revision or constants.DEFAULT_REVISION
    if constants.is_offline_mode():
        commit = rev if _SHA.match(rev) else None
        if commit is None:
            with contextlib.suppress(OSError):
                commit = _ref_path(repo_id, rev).read_text("utf-8").strip() or None
        files = CommitCache(repo_id, commit).load_files() if commit else None
        if files is None:
            commit, files = _snapshot_listing(repo_id, rev)
        if commit is None or files is None:
            raise NetworkError(f"HF_HUB_OFFLINE is set and {repo_id}@{rev} has not been read on this machine before",
                               "unset HF_HUB_OFFLINE to download it, or run once online to fill the cache")
        return HubStore(repo_id, commit, files, revision=rev, offline=True)
    with hub_errors(repo_id, rev):
        info = _model_info(repo_id, rev)
    commit = str(info.sha or "")
    if not _SHA.match(commit):
        raise NetworkError(f"{constants.ENDPOINT} did not report a commit for {repo_id}@{rev}",
                           "check HF_ENDPOINT: it must point to a Hugging Face Hub compatible server")
    files: dict[str, int] = {}
    for s in info.siblings or []:
        if s.size is None:
            raise NetworkError(f"{constants.ENDPOINT} did not report file sizes for {repo_id}@{rev}",
                               "check HF_ENDPOINT: it must point to a Hugging Face Hub compatible server")
        files[s.rfilename] = int(s.size)
    with contextlib.suppress(OSError):  # the cache only serves offline runs later
        CommitCache(repo_id, commit).save_files(files)
        if rev != commit:
            atomic_write(_ref_path(repo_id, rev), commit.encode())
    return HubStore(repo_id, commit, files, revision=rev)


__all__ = ["HubStore", "open_store", "hub_errors", "stream_range", "RangeIgnoredError", "cache_root",
           "repo_cache_dir", "atomic_write", "retry_wait"]
