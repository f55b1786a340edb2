#!/usr/bin/env python3
"""Measure a non-Qwen family's MTP head with the real programs, on the tiny checkpoint the repo
builds for it (tests/support/synth/<family>.py). What it prints is recorded in
docs/families/<family>.md; the two families differ only in the rows of ``PROBES``.

Steps (each reported, none hidden when it fails):
 1. transformers' model class (llama.cpp's converter virtualenv has torch): its state dict
    against the checkpoint's trunk keys; which keys ``from_pretrained`` leaves out.
 2. llama.cpp's converter: ``--no-mtp``, ``--mtp`` and the default, f32; every tensor name and
    metadata key (gguf-py's reader); the head's norms compared with the source (raw or shifted).
 3. llama-server: the trunk alone, the trunk with ``-md <MTP-only file> --spec-type draft-mtp``,
    and the full file drafting from its own NextN tail (greedy).
 4. released mlx-lm: the source folder unquantized (greedy ids against llama.cpp's), and
    ``mlx_lm.convert -q`` (4-bit, group 64) loaded and generated; which keys survive.
 5. MTPLX 2.12.2 (its own venv): the 4-bit folder with the source head as ``mtp.safetensors``
    (source names), unquantized and 4-bit, and a float32 folder whose drafts are compared with
    llama.cpp's; ``mtplx.runtime.load(mtp=True)`` and greedy plain / MTP decoding.
 6. mlx-vlm 0.7.10 (its own venv): ``load_drafter`` on the source folder, and (where the family
    row says it decodes) speculative decoding against the 4-bit target.

    .venv/bin/python scripts/probe_family.py glm4_moe_lite [--variant distinct-copies] [--work DIR] [--json OUT]
    .venv/bin/python scripts/probe_family.py nemotron_h [--variant latent] [--markdown OUT]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support import family_probe as fp  # noqa: E402
from tests.support.synth.glm4_moe_lite import build_glm4_moe_lite, nextn_keys  # noqa: E402
from tests.support.synth.nemotron_h import build_nemotron_h, mtp_keys  # noqa: E402


@dataclass(frozen=True)
class Probe:
    """What differs between two families' probes: the rest of the run is the same."""

    title: str
    build: Callable[..., Path]
    #: the variant's name -> the builder's keyword arguments
    variants: dict[str, dict[str, Any]]
    head_prefix: Callable[[dict[str, Any]], str]
    head_keys: Callable[[dict[str, Any]], Any]
    #: llama.cpp's pre-tokenizer name for the converter
    pre: str
    #: (source key below the head prefix, llama.cpp name below ``blk.{n}.``) of the head's norms
    norms: tuple[tuple[str, str], ...]
    #: the router's key ending (kept unquantized in the sidecar, as mlx-lm keeps routers)
    router: str
    expert_names: dict[str, Any] = field(default_factory=dict)
    #: mlx-vlm has a drafter that decodes (not only loads) for this family
    vlm_decodes: bool = False


PROBES: dict[str, Probe] = {
    "glm4_moe_lite": Probe(
        "GLM-4.7-Flash (glm4_moe_lite)", build_glm4_moe_lite, {"distinct-copies": {"distinct_copies": True}},
        lambda cfg: f"model.layers.{cfg['num_hidden_layers']}.", nextn_keys, "glm4",
        (("enorm", "nextn.enorm"), ("hnorm", "nextn.hnorm"), ("shared_head.norm", "nextn.shared_head_norm"),
         ("input_layernorm", "attn_norm")),
        "mlp.gate.weight"),
    "nemotron_h": Probe(
        "Nemotron-H (nemotron_h)", build_nemotron_h, {"latent": {"moe_latent_size": 64}},
        lambda cfg: "mtp.", mtp_keys, "qwen35",
        (("layers.0.enorm", "nextn.enorm"), ("layers.0.hnorm", "nextn.hnorm"), ("layers.0.norm", "attn_norm"),
         ("layers.1.norm", "post_attention_norm"), ("layers.1.final_layernorm", "nextn.shared_head_norm")),
        "mixer.gate.weight", {"gate_up": False, "rename": ("backbone.", "model.")}, vlm_decodes=True),
}


