"""add-mtp planned from data alone: configs and tensor headers in memory, no file opened. The
plan must say what the real run (recorded in tests/golden) wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpforge.checkpoint.safetensors_header import DTYPE_SIZES, TensorInfo
from mtpforge.families.detect import detect_family
from mtpforge.layouts.detect import HeadLocation
from mtpforge.options import AddOptions
from mtpforge.pipeline import SourceHead, make_plan
from tests.golden import cases as golden
from tests.support.synth import hf_tensor_specs, tiny_config

GOLDEN = json.loads(golden.GOLDEN.read_text())["cases"]


def _source_head(config: dict) -> SourceHead:
    """The Qwen3-Next fixture's head as its safetensors headers describe it: bf16, packed."""
    entries, offset = {}, 0
    for name, (shape, *_rest) in sorted(hf_tensor_specs(config).items()):
        if not name.startswith("mtp."):
            continue
        n = DTYPE_SIZES["BF16"]
        for d in shape:
            n *= d
        entries[name[len("mtp."):]] = TensorInfo(name, "model-00003-of-00003.safetensors", "BF16", tuple(shape), offset, offset + n)
        offset += n
    head = HeadLocation("hf", entries, {k: i.name for k, i in entries.items()})
    return SourceHead("qwen3_next", config, detect_family(config), head, None, True,
                      {"model-00003-of-00003.safetensors": offset})


@pytest.mark.parametrize("layout,precision", [("sidecar", "match"), ("vllm-mlx", "bf16"), ("sidecar", "8")])
def test_plan_from_data_matches_the_recorded_run(layout, precision):
    config = tiny_config("qwen3_next")
    target_config = {**config, "quantization": {"group_size": 64, "bits": 4, "mode": "affine"}}
    options = AddOptions(source="/nowhere/qwen3_next", target="/nowhere/target", layout=layout, precision=precision)
    plan = make_plan(options, target=Path("/nowhere/target"), target_config=target_config, family="qwen3_next",
                     source=_source_head(config))
    recorded = GOLDEN[f"qwen3_next/q4/{layout}/precision={precision}"]
    got = plan.result().as_dict()
    assert {k: got[k] for k in ("layout", "family", "expert_format", "mtp_tensors", "mtp_bytes")} == \
        {k: v for k, v in recorded["report"].items() if k != "status"}
    assert sorted(Path(f).relative_to("/nowhere").as_posix() for f in plan.files) == recorded["files_written"]
    assert not Path("/nowhere").exists()


def test_plan_refuses_a_layout_the_family_has_not():
    config = tiny_config("qwen3_next")
    with pytest.raises(Exception, match="embedded layout does not apply"):
        make_plan(AddOptions(source="s", target="t", layout="embedded"), target=Path("/nowhere/t"),
                  target_config=config, family="qwen3_next", source=_source_head(config))


def test_one_plan_and_execute_for_every_output_format(synth, make_target, tmp_path: Path) -> None:
    """``plan_add_mtp`` reads headers only and returns the target's format's plan (an MLX folder:
    AddPlan; a llama.cpp trunk: GgufAddPlan); nothing is written until ``execute`` carries it out,
    and then the head is there."""
    from mtpforge.gguf.addmtp import GgufAddPlan
    from mtpforge.pipeline import AddPlan, execute, plan_add_mtp
    from mtpforge.results import AddResult
    from tests.checkers import folder_state
    from tests.support.synth.gguf_trunk import synthetic_trunk

    hf = synth.hf("qwen3_5")
    trunk = synthetic_trunk(hf, tmp_path / "gguf" / "Tiny-Qwen3_5-F32.gguf")
    folder = make_target("qwen3_5")
    for target, kind in ((trunk, GgufAddPlan), (folder, AddPlan)):
        parent = target.parent if target.is_file() else target
        before = folder_state(parent)
        plan = plan_add_mtp(AddOptions.parse(source=str(hf), target=str(target)), progress=False)
        assert isinstance(plan, kind) and folder_state(parent) == before
        r = execute(plan, progress=False)
        assert isinstance(r, AddResult)  # one result type for every output format
        report = r.as_dict()
        assert report["status"] == "written" and folder_state(parent) != before, report


