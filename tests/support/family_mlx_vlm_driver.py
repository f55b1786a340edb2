"""Run inside mlx-vlm 0.7.10's own virtualenv: ``python family_mlx_vlm_driver.py SPEC_JSON OUT_JSON``.

For each folder in SPEC, what ``mlx_vlm.speculative.drafters.load_drafter`` (the loader behind
``mlx_vlm.generate --draft-model``) does with it: the splitter it picks for the folder's
``model_type``, the drafter keys it prepares (``prepare``: names and shapes after its rename and
transform), and whether it builds a drafter model. Failures are reported, not raised.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance" / "drivers"))


def run(entry: dict) -> dict:
    from mlx_vlm.speculative.drafters import load_drafter
    from mlx_vlm.speculative.drafters.mtp_split import get_mtp_splitter

    folder = Path(entry["folder"])
    out: dict = {"folder": str(folder)}
    config = json.loads((folder / "config.json").read_text())
    splitter = get_mtp_splitter(source_config=config)
    out["splitter"] = type(splitter).__name__ if splitter is not None else None
    if splitter is not None:
        try:
            draft_config, weights = splitter.prepare(folder, source_config=config)
            out["draft_model_type"] = draft_config.get("model_type")
            out["draft_keys"] = {k: [list(v.shape), str(v.dtype)] for k, v in sorted(weights.items())}
        except Exception as e:  # noqa: BLE001
            out["prepare_error"] = f"{type(e).__name__}: {e}"
    try:
        draft, kind = load_drafter(str(folder))
        out["loaded"] = {"class": type(draft).__name__, "kind": kind}
    except Exception as e:  # noqa: BLE001
        out["load_error"] = f"{type(e).__name__}: {e}"
        out["trace"] = traceback.format_exc()[-2000:]
        return out
    if entry.get("target"):
        decode(entry, draft, kind, out)
    return out


def _decode(model, processor, ids, n, **kw):
    import mlx.core as mx
    from mlx_vlm.generate import stream_generate

    return [int(r.token) for r in stream_generate(model, processor, "", input_ids=mx.array([ids]), max_tokens=n,
                                                  temperature=0.0, **kw)]


def decode(entry: dict, draft, kind: str, out: dict) -> None:
    """``mlx_vlm.load`` on the target and greedy ``stream_generate``, plain and with the drafter
    (as ``mlx_vlm.generate --draft-model`` drives it); the drafter's own accept/draft counts."""
    import standins
    from mlx_vlm import load

    stage = "target load"
    try:
        model, processor = load(entry["target"])
        standins.float32_expert_stacks(model)
        standins.float32_expert_stacks(draft)
        stage = "plain decode"
        out["plain"] = [_decode(model, processor, ids, entry["max_tokens"]) for ids in entry["prompts"]]
        stage = "mtp decode"
        mtp, drafted, accepted = [], 0, 0
        for ids in entry["prompts"]:
            mtp.append(_decode(model, processor, ids, entry["max_tokens"], draft_model=draft, draft_kind=kind))
            accepted += sum(getattr(draft, "accept_lens", []) or [])
            drafted += sum(getattr(draft, "draft_lens", []) or [])
        out.update(mtp=mtp, drafted=drafted, accepted=accepted, identical_to_plain=mtp == out["plain"])
    except Exception as e:  # noqa: BLE001
        out.update(decode_stage=stage, decode_error=f"{type(e).__name__}: {e}", decode_trace=traceback.format_exc()[-2500:])


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps({e["id"]: run(e) for e in spec["cells"]}, indent=1, default=str))


if __name__ == "__main__":
    main()
