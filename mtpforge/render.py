"""Human output (rich) for each command's result dict. JSON output never passes through here.

One interface for every command: no title repeating the command line, one success line, sizes
with units, and tables whose cells never split a path or a word: a table that cannot keep every
word whole at the console's width (80 columns, a CI log's pipe) is printed as plain lines
instead, which the terminal wraps and a copy keeps whole (:func:`print_table`).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .cells import counted, fits, human_bytes, norm_convention, print_rows

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


_human_bytes = human_bytes


def render_findings(findings: list[dict[str, Any]], console: Console) -> None:
    if not findings:
        console.print("[green]no problems found[/green]")
        return
    t = Table(show_header=True, header_style="bold", expand=False)
    t.add_column("severity", no_wrap=True)
    t.add_column("code", no_wrap=True)
    t.add_column("what is wrong")
    for f in findings:
        sev = f["severity"]
        t.add_row(f"[{_STYLE.get(sev, '')}]{sev}[/]", f["code"], escape(f["message"]))
    if fits(t, console):
        console.print(t)
    else:  # a path in a message would be cut: one line per finding, wrapped by the terminal
        for f in findings:
            sev = f["severity"]
            console.print(f"[{_STYLE.get(sev, '')}]{sev}[/] {f['code']}: {escape(f['message'])}", soft_wrap=True,
                          highlight=False)
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
    q = r.get("quantization") or {}
    d = q.get("default")
    rows = [
        ("family", r.get("family")),
        ("layout", r.get("layout")),
        ("config MTP layers", r.get("config_mtp_layers")),
        ("MTP tensors", f"{r.get('mtp_tensors')} ({_human_bytes(r.get('mtp_bytes'))})"),
        ("norm convention", norm_convention(r)),
        ("expert format", r.get("expert_format")),
        ("quantization", f"{d['bits']}-bit, group {d['group_size']}, {d['mode']}" if d else "none"),
    ]
    nb = r.get("norm_behaviour")
    if nb:
        c = nb["cost"]
        rows.append(("norm check by behaviour", f"{nb['convention']} (margin {nb['evidence_nats']} nats; "
                     f"{c['positions']} positions, {c['head_passes']} head passes, {c['seconds']:.1f} s)"))
    if r.get("head_folder"):
        rows.insert(0, ("head folder", r["head_folder"]))
    if r.get("norm_source"):
        rows.append(("norms compared with", r["norm_source"]))
    for note in r.get("norm_notes") or []:
        rows.append(("note", note))
    print_rows(rows, console)
    render_findings(r.get("findings", []), console)


def render_add(r: dict[str, Any], console: Console) -> None:
    if r.get("dry_run"):
        console.print("[bold]plan[/bold] (dry run: nothing written, no tensor data downloaded)")
    for note in r.get("notes", []):
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    present = r.get("status") == "already-present"
    if present:
        console.print("[green]already present[/green]: the head from this source and options is in place; nothing to do",
                      soft_wrap=True)
    planned = bool(r.get("dry_run"))
    keys = ("layout", "expert_format", "precision", "mtp_tensors", "mtp_bytes", "fetch_tensors", "fetch_bytes", "fetch_requests",
            "fetch_files", "revision", "peak_memory_estimate") if planned else \
        ("layout", "expert_format", "precision", "mtp_tensors", "mtp_bytes", "fetched_bytes", "revision", "manifest", "run")
    labels = {"expert_format": "expert format", "mtp_tensors": "MTP tensors",
              "mtp_bytes": "MTP bytes to write" if planned else "MTP bytes in place" if present else "MTP bytes written",
              "fetch_bytes": "source bytes to read", "fetch_tensors": "source tensors", "fetch_files": "from files",
              "fetch_requests": "range requests",
              "fetched_bytes": "downloaded", "peak_memory_estimate": "peak memory (est.)"}
    downloaded = r.get("fetch_mode") not in (None, "local")  # a local source is read in place: nothing downloaded
    rows = []
    for k in keys:
        if r.get(k) is not None and (k != "fetched_bytes" or downloaded):
            v = r[k]
            if isinstance(v, list):
                v = "\n".join(map(str, v))
            elif k.endswith("bytes") or k == "peak_memory_estimate":
                v = human_bytes(v)
            elif k == "precision" and str(v).isdigit():
                v = f"{v}-bit"
            rows.append((labels.get(k, k), v))
    files = r.get("files_written") or r.get("files_to_write") or []
    if files or not present:
        rows.append(("files to write" if planned else "files written", "\n".join(files)))
    print_rows(rows, console)
    if "inspect" in r:
        render_findings(r["inspect"].get("findings", []), console)


def render_verify(r: dict[str, Any], console: Console) -> None:
    rows = []
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
        elif k == "tokens" and r.get("prompts") and r.get("max_tokens"):
            v = f"{v} ({counted(r['prompts'], 'prompt')}, up to {r['max_tokens']} each)"
        rows.append((k, v))
    print_rows(rows, console)
    for n in r.get("notes", []):
        console.print(f"[yellow]note:[/yellow] {escape(n)}")
    for p in r.get("problems", []):
        console.print(f"[bold red]problem:[/bold red] {p}")


def render_remove(r: dict[str, Any], console: Console) -> None:
    gone = " and the folder add-mtp had made for it" if r.get("folder_removed") else ""
    console.print(f"[bold green]✓[/bold green] removed the MTP head from {escape(r['target'])}{gone}", soft_wrap=True)
    for k in ("removed", "restored"):
        if r.get(k):
            console.print(f"  {k}: {', '.join(r[k])}")
    if r.get("kept_edits"):
        console.print(f"  kept your later edits in: {', '.join(r['kept_edits'])}")


def render_run(r: dict[str, Any], console: Console) -> None:
    rows: list[tuple[str, Any]] = [("recipe", f"{r.get('recipe')} ({r.get('mode')})")]
    for k in ("source", "revision", "target", "output", "layout", "precision", "family", "status", "written_to"):
        if r.get(k) is not None:
            rows.append((k, r[k]))
    if r.get("mode") == "dry-run":
        rows.append(("would download", human_bytes(r.get("fetch_bytes"))))
        rows.append(("would write", "\n".join(r.get("files_to_write") or [])))
    for name, verdict in (r.get("check_results") or {}).items():
        style = "green" if verdict == "passed" else "bold red"
        rows.append((f"check {name}", f"[{style}]{verdict}[/]"))
    print_rows(rows, console)
    for note in r.get("notes", []):
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    if r.get("mode") == "validate":
        console.print("[green]valid[/green]: the recipe passes the schema and the static checks")


def render_demo(r: dict[str, Any], console: Console) -> None:
    """The demo narrates as it goes; only the verdict is left to say."""
    style = "bold green" if r.get("ok") else "bold red"
    acc = r.get("acceptance")
    acc_text = f"{acc:.1%}" if isinstance(acc, (int, float)) else str(acc)

    def codes(v: Any) -> str:
        return ", ".join(map(str, v)) if isinstance(v, list) else str(v)

    console.print(f"[{style}]demo {'passed' if r.get('ok') else 'FAILED'}[/]: inspect before: {codes(r.get('before')) or 'clean'}; "
                  f"after: {codes(r.get('after'))}; output identical: {r.get('identical')}; acceptance {acc_text}",
                  soft_wrap=True)


def render_repair(r: dict[str, Any], console: Console) -> None:
    status = r.get("status")
    if status == "nothing-to-repair":
        console.print(f"[bold green]✓[/bold green] nothing to repair: the head's norms in {escape(r['target'])} are in "
                      f"MLX's convention (evidence: {r.get('evidence')})", soft_wrap=True)
        return
    verb = "would change" if r.get("dry_run") else "[bold green]✓[/bold green] changed"
    console.print(f"{verb} {counted(len(r.get('changed_norms', {})), 'norm tensor')} ({r.get('bytes_rewritten', 0):,} bytes) "
                  f"in {r['target']} (evidence: {r.get('evidence')}):")
    for k, o in (r.get("changed_norms") or {}).items():
        console.print(f"  {k}: {o}")


def render_align(r: dict[str, Any], console: Console) -> None:
    b, a = r["before"]["acceptance"], r["after"]["acceptance"]
    said = {"aligned": "[bold green]✓[/bold green] aligned head written", "planned": "would write the aligned head (--dry-run)",
            "not-improved": "not improved: the head was left as it was",
            "not-written": "[red]not written[/red]: the head was left as it was"}.get(r.get("status"), str(r.get("status")))
    console.print(f"{said} ({escape(r['head_folder'])})", soft_wrap=True)
    rows = [("acceptance", f"{b:.1%} -> {a:.1%} ({r['gain'] * 100:+.1f} points, {r['after']['hidden']}-norm hidden)"),
            ("output identical", str(r["after"]["identical"])),
            ("fine-tune", f"{r['train_steps']} steps on {r['sequences']} sequences of {r['length']} tokens the trunk wrote"),
            ("tensors changed", str(r.get("changed_tensors", 0))),
            ("time", f"{r.get('text_seconds', 0)} s text + {r.get('train_seconds', 0)} s steps ({r.get('seconds', 0)} s in all)")]
    if r.get("requantized_modules"):
        rows.append(("re-quantized", ", ".join(r["requantized_modules"])))
    print_rows(rows, console)
    for p in r.get("problems", []):
        console.print(f"[red]problem:[/red] {escape(p)}", soft_wrap=True)


def render_convert(r: dict[str, Any], console: Console) -> None:
    q = (r.get("quantization") or {}).get("default")
    rows = [("source", r["source"]), ("mlx path", r["mlx_path"]), ("revision", r.get("revision") or "local"),
            ("quantization", f"{q['bits']}-bit, group {q['group_size']}, {q['mode']}" if q else "none"),
            ("layout", r["layout"]), ("MTP tensors", f"{r['mtp_tensors']} ({human_bytes(r['mtp_bytes'])})")]
    if not r.get("local_source"):  # a local source is read in place: nothing is downloaded
        rows.append(("downloaded again for the head", human_bytes(r["fetched_bytes"])))
    print_rows(rows, console)
    for note in r.get("notes", []):
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    render_findings(r.get("findings", []), console)