#: the keys docs/CONTRACT.md promises for add-mtp, written and planned
CONTRACT_KEYS = {"target", "output", "layout", "family", "expert_format", "mtp_tensors", "mtp_bytes", "revision", "notes",
                 "fetched_bytes", "manifest", "status", "files_written", "precision"}
DRY_RUN_KEYS = {"dry_run", "files_to_write", "fetch_bytes", "fetch_tensors", "fetch_files", "fetch_requests",
                "peak_memory_estimate"}


def test_gguf_add_reports_as_the_mlx_one_does(synth, tmp_path: Path) -> None:
    """A GGUF head's report is the AddResult an MLX one is: the contract's keys, then the GGUF's
    own (architecture, precision, the command that runs it); planned, the dry run's facts."""
    from mtpforge.pipeline import add_mtp
    from tests.support.synth.gguf_trunk import synthetic_trunk

    hf = synth.hf("qwen3_5_moe")
    trunk = synthetic_trunk(hf, tmp_path / "gguf" / "Tiny-Qwen3_5-F32.gguf")
    planned = add_mtp(source=str(hf), target=str(trunk), dry_run=True, progress=False)
    assert CONTRACT_KEYS | DRY_RUN_KEYS <= set(planned) and planned["status"] == "planned" and planned["files_written"] == []
    assert planned["peak_memory_estimate"] > 0 and planned["fetch_bytes"] > 0 and planned["tensors"]
    written = add_mtp(source=str(hf), target=str(trunk), progress=False)
    assert CONTRACT_KEYS <= set(written) and not DRY_RUN_KEYS & set(written), written
    assert written["status"] == "written" and written["precision"] == "f16" and written["architecture"] == "qwen35moe"
    assert written["mtp_tensors"] == planned["mtp_tensors"] and written["fetch_mode"]


def test_gguf_add_takes_or_refuses_every_head_option(synth, tmp_path: Path) -> None:
    """--experts has no GGUF meaning: refused in one line; --keep-fc-full-precision keeps the
    fc F32 in a q8_0 head and says it has no effect on a float one — neither is dropped."""
    from mtpforge.errors import InputError
    from mtpforge.gguf.gguffile import read_local
    from mtpforge.pipeline import add_mtp
    from tests.support.synth.gguf_trunk import synthetic_trunk

    hf = synth.hf("qwen3_5_moe")
    trunk = synthetic_trunk(hf, tmp_path / "gguf" / "Tiny-Qwen3_5-F32.gguf")
    for experts in ("source", "switch_mlp"):
        with pytest.raises(InputError, match="--experts .* GGUF head's experts are stacked"):
            add_mtp(source=str(hf), target=str(trunk), experts=experts, dry_run=True, progress=False)
    kept = add_mtp(source=str(hf), target=str(trunk), precision="q8_0", keep_fc_full_precision=True, progress=False)
    plain = add_mtp(source=str(hf), target=str(trunk), precision="q8_0", output=str(tmp_path / "plain.gguf"), progress=False)
    types = {p: {n: t.type.name for n, t in read_local(r["output"]).tensors.items()} for p, r in (("kept", kept), ("plain", plain))}
    fc = next(n for n in types["kept"] if n.endswith("nextn.eh_proj.weight"))
    assert types["kept"][fc] == "F32" and types["plain"][fc] == "Q8_0"
    assert {n: t for n, t in types["kept"].items() if n != fc} == {n: t for n, t in types["plain"].items() if n != fc}
    noted = add_mtp(source=str(hf), target=str(trunk), keep_fc_full_precision=True, dry_run=True, progress=False)
    assert any("--keep-fc-full-precision has no effect with precision f16" in n for n in noted["notes"])


