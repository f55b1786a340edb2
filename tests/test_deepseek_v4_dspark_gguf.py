"""DeepSeek-V4's DSpark drafter (``-DSpark`` releases, llama.cpp ``dflash``): what llama.cpp's own
programs do with it, and mtpforge's file held to them.

The reference is llama.cpp's converter ``--dspark`` (``DeepseekV4DSparkModel``, the tokenizer
from ``--target-model-dir``) on the tiny ``-DSpark`` checkpoint (tests/support/synth/deepseek_v4.py
``build_deepseek_v4_dspark``: the trunk, and in ``mtp.*`` three uncompressed DeepSeek-V4 stages
plus ``main_proj`` (FP8 + E8M0), ``main_norm``, ``norm``, ``hc_head_*``, the Markov and confidence
heads, with the ``dspark_*`` config keys). llama-server loads the converter's file with ``-md
FILE --spec-type draft-dspark`` beside the ``--no-mtp`` trunk and drafts, output identical to
plain. add-mtp, from that trunk and the drafter's bytes only, writes the converter's file: every
tensor byte for byte and every metadata key in its order; llama-server drafts and accepts with it
exactly as with the converter's (docs/families/deepseek_v4.md §6).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mtpforge.gguf.gguffile import read_local, tensor_array
from tests import gguf_env
from tests import gguf_judged as judged
from tests.gguf_env import official, sha256

pytestmark = pytest.mark.xdist_group(gguf_env.XDIST_GROUP_FAMILIES)
PRE = "qwen35"  # the converter's pre-tokenizer for the synthetic byte-level vocabulary
STAGES = 3
#: a stage's tensors as the converter writes them: 9 attention (two norms, sinks, q_a, its norm,
#: q_b, kv, its norm, output a and b... with ffn_norm), 6 hyper-connection, router and bias, 3 shared
#: and 3 routed expert stacks
BLOCK = 24
#: what ``DeepseekV4DSparkModel`` writes outside the blocks
MAIN_NORM = "enc.output_norm.weight"
ROOT = ("fc.weight", MAIN_NORM, "output_norm.weight", "output_hc_fn.weight", "output_hc_base.weight",
        "output_hc_scale.weight", "markov_w1.weight", "markov_w2.weight", "conf_proj.weight")
#: how the converter's file is drafted with: the block size less the anchor
N_MAX = 3


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny ``-DSpark`` release with a Markov head that drafts: fitted to the bigrams its
    trunk writes on the test prompts (measured by llama-server on a first build's trunk; the
    trunk does not depend on the drafter), so equal counts are hundreds of acceptances."""
    from collections import Counter

    from tests.support.synth.deepseek_v4 import build_deepseek_v4_dspark

    gguf_env.need("server")
    root = tmp_path_factory.mktemp("deepseek_v4_dspark")
    untrained = build_deepseek_v4_dspark(root / "untrained")
    follows: dict[int, Counter[int]] = {}
    for seq in _measure(_trunk(untrained, root / "plain"), None)["tokens"]:
        for a, b in zip(seq, seq[1:]):
            follows.setdefault(a, Counter())[b] += 1
    bigrams = {a: c.most_common(1)[0][0] for a, c in follows.items()}
    return build_deepseek_v4_dspark(root / "tiny-deepseek_v4-dspark", bigrams=bigrams)


def _trunk(src: Path, dst: Path, qtype: str = "f32") -> Path:
    from tests.test_deepseek_v4_gguf import _trunk as v4_trunk

    return v4_trunk(src, dst, qtype)


def _measure(trunk: Path, draft: Path | None) -> dict[str, Any]:
    return gguf_env.measure(trunk, draft=draft, texts=gguf_env.prompts()[:4], spec_type="draft-dspark", n_max=N_MAX)


