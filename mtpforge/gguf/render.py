"""Human output for a GGUF inspect report (the findings table is the shared one)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from ..cells import human_bytes, norm_convention, print_rows
from ..layouts.gguf import beside_trunk


def render_inspect_gguf(r: dict[str, Any], console: Console) -> None:
    rows: list[tuple[str, Any]] = [("format", "GGUF (llama.cpp)" + (", headers only" if r.get("headers_only") else "")),
                                   ("architecture", r.get("architecture")), ("family", r.get("family")),
                                   ("layout", r.get("layout"))]
    if r.get("headers_only"):
        rows.append(("header bytes read", f"{r.get('header_bytes_read', 0):,}"))
        for f in r.get("files", []):
            rows.append((f["file"], f"{f['layout']}, block_count {f['block_count']}, nextn {f['nextn_predict_layers']}"))
    elif r.get("drafter"):  # a drafter file itself: its stages, not NextN layers
        d = r["drafter"]
        rows += [("stages", d["stages"]), ("block size", d["block_size"]), ("target layers", d["target_layers"]),
                 ("tensors", f"{r.get('mtp_tensors')} ({human_bytes(r.get('mtp_bytes', 0))})"),
                 ("norm convention", norm_convention(r)), ("trunk", r.get("trunk") or "not beside it"),
                 ("run with", f"--spec-type {d['spec_type']}")]
    else:
        rows += [("block_count", r.get("block_count")), ("nextn_predict_layers", r.get("config_mtp_layers")),
                 ("MTP tensors", f"{r.get('mtp_tensors')} ({human_bytes(r.get('mtp_bytes', 0))})"),
                 ("norm convention", norm_convention(r)),
                 ("expert format", r.get("expert_format"))]
        if r.get("head_file") and beside_trunk(r.get("layout")):
            rows.append(("MTP file", r["head_file"]))
        for d in r.get("drafters", []):
            rows.append(("drafter", f"{d['file']}" + (f" ({d['family']}, --spec-type {d['spec_type']})" if "family" in d else "")))
        types = sorted(set((r.get("quantization") or {}).get("mtp_types", {}).values()))
        if types:
            rows.append(("MTP tensor types", ", ".join(types)))
    print_rows(rows, console)
