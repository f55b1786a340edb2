"""Every reference to the project's documents resolves inside the repository.

The code, tests and docs cite ``docs/SPEC.md`` by section and ``docs/CONTRACT.md``; a reader
who clones the repository must find what they cite. This test fails when a file

- names a ``docs/*.md`` that does not exist,
- cites a ``docs/SPEC.md`` section that has no heading there,
- links (Markdown) to a relative path that does not exist, or
- points outside the repository (a ``shared`` folder beside it, a bare "SPEC §N", or outside
  ``docs/`` a bare SPEC.md / CONTRACT.md), where a contributor cannot follow it.

The files are those git knows (tracked, plus untracked files that are not ignored). It also
holds docs/SPEC.md §6 to the finding codes the code has (``mtpforge/findings.py``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = "docs/SPEC.md"
#: this file's own examples of broken references are not references
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

DOC_PATH = re.compile(r"(?<![\w./-])docs/[\w./-]*?\.md(?![\w-])")
#: ``docs/SPEC.md §5``, ``docs/SPEC.md §5, §5.1``, ``docs/SPEC.md §2/§4``
SPEC_CITATION = re.compile(r"docs/SPEC\.md((?:\s*(?:,|/|&|and|or)?\s*§\s*\d+(?:\.\d+)*)+)")
SECTION = re.compile(r"§\s*(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{2,6}[ \t]+(\d+(?:\.\d+)*)\.?[ \t]", re.M)
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
#: fenced blocks and inline code, where ``](x)`` is code, not a link
MD_CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.M | re.S)
#: references to documents that live outside the repository
OUTSIDE = (
    (re.compile(r"(?<![\w-])shared/|\.\./shared\b"), "points into a folder outside the repository"),
    (re.compile(r"(?<!docs/)\bSPEC(?:\.md)?[ \t]*§"), "cites the specification without its path: write docs/SPEC.md §N"),
)
#: outside docs/, a bare file name is not a path a reader can open
BARE_DOC = re.compile(r"(?<![\w/.-])(?:SPEC|CONTRACT)\.md")


def repo_files() -> list[str]:
    """Tracked files plus untracked ones git does not ignore, as paths relative to ROOT."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the files to check come from `git ls-files`")
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, check=True, capture_output=True).stdout
    return sorted({p for p in out.decode("utf-8", "surrogateescape").split("\0") if p and (ROOT / p).is_file()})


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file (weights, GGUF, images)."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def spec_sections(spec_text: str) -> set[str]:
    """The section numbers docs/SPEC.md has headings for (``## 4. ...``, ``### 5.1 ...``)."""
    return set(HEADING.findall(spec_text))


def problems_in(rel: str, text: str, exists, sections: set[str]) -> list[str]:
    """Broken or outside references in one file's text. ``exists(path)`` answers for a path
    relative to the repository root; ``sections`` are docs/SPEC.md's."""
    out: list[str] = []

    def where(pos: int) -> str:
        return f"{rel}:{text.count(chr(10), 0, pos) + 1}"

    for m in DOC_PATH.finditer(text):
        if not exists(m.group(0)):
            out.append(f"{where(m.start())}: {m.group(0)} does not exist")
    for m in SPEC_CITATION.finditer(text):
        for n in SECTION.findall(m.group(1)):
            if n not in sections:
                out.append(f"{where(m.start())}: {SPEC} has no section §{n}")
    if rel == SPEC:  # its own bare cross-references
        for m in SECTION.finditer(text):
            if m.group(1) not in sections:
                out.append(f"{where(m.start())}: §{m.group(1)} is not a section of this file")
    if rel.endswith(".md"):
        base = Path(rel).parent
        prose = MD_CODE.sub(lambda c: re.sub(r"[^\n]", " ", c.group(0)), text)  # same offsets, code blanked
        for m in MD_LINK.finditer(prose):
            target = m.group(1).split("#", 1)[0]
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
                continue
            resolved = (base / target).as_posix()
            if not exists(resolved):
                out.append(f"{where(m.start())}: link to {target} does not resolve ({resolved})")
    for pattern, why in OUTSIDE:
        for m in pattern.finditer(text):
            out.append(f"{where(m.start())}: {m.group(0)!r} {why}")
    if not rel.startswith("docs/"):
        for m in BARE_DOC.finditer(text):
            out.append(f"{where(m.start())}: {m.group(0)} without docs/ is not a path in this repository")
    return out


