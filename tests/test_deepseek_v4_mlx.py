"""DeepSeek-V4 (``deepseek_v4``) and MLX: why mtpforge writes no MLX form for it, held by mlx-vlm
0.7.10's own code (docs/families/deepseek_v4.md §5).

mlx-vlm is the installed MLX runtime with both a ``deepseek_v4`` model and a drafter read from files
(``deepseek_v4_mtp``). Its ``convert`` cannot make the head-less target from the release's spelling
(block-FP8 config + FP4 experts): its generic FP8 transform claims the whole model as MXFP8, so the
FP4 experts' packed bytes are half the width it then expects. Without a target nothing can prove a
drafter mtpforge would write, so add-mtp into an MLX folder refuses in one line naming mlx-vlm's own
splitter. The tiny checkpoint here is the repo's at widths mlx-vlm's E8M0 sanitize can take (every
FP8 matrix a multiple of 128: it repeats each block's exponent 128 rows without cropping) and no
hash-routed layer (mlx-vlm's hashed layer has no ``gate.bias``; the tiny one has). MTPLX 2.12.2, the
other runtime with a ``deepseek_v4`` model, loads only an MLX conversion, which nothing here makes:
its loader refuses the release. When a later runtime converts or loads it, a test here fails: the
day to write the form.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import external
from tests import mlx_judged as judged

#: widths at which every block-FP8 matrix of the tiny checkpoint is a multiple of 128 (the release's are)
WIDE = {"num_hash_layers": 0, "hidden_size": 128, "q_lora_rank": 128, "o_lora_rank": 64, "moe_intermediate_size": 128}

#: mlx-vlm 0.7.10 on the source (argv: source, scratch): its own convert (4-bit, group 32, as the
#: other MLX families' targets are made), then its own splitter and ``load_drafter`` on what it wrote
VLM_PROBE = """
import contextlib, io, json, sys
from pathlib import Path
from mlx.utils import tree_flatten
from mlx_vlm.convert import convert
from mlx_vlm.speculative.drafters import load_drafter
from mlx_vlm.speculative.drafters.deepseek_v4_mtp.split import split_deepseek_v4_mtp
out = {}
try:
    with contextlib.redirect_stdout(io.StringIO()):
        convert(sys.argv[1], str(Path(sys.argv[2]) / "mlx"), quantize=True, q_group_size=32, q_bits=4)
    out["convert"] = "ok"
except ValueError as e:
    out["convert"] = str(e)
drafter = split_deepseek_v4_mtp(sys.argv[1], str(Path(sys.argv[2]) / "drafter"))
draft, kind = load_drafter(str(drafter), kind="mtp")
params = dict(tree_flatten(draft.parameters()))
out |= {"drafter": type(draft).__name__, "kind": kind, "params": len(params),
        "config": json.loads((Path(drafter) / "config.json").read_text())}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def wide_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.synth.deepseek_v4 import build_deepseek_v4

    return build_deepseek_v4(tmp_path_factory.mktemp("deepseek_v4_mlx") / "tiny-deepseek_v4", **WIDE)


def test_mlx_vlm_cannot_convert_the_trunk_but_its_splitter_builds_the_drafter(wide_source: Path, tmp_path: Path) -> None:
    """Measured: mlx-vlm 0.7.10's convert stops at the FP4 experts (expected MXFP8's width, got
    the packed FP4 bytes'), while its splitter writes a ``deepseek_v4_mtp`` drafter from the
    release (FP8 as MXFP8, FP4 experts as MXFP4, stacked) that ``load_drafter`` builds."""
    external.require("mlx-vlm", judged.setup_runtimes.is_ready("mlx-vlm"),
                     f"no virtualenv at {judged.setup_runtimes.venv_dir('mlx-vlm')}")
    r = subprocess.run([str(judged.setup_runtimes.venv_python("mlx-vlm")), "-c", VLM_PROBE, str(wide_source),
                        str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "switch_mlp.gate_proj.weight" in out["convert"] and "(4, 128, 32)" in out["convert"], out["convert"]
    assert (out["drafter"], out["kind"], out["params"]) == ("DeepseekV4MTPDraftModel", "mtp", 45), out
    quant = out["config"]["quantization"]
    assert out["config"]["model_type"] == "deepseek_v4_mtp" and quant["e_proj"]["mode"] == "mxfp8"
    assert quant["decoder.ffn.switch_mlp.gate_proj"] == {"group_size": 32, "bits": 4, "mode": "mxfp4"}


#: MTPLX 2.12.2's own loader on the release (argv: source, the conformance stand-ins)
MTPLX_LOAD = """
import sys
sys.path.insert(0, sys.argv[2])
import standins
standins.libsystem()
from mtplx import runtime as R
try:
    R.load(sys.argv[1], mtp=True)
    print("loaded")
except ValueError as e:
    print(str(e).splitlines()[0] + " " + str(e).splitlines()[1])
"""


def test_mtplx_cannot_load_the_release_itself(wide_source: Path) -> None:
    """Measured: MTPLX binds the head from an MLX conversion's own ``mtp.{i}.*``; the release's
    names (``embed``, ``head``, ``layers.{i}.ffn.experts.{e}``) are not that conversion's, and
    MTPLX has no converter for the family."""
    judged.require_mtplx()
    r = judged.mtplx_run(MTPLX_LOAD, wide_source)
    assert r.returncode == 0, r.stderr[-2000:]
    line = r.stdout.strip().splitlines()[-1]
    assert "parameters not in model" in line and "embed.weight" in line, line


def test_add_mtp_into_an_mlx_deepseek_v4_folder_refuses_in_one_line(wide_source: Path, tmp_path: Path) -> None:
    """An MLX folder of the family (config and one trunk tensor: no MLX tool here makes a real
    one, the test above): plain add-mtp and ``--runtime mlx-vlm`` refuse in one line that says
    to pass the GGUF trunk or to split the drafter with mlx-vlm, and write nothing."""
    import numpy as np
    from safetensors.numpy import save_file

    folder = tmp_path / "tiny-deepseek_v4-4bit"
    folder.mkdir()
    config = json.loads((wide_source / "config.json").read_text())
    config.pop("quantization_config")
    (folder / "config.json").write_text(json.dumps({**config, "quantization": {"group_size": 32, "bits": 4}}))
    save_file({"language_model.model.embed.weight": np.zeros((512, 128), np.float32)},
              str(folder / "model.safetensors"), {"format": "mlx"})
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for extra in ((), ("--runtime", "mlx-vlm")):
        r = judged.mtpforge("add-mtp", "--source", str(wide_source), "--target", str(folder), *extra)
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1, r.stderr
        assert "llama.cpp only" in lines[0] and "--target" in lines[0], lines[0]
        assert "python -m mlx_vlm.speculative.drafters.deepseek_v4_mtp.split --model REPO --output DIR" in lines[0]
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
