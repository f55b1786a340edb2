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


def test_no_hand_kept_list_of_families():
    """A message that names the families mtpforge handles builds the list from the registry
    (``families/unhandled.handled_model_types``): a string listing two family names by hand goes
    stale with the next family (it said "qwen3_5, qwen3_5_moe and qwen3_next" after GLM joined)."""
    import re

    from mtpforge.families import FAMILIES

    names = set(FAMILIES)
    offenders = []
    for path, tree in _modules(PACKAGE):
        if path.relative_to(PACKAGE).parts[0] in TABLE_DIRS:
            continue
        # docstrings name the code they were read from (mlx-lm's modules), not what mtpforge handles
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                hits = sorted({w for w in re.findall(r"[a-z0-9_-]+", node.value) if w in names})
                if len(hits) >= 2:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} lists {hits}")
    assert offenders == [], "build the list from FAMILIES instead:\n" + "\n".join(offenders)


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


#: the package directory that may spell a family's tensor keys
FAMILY_DIR = "families"
#: file names are not keys (``mtp.safetensors`` is the sidecar a runtime opens, whatever it holds)
_FILE_NAME = r"[\w./-]+\.(?:safetensors|json|gguf|jinja)\b"


def _key_fragments() -> tuple[set[str], set[str]]:
    """(fragments, expert format names) built from every family spec's rows, so a new family's
    spelling is forbidden outside ``families/`` the moment its rows exist.

    A row's key template yields each segment with an underscore (``pre_fc_norm_hidden``,
    ``shared_expert_gate``, ``switch_mlp``), each pair of adjacent segments (``mlp.gate``,
    ``experts.down_proj``) and, without placeholders, the key itself (``fc.weight``, and
    ``{i}.enorm.weight`` whose only placeholder is the step, or what follows the step from its dot,
``.enorm.weight`` of ``layers.{i}.enorm.weight``); a spec's
    head prefixes yield themselves (``mtp.``, ``language_model.mtp.``, the literal part of
    ``model.layers.{N}.``)."""
    from mtpforge.families import FAMILIES

    frags: set[str] = set()
    formats: set[str] = set()
    for spec in FAMILIES.values():
        formats |= set(spec.expert_rows)
        for p in (spec.hf_head_prefix, spec.head_file_prefix, *spec.mlx_head_prefixes):
            frags.add(p.split("{")[0])
        for row in spec.rows():
            segs = [s for s in row.key.split(".") if s not in ("weight", "bias")]
            for a, b in zip(segs, segs[1:]):
                if "{" not in a + b:
                    frags.add(f"{a}.{b}")
            frags |= {s for s in segs if "_" in s and "{" not in s}
            if "{" not in row.key:
                frags.add(row.key)
            elif row.key.startswith("{i}.") and "{" not in row.key[4:]:
                frags.add(row.key)  # a step-indexed key, spelled whole (Step-3.5's ``{i}.enorm.weight``)
            elif "{e}" not in row.key and "{" not in (tail := row.key.rsplit("{i}", 1)[1]):
                frags.add(tail)  # what follows the step, from its dot (MiMo-V2's ``.enorm.weight``)
    frags.discard("")
    return frags, formats


def _pattern(frag: str, formats: set[str]) -> "re.Pattern[str]":
    import re

    body = re.escape(frag)
    if frag in formats:
        # an expert format is also a user-facing value (``--experts switch_mlp``): only a key
        # spelling (the name between dots) is forbidden
        return re.compile(rf"\.{body}\b|\b{body}\.")
    # a whole key (``norm.weight``) must not be the tail of a longer one (``model.norm.weight``)
    before = r"(?<![\w.])" if frag.endswith(".weight") else r"(?<!\w)"
    return re.compile(before + body + ("" if frag.endswith(".") else r"(?!\w)"))


def _docstrings(tree: ast.Module) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def test_no_family_key_literals_outside_the_families():
    """Keys are asked of the family spec (by Role), never spelled: a string constant outside
    ``mtpforge/families/`` that holds a fragment of any family's key templates is an offender
    (docstrings excepted: they may say what a key looks like)."""
    import re

    frags, formats = _key_fragments()
    pats = {f: _pattern(f, formats) for f in frags}
    offenders = []
    for path, tree in _modules(PACKAGE):
        if path.relative_to(PACKAGE).parts[0] == FAMILY_DIR:
            continue
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docs:
                continue
            text = re.sub(_FILE_NAME, "", node.value)
            hits = sorted(f for f, p in pats.items() if p.search(text))
            if hits:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value[:60]!r} spells {hits}")
    assert offenders == [], "ask the family spec for the key (spec.key(Role...), role_of, is_head_key):\n" + "\n".join(offenders)


def test_the_key_fragments_cover_every_family_row():
    """The forbidden set is built from the rows themselves: every row of every family yields a
    fragment, so a family whose keys escaped the rule would fail here."""
    from mtpforge.families import FAMILIES

    frags, formats = _key_fragments()
    for spec in FAMILIES.values():
        for row in spec.rows():
            stored = spec.hf_head_prefix.split("{")[0] + row.key.format(i=0, e=0)
            assert any(_pattern(f, formats).search(row.key) for f in frags), f"{spec.name}: {row.key} yields no fragment"
            assert any(_pattern(f, formats).search(stored) for f in frags), f"{spec.name}: {stored} yields no fragment"
    assert {"pre_fc_norm_hidden", "shared_expert_gate", "mtp.", "mlp.gate"} <= frags


def test_a_rank_sharded_release_is_read_by_every_emitter_its_family_has():
    """``FamilySpec.rank_sharded`` is honoured by the GGUF emitter's decode only: a family that
    gains an MLX layout must have the MLX emitter read it too before this passes."""
    from mtpforge.families import FAMILIES

    assert [s.name for s in FAMILIES.values() if s.rank_sharded and s.layouts] == []