def test_a_large_gguf_head_at_the_default_precision_is_told_what_q8_0_would_write(synth, tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """A giant MoE head is 10-25 GB at the default f16: the plan (and so --dry-run) says what
    --precision q8_0 would write — the size the q8_0 plan has — and that it cost no drafts where
    measured; a precision the user chose, or a head under the line, gets no such note."""
    from mtpforge.cells import human_bytes
    from mtpforge.gguf import addmtp
    from mtpforge.gguf.addmtp import plan_gguf
    from tests.support.synth.gguf_trunk import synthetic_trunk

    hf = synth.hf("qwen3_5_moe")
    trunk = synthetic_trunk(hf, tmp_path / "gguf" / "Tiny-F32.gguf")

    def notes(**kw: object) -> list[str]:
        return plan_gguf(AddOptions.parse(source=str(hf), target=str(trunk), **kw), progress=False).report["notes"]

    assert notes() == []  # a tiny head is under the line
    monkeypatch.setattr(addmtp, "LARGE_HEAD", 1)
    q8 = plan_gguf(AddOptions.parse(source=str(hf), target=str(trunk), precision="q8_0"), progress=False)
    [note] = notes()
    assert "--precision q8_0" in note and f"about {human_bytes(q8.report['mtp_bytes'])}" in note, note
    assert notes(precision="f16") == [] and q8.report["notes"] == []


def test_a_large_mlx_head_at_the_default_bf16_is_told_what_the_targets_bits_would_write(
        synth, make_target, tmp_path: Path, monkeypatch) -> None:
    """Plain add-mtp writes MoE heads as bf16 beside a 4-bit target: a giant's is 20 GB or more,
    held in memory beside the model, so the plan says what the target's bits would write (the
    size the ``match`` plan has) and what that cost in drafts on the trained tiny head of the
    shape. The form it offers must load: DeepSeek-V3.2's plain ``--precision match`` head does in
    every runtime that drafts it (MTPLX: tests/test_mla_hybrid_trained.py), a Qwen MoE head at
    the model's bits loads in MTPLX and exo only in their own templates, so there the note names
    ``--runtime``. A precision the user chose, a runtime's own choice, or a head under the line
    gets no such note."""
    from mtpforge import pipeline
    from mtpforge.cells import human_bytes
    from mtpforge.headplan import measured_at
    from mtpforge.pipeline import plan_add_mtp
    from tests.support.synth import convert_to_mlx

    trained = Path(__file__).resolve().parent / "data" / "tiny-deepseek_v32-trained"
    cases = {"qwen3_5_moe": (synth.hf("qwen3_5_moe"), make_target("qwen3_5_moe"),
                             "--runtime exo or --runtime mtplx writes it, in the form that runtime loads,"),
             "deepseek_v32": (trained, convert_to_mlx(trained, tmp_path / "ds-4bit", q_bits=4, q_group_size=64,
                                                      dtype="float32"), "--precision match writes it")}
    for family, (hf, target, offer) in cases.items():
        def plan(**kw: object) -> pipeline.AddPlan:
            return plan_add_mtp(AddOptions.parse(source=str(hf), target=str(target), **kw), progress=False)

        monkeypatch.setattr(pipeline, "LARGE_HEAD", 2 << 30)
        assert not [n for n in plan().notes if "held in memory" in n]  # a tiny head is under the line
        monkeypatch.setattr(pipeline, "LARGE_HEAD", 1)
        default, matched = plan(), plan(precision="match")
        bits = default.head.default_q.bits
        [note] = [n for n in default.notes if "held in memory" in n]
        assert default.head.float_dtype == "bfloat16" and matched.head.mtp_bytes < default.head.mtp_bytes
        # the report says which, in --precision's words (match resolved to the target's bits)
        assert (default.result().as_dict()["precision"], matched.result().as_dict()["precision"]) == ("bf16", str(bits))
        assert f"the head is {human_bytes(default.head.mtp_bytes)} as bfloat16" in note, note
        assert f"{offer} at the target's {bits} bits in about {human_bytes(matched.head.mtp_bytes)}" in note, note
        assert measured_at(family, bits) in note, note
        for chosen in ({"precision": "bf16"}, {"runtime": "mtplx"}):
            assert not [n for n in plan(**chosen).notes if "held in memory" in n], (family, chosen)
