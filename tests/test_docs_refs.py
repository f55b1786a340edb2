"""Every documentation reference in the repository resolves inside the repository.

Code, tests and docs cite ``docs/<NAME>.md`` and ``docs/SPEC.md §N`` / ``§N.M``. This test fails
when a tracked text file cites a docs file that does not exist, a SPEC section that docs/SPEC.md
has no heading for (``## N.`` or ``### N.M``), or points outside the repository (the folders the
docs were first drafted in are not part of a clone).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve()

#: what is scanned: tracked files under these prefixes (a prefix without "/" is one file)
SCOPE = ("README.md", "docs/", "mtpforge/", "tests/", "benchmarks/", "scripts/", "examples/", "recipes/",
         "action.yml")
#: files scanned even before they are committed
ALWAYS = ("docs/SPEC.md", "docs/CONTRACT.md")

SPEC = "docs/SPEC.md"
SECTION = r"§\s*(\d+(?:\.\d+)*)"
# a docs file named from the repository root (or from a subfolder via ../); not part of a URL or
# of another project's path such as "vllm/docs/x.md"
DOC_FILE = re.compile(r"(?<![\w./-])((?:\.\./)*docs/[\w./-]*?[\w-]\.md)\b")
# "docs/SPEC.md §4", "docs/SPEC.md §5, §5.1", "docs/SPEC.md §2/§4", "docs/SPEC.md §4 and §5"
SPEC_REF = re.compile(r"docs/SPEC\.md((?:\s*(?:,|/|;|\band\b|\bor\b|&)?\s*§\s*\d+(?:\.\d+)*)+)")
BARE_SECTION = re.compile(SECTION)
HEADING = re.compile(r"^#{2,6}\s+(\d+(?:\.\d+)*)\.?(?=\s)", re.M)
# references to the folder the docs were drafted in, outside the repository
OUTSIDE = [
    (re.compile(r"\.\./shared\b"), "../shared"),
    (re.compile(r"shared/SPEC"), "shared/SPEC"),
    (re.compile(r"shared/CONTRACT"), "shared/CONTRACT"),
    (re.compile(r"(?<!docs/)\bSPEC §"), "'SPEC §' (write 'docs/SPEC.md §')"),
]


def spec_sections(spec_text: str) -> set[str]:
    """Section numbers docs/SPEC.md has a heading for: "## 5. ..." -> "5", "### 5.1 ..." -> "5.1"."""
    return set(HEADING.findall(spec_text))


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def problems_in(rel: str, text: str, root: Path, sections: set[str]) -> list[str]:
    """Every broken or outside reference in one file's text, as "path:line: what"."""
    out: list[str] = []
    for m in DOC_FILE.finditer(text):
        ref = m.group(1)
        base = root / Path(rel).parent if ref.startswith("../") else root
        if not (base / ref).resolve().is_file():
            out.append(f"{rel}:{_line(text, m.start())}: cites {ref}, which does not exist")
    for m in SPEC_REF.finditer(text):
        for n in BARE_SECTION.findall(m.group(1)):
            if n not in sections:
                out.append(f"{rel}:{_line(text, m.start())}: cites {SPEC} §{n}, which has no heading '{n}'")
    if rel == SPEC:  # the spec's own "see §8"
        for m in BARE_SECTION.finditer(text):
            if m.group(1) not in sections:
                out.append(f"{rel}:{_line(text, m.start())}: refers to §{m.group(1)}, which has no heading")
    for pattern, what in OUTSIDE:
        for m in pattern.finditer(text):
            out.append(f"{rel}:{_line(text, m.start())}: outside reference {what}")
    return out


def scan(root: Path, files: list[str]) -> list[str]:
    """Problems in the given repository-relative files under ``root`` (binary files skipped)."""
    spec = root / SPEC
    sections = spec_sections(spec.read_text(encoding="utf-8")) if spec.is_file() else set()
    out: list[str] = []
    for rel in files:
        path = root / rel
        if path.resolve() == SELF or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        out += problems_in(rel, text, root, sections)
    return out


def in_scope(rel: str) -> bool:
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in SCOPE)


def tracked_files(root: Path) -> list[str]:
    try:
        res = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    files = {f for f in res.stdout.decode("utf-8", "replace").split("\0") if f and in_scope(f)}
    files.update(f for f in ALWAYS if (root / f).is_file())
    return sorted(files)


def test_docs_references_resolve() -> None:
    assert (ROOT / SPEC).is_file(), f"{SPEC} is missing: code and docs cite its sections"
    problems = scan(ROOT, tracked_files(ROOT))
    assert not problems, "broken documentation references:\n" + "\n".join(problems)


def test_spec_has_the_cited_sections() -> None:
    sections = spec_sections((ROOT / SPEC).read_text(encoding="utf-8"))
    assert {"1", "2", "3", "4", "5", "5.1", "5.2", "6", "7"} <= sections


def test_scanner_catches_bad_references(tmp_path: Path) -> None:
    """The checks above can fail: a scratch repository with one bad reference of each kind."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "SPEC.md").write_text("# spec\n\n## 1. One\n\n### 1.1 Sub\n\nsee §1.1 and §3\n")
    (tmp_path / "docs" / "GOOD.md").write_text("fine\n")
    sec = "\u00a7"
    bad = "\n".join([
        f"ok: docs/GOOD.md, docs/SPEC.md {sec}1, docs/SPEC.md {sec}1.1, docs/SPEC.md {sec}1.",
        "https://example.org/docs/ELSEWHERE.md is someone else's",
        "missing: docs/" + "NOPE.md",
        f"no such section: docs/SPEC.md {sec}2, and docs/SPEC.md {sec}1/{sec}4.2",
        "outside: ../" + "shared/notes, /work/" + "shared/SPEC.md, shared/" + "CONTRACT.md",
        f"bare: see SPEC {sec}1",
    ])
    (tmp_path / "README.md").write_text(bad)
    problems = scan(tmp_path, ["README.md", "docs/SPEC.md", "docs/GOOD.md"])
    text = "\n".join(problems)
    readme = [p for p in problems if p.startswith("README.md:")]
    assert "README.md:3: cites docs/NOPE.md, which does not exist" in readme
    assert "ELSEWHERE" not in text  # a URL's docs/ is not this repository's
    assert [p for p in readme if "has no heading" in p] == [
        f"README.md:4: cites docs/SPEC.md {sec}2, which has no heading '2'",
        f"README.md:4: cites docs/SPEC.md {sec}4.2, which has no heading '4.2'",
    ]
    assert sorted(p.split("outside reference ")[1] for p in readme if "outside reference" in p) == sorted(
        ["../shared", "shared/SPEC", "shared/CONTRACT", f"'SPEC {sec}' (write 'docs/SPEC.md {sec}')"])
    assert len(readme) == 7
    assert problems.count(f"docs/SPEC.md:7: refers to {sec}3, which has no heading") == 1
    assert not any("GOOD" in p for p in problems)
