"""A trained GLM-4.5-style head, judged by llama.cpp: acceptance that can tell right from wrong.

On random weights (tests/test_glm4_moe_gguf.py) llama-server accepts ~0% of the drafts, so a
head written wrong drafts exactly as badly as one written right. ``tests/data/tiny-glm4_moe-trained``
(``scripts/train_tiny_glm.py``: the trunk trained as a language model, the NextN layer as the
next-next-token predictor exactly as llama.cpp's GLM4_MOE MTP graph runs it) drafts well, so here
llama-server's own draft counters say, on f32, Q8_0 and Q4_K_M trunks from the converter's
``--no-mtp``: mtpforge's MTP file (f32 and the default f16) decodes exactly as plain, accepts a
substantial share, as much as the converter's own ``--mtp`` block beside the same trunk, and a
copy whose head norms got Qwen's +1 drafts clearly worse (GLM's norms are raw), which
``inspect --source`` reports as ``MTP_NORMS_SHIFTED``.

Measured (llama-server, 24 prompts x 64 tokens, depth 1): see docs/families/glm4_moe.md.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mtpforge.gguf.names import block_of
from tests import gguf_env
from tests.gguf_env import mtpforge, official

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP)
MODEL = Path(__file__).resolve().parent / "data" / "tiny-glm4_moe-trained"
PRE = "glm4"
N = 2  # num_hidden_layers: the NextN layer is blk.2
#: llama-server's acceptance with our head is ~85% on every trunk type (docs/families/glm4_moe.md);
#: random weights accept ~0%
ACCEPTANCE_FLOOR = 0.7
#: ours and the converter's block beside the same trunk: the same bytes at f32, f16 rounding else
NOISE = 0.02
#: the +1 norm shift costs far more than that
SHIFT_DROP = 0.05
QTYPES = ["f32", "Q8_0", "Q4_K_M"]


def _add(trunk: Path, *extra: str) -> Path:
    """mtpforge's MTP file beside ``trunk`` (returns its path)."""
    r = mtpforge("add-mtp", "--source", str(MODEL), "--target", str(trunk), "--json", *extra)
    assert r.returncode == 0, r.stderr
    return Path(json.loads(r.stdout)["output"])


def _shift_head_norms(name: str, a: np.ndarray) -> np.ndarray | None:
    """The NextN block's RMSNorm weights +1, as a tool that took GLM's norms for Qwen's
    zero-centred ones would write them; every other tensor untouched."""
    return a + 1 if block_of(name) == N and name.endswith("norm.weight") else None


def _swap_concat_halves(name: str, a: np.ndarray) -> np.ndarray | None:
    """``eh_proj`` reading ``[hnorm(h), enorm(e)]``: the other concat order (MTPLX accepts only
    ``embedding_hidden``; llama.cpp concatenates ``e_norm`` first)."""
    if not name.endswith("nextn.eh_proj.weight"):
        return None
    h = a.shape[1] // 2
    return np.concatenate([a[:, h:], a[:, :h]], axis=1)


def _shifted_beside(ours: Path, trunk: Path, folder: Path) -> tuple[Path, Path]:
    """(trunk copy, shifted MTP file under our file's name) in ``folder``, so llama.cpp's and
    inspect's sibling discovery find it as they find ours."""
    from tests.test_gguf import _rewrite

    folder.mkdir(parents=True)
    t = Path(shutil.copyfile(trunk, folder / trunk.name))
    return t, _rewrite(ours, folder / ours.name, edit=_shift_head_norms)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict]]:
    """Per trunk type: llama-server's greedy decode plain, with our f32 and f16 MTP files, with
    the converter's ``--mtp`` block grafted beside the trunk, and with our file's norms shifted."""
    gguf_env.need("server")
    gguf_env.need("converter")
    root = tmp_path_factory.mktemp("glm4_moe_trained")
    out: dict[str, dict[str, dict]] = {}
    for qtype in QTYPES:
        d = root / qtype
        trunk = gguf_env.trunk_copy(MODEL, d, qtype, pre=PRE)
        ours32 = _add(trunk, "--precision", "f32")
        files = {"ours_f32": ours32}
        f16_dir = d / "f16"
        f16_dir.mkdir()
        files["ours_f16"] = _add(Path(shutil.copyfile(trunk, f16_dir / trunk.name)))
        files["official"] = gguf_env.graft(official(MODEL, "mtp", "f32", pre=PRE), trunk, d / "official" / "mtp-official.gguf")
        shifted_trunk, files["shifted"] = _shifted_beside(ours32, trunk, d / "shifted")
        out[qtype] = {"plain": gguf_env.measure(trunk), **{k: gguf_env.measure(trunk, draft=f) for k, f in files.items()},
                      "paths": {"trunk": trunk, "shifted_trunk": shifted_trunk}}
    return out


