"""The architecture's rules, enforced: families, layouts and runtimes are data (no name
comparisons outside their own modules), nothing is defined that nothing uses, and no function
grows past one screen."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mtpforge"
#: the only modules that may look at a family or layout name
TABLE_DIRS = ("families", "layouts", "runtimes")
#: where a definition may be used from
USERS = [PACKAGE, ROOT / "tests", ROOT / "benchmarks", ROOT / "scripts", ROOT / "examples"]
MAX_FUNCTION_LINES = 80


def _modules(*roots: Path) -> list[tuple[Path, ast.Module]]:
    out = []
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            if ".venv" not in p.parts:
                out.append((p, ast.parse(p.read_text("utf-8"), str(p))))
    return out


def _names() -> set[str]:
    from mtpforge.families import FAMILIES
    from mtpforge.layouts.table import GGUF_LAYOUT_NAMES, LAYOUT_NAMES

    return set(FAMILIES) | set(LAYOUT_NAMES) | set(GGUF_LAYOUT_NAMES)


def _compared_names(node: ast.Compare, names: set[str]) -> list[str]:
    hits = []
    for c in [node.left, *node.comparators]:
        elts = c.elts if isinstance(c, (ast.Tuple, ast.List, ast.Set)) else [c]
        hits += [e.value for e in elts if isinstance(e, ast.Constant) and e.value in names]
    return hits


def test_no_family_or_layout_comparisons_outside_the_tables():
    names = _names()
    offenders = []
    for path, tree in _modules(PACKAGE):
        if path.relative_to(PACKAGE).parts[0] in TABLE_DIRS:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and (hits := _compared_names(node, names)):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} compares with {hits}")
    assert offenders == [], "ask the family/layout/runtime row instead:\n" + "\n".join(offenders)


def test_no_function_longer_than_a_screen():
    long = []
    for path, tree in _modules(PACKAGE):
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n >= MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} is {n} lines")
    assert long == [], "\n".join(long)


def _used_identifiers() -> dict[str, int]:
    """How often each identifier is read (names, attributes, keyword arguments, strings that
    name an attribute, ``__all__`` entries) across the package, tests, benchmarks and scripts."""
    seen: dict[str, int] = {}

    def bump(name: str) -> None:
        seen[name] = seen.get(name, 0) + 1

    for _, tree in _modules(*USERS):
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                bump(node.id)
            elif isinstance(node, ast.Attribute):
                bump(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                bump(node.arg)
            elif isinstance(node, ast.alias):
                bump(node.asname or node.name.split(".")[-1])
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                bump(node.value)
    return seen


def _definitions() -> list[tuple[str, str, str]]:
    """(where, kind, name) of every function, method and dataclass field in the package."""
    out = []
    for path, tree in _modules(PACKAGE):
        rel = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("__") or node.decorator_list and any(
                        "validator" in ast.unparse(d) or "command" in ast.unparse(d) for d in node.decorator_list):
                    continue
                out.append((f"{rel}:{node.lineno}", "function", node.name))
            elif isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        out.append((f"{rel}:{item.lineno}", "field", item.target.id))
    return out


def test_nothing_is_defined_that_nothing_uses():
    used = _used_identifiers()
    unused = [f"{where} {kind} {name}" for where, kind, name in _definitions() if used.get(name, 0) == 0]
    assert unused == [], "remove (or use) these:\n" + "\n".join(unused)


def test_lowest_constraints_pin_every_floor():
    """CI's lowest-dependencies run pins exactly the floors pyproject.toml declares."""
    import re

    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    for spec in deps["dependencies"] + deps["optional-dependencies"]["dev"]:
        m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?>=([0-9.]+)", spec)
        assert m, f"{spec} has no floor"
        floors[m.group(1).lower().replace("_", "-")] = m.group(2)
    pins = {}
    for line in (ROOT / ".ci" / "lowest-constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    for name, floor in floors.items():
        have = tuple(int(x) for x in pins[name].split("."))
        want = tuple(int(x) for x in floor.split("."))
        assert have[:len(want)] == want and not any(have[len(want):]), f"{name}: pinned {pins[name]}, floor {floor}"
