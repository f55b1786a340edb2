"""Human output (rich) for each command's result dict. JSON output never passes through here."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .checks.basis import norm_convention_text

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _human_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if x < 1024 or unit == "TiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return str(n)


def render_findings(findings: list[dict[str, Any]], console: Console) -> None:
    if not findings:
        console.print("[green]no problems found[/green]")
        return
    t = Table(show_header=True, header_style="bold", expand=False)
    t.add_column("severity")
    t.add_column("code")
    t.add_column("what is wrong", overflow="fold")
    for f in findings:
        sev = f["severity"]
        t.add_row(f"[{_STYLE.get(sev, '')}]{sev}[/]", f["code"], escape(f["message"]))
    console.print(t)
    # fixes below the table, one line each and never wrapped by rich, so a command copies whole
    for f in findings:
        if f.get("fix"):
            console.print(f"[dim]fix ({f['code']}):[/dim] {escape(f['fix'])}", soft_wrap=True, highlight=False)


def render_inspect(r: dict[str, Any], console: Console) -> None:
    if r.get("format") == "gguf":
        from .gguf.render import render_inspect_gguf

        render_inspect_gguf(r, console)
        render_findings(r.get("findings", []), console)
        return
    t = Table(title=f"mtpforge inspect {r['target']}", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    q = r.get("quantization") or {}
    d = q.get("default")
    rows = [
        ("family", r.get("family")),
        ("layout", r.get("layout")),
        ("config MTP layers", r.get("config_mtp_layers")),
        ("MTP tensors", f"{r.get('mtp_tensors')} ({_human_bytes(r.get('mtp_bytes'))})"),
        ("norm convention", norm_convention_text(r)),
        ("expert format", r.get("expert_format")),
        ("quantization", f"{d['bits']}-bit, group {d['group_size']}, {d['mode']}" if d else "none"),
    ]
    nb = r.get("norm_behaviour")
    if nb:
        c = nb["cost"]
        rows.append(("norm check by behaviour", f"{nb['convention']} (margin {nb['evidence_nats']} nats; "
                     f"{c['positions']} positions, {c['head_passes']} head passes, {c['seconds']:.1f} s)"))
    if r.get("norm_source"):
        rows.append(("norms compared with", r["norm_source"]))
    for note in r.get("norm_notes") or []:
        rows.append(("note", note))
    for k, v in rows:
        t.add_row(k, str(v))
    console.print(t)
    render_findings(r.get("findings", []), console)


def render_add(r: dict[str, Any], console: Console) -> None:
    if r.get("dry_run"):
        console.print("[bold]plan[/bold] (dry run: nothing written, no tensor data downloaded)")
    for note in r.get("notes", []):
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    if r.get("status") == "already-present":
        console.print("[green]already present[/green]: the head from this source and options is in place; nothing to do")
    t = Table(show_header=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    planned = bool(r.get("dry_run"))
    keys = ("layout", "expert_format", "mtp_tensors", "mtp_bytes", "fetch_tensors", "fetch_bytes", "fetch_requests",
            "fetch_files", "revision", "peak_memory_estimate") if planned else \
        ("layout", "expert_format", "precision", "mtp_tensors", "mtp_bytes", "fetched_bytes", "revision", "manifest", "run")
    labels = {"mtp_bytes": "MTP bytes written" if not planned else "MTP bytes to write",
              "fetch_bytes": "source bytes to read", "fetch_tensors": "source tensors", "fetch_files": "from files",
              "fetch_requests": "range requests",
              "fetched_bytes": "downloaded", "peak_memory_estimate": "peak memory (est.)"}
    for k in keys:
        if r.get(k) is not None:
            v = r[k]
            if isinstance(v, list):
                v = "\n".join(map(str, v))
            elif k.endswith("bytes") or k == "peak_memory_estimate":
                v = _human_bytes(v)
            t.add_row(labels.get(k, k), str(v))
    files = r.get("files_written") or r.get("files_to_write") or []
    t.add_row("files to write" if planned else "files written", "\n".join(files))
    console.print(t)
    if "inspect" in r:
        render_findings(r["inspect"].get("findings", []), console)


def render_verify(r: dict[str, Any], console: Console) -> None:
    t = Table(title="mtpforge verify", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    pct = {"acceptance", "acceptance_by_position", "hidden_variants"}
    for k in ("family", "layout", "draft_token", "identical", "tokens", "drafted", "accepted", "acceptance",
              "acceptance_by_position", "hidden", "hidden_variants", "accepted_per_verify", "tokens_per_verify",
              "baseline_tok_s", "mtp_tok_s", "speedup"):
        if k not in r:
            continue
        v = r[k]
        if k in pct and isinstance(v, (int, float)):
            v = f"{v:.1%}"
        elif k in pct and isinstance(v, list):
            v = "  ".join(f"{i + 1}: {a:.1%}" for i, a in enumerate(v))
        elif k in pct and isinstance(v, dict):
            v = "  ".join(f"{name}: {a:.1%}" for name, a in v.items())
        elif k == "speedup" and isinstance(v, float):
            v = f"{v:.2f}x"
        elif isinstance(v, float):
            v = f"{v:.2f}"
        t.add_row(k, str(v))
    console.print(t)
    for n in r.get("notes", []):
        console.print(f"[yellow]note:[/yellow] {escape(n)}")
    for p in r.get("problems", []):
        console.print(f"[bold red]problem:[/bold red] {p}")


def render_remove(r: dict[str, Any], console: Console) -> None:
    console.print(f"[green]removed[/green] the MTP head from {r['target']}")
    for k in ("removed", "restored"):
        if r.get(k):
            console.print(f"  {k}: {', '.join(r[k])}")
    if r.get("kept_edits"):
        console.print(f"  kept your later edits in: {', '.join(r['kept_edits'])}")


def render_run(r: dict[str, Any], console: Console) -> None:
    t = Table(title=f"mtpforge run {r.get('recipe')} ({r.get('mode')})", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    for k in ("source", "revision", "target", "output", "layout", "precision", "family", "status", "written_to"):
        if r.get(k) is not None:
            t.add_row(k, str(r[k]))
    if r.get("mode") == "dry-run":
        t.add_row("would download", _human_bytes(r.get("fetch_bytes")))
        t.add_row("would write", "\n".join(r.get("files_to_write") or []))
    for name, verdict in (r.get("check_results") or {}).items():
        style = "green" if verdict == "passed" else "bold red"
        t.add_row(f"check {name}", f"[{style}]{verdict}[/]")
    console.print(t)
    for note in r.get("notes", []):
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    if r.get("mode") == "validate":
        console.print("[green]valid[/green]: the recipe passes the schema and the static checks")


def render_demo(r: dict[str, Any], console: Console) -> None:
    """The demo narrates as it goes; only the verdict is left to say."""
    style = "bold green" if r.get("ok") else "bold red"
    acc = r.get("acceptance")
    acc_text = f"{acc:.1%}" if isinstance(acc, (int, float)) else str(acc)
    console.print(f"[{style}]demo {'passed' if r.get('ok') else 'FAILED'}[/]: inspect before {r.get('before')}, "
                  f"after {r.get('after')}; identical {r.get('identical')}; acceptance {acc_text}", soft_wrap=True)


def render_repair(r: dict[str, Any], console: Console) -> None:
    status = r.get("status")
    if status == "nothing-to-repair":
        console.print(f"[green]nothing to repair[/green]: the head's norms in {r['target']} are in MLX's convention "
                      f"(evidence: {r.get('evidence')})")
        return
    verb = "would change" if r.get("dry_run") else "changed"
    console.print(f"{verb} {len(r.get('changed_norms', {}))} norm tensors ({r.get('bytes_rewritten', 0):,} bytes) "
                  f"in {r['target']} (evidence: {r.get('evidence')}):")
    for k, o in (r.get("changed_norms") or {}).items():
        console.print(f"  {k}: {o}")


def render_convert(r: dict[str, Any], console: Console) -> None:
    t = Table(title=f"mtpforge convert {r['source']}", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    q = (r.get("quantization") or {}).get("default")
    for k, v in (("mlx path", r["mlx_path"]), ("revision", r.get("revision") or "local"),
                 ("quantization", f"{q['bits']}-bit, group {q['group_size']}, {q['mode']}" if q else "none"),
                 ("layout", r["layout"]), ("MTP tensors", f"{r['mtp_tensors']} ({_human_bytes(r['mtp_bytes'])})"),
                 ("downloaded again for the head", _human_bytes(r["fetched_bytes"]))):
        t.add_row(k, str(v))
    console.print(t)
    for note in r.get("notes", []):
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    render_findings(r.get("findings", []), console)
