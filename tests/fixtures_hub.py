"""The loopback test hub: a session-wide hub-compatible server on 127.0.0.1 and a way to run
mtpforge against it through the real huggingface_hub client.

huggingface_hub reads HF_ENDPOINT (and HF_HOME, HF_HUB_OFFLINE, timeouts) when it is imported,
so mtpforge runs in a subprocess (``python -m mtpforge ... --json``) with those set in its
environment; each test gets its own HF_HOME (an empty cache) unless it passes one.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.synth.hub_server import Fault, HubServer, LogEntry

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> dict[str, Any]:
        return json.loads(self.stdout)

    def error_lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.startswith("error:")]

    def assert_one_line_error(self, code: int = 2) -> dict[str, Any]:
        """Exit ``code``, one ``error:`` line with a fix, no traceback; returns the JSON error."""
        assert self.code == code, (self.code, self.stdout, self.stderr)
        assert "Traceback" not in self.stderr and "Traceback" not in self.stdout, self.stderr
        lines = self.error_lines()
        assert len(lines) == 1 and " — fix: " in lines[0], self.stderr
        return self.json["error"]


class LoopbackHub:
    """What tests use: publish folders as repos, inject faults, read the request log, run mtpforge."""

    def __init__(self, server: HubServer, home: Path) -> None:
        self.server = server
        self.home = home
        self._published = _PUBLISHED

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def publish(self, folder: Path, repo_id: str | None = None, **kw: Any) -> tuple[str, str]:
        """Publish ``folder`` (as ``repo_id``, or a fresh ``org/repo-N``); returns (repo_id, sha)."""
        if repo_id is None:
            repo_id = f"org/repo-{next(_COUNTER)}"
        return repo_id, self.server.publish(repo_id, folder, **kw)

    def source(self, synth: Any, variant: str, **build_kw: Any) -> tuple[str, str]:
        """The session's HF source of ``variant`` published once as ``org/<variant>[-kw]``."""
        key = variant + "".join(f"-{k}{v}" for k, v in sorted(build_kw.items()))
        if key not in self._published:
            self._published[key] = self.publish(synth.hf(variant, **build_kw), f"org/{key}")
        return self._published[key]

    def fault(self, kind: str, **kw: Any) -> Fault:
        return self.server.add_fault(Fault(kind, **kw))

    def log(self, repo: str | None = None) -> list[LogEntry]:
        return self.server.entries(repo=repo)

    def tensor_bytes(self, repo: str | None = None) -> int:
        return self.server.tensor_bytes(repo)

    def env(self, hf_home: Path | None = None, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
        env.update(
            HF_ENDPOINT=self.endpoint,
            HF_HOME=str(hf_home or self.home),
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_XET="1",
            MTPFORGE_HTTP_RETRY_WAIT="0.05",
            HF_HUB_ETAG_TIMEOUT="5",
            HF_HUB_DOWNLOAD_TIMEOUT="5",
            NO_COLOR="1",
            TERM="dumb",
            COLUMNS="200",
            PYTHONPATH=str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        )
        env.update(extra)
        return env

    def run(self, *args: str, hf_home: Path | None = None, timeout: float = 120, **env: str) -> Run:
        """``python -m mtpforge ARGS --json`` against this hub."""
        p = subprocess.run([sys.executable, "-m", "mtpforge", *args, "--json"], cwd=REPO_ROOT,
                           env=self.env(hf_home, **env), capture_output=True, text=True, timeout=timeout)
        return Run(p.returncode, p.stdout, p.stderr)


@pytest.fixture(scope="session")
def _hub_server() -> Iterator[HubServer]:
    with HubServer() as server:
        yield server


@pytest.fixture
def hub(_hub_server: HubServer, tmp_path: Path) -> Iterator[LoopbackHub]:
    """The session's loopback hub with a clean log, no faults and an empty HF_HOME for this test."""
    _hub_server.clear_faults()
    _hub_server.clear_log()
    yield LoopbackHub(_hub_server, tmp_path / "hf-home")
    _hub_server.clear_faults()


#: sources published once per session (the server keeps them for its lifetime)
_PUBLISHED: dict[str, tuple[str, str]] = {}
_COUNTER = itertools.count(1)