def _head_sidecar(src: Path, dst_folder: Path, prefix: str, router: str, q_bits: int | None,
                  dtype: str | None = None) -> list[str]:
    """The source's head tensors (``prefix*``, names unchanged) as ``dst_folder/mtp.safetensors``;
    with ``q_bits`` every matrix but the router is quantized (group 64) the way mlx-lm stores a
    quantized Linear (weight, scales, biases)."""
    import mlx.core as mx

    idx = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    files = sorted({f for k, f in idx.items() if k.startswith(prefix)})
    head: dict[str, mx.array] = {}
    for f in files:
        head.update({k: v for k, v in mx.load(str(src / f)).items() if k.startswith(prefix)})
    if dtype:
        head = {k: v.astype(getattr(mx, dtype)) for k, v in head.items()}
    if q_bits:
        for k in list(head):
            v = head[k]
            if v.ndim == 2 and k.endswith(".weight") and not k.endswith(router) and "norm" not in k:
                w, s, b = mx.quantize(v, group_size=64, bits=q_bits)
                head[k] = w
                head[k[: -len("weight")] + "scales"] = s
                head[k[: -len("weight")] + "biases"] = b
    mx.save_safetensors(str(dst_folder / "mtp.safetensors"), head, metadata={"format": "mlx"})
    cfg = json.loads((dst_folder / "config.json").read_text())
    cfg["mlx_lm_extra_tensors"] = {"mtp_file": "mtp.safetensors", "mtp_tensor_count": len(head)}
    (dst_folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return sorted(head)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("family", choices=sorted(PROBES))
    ap.add_argument("--variant", default=None, help="distinct-copies (glm4_moe_lite: the NextN embed_tokens / "
                    "shared_head.head drawn apart from the trunk's), latent (nemotron_h: moe_latent_size=64)")
    ap.add_argument("--work", type=Path, default=None, help="keep the files here (default: a temporary folder)")
    ap.add_argument("--json", type=Path, default=None, help="write every measurement to this file")
    ap.add_argument("--markdown", type=Path, default=None, help="write the measured tables (Markdown) to this file")
    ap.add_argument("--skip", default="", help="comma-separated steps to skip: hf,gguf,server,mlx,mtplx,mlxvlm")
    a = ap.parse_args()
    p = PROBES[a.family]
    if a.variant is not None and a.variant not in p.variants:
        ap.error(f"{a.family} has the variants {', '.join(p.variants)}")
    skip = set(filter(None, a.skip.split(",")))
    work = a.work or Path(tempfile.mkdtemp(prefix=f"probe-{a.family}-"))
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {}
    src = p.build(work / (f"tiny-{a.family}" + (f"-{a.variant}" if a.variant else "")), **p.variants.get(a.variant or "", {}))
    res["variant"] = a.variant
    cfg = json.loads((src / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    prefix = p.head_prefix(cfg)
    res["source_head"] = fp.source_tensors(src, lambda k: k.startswith(prefix))
    res["source_head_keys"] = p.head_keys(cfg)

    if "hf" not in skip:
        hf = fp.hf_model_class_check(src)
        if hf.get("ok"):
            ours = fp.fused_expert_names({k for k in json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
                    if not k.startswith(prefix)})
            hf["trunk_keys_not_in_model_class"] = sorted(ours - set(hf["state_dict"]))
            hf["model_class_keys_not_in_trunk"] = sorted(set(hf["state_dict"]) - ours)
        res["hf"] = hf
        print("[hf]", {k: v for k, v in hf.items() if k != "state_dict"}, flush=True)

    files = {}
    if "gguf" not in skip:
        res["gguf"] = {}
        for mode in ("trunk", "mtp", "full"):
            c = fp.convert(src, work, mode, pre=p.pre)
            if c["rc"] == 0:
                c.update(fp.gguf_summary(Path(c["file"])))
                files[mode] = Path(c["file"])
            res["gguf"][mode] = c
            print(f"[gguf {mode}] rc={c['rc']} tensors={len(c.get('tensors', {}))}", c.get("error", "")[-500:], flush=True)
        if "mtp" in files:
            import mlx.core as mx
            import numpy as np

            srcw = {}
            for f in sorted(src.glob("model-*.safetensors")):
                srcw.update(mx.load(str(f)))
            norms = {}
            for hf_name, gg in p.norms:
                s = np.array(srcw[f"{prefix}{hf_name}.weight"].astype(mx.float32))
                g = fp.gguf_tensor(files["mtp"], f"blk.{n}.{gg}.weight")
                norms[hf_name] = {"max_abs_diff_raw": float(np.abs(g - s).max()),
                                  "max_abs_diff_plus1": float(np.abs(g - (s + 1)).max())}
            res["gguf"]["norms_vs_source"] = norms
            print("[gguf norms]", norms, flush=True)

    if "server" not in skip and "trunk" in files:
        sv = fp.llama_server_runs(files["trunk"], files.get("mtp"), files.get("full"))
        res["server"] = sv
        for k, v in sv.items():
            print(f"[server {k}]", {kk: vv for kk, vv in v.items() if kk not in ("tokens", "log")}, flush=True)

    if "mlx" not in skip:
        ref = fp.mlx_reference_tokens(src)
        res["mlx_reference"] = ref
        if "server" in res and res["server"]["plain"].get("ok"):
            ref["identical_to_llama_cpp_plain"] = ref["tokens"] == res["server"]["plain"]["tokens"]
        print("[mlx-lm source, unquantized] identical to llama.cpp plain:", ref.get("identical_to_llama_cpp_plain"), flush=True)
        conv = fp.mlx_convert_and_generate(src, work)
        conv["head_keys_left"] = sorted(k for k in conv.get("keys", {}) if k.startswith(prefix))
        res["mlx_convert"] = conv
        print("[mlx_lm.convert 4-bit]", {k: v for k, v in conv.items() if k != "keys"}, flush=True)

        if "mtplx" not in skip and conv.get("rc") == 0:
            cells = []
            for q in (None, 4):
                d = work / f"mtplx-{'bf16' if q is None else f'{q}bit'}-head"
                if d.exists():
                    shutil.rmtree(d)
                shutil.copytree(conv["folder"], d)
                _head_sidecar(src, d, prefix, p.router, q)
                cells.append({"id": d.name, "folder": str(d)})
            # float32 trunk and head: the head's drafts compared one by one with llama.cpp's (f32 GGUF)
            f32 = fp.mlx_convert_float32(src, work)
            if f32.get("rc") == 0 and "server" in res and res["server"].get("draft_mtp_file", {}).get("ok"):
                d = Path(f32["folder"])
                _head_sidecar(src, d, prefix, p.router, None, dtype="float32")
                cells.append({"id": "mtplx-f32", "folder": str(d), "head_preds": res["server"]["plain"]["tokens"]})
            spec = {"cells": cells, "max_tokens": 16, "prompts": ref["prompt_ids"]}
            mt = fp.run_in_runtime("mtplx-2.12.2", REPO / "tests" / "support" / "family_mtplx_driver.py", spec, work)
            res["mtplx"] = mt
            if "mtplx-f32" in mt and mt["mtplx-f32"].get("head_preds") is not None:
                mt["head_preds_vs_llama_cpp"] = fp.compare_drafts(res["server"]["draft_mtp_file"]["drafts"],
                                                                  mt["mtplx-f32"]["head_preds"])
                print("[mtplx f32 head vs llama.cpp drafts]", mt["head_preds_vs_llama_cpp"], flush=True)
            for k, v in mt.items():
                if isinstance(v, dict) and k != "head_preds_vs_llama_cpp":
                    print(f"[mtplx {k}]", {kk: vv for kk, vv in v.items() if kk not in ("plain", "mtp", "head_params", "trace", "head_preds")}, flush=True)
                elif k in ("ok", "error"):
                    print(f"[mtplx {k}]", v, flush=True)

    if "mlxvlm" not in skip:
        cell: dict[str, Any] = {"id": "source", "folder": str(src)}
        if p.vlm_decodes:
            cell.update(target=res.get("mlx_convert", {}).get("folder"), prompts=res.get("mlx_reference", {}).get("prompt_ids"),
                        max_tokens=16)
        spec = {"cells": [cell]}
        mv = fp.run_in_runtime("mlx-vlm-0.7.10", REPO / "tests" / "support" / "family_mlx_vlm_driver.py", spec, work)
        res["mlx_vlm"] = mv
        print("[mlx-vlm]", json.dumps(mv, default=str)[:3000], flush=True)

    if a.markdown:
        a.markdown.write_text(fp.render_markdown(res, p.title + (", latent MoE" if a.variant == "latent" else "")))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1, default=str))
    print("work folder:", work)


if __name__ == "__main__":
    main()
