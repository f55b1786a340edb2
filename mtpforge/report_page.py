"""``verify --report FILE.html|FILE.md``: verify's figures as a page for a model card or a PR.

The HTML page is self-contained (inline CSS and SVG, no script, no external resource), so it
renders the same from a CI artifact, an e-mail or a Hub repo. The Markdown variant carries the
same tables, for a PR comment or a README section. Both are pure functions of verify's result.
"""

from __future__ import annotations

import html
import os
import tempfile
from pathlib import Path
from typing import Any

from . import __version__
from .cells import counted
from .errors import InputError

FORMATS = {".html": "html", ".htm": "html", ".md": "markdown", ".markdown": "markdown"}
#: bar colours: one per plot, distinct so a screenshot can tell them apart
POSITION_COLOUR = "#1f6feb"
PROMPT_COLOUR = "#8250df"


def report_format(path: str | Path) -> str:
    """The page format from the file name, or one clear error before anything runs."""
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise InputError(f"--report {path}: the name must end in .html or .md",
                         "pass e.g. --report verify.html (a page with plots) or --report verify.md")
    return fmt


def _pct(v: Any) -> str:
    return f"{v:.1%}" if isinstance(v, (int, float)) else "-"


def _num(v: Any, fmt: str = "{:.2f}") -> str:
    return fmt.format(v) if isinstance(v, (int, float)) else "-"


def _short(text: str, n: int = 60) -> str:
    one = " ".join(text.split())
    return one if len(one) <= n else one[: n - 1] + "…"


# ----------------------------------------------------------------------------- SVG

def bar_chart(values: list[float], labels: list[str], *, title: str, colour: str, css_class: str,
              width: int = 560, height: int = 220) -> str:
    """A vertical bar chart of fractions in [0, 1]; each bar carries its value as data-* so a
    reader (or a test) needs no pixel maths to know what it shows."""
    left, right, top, bottom = 44, 12, 24, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    n = max(len(values), 1)
    slot = plot_w / n
    bar_w = min(64.0, slot * 0.7)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {css_class}" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
             f'<title>{html.escape(title)}</title>']
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = top + plot_h * (1 - tick)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#d0d7de" stroke-width="1"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" fill="#57606a">{tick:.0%}</text>')
    for i, (v, label) in enumerate(zip(values, labels)):
        frac = min(max(float(v), 0.0), 1.0)
        h = plot_h * frac
        x = left + slot * i + (slot - bar_w) / 2
        y = top + plot_h - h
        parts.append(f'<rect class="bar" data-index="{i + 1}" data-value="{frac:.4f}" x="{x:.1f}" y="{y:.1f}" '
                     f'width="{bar_w:.1f}" height="{h:.1f}" fill="{colour}"><title>{html.escape(label)}: {frac:.1%}</title></rect>')
        parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{y - 4:.1f}" text-anchor="middle" font-size="11" fill="#24292f">{frac:.0%}</text>')
        parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{top + plot_h + 16:.1f}" text-anchor="middle" font-size="11" '
                     f'fill="#24292f">{html.escape(_short(label, 14))}</text>')
    parts.append("</svg>")
    return "".join(parts)


# ----------------------------------------------------------------------------- HTML

_CSS = """
body{font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;color:#24292f;margin:24px;max-width:900px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}
.verdict{display:inline-block;padding:2px 8px;border-radius:4px;font-weight:600}
.ok{background:#dafbe1;color:#116329}.bad{background:#ffebe9;color:#a40e26}
table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #d0d7de;padding:4px 8px;text-align:left}
th{background:#f6f8fa}.muted{color:#57606a}
"""


def _rows(rows: list[tuple[str, str]]) -> str:
    return "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)