def _exists(rel: str) -> bool:
    path = (ROOT / rel).resolve()
    return path.is_relative_to(ROOT) and path.exists()


def test_spec_keeps_the_cited_section_numbers():
    sections = spec_sections((ROOT / SPEC).read_text("utf-8"))
    assert {"1", "2", "3", "4", "5", "5.1", "5.2", "6", "7"} <= sections


def test_spec_lists_every_finding_code_the_code_has():
    from mtpforge.findings import CODES

    text = (ROOT / SPEC).read_text("utf-8")
    section = text[text.index("\n## 6."):text.index("\n## 7.")]
    rows = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)`", section, re.M))
    assert (sorted(set(CODES) - rows), sorted(rows - set(CODES))) == ([], []), \
        "docs/SPEC.md §6 must have one row per code of mtpforge/findings.py (missing, unknown)"


def test_every_reference_to_the_projects_documents_resolves():
    sections = spec_sections((ROOT / SPEC).read_text("utf-8"))
    problems: list[str] = []
    for rel in repo_files():
        if rel == SELF:
            continue
        text = text_of(ROOT / rel)
        if text is not None:
            problems += problems_in(rel, text, _exists, sections)
    assert problems == [], "broken or outside references:\n" + "\n".join(problems)


@pytest.mark.parametrize("rel, text, expected", [
    ("mtpforge/x.py", "see docs/NOPE.md", "docs/NOPE.md does not exist"),
    ("mtpforge/x.py", "as docs/SPEC.md §9 says", "no section §9"),
    ("mtpforge/x.py", "docs/SPEC.md §5, §5.7", "no section §5.7"),
    ("tests/x.py", "docs/SPEC.md §2/§8", "no section §8"),
    ("README.md", "[spec](docs/GONE.md#top)", "link to docs/GONE.md does not resolve"),
    ("docs/A.md", "[c](MISSING.md)", "link to MISSING.md does not resolve (docs/MISSING.md)"),
    ("docs/A.md", "[`SPEC.md`](SPECS.md)", "link to SPECS.md does not resolve"),
    ("mtpforge/x.py", "read ../shared/SPEC.md", "outside the repository"),
    ("mtpforge/x.py", "(SPEC §4)", "without its path"),
    ("mtpforge/x.py", "the CONTRACT.md says", "CONTRACT.md without docs/"),
    ("docs/SPEC.md", "as §12 says", "§12 is not a section of this file"),
])
def test_a_broken_reference_is_reported(rel, text, expected):
    known = {"docs/SPEC.md", "docs/CONTRACT.md", "docs/A.md"}
    found = problems_in(rel, text, lambda p: p in known, {"1", "2", "4", "5", "5.1"})
    assert any(expected in p for p in found), found


@pytest.mark.parametrize("text", [
    "docs/SPEC.md §5. Then", "(docs/SPEC.md §5, §5.1)", "docs/SPEC.md §2/§4", "docs/SPEC.md §5.1's table",
    "see docs/CONTRACT.md and docs/SPEC.md", "mlp.shared_expert/gate", "a SPEC_JSON file",
])
def test_a_good_reference_is_not_reported(text):
    known = {"docs/SPEC.md", "docs/CONTRACT.md"}
    assert problems_in("mtpforge/x.py", text, lambda p: p in known, {"2", "4", "5", "5.1"}) == []


def test_code_in_markdown_is_not_a_link():
    text = "```\nz = mtp.layers[0](z)\n```\nand `a[0](b)` inline, [the spec](docs/SPEC.md)\n"
    assert problems_in("README.md", text, lambda p: p == "docs/SPEC.md", set()) == []