def test_a_dspark_release_is_told_from_the_mtp_one_by_its_config() -> None:
    """The ``dspark_*`` keys make the source a DSpark drafter; DeepSeek-V4's MTP release, same
    ``model_type``, stays the MTP family (and the trunk's ``deepseek4`` stays that family's)."""
    from mtpforge.families.detect import detect_family
    from mtpforge.gguf.names import FAMILY_OF_ARCH
    from tests.support.synth.deepseek_v4 import CONFIG, DSPARK_CONFIG

    assert detect_family({**CONFIG, **DSPARK_CONFIG}) == "deepseek_v4_dspark"
    assert detect_family(CONFIG) == "deepseek_v4" and FAMILY_OF_ARCH["deepseek4"] == "deepseek_v4"


def test_llama_server_drafts_with_the_converters_dspark_file(src: Path, tmp_path: Path) -> None:
    """The converter's ``--dspark`` file is a ``dflash`` model of its own (its stages as blk.0-2,
    the target layers 1-based, the noise token as the mask token); beside the ``--no-mtp`` trunk
    llama-server drafts with it and decodes as without it."""
    gguf_env.need("server")
    ref = read_local(official(src, "dspark", "f32", pre=PRE))
    assert ref.arch == "dflash" and ref.block_count == STAGES and ref.get("{arch}.target_layers") == [1, 2]
    assert ref.get("tokenizer.ggml.mask_token_id") == 505 and ref.get("{arch}.block_size") == 4
    assert len(ref.tensors) == STAGES * BLOCK + len(ROOT) and set(ROOT) <= set(ref.tensors)
    trunk = _trunk(src, tmp_path)
    plain, spec = _measure(trunk, None), _measure(trunk, ref.path)
    assert spec["tokens"] == plain["tokens"] and spec["drafted"] > 0, (plain["drafted"], spec["drafted"])


def test_the_dspark_file_equals_the_converters_export(src: Path, tmp_path: Path) -> None:
    """Everything ``--dspark`` writes (tensors, values, metadata and its order: the trunk's under
    ``dflash``, 3 blocks, the per-stage arrays, the config's keys), from the trunk and the
    drafter's bytes; nothing of the trunk is copied and the trunk is only read."""
    trunk = _trunk(src, tmp_path)
    before = sha256(trunk)
    r = judged.add_mtp(trunk, src, "--precision", "f32")
    assert r["family"] == "deepseek_v4_dspark" and r["copied_bytes"] == 0 and "--spec-type draft-dspark" in r["run"]
    assert Path(r["output"]).name.startswith("dspark-") and r["mtp_tensors"] == STAGES * BLOCK + len(ROOT)
    ours, ref = read_local(r["output"]), read_local(official(src, "dspark", "f32", pre=PRE))
    judged._same_values(ours, ref)
    assert judged.kv_list(ours) == judged.kv_list(ref) and sha256(trunk) == before


def test_the_dspark_file_equals_the_converters_at_q8_0(src: Path, tmp_path: Path) -> None:
    """The converter's types follow the source's whatever ``--outtype`` says, and add-mtp's
    whatever ``--precision`` says: byte for byte its ``--outtype q8_0`` file — with
    ``--keep-fc-full-precision`` too, which says that it changes nothing here (the fc is Q8_0)."""
    r = judged.add_mtp(_trunk(src, tmp_path), src, "--precision", "q8_0", "--keep-fc-full-precision")
    assert any("--keep-fc-full-precision has no effect on deepseek_v4_dspark" in n for n in r["notes"]), r["notes"]
    ours, ref = Path(r["output"]), official(src, "dspark", "q8_0", pre=PRE)
    assert ours.name.endswith("-Q8_0.gguf")
    a, b = read_local(ours), read_local(ref)
    assert judged.tensor_table(a) == judged.tensor_table(b) and judged.kv_list(a) == judged.kv_list(b)
    with open(ours, "rb") as fa, open(ref, "rb") as fb:
        for k, t in b.tensors.items():
            fa.seek(a.tensors[k].offset)
            fb.seek(t.offset)
            assert fa.read(t.nbytes) == fb.read(t.nbytes), k


