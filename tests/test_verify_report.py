"""``verify --report``: the page renders in real headless Chromium and its plot shows the
acceptance per draft position that verify measured."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtpforge.pipeline import add_mtp
from tests import external
from mtpforge.report_page import POSITION_COLOUR, PROMPT_COLOUR
from mtpforge.community import convert_to_mlx

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "mtpforge" / "data"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run")


def chromium() -> str:
    path = next(filter(None, (shutil.which(n) for n in ("chromium", "chromium-browser"))), None)
    external.require("chromium", path is not None)
    return str(path)


def browser(page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def headed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled trained model, converted as the community does, with its head put back."""
    t = convert_to_mlx(DATA / "tiny-qwen3_5", tmp_path_factory.mktemp("rep") / "tiny-4bit")
    add_mtp(source=str(DATA / "tiny-qwen3_5"), target=str(t), precision="bf16", progress=False)
    return t


def verify_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mtpforge", "verify", *args, "--json"], capture_output=True, text=True,
                          cwd=REPO, timeout=600)


PROMPTS = ("Count: 3, 4, 5, 6, 7, 8.\n25 + 17 =", "The old man reads the map after the rain.\n")


def test_html_report_renders_in_chromium_with_the_position_bars(headed: Path, tmp_path: Path) -> None:
    page = tmp_path / "verify.html"
    p = verify_cli(str(headed), "--generate", "--depth", "3", "--max-tokens", "24", "--prompt", PROMPTS[0],
                   "--prompt", PROMPTS[1], "--report", str(page))
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["report"] == str(page) and len(r["acceptance_by_position"]) == 3 and len(r["per_prompt"]) == 2
    by_pos = r["acceptance_by_position"]
    assert by_pos[0] > 0.3  # a trained head: the bars have something to show

    src = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", src) and "<script" not in src  # self-contained

    # the DOM Chromium built: one bar per position, carrying verify's figures
    dom = browser(page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr
    chart = re.search(r'<svg[^>]*class="chart by-position".*?</svg>', dom.stdout, re.S)
    assert chart, dom.stdout[:2000]
    bars = re.findall(r'<rect class="bar" data-index="(\d+)" data-value="([\d.]+)"[^>]*height="([\d.]+)"', chart.group(0))
    assert [int(b[0]) for b in bars] == [1, 2, 3]
    assert [float(b[1]) for b in bars] == pytest.approx(by_pos, abs=1e-4)
    prompts_dom = html.unescape(dom.stdout)
    assert all(" ".join(t.split())[:20] in prompts_dom for t in PROMPTS)

    # the pixels: a screenshot has three bars in the position colour, heights in proportion
    from PIL import Image

    shot = tmp_path / "shot.png"
    s = browser(page, tmp_path, "--window-size=900,900", "--hide-scrollbars", f"--screenshot={shot}")
    assert s.returncode == 0 and shot.is_file(), s.stderr
    img = Image.open(shot).convert("RGB")
    colour = tuple(int(POSITION_COLOUR[i:i + 2], 16) for i in (1, 3, 5))
    w, h = img.size
    px = img.load()
    heights = [sum(1 for y in range(h) if _near(px[x, y], colour)) for x in range(w)]
    runs: list[list[int]] = []
    for x, n in enumerate(heights):
        if n:
            if runs and runs[-1][-1] == x - 1:
                runs[-1].append(x)
            else:
                runs.append([x])
    bar_heights = [max(heights[x] for x in run) for run in runs]
    assert len(bar_heights) == sum(1 for a in by_pos if a > 0.01), (bar_heights, by_pos)
    full = 220 - 24 - 40  # the chart's plot height in CSS pixels
    for got, want in zip(bar_heights, [a for a in by_pos if a > 0.01]):
        assert abs(got - want * full) <= 2.5, (bar_heights, by_pos)
    # the per-prompt plot is there too, in its own colour
    other = tuple(int(PROMPT_COLOUR[i:i + 2], 16) for i in (1, 3, 5))
    assert any(_near(px[x, y], other) for x in range(0, w, 2) for y in range(0, h, 2))


def _near(a: tuple[int, ...], b: tuple[int, ...], tol: int = 6) -> bool:
    return all(abs(x - y) <= tol for x, y in zip(a, b))


def test_markdown_report_and_bad_names(headed: Path, tmp_path: Path) -> None:
    md = tmp_path / "verify.md"
    p = verify_cli(str(headed), "--generate", "--depth", "2", "--max-tokens", "12", "--prompt", PROMPTS[0], "--report", str(md))
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    text = md.read_text()
    assert text.startswith("## MTP verification: passed")
    for i, a in enumerate(r["acceptance_by_position"]):
        assert f"| {i + 1} | {a:.1%} |" in text
    # a name that is neither .html nor .md, or --report without --generate: one line, before decoding
    for args in (("--generate", "--report", str(tmp_path / "x.pdf")), ("--report", str(tmp_path / "x.html"))):
        bad = verify_cli(str(headed), *args)
        assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["code"] == "BAD_INPUT"
        assert "Traceback" not in bad.stderr
    assert not (tmp_path / "x.html").exists() and not (tmp_path / "x.pdf").exists()