def test_the_committed_model_is_glm45_shaped_and_small() -> None:
    cfg = json.loads((MODEL / "config.json").read_text())
    assert cfg["model_type"] == "glm4_moe" and cfg["num_nextn_predict_layers"] == 1 and cfg["num_hidden_layers"] == N
    index = json.loads((MODEL / "model.safetensors.index.json").read_text())["weight_map"]
    assert f"model.layers.{N}.shared_head.head.weight" in index and f"model.layers.{N}.eh_proj.weight" in index
    assert sum(p.stat().st_size for p in MODEL.iterdir()) <= 3 * 2**20


@pytest.mark.parametrize("qtype", QTYPES)
def test_our_head_decodes_as_plain_and_drafts_well(runs, qtype: str) -> None:
    """Greedy output identical to the trunk alone, and a substantial share of drafts accepted,
    for the f32 file and the default f16 one."""
    r = runs[qtype]
    for k in ("ours_f32", "ours_f16"):
        assert r[k]["tokens"] == r["plain"]["tokens"], k
        assert r[k]["drafted"] > 300 and r[k]["acceptance"] >= ACCEPTANCE_FLOOR, (k, r[k]["acceptance"])


@pytest.mark.parametrize("qtype", QTYPES)
def test_our_head_accepts_as_much_as_the_converters(runs, qtype: str) -> None:
    r = runs[qtype]
    assert r["official"]["tokens"] == r["plain"]["tokens"]
    for k in ("ours_f32", "ours_f16"):
        assert abs(r[k]["acceptance"] - r["official"]["acceptance"]) <= NOISE, (k, r[k], r["official"])


@pytest.mark.parametrize("qtype", QTYPES)
def test_norms_shifted_as_if_qwens_draft_clearly_worse(runs, qtype: str) -> None:
    """GLM's norms are raw: the same head with +1 on its norms loses acceptance (the output
    stays plain greedy: llama.cpp only ever emits verified tokens)."""
    r = runs[qtype]
    assert r["shifted"]["tokens"] == r["plain"]["tokens"]
    assert r["shifted"]["acceptance"] <= r["ours_f32"]["acceptance"] - SHIFT_DROP, (r["shifted"], r["ours_f32"])


def test_the_concat_order_matters(runs, tmp_path: Path) -> None:
    """Our f32 file with eh_proj's halves swapped drafts next to nothing: acceptance here
    checks the order llama.cpp feeds, not only that a head is present."""
    from tests.test_gguf import _rewrite

    trunk = runs["f32"]["paths"]["trunk"]
    ours = next(trunk.parent.glob("mtp-*.gguf"))
    swapped = _rewrite(ours, tmp_path / ours.name, edit=_swap_concat_halves)
    m = gguf_env.measure(trunk, draft=swapped)
    assert m["drafted"] > 300 and m["acceptance"] <= 0.2, m["acceptance"]


def test_inspect_reports_the_shifted_head_and_not_ours(runs) -> None:
    paths = runs["f32"]["paths"]

    def codes(trunk: Path) -> tuple[int, set[str]]:
        r = mtpforge("inspect", str(trunk), "--source", str(MODEL), "--json")
        assert "Traceback" not in r.stderr, r.stderr
        return r.returncode, {f["code"] for f in json.loads(r.stdout)["findings"]}

    assert codes(paths["shifted_trunk"]) == (1, {"MTP_NORMS_SHIFTED"})
    assert codes(paths["trunk"]) == (0, set())
