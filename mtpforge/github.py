"""GitHub Actions output: workflow-command annotations (``--format github``) and the Markdown
step summary written when ``GITHUB_STEP_SUMMARY`` is set.

Workflow commands are one line each, ``::error file=F,line=N,title=T::MESSAGE``. The runner
splits on ``::``, ``,`` and ``=``, so data and property values are escaped as the runner's
``toolkit/core`` does (``%`` first, then CR/LF; properties also ``:`` and ``,``) — a finding's
message with a newline or a colon would otherwise be cut or mis-parsed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable

#: finding severity -> workflow command
LEVEL = {"error": "error", "warning": "warning", "info": "notice"}
#: "recipes/x.yaml:7: checks.verify.depth: ..." (recipe errors name the file and line)
_LOCATED = re.compile(r"^(?P<file>[^\s:]+\.ya?ml):(?P<line>\d+): (?P<rest>.*)$", re.S)


def escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(s: str) -> str:
    return escape_data(s).replace(":", "%3A").replace(",", "%2C")


def workflow_command(level: str, message: str, **props: str | int | None) -> str:
    """One annotation line; ``props`` in the order given, empty ones left out."""
    p = ",".join(f"{k}={escape_property(str(v))}" for k, v in props.items() if v not in (None, ""))
    return f"::{level}{' ' + p if p else ''}::{escape_data(message)}"


def _rel(path: str | Path) -> str:
    """A path as the runner wants it for ``file=``: relative to the workspace when inside it."""
    p = Path(path)
    base = Path(os.environ.get("GITHUB_WORKSPACE") or os.getcwd())
    try:
        return p.resolve().relative_to(base.resolve()).as_posix()
    except (ValueError, OSError):
        return p.as_posix()


def _anchor(folder: str | None) -> str | None:
    """Findings are about a model folder; annotations attach to its config.json (a file the
    repository tracks) when the folder is local."""
    if not folder:
        return None
    p = Path(folder)
    if (p / "config.json").is_file():
        return _rel(p / "config.json")
    return _rel(p) if p.exists() else None


def _findings(findings: Iterable[dict[str, Any]], folder: str | None) -> list[str]:
    file = _anchor(folder)
    return [workflow_command(LEVEL.get(f.get("severity", "error"), "error"), f"{f['message']}\nfix: {f['fix']}",
                             file=file, title=f"mtpforge {f['code']}") for f in findings]


def annotations(command: str, result: dict[str, Any]) -> list[str]:
    """The workflow commands for one command's result (an empty list when all is well)."""
    out: list[str] = []
    folder = result.get("mlx_path") or result.get("written_to") or result.get("output") or result.get("target")
    out += _findings(result.get("findings") or [], folder)
    if isinstance(result.get("inspect"), dict):
        out += _findings(result["inspect"].get("findings") or [], folder)
    for p in result.get("problems") or []:
        out.append(workflow_command("error", p, file=_anchor(folder), title=f"mtpforge {command}"))
    steps = result.get("steps") or {}
    if isinstance(steps.get("inspect"), dict):
        failing = set(steps["inspect"].get("failing") or [])
        out += _findings([f for f in steps["inspect"].get("findings") or [] if not failing or f["code"] in failing], folder)
    if isinstance(steps.get("verify"), dict):
        for p in steps["verify"].get("problems") or []:
            out.append(workflow_command("error", p, file=_anchor(folder), title="mtpforge verify"))
    for name, verdict in (result.get("check_results") or {}).items():
        if verdict != "passed":
            out.append(workflow_command("error", f"recipe check {name} failed", file=_rel(result["recipe"]) if result.get("recipe") else None,
                                        title=f"mtpforge run: {name}"))
    for n in result.get("notes") or []:
        out.append(workflow_command("notice", n, title=f"mtpforge {command}"))
    return out


def error_annotation(command: str, error: dict[str, Any]) -> str:
    """An error that stopped the command (exit 2, or a refusal): one ``::error``; a recipe error
    names its file and line."""
    msg = str(error.get("message") or "")
    m = _LOCATED.match(msg)
    props: dict[str, Any] = {"title": f"mtpforge {command}: {error.get('code')}"}
    if m:
        props = {"file": _rel(m["file"]), "line": int(m["line"]), **props}
        msg = m["rest"]
    fix = error.get("fix")
    return workflow_command("error", msg + (f"\nfix: {fix}" if fix else ""), **props)


# ----------------------------------------------------------------------------- step summary

def _cell(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def _pct(v: Any) -> str:
    return f"{v:.1%}" if isinstance(v, (int, float)) else "-"


def summary_markdown(command: str, result: dict[str, Any] | None, error: dict[str, Any] | None = None, exit_code: int = 0) -> str:
    """A Markdown section for the job's summary page: verdict, the findings as a table, and
    verify's figures when there are any."""
    r = result or {}
    what = r.get("target") or r.get("mlx_path") or r.get("recipe") or ""
    verdict = "passed" if exit_code == 0 else ("failed" if exit_code == 1 else "error")
    icon = {"passed": "✅", "failed": "❌", "error": "⛔"}[verdict]
    lines = [f"### {icon} mtpforge {command} {_cell(what)}".rstrip(), ""]
    if error:
        lines += [f"**{_cell(error.get('code'))}**: {_cell(error.get('message'))}", "",
                  f"Fix: {_cell(error.get('fix'))}", ""]
        return "\n".join(lines) + "\n"
    facts = [(k, r[k]) for k in ("family", "layout", "norm_convention", "expert_format", "mtp_tensors", "status", "revision")
             if r.get(k) is not None]
    if facts:
        lines += ["| | |", "|---|---|"] + [f"| {k} | {_cell(v)} |" for k, v in facts] + [""]
    findings = list(r.get("findings") or []) + list((r.get("inspect") or {}).get("findings") or []) \
        + list(((r.get("steps") or {}).get("inspect") or {}).get("findings") or [])
    if findings:
        lines += ["| severity | code | what is wrong | fix |", "|---|---|---|---|"]
        lines += [f"| {_cell(f['severity'])} | `{_cell(f['code'])}` | {_cell(f['message'])} | {_cell(f['fix'])} |" for f in findings]
        lines.append("")
    elif command in ("inspect", "convert", "add-mtp"):
        lines += ["No findings.", ""]
    v = r if "acceptance" in r else ((r.get("steps") or {}).get("verify") or {})
    if "acceptance" in v:
        lines += ["| verify | |", "|---|---|",
                  f"| identical to greedy | {_cell(v.get('identical'))} |",
                  f"| acceptance | {_pct(v.get('acceptance'))} |",
                  f"| by position | {' · '.join(_pct(a) for a in v.get('acceptance_by_position') or [])} |",
                  f"| hidden state | {_cell(v.get('hidden'))} ({', '.join(f'{k} {_pct(a)}' for k, a in (v.get('hidden_variants') or {}).items())}) |",
                  f"| speed-up | {v['speedup']:.2f}x |" if isinstance(v.get("speedup"), (int, float)) else "| speed-up | - |", ""]
    for name, res in (r.get("check_results") or {}).items():
        lines.append(f"- check **{name}**: {res}")
    for p in r.get("problems") or []:
        lines.append(f"- problem: {_cell(p)}")
    return "\n".join(lines).rstrip() + "\n"


def write_step_summary(markdown: str) -> None:
    """Append to the file GitHub names; no variable (not in Actions), nothing to do."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(markdown + "\n")
    except OSError:
        pass  # a summary is a courtesy: never fail the command over it


__all__ = ["escape_data", "escape_property", "workflow_command", "annotations", "error_annotation",
           "summary_markdown", "write_step_summary"]
