"""remove-mtp undoes every add-mtp: each registered family, each of its MLX layouts, and the GGUF
sibling (``gguf-mtp``) and ``gguf-tail`` outputs, with and without a model card that existed
before — the folder byte for byte as it was, the card included, in one parametrized test.

The cases come from the registry (``FAMILIES`` and each spec's ``layouts``), so a family added
later is undone here too: two earlier tests kept their own lists and missed six families. A
GLM head (a NextN layer under ``model.layers.{N}.``) was refused as "not the MTP head", and a
GGUF target had no undo at all ("not a folder").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mtpforge.families import FAMILIES
from tests.checkers import folder_state
from tests.crash_harness import run_cli
from tests.support.families import GGUF_LAYOUTS as FAMILY_GGUF, MLX_LAYOUTS, mlx_trunk, tiny_source

GGUF_LAYOUTS = ("gguf-mtp", "gguf-tail")
CARD = "---\nlicense: apache-2.0\n---\n# my model\n\nWords the user wrote.\n"

#: (family, layout, whether a card existed before add-mtp): every family and layout with the
#: user's card (restored as it was); a card add-mtp created (removed again) once per layout —
#: which card is restored is the layout's code, not the family's, and each case costs seconds
_PAIRS = [(f, layout) for f in FAMILIES for layout in (*MLX_LAYOUTS.get(f, ()), *FAMILY_GGUF.get(f, ()))]
CASES = [(f, layout, "card") for f, layout in _PAIRS] + \
        [next((f, layout, "no-card") for f, lay in _PAIRS if lay == layout) for layout in dict.fromkeys(l for _, l in _PAIRS)]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    """Each family's tiny source and its MLX trunk, built once, on first use."""
    root = tmp_path_factory.mktemp("every-add")
    cache: dict[tuple[str, str], Path] = {}

    def get(family: str, what: str) -> Path:
        if (family, "src") not in cache:
            cache[family, "src"] = tiny_source(family, root / f"{family}-hf")
        if what == "mlx" and (family, "mlx") not in cache:
            cache[family, "mlx"] = mlx_trunk(family, cache[family, "src"], root / f"{family}-mlx")
        return cache[family, what]

    return get


def _target(built, family: str, layout: str, card: str, root: Path) -> tuple[Path, Path, list[str]]:
    """(source, the target add-mtp writes into, add-mtp's extra arguments) in ``root``."""
    from tests.support.synth.gguf_trunk import synthetic_trunk

    src = built(family, "src")
    if layout in GGUF_LAYOUTS:
        folder = root / "repo"
        target = synthetic_trunk(src, folder / "trunk.gguf")
        extra = ["--layout", "gguf-tail", "--output", str(root / "tail" / "t.gguf")] if layout == "gguf-tail" else []
        (root / "tail").mkdir()
    else:
        folder = target = Path(shutil.copytree(built(family, "mlx"), root / "model"))
        extra = ["--layout", layout]
    card_path = (root / "tail" if layout == "gguf-tail" else folder) / "README.md"
    if card == "card":
        card_path.write_text(CARD)
    else:
        card_path.unlink(missing_ok=True)
    return src, target, extra


@pytest.mark.parametrize("family,layout,card", CASES, ids=lambda v: str(v))
def test_remove_mtp_after_every_add_mtp_restores_the_folder_byte_for_byte(built, family: str, layout: str, card: str,
                                                                         tmp_path: Path) -> None:
    src, target, extra = _target(built, family, layout, card, tmp_path)
    pristine = folder_state(tmp_path)
    add = run_cli(["add-mtp", "--source", str(src), "--target", str(target), *extra, "--json"])
    assert add.returncode == 0, add.stderr[-3000:]
    rep = json.loads(add.stdout)
    assert rep["status"] == "written" and folder_state(tmp_path) != pristine
    if layout != "mlx-vlm-drafter":  # a drafter folder add-mtp makes gets no card
        assert "README.md" in {Path(p).name for p in rep["files_written"]}, rep["files_written"]
    undo = rep["output"] if layout == "gguf-tail" else str(Path(rep["manifest"]).parent) \
        if layout not in GGUF_LAYOUTS else str(target)
    r = run_cli(["remove-mtp", undo, "--json"])
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "removed", r.stderr[-3000:]
    assert folder_state(tmp_path) == pristine
    if card == "card":
        return
    # nothing left to undo: one line, nothing changed
    again = run_cli(["remove-mtp", undo if layout != "gguf-tail" else str(target)])
    assert again.returncode in (1, 2) and "Traceback" not in again.stderr and len(
        [ln for ln in again.stderr.splitlines() if ln.startswith("error: ")]) == 1, again.stderr
    assert folder_state(tmp_path) == pristine
