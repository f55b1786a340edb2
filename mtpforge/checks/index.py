"""Damaged files and an index that disagrees with the shards (CORRUPT_FILE, INDEX_INCONSISTENT,
STALE_SHARD): defects of the folder, whatever its head."""

from __future__ import annotations

from ..checkpoint.catalogue import INDEX_FILE
from ..findings import Finding, finding
from ..layouts.table import loads_in_mlx_lm_glob
from .context import InspectContext


def check(ctx: InspectContext) -> list[Finding]:
    out = [finding("CORRUPT_FILE", why, f"re-download {f} (it is damaged or truncated)")
           for f, why in sorted(ctx.cat.corrupt.items())]
    cat = ctx.cat
    if cat.index is None:
        return out
    if cat.unsafe_index:
        k, why = next(iter(sorted(cat.unsafe_index.items())))
        out.append(finding(
            "INDEX_INCONSISTENT",
            f"{INDEX_FILE}: {len(cat.unsafe_index)} entries name files outside the model folder (e.g. {k}: {why})",
            "the index must name files inside the folder: re-download it or regenerate it from the shards",
        ))
    indexed_files = set(cat.index.values())
    for f in sorted(f for f in indexed_files if not cat.store.exists(f)):
        out.append(finding(
            "INDEX_INCONSISTENT", f"{INDEX_FILE} names {f}, which is not in the folder",
            f"re-download {f}, or regenerate the index",
        ))
    absent = [k for k, f in cat.index.items() if f in cat.headers and k not in cat.headers[f].tensors]
    if absent:
        out.append(finding(
            "INDEX_INCONSISTENT",
            f"{len(absent)} tensor(s) listed in {INDEX_FILE} are absent from their shard (e.g. {absent[0]})",
            "regenerate the index from the shards, or re-download the model",
        ))
    for f in cat.files:
        if loads_in_mlx_lm_glob(f) and f not in indexed_files:
            out.append(finding(
                "STALE_SHARD", f"{f} is not in {INDEX_FILE}, but mlx-lm loads every model*.safetensors file",
                f"delete {f} if it is left over, or add its tensors to the index",
            ))
    return out