@pytest.mark.parametrize("qtype", ["f32", "Q8_0"])
def test_llama_server_drafts_with_mtpforges_dspark_file_as_with_the_converters(src: Path, qtype: str,
                                                                                tmp_path: Path) -> None:
    """On the f32 and Q8_0 trunks: plain output, and the converter's file's drafted / accepted
    counts (its stages untrained, its Markov head fitted: nearly every draft accepted) — measured
    by ``mtpforge verify`` of the trunk, which finds the drafter beside it and runs it as
    llama.cpp's DSpark example does (``--spec-type draft-dspark``, the block less its anchor)."""
    gguf_env.need("server")
    trunk = _trunk(src, tmp_path, qtype)
    ours = Path(judged.add_mtp(trunk, src, "--precision", "f32")["output"])
    r = gguf_env.mtpforge("verify", str(trunk), "--json", "--llama-server", str(gguf_env.BIN / "llama-server"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    v = json.loads(r.stdout)
    assert v["draft"] == str(ours) and v["spec_type"] == "draft-dspark" and v["draft_max"] == N_MAX
    with_theirs = _measure(trunk, official(src, "dspark", "f32", pre=PRE))
    assert v["identical"] is True and v["drafted"] > 0
    assert (v["drafted"], v["accepted"]) == (with_theirs["drafted"], with_theirs["accepted"])
    assert v["acceptance"] > 0.9 and v["dead_head"] is None, v["acceptance"]
    print(json.dumps({qtype: [v["drafted"], v["accepted"]]}))


def test_inspect_reads_the_drafter_beside_the_trunk_and_the_drafter_itself(src: Path, tmp_path: Path) -> None:
    """The trunk: no MTP head, but the drafter beside it drafts for it (info, exit 0); the
    drafter: three stages, its target layers, no finding; a copy without ``markov_w2`` or from
    another trunk's width is named."""
    from tests.test_gguf import _rewrite

    trunk = _trunk(src, tmp_path)
    ours = Path(judged.add_mtp(trunk, src, "--precision", "f32")["output"])
    code, rep = judged.inspect_json(trunk)
    assert code == 0 and rep["layout"] == "none" and [d["file"] for d in rep["drafters"]] == [ours.name]
    assert rep["drafters"][0]["stages"] == STAGES and rep["drafters"][0]["spec_type"] == "draft-dspark"
    assert [(f["code"], f["severity"]) for f in rep["findings"]] == [("MTP_HEAD_MISSING", "info")]
    code, rep = judged.inspect_json(ours)
    assert code == 0 and rep["findings"] == [] and rep["family"] == "deepseek_v4_dspark"
    assert rep["drafter"]["target_layers"] == [1, 2] and rep["mtp_tensors"] == STAGES * BLOCK + len(ROOT)
    assert rep["trunk"] == str(trunk)
    (tmp_path / "bad").mkdir()
    bad = _rewrite(ours, tmp_path / "bad" / ours.name, drop=("markov_w2.weight",))
    code, rep = judged.inspect_json(bad)
    assert code == 1 and [f["code"] for f in rep["findings"]] == ["MTP_MISSING_TENSORS"]
    assert "markov_w2.weight" in rep["findings"][0]["message"]
    (tmp_path / "bad" / trunk.name).write_bytes(trunk.read_bytes())
    bad.rename(tmp_path / "bad" / ("dspark-other-F32.gguf"))
    _rewrite(ours, tmp_path / "bad" / ours.name, kv={"dflash.target_layers": [1, 7]})
    code, rep = judged.inspect_json(tmp_path / "bad" / trunk.name)
    codes = sorted(f["code"] for f in rep["findings"])
    assert code == 1 and codes == ["MTP_HEAD_MISSING", "MTP_MISSING_TENSORS", "MTP_SHAPE_MISMATCH"], rep["findings"]


def test_inspect_source_holds_the_drafters_norms_against_the_release(src: Path, tmp_path: Path) -> None:
    """``inspect DRAFTER --source RELEASE``: every norm of the stages and the one closing them
    equals the release's (raw, as the converter writes DeepSeek-V4's) — no finding; the same file
    with its norms +1 is named shifted; the MTP release as ``--source`` is another model's. The
    trunk with the drafter beside it (``inspect TRUNK --source RELEASE``) holds the drafter alike."""
    from tests.support.synth.deepseek_v4 import build_deepseek_v4
    from tests.test_gguf import _rewrite

    trunk = _trunk(src, tmp_path)
    ours = Path(judged.add_mtp(trunk, src, "--precision", "f32")["output"])
    code, rep = judged.inspect_json(ours, "--source", str(src))
    assert (code, rep["findings"]) == (0, []) and (rep["norm_convention"], rep["norm_convention_from"]) == ("raw", "source")
    (tmp_path / "shifted").mkdir()
    shifted = _rewrite(ours, tmp_path / "shifted" / ours.name,
                       edit=lambda k, a: a + 1 if k.endswith("norm.weight") else None)
    code, rep = judged.inspect_json(shifted, "--source", str(src))
    assert code == 1 and rep["norm_convention"] == "shifted", rep
    assert [f["code"] for f in rep["findings"]] == ["MTP_NORMS_SHIFTED"], rep["findings"]
    # the norm after the input projection (main_norm, outside the stages) is held too
    (tmp_path / "main").mkdir()
    main_only = _rewrite(ours, tmp_path / "main" / ours.name, edit=lambda k, a: a + 1 if k == MAIN_NORM else None)
    code, rep = judged.inspect_json(main_only, "--source", str(src))
    assert code == 1 and [f["code"] for f in rep["findings"]] == ["MTP_NORMS_MIXED"], rep["findings"]
    assert MAIN_NORM in rep["findings"][0]["message"]
    mtp_release = build_deepseek_v4(tmp_path / "tiny-deepseek_v4")
    code, rep = judged.inspect_json(ours, "--source", str(mtp_release))
    assert code == 1 and [f["code"] for f in rep["findings"]] == ["SOURCE_MISMATCH"], rep["findings"]
    # the trunk with the drafter beside it: --source is the drafter's release, its norms held to it
    code, rep = judged.inspect_json(trunk, "--source", str(src))
    assert code == 0 and rep["drafters"][0]["norm_convention"] == "raw", rep
    shifted.replace(ours)
    code, rep = judged.inspect_json(trunk, "--source", str(src))
    assert code == 1 and sorted(f["code"] for f in rep["findings"]) == ["MTP_HEAD_MISSING", "MTP_NORMS_SHIFTED"], rep
    assert rep["drafters"][0]["norm_convention"] == "shifted"


def test_the_drafting_comparison_sees_a_misread_markov_head(src: Path, tmp_path: Path) -> None:
    """The equal counts mean something: with ``markov_w1`` and ``markov_w2`` read the other way
    round (same shape), llama-server accepts a small fraction of what it accepts with mtpforge's
    file."""
    from tests.test_gguf import _rewrite

    gguf_env.need("server")
    trunk = _trunk(src, tmp_path)
    ours = Path(judged.add_mtp(trunk, src, "--precision", "f32")["output"])
    g = read_local(ours)
    w = {k: tensor_array(g, g.tensors[k]) for k in ("markov_w1.weight", "markov_w2.weight")}
    (tmp_path / "swapped").mkdir()
    bad = _rewrite(ours, tmp_path / "swapped" / ours.name, edit=lambda k, a: (
        w["markov_w2.weight"] if k == "markov_w1.weight" else w["markov_w1.weight"] if k == "markov_w2.weight" else None))
    good, wrong = _measure(trunk, ours), _measure(trunk, bad)
    assert good["acceptance"] > 0.9 and wrong["acceptance"] < good["acceptance"] / 4, (good, wrong)
    print(json.dumps({"good": [good["drafted"], good["accepted"]], "swapped": [wrong["drafted"], wrong["accepted"]]}))


def test_only_the_drafters_bytes_come_from_the_hub(src: Path, hub: Any, tmp_path: Path) -> None:
    """From the loopback Hub: ≤ 1.01 × the drafter's bytes fetched (mtpforge's count and the
    hub's log), and the file equals the one written from the local source."""
    judged.fetches_only_the_head(hub, src, lambda d: _trunk(src, d), tmp_path)
