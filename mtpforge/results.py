"""Typed results of the API calls; the CLI maps ``.ok`` to an exit code and ``as_dict()`` to
docs/CONTRACT.md's JSON (key order kept as the contract's examples show it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class DryRunFacts:
    """What a dry run reports: the plan, with nothing fetched or written."""

    files_to_write: list[str]
    fetch_bytes: int
    fetch_tensors: int
    fetch_files: list[str]
    fetch_requests: Optional[int]
    peak_memory_estimate: int


@dataclass
class AddResult:
    """What add-mtp did (``status``: planned | already-present | written)."""

    target: str
    output: Optional[str]
    layout: str
    family: str
    expert_format: str
    mtp_tensors: int
    mtp_bytes: int
    revision: Optional[str]
    notes: list[str]
    manifest: str
    status: str = "planned"
    fetched_bytes: int = 0
    fetch_mode: Optional[str] = None
    files_written: list[str] = field(default_factory=list)
    dry_run: Optional[DryRunFacts] = None
    inspect: Optional[dict[str, Any]] = None
    #: what one output format adds to the report (a GGUF head: its architecture, precision, the
    #: tensors copied from the trunk, the llama-server command that runs it)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """add-mtp raises on every refusal; a result is a success."""
        return True

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "target": self.target, "output": self.output, "layout": self.layout, "family": self.family,
            "expert_format": self.expert_format, "mtp_tensors": self.mtp_tensors, "mtp_bytes": self.mtp_bytes,
            "revision": self.revision, "notes": list(self.notes), "fetched_bytes": self.fetched_bytes,
            "manifest": self.manifest,
        }
        d.update(self.extra)
        if self.fetch_mode is not None:
            d["fetch_mode"] = self.fetch_mode
        if self.dry_run is not None:
            f = self.dry_run
            d.update(dry_run=True, status=self.status, files_to_write=f.files_to_write, fetch_bytes=f.fetch_bytes,
                     fetch_tensors=f.fetch_tensors, fetch_files=f.fetch_files, fetch_requests=f.fetch_requests,
                     peak_memory_estimate=f.peak_memory_estimate, files_written=[])
            return d
        d.update(status=self.status, files_written=list(self.files_written))
        if self.inspect is not None:
            d["inspect"] = self.inspect
        return d