def render_html(r: dict[str, Any]) -> str:
    by_pos = list(r.get("acceptance_by_position") or [])
    per_prompt = list(r.get("per_prompt") or [])
    ok = bool(r.get("ok"))
    summary = [
        ("target", str(r.get("target"))), ("family", str(r.get("family"))), ("layout", str(r.get("layout"))),
        ("identical to plain greedy", str(r.get("identical"))),
        ("acceptance", f"{_pct(r.get('acceptance'))} ({r.get('accepted')} of {r.get('drafted')} drafts)"),
        ("depth", str(r.get("depth"))), ("hidden state used", str(r.get("hidden"))),
        ("tokens per verify pass", _num(r.get("tokens_per_verify"))),
    ]
    speed = [("plain decoding", f"{_num(r.get('baseline_tok_s'), '{:.1f}')} tok/s"),
             ("MTP decoding", f"{_num(r.get('mtp_tok_s'), '{:.1f}')} tok/s"),
             ("speed-up", f"{_num(r.get('speedup'))}x")]
    variants = r.get("hidden_variants") or {}
    out = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>mtpforge verify: {html.escape(str(r.get('target')))}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>MTP verification <span class=\"verdict {'ok' if ok else 'bad'}\">{'passed' if ok else 'FAILED'}</span></h1>",
        f"<p class=\"muted\">{html.escape(str(r.get('target')))} · mtpforge {html.escape(__version__)} · "
        f"{counted(int(r.get('prompts') or 0), 'prompt')}, {r.get('max_tokens')} tokens each, temperature {r.get('temp')}</p>",
        '<h2 id="by-position">Acceptance by draft position</h2>',
        bar_chart(by_pos, [f"position {i + 1}" for i in range(len(by_pos))], title="acceptance by draft position",
                  colour=POSITION_COLOUR, css_class="by-position"),
        f"<table>{_rows(summary)}</table>",
    ]
    if per_prompt:
        out += ['<h2 id="per-prompt">Acceptance per prompt</h2>',
                bar_chart([p.get("acceptance") or 0.0 for p in per_prompt], [f"#{i + 1}" for i in range(len(per_prompt))],
                          title="acceptance per prompt", colour=PROMPT_COLOUR, css_class="per-prompt"),
                "<table><tr><th>#</th><th>prompt</th><th>tokens</th><th>accepted / drafted</th><th>acceptance</th></tr>"]
        out += [f"<tr><td>{i + 1}</td><td>{html.escape(_short(str(p.get('prompt', ''))))}</td><td>{p.get('tokens')}</td>"
                f"<td>{p.get('accepted')} / {p.get('drafted')}</td><td>{_pct(p.get('acceptance'))}</td></tr>" for i, p in enumerate(per_prompt)]
        out.append("</table>")
    if variants:
        out += ['<h2 id="hidden">Hidden-state variants</h2>', "<table><tr><th>hidden state fed to the head</th><th>acceptance</th></tr>"]
        out += [f"<tr><td>{html.escape(k)}{' (used)' if k == r.get('hidden') else ''}</td><td>{_pct(v)}</td></tr>" for k, v in variants.items()]
        out.append("</table>")
    out += ['<h2 id="speed">Speed</h2>', f"<table>{_rows(speed)}</table>",
            '<p class="muted">Speed is measured in this process on this machine, plain and MTP decoding interleaved per prompt.</p>']
    problems = list(r.get("problems") or [])
    if problems:
        out += ['<h2 id="problems">Problems</h2>', "<ul>"] + [f"<li>{html.escape(p)}</li>" for p in problems] + ["</ul>"]
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- Markdown

def _md(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def render_markdown(r: dict[str, Any]) -> str:
    by_pos = list(r.get("acceptance_by_position") or [])
    lines = [f"## MTP verification: {'passed' if r.get('ok') else 'FAILED'}", "",
             f"`{_md(r.get('target'))}` · mtpforge {__version__} · {counted(int(r.get('prompts') or 0), 'prompt')}, {r.get('max_tokens')} tokens each", "",
             "| | |", "|---|---|",
             f"| identical to plain greedy | {_md(r.get('identical'))} |",
             f"| acceptance | {_pct(r.get('acceptance'))} ({r.get('accepted')} of {r.get('drafted')} drafts) |",
             f"| by position | {' · '.join(f'{i + 1}: {_pct(a)}' for i, a in enumerate(by_pos))} |",
             f"| hidden state | {_md(r.get('hidden'))} ({', '.join(f'{k} {_pct(v)}' for k, v in (r.get('hidden_variants') or {}).items())}) |",
             f"| speed | {_num(r.get('baseline_tok_s'), '{:.1f}')} → {_num(r.get('mtp_tok_s'), '{:.1f}')} tok/s ({_num(r.get('speedup'))}x) |", ""]
    if by_pos:
        lines += ["| position | acceptance | |", "|---|---|---|"]
        lines += [f"| {i + 1} | {_pct(a)} | {'█' * round(20 * min(max(a, 0.0), 1.0))} |" for i, a in enumerate(by_pos)]
        lines.append("")
    if r.get("per_prompt"):
        lines += ["| # | prompt | accepted / drafted | acceptance |", "|---|---|---|---|"]
        lines += [f"| {i + 1} | {_md(_short(str(p.get('prompt', ''))))} | {p.get('accepted')} / {p.get('drafted')} | {_pct(p.get('acceptance'))} |"
                  for i, p in enumerate(r["per_prompt"])]
        lines.append("")
    lines += [f"- problem: {_md(p)}" for p in r.get("problems") or []]
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------- write

def write_report(path: str | Path, r: dict[str, Any]) -> str:
    """Write the page atomically (a temp file beside it, one rename: never half a page, never
    through a symlink — the link itself is replaced). Returns the path."""
    p = Path(path).expanduser()
    text = render_html(r) if report_format(p) == "html" else render_markdown(r)
    if not p.parent.is_dir():
        raise InputError(f"--report {path}: the folder {p.parent} does not exist", "create it, or pass another path")
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # as an ordinary new file; mkstemp's 0600 would hide it
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return str(p)


__all__ = ["report_format", "render_html", "render_markdown", "write_report", "bar_chart"]
