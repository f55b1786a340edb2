"""Measure a tiny non-Qwen MTP checkpoint with the real programs: transformers' model class (in
llama.cpp's converter virtualenv, which has torch), llama.cpp's converter in its three modes,
llama-server with and without the MTP-only GGUF, and ``mlx_lm.convert`` + mlx-lm generation.

Used by scripts/probe_family.py; each step returns plain
data (JSON-able) so the scripts can print and save what was measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Sequence

from tests import gguf_env

REPO = Path(__file__).resolve().parents[2]

PROMPTS = ("The cat sees the red ball in the garden.", "Count: 3, 4, 5, 6,", "12 + 30 = 42. 12 times 2 is")


def hf_model_class_check(folder: Path) -> dict[str, Any]:
    """transformers' own model class (converter venv, torch on the meta device): its state-dict
    names and shapes, which of the folder's keys ``from_pretrained`` calls missing/unexpected, and
    that a forward pass runs."""
    code = textwrap.dedent("""
        import json, sys, torch
        from safetensors import safe_open
        from transformers import AutoConfig, AutoModelForCausalLM
        d = sys.argv[1]
        cfg = AutoConfig.from_pretrained(d)
        with torch.device("meta"):
            m = AutoModelForCausalLM.from_config(cfg)
        sd = {k: list(v.shape) for k, v in m.state_dict().items()}
        m2, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, dtype=torch.float32)
        out = m2(torch.tensor([[5, 9, 13, 40, 80]]))
        print(json.dumps({"class": type(m).__name__, "state_dict": sd,
                          "missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
                          "mismatched": [list(map(str, x)) for x in info["mismatched_keys"]],
                          "logits_shape": list(out.logits.shape), "finite": bool(torch.isfinite(out.logits).all())}))
    """)
    r = subprocess.run([str(gguf_env.TOOLS_PY), "-c", code, str(folder)], capture_output=True, text=True,
                       env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    if r.returncode != 0:
        return {"ok": False, "error": r.stderr[-3000:]}
    return {"ok": True, **json.loads(r.stdout.strip().splitlines()[-1])}


def fused_expert_names(keys: Any, gate_up: bool = True, rename: tuple[str, str] | None = None) -> set[str]:
    """Per-expert source names folded to transformers 5's fused parameters, which its loader does
    on the fly: with ``gate_up`` (SwiGLU experts) ``experts.{e}.gate_proj/up_proj.weight`` ->
    ``experts.gate_up_proj``; without (ReLU² experts) ``experts.{e}.up_proj.weight`` ->
    ``experts.up_proj``; ``down_proj`` -> ``experts.down_proj``. ``rename`` replaces a leading
    prefix (Nemotron-H: ``backbone.`` is ``model.`` in transformers 5)."""
    import re

    out = set()
    for k in keys:
        if rename and k.startswith(rename[0]):
            k = rename[1] + k[len(rename[0]):]
        m = re.match(r"(.*\.experts)\.\d+\.(gate_proj|up_proj|down_proj)\.weight$", k)
        if m:
            k = f"{m.group(1)}.{'gate_up_proj' if gate_up and m.group(2) != 'down_proj' else m.group(2)}"
        out.add(k)
    return out


def convert(folder: Path, out_dir: Path, mode: str, pre: str, outtype: str = "f32",
            raw_config: bool = False) -> dict[str, Any]:
    """llama.cpp's converter: ``trunk`` (--no-mtp), ``mtp`` (--mtp) or ``full`` (default);
    ``raw_config``: config.json read as stored (scripts/convert_official_gguf.py --raw-config)."""
    flag = {"trunk": ["--no-mtp"], "mtp": ["--mtp"], "full": []}[mode]
    out = out_dir / f"{folder.name}-{mode}-{outtype}.gguf"
    rc, log = gguf_env.convert(folder, out, outtype, flag, pre=pre, raw_config=raw_config)
    res: dict[str, Any] = {"mode": mode, "flag": " ".join(flag) or "(default)", "rc": rc, "file": str(out)}
    if rc != 0:
        res["error"] = log[-3000:]
    return res


def gguf_summary(path: Path) -> dict[str, Any]:
    """Tensor names, shapes (ggml order) and types, and every metadata key but the vocabulary."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    kv: dict[str, Any] = {}
    for k, f in r.fields.items():
        if k in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.scores",
                 "tokenizer.chat_template"):
            kv[k] = f"[{len(f.data)} items]"
            continue
        try:
            v = f.contents()
        except Exception:  # noqa: BLE001 - a field gguf-py cannot decode is reported as such
            v = "?"
        kv[k] = v
    tensors = {t.name: {"shape": [int(x) for x in t.shape], "type": t.tensor_type.name} for t in r.tensors}
    return {"kv": kv, "tensors": tensors}


def gguf_tensor(path: Path, name: str) -> Any:
    from gguf import GGUFReader

    import numpy as np

    for t in GGUFReader(str(path)).tensors:
        if t.name == name:
            return np.array(t.data, dtype=np.float32)
    raise KeyError(name)


_DRAFT_RE = None


def _drafts_in(text: str) -> list[int]:
    """The drafted token ids llama.cpp logs at ``-v`` (``draft candidate   0``: the head's top
    candidate, which draft-mtp proposes)."""
    import re

    global _DRAFT_RE
    _DRAFT_RE = _DRAFT_RE or re.compile(r"draft candidate\s+0, pos\s+\d+:\s+(-?\d+)")
    return [int(m.group(1)) for m in _DRAFT_RE.finditer(text)]


def llama_server_runs(trunk: Path, mtp_file: Path | None, full: Path | None, n_predict: int = 16,
                      prompts: Sequence[str] = PROMPTS) -> dict[str, Any]:
    """Greedy completions: the trunk alone, the trunk with ``-md <MTP-only file> --spec-type
    draft-mtp``, and (``full``) the full GGUF drafting from its own NextN tail. With a head,
    llama-server runs at ``-v`` and the tokens it drafted are read from its log."""
    from mtpforge.gguf.server import RefusedError, llama_server

    gguf_env.need("server")
    out: dict[str, Any] = {}
    runs: list[tuple[str, Path, Path | None, bool]] = [("plain", trunk, None, False)]
    if mtp_file is not None:
        runs.append(("draft_mtp_file", trunk, mtp_file, True))
    if full is not None:
        runs.append(("full_plain", full, None, False))
        runs.append(("full_own_tail", full, None, True))
    for name, model, draft, mtp in runs:
        try:
            extra = ["-v"] if (mtp or draft is not None) else []
            with llama_server(gguf_env.BIN / "llama-server", model, draft=draft, mtp=mtp, threads=1, ctx=512,
                              extra=extra) as srv:
                comps, drafts = [], []
                for p in prompts:
                    before = srv.log.stat().st_size
                    comps.append(srv.complete(p, n_predict))
                    time.sleep(0.5)  # the log is written after the reply
                    with open(srv.log, "rb") as f:
                        f.seek(before)
                        drafts.append(_drafts_in(f.read().decode("utf-8", "replace")))
                log_text = srv.log.read_text(errors="replace")
            out[name] = {"ok": True, "tokens": [c.tokens for c in comps], "drafted": sum(c.drafted for c in comps),
                         "accepted": sum(c.accepted for c in comps)}
            if extra:
                out[name]["drafts"] = drafts
                out[name]["log"] = [ln for ln in log_text.splitlines()
                                    if ("mtp" in ln.lower() or "draft acceptance" in ln) and "candidate" not in ln][:12]
        except RefusedError as e:
            out[name] = {"ok": False, "error": str(e)[-3000:]}
    plain = out["plain"].get("tokens")
    for name in list(out):
        if name != "plain" and out[name].get("ok"):
            out[name]["identical_to_plain"] = out[name]["tokens"] == plain
    return out


def mlx_convert_and_generate(folder: Path, out_dir: Path, q_bits: int = 4, q_group: int = 64,
                             prompt: str = PROMPTS[0], max_tokens: int = 12) -> dict[str, Any]:
    """The real ``mlx_lm.convert -q`` (a subprocess, as a user runs it), then mlx-lm's ``load`` and
    greedy ``generate`` on the result. Reports the files and every key left in them."""
    import shutil

    dst = out_dir / f"{folder.name}-mlx-{q_bits}bit"
    if dst.exists():
        shutil.rmtree(dst)
    r = subprocess.run([sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(folder), "--mlx-path", str(dst), "-q",
                        "--q-bits", str(q_bits), "--q-group-size", str(q_group)], capture_output=True, text=True)
    res: dict[str, Any] = {"rc": r.returncode, "folder": str(dst)}
    if r.returncode != 0:
        res["error"] = (r.stdout + r.stderr)[-3000:]
        return res
    import mlx.core as mx
    from mlx_lm import load

    keys: dict[str, list[int]] = {}
    for f in sorted(dst.glob("*.safetensors")):
        for k, v in mx.load(str(f)).items():
            keys[k] = list(v.shape)
    res["files"] = sorted(p.name for p in dst.iterdir())
    res["keys"] = keys
    res["quantization"] = json.loads((dst / "config.json").read_text()).get("quantization")
    from mlx_lm.generate import generate_step

    model, tok = load(str(dst))
    ids = tok.encode(prompt)
    toks = [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens)]
    res["generated_tokens"] = toks
    res["generated"] = tok.decode(toks)
    return res


RUNTIMES = gguf_env.CACHE / "runtimes"


def mlx_convert_float32(folder: Path, out_dir: Path) -> dict[str, Any]:
    """``mlx_lm.convert --dtype float32`` (no quantization): the MLX form closest to llama.cpp's
    f32 GGUF, for comparing a head's drafts token by token."""
    import shutil

    dst = out_dir / f"{folder.name}-mlx-f32"
    if dst.exists():
        shutil.rmtree(dst)
    r = subprocess.run([sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(folder), "--mlx-path", str(dst),
                        "--dtype", "float32"], capture_output=True, text=True)
    return {"rc": r.returncode, "folder": str(dst), **({"error": (r.stdout + r.stderr)[-3000:]} if r.returncode else {})}


def compare_drafts(llama_drafts: list[list[int]], mlx_preds: list[dict[str, list]]) -> dict[str, Any]:
    """llama.cpp's drafted tokens (one per step) against the MLX head's predictions for the same
    pairs, aligned from the first pair; counts equal positions and lists the MLX margin (top-1
    minus top-2 logit) where they differ, next to the median margin (a near-tie shows as a tiny
    margin)."""
    import statistics

    same = total = 0
    per_prompt, differ, all_margins = [], [], []
    for i, (d, p) in enumerate(zip(llama_drafts, mlx_preds)):
        k = min(len(d), len(p["preds"]))
        eq = 0
        for j in range(k):
            all_margins.append(p["margins"][j])
            if d[j] == p["preds"][j]:
                eq += 1
            else:
                differ.append({"prompt": i, "step": j, "llama.cpp": d[j], "mlx": p["preds"][j], "mlx_margin": p["margins"][j]})
        per_prompt.append(f"{eq}/{k}")
        same += eq
        total += k
    out = {"equal": same, "compared": total, "per_prompt": per_prompt, "differ": differ,
           "median_margin": statistics.median(all_margins) if all_margins else None}
    if all("preds_no_prompt_prefill" in p for p in mlx_preds):
        out["equal_if_head_not_prefilled"] = sum(
            int(a == b) for d, p in zip(llama_drafts, mlx_preds) for a, b in zip(d, p["preds_no_prompt_prefill"]))
    for key, name in (("preds_llama_history", "equal_with_llama_cpp_history"),
                      ("preds_zero_first_pair", "equal_with_zero_hidden_first_pair"),
                      ("preds_zero_first_pair_layernorm", "equal_with_zero_hidden_first_pair_and_layernorm"),
                      ("preds_stale_first_pair", "equal_with_carried_first_pair"),
                      ("preds_stale_first_pair_layernorm", "equal_with_carried_first_pair_and_layernorm"),
                      ("preds_llama_history_layernorm", "equal_with_llama_cpp_history_and_layernorm")):
        if all(key in p for p in mlx_preds):
            out[name] = sum(int(a == b) for d, p in zip(llama_drafts, mlx_preds) for a, b in zip(d, p[key]))
    if all("preds_final_layernorm" in p for p in mlx_preds):
        out["equal_if_final_norm_is_layernorm"] = sum(
            int(a == b) for d, p in zip(llama_drafts, mlx_preds) for a, b in zip(d, p["preds_final_layernorm"]))
    return out


def runtime_python(name: str) -> Path:
    return RUNTIMES / name / "bin" / "python"


def mlx_reference_tokens(folder: Path, prompts: Sequence[str] = PROMPTS, max_tokens: int = 16) -> dict[str, Any]:
    """Greedy token ids from released mlx-lm on ``folder`` (an HF source folder loads unquantized:
    mlx-lm's sanitize drops the head), prompt tokenized by the folder's own tokenizer."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tok = load(str(folder))
    model.set_dtype(mx.float32)  # as llama.cpp's f32 GGUF; MLX's CPU gather_mm is float32-only anyway
    out: dict[str, Any] = {"prompt_ids": [], "tokens": []}
    for p in prompts:
        ids = tok.encode(p)
        out["prompt_ids"].append(ids)
        toks = []
        for t, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens):
            toks.append(int(t))
        out["tokens"].append(toks)
    return out


def run_in_runtime(runtime: str, script: Path, spec: dict[str, Any], work: Path, timeout: float = 900) -> dict[str, Any]:
    """``script SPEC OUT`` with a runtime's own interpreter; returns OUT's JSON (or the failure)."""
    py = runtime_python(runtime)
    if not py.is_file():
        return {"ok": False, "error": f"{runtime} is not installed under {RUNTIMES}"}
    spec_f, out_f = work / f"{runtime}-spec.json", work / f"{runtime}-out.json"
    spec_f.write_text(json.dumps(spec))
    out_f.unlink(missing_ok=True)
    r = subprocess.run([str(py), str(script), str(spec_f), str(out_f)], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"})
    if not out_f.is_file():
        return {"ok": False, "rc": r.returncode, "error": (r.stdout + r.stderr)[-4000:]}
    return {"ok": True, "rc": r.returncode, **json.loads(out_f.read_text())}


def source_tensors(folder: Path, keep: Any) -> dict[str, list]:
    """name -> [shape, dtype] for the source tensors whose name passes ``keep``."""
    import mlx.core as mx

    out: dict[str, list] = {}
    for f in sorted(folder.glob("model*.safetensors")):
        for k, v in mx.load(str(f)).items():
            if keep(k):
                out[k] = [list(v.shape), str(v.dtype).replace("mlx.core.", "")]
    return out


def _table(rows: list[list[Any]], head: list[str]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(res: dict[str, Any], title: str) -> str:
    """What a probe measured, as the Markdown the family's doc quotes (generated, not edited)."""
    out = [f"## {title}: measured (generated by the probe script)", ""]
    if "source_head" in res:
        out += ["### The head in the tiny source checkpoint", "",
                _table([[f"`{k}`", v[0], v[1]] for k, v in sorted(res["source_head"].items())], ["tensor", "shape", "dtype"]), ""]
    hf = res.get("hf")
    if hf:
        out += ["### transformers' model class", ""]
        if hf.get("ok"):
            out += [f"`{hf['class']}` built from the config: its state dict equals the trunk's keys (experts fused): "
                    f"{not hf['trunk_keys_not_in_model_class'] and not hf['model_class_keys_not_in_trunk']}; "
                    f"`from_pretrained` missing: {hf['missing'] or 'none'}; unexpected: "
                    f"{len(hf['unexpected'])} ({'the head' if hf['unexpected'] else 'none: ignored by the class'}); "
                    f"forward pass finite: {hf['finite']}.", ""]
        else:
            out += ["failed: " + hf.get("error", "")[-800:], ""]
    g = res.get("gguf")
    if g:
        out += ["### llama.cpp's converter (f32)", ""]
        rows = []
        for mode in ("trunk", "mtp", "full"):
            c = g.get(mode, {})
            if c.get("rc") != 0:
                rows.append([mode, c.get("flag"), "failed", c.get("error", "")[-200:]])
                continue
            arch = c["kv"].get("general.architecture")
            rows.append([mode, f"`{c['flag']}`", len(c["tensors"]),
                         f"arch `{arch}`, `{arch}.block_count` = {c['kv'].get(f'{arch}.block_count')}, "
                         f"`{arch}.nextn_predict_layers` = {c['kv'].get(f'{arch}.nextn_predict_layers', '(absent)')}"])
        out += [_table(rows, ["mode", "flag", "tensors", "metadata"]), ""]
        m, t = g.get("mtp", {}), g.get("trunk", {})
        if m.get("tensors"):
            out += ["MTP-only file (`--mtp`), every tensor (ggml order of dimensions):", "",
                    _table([[f"`{k}`", v["shape"], v["type"]] for k, v in m["tensors"].items()], ["tensor", "shape", "type"]), ""]
            kv_rows = [[f"`{k}`", v] for k, v in m["kv"].items() if not k.startswith("tokenizer.") and not k.startswith("GGUF.")]
            out += ["Its metadata (tokenizer keys left out; they equal the trunk's):", "", _table(kv_rows, ["key", "value"]), ""]
            if t.get("kv"):
                only_m = sorted(set(m["kv"]) - set(t["kv"]))
                only_t = sorted(set(t["kv"]) - set(m["kv"]))
                diff = sorted(k for k in set(m["kv"]) & set(t["kv"]) if m["kv"][k] != t["kv"][k] and not k.startswith("GGUF."))
                out += [f"Against the `--no-mtp` trunk: keys only in the MTP file {only_m or 'none'}; only in the trunk "
                        f"{only_t or 'none'}; different values {diff or 'none'}.", ""]
            full = g.get("full", {})
            if full.get("tensors"):
                extra = sorted(set(full["tensors"]) - set(t.get("tensors", {})))
                out += [f"The default (full) file is the trunk plus {len(extra)} tensors, exactly the MTP file's own "
                        f"block: {sorted(set(m['tensors']) - set(t.get('tensors', {}))) == extra}.", ""]
        if "norms_vs_source" in g:
            out += ["Head norms in the MTP file against the source (max |difference|): " + "; ".join(
                f"`{k}` raw {v['max_abs_diff_raw']:.3g} / +1 {v['max_abs_diff_plus1']:.3g}" for k, v in g["norms_vs_source"].items()), ""]
    sv = res.get("server")
    if sv:
        out += ["### llama-server (greedy, 3 prompts x 16 tokens, `--spec-draft-n-max 1`)", ""]
        out += [_table([[k, v.get("ok"), v.get("drafted"), v.get("accepted"), v.get("identical_to_plain", "-"),
                         (v.get("error", "") or "")[-150:]] for k, v in sv.items()],
                       ["run", "served", "drafted", "accepted", "output = plain", "error"]), ""]
    ref = res.get("mlx_reference")
    if ref:
        out += ["### mlx-lm (released)", "", f"Source folder loaded unquantized (float32): greedy ids identical to "
                f"llama.cpp's f32 trunk: {ref.get('identical_to_llama_cpp_plain')}.", ""]
    conv = res.get("mlx_convert")
    if conv:
        if conv.get("rc") == 0:
            out += [f"`mlx_lm.convert -q --q-bits 4 --q-group-size 64`: files {conv['files']}; quantization "
                    f"{conv['quantization']}; head keys left: {conv['head_keys_left'] or 'none (dropped by sanitize)'}; "
                    f"{len(conv['keys'])} tensors; loads and generates: {len(conv.get('generated_tokens') or [])} tokens.", ""]
        else:
            out += ["`mlx_lm.convert` failed: " + conv.get("error", "")[-500:], ""]
    mt = res.get("mtplx")
    if mt:
        out += ["### MTPLX 2.12.2 (its own venv, CPU MLX, libSystem stand-in)", ""]
        if not mt.get("ok"):
            out += ["failed: " + str(mt.get("error"))[-800:], ""]
        else:
            rows = []
            for k, v in mt.items():
                if isinstance(v, dict) and "folder" in v:
                    rows.append([k, v.get("mtp_enabled"), v.get("drafted"), v.get("accepted"), v.get("identical_to_plain"),
                                 (v.get("stage", "") + " " + v.get("error", "")).strip()[-200:]])
            out += [_table(rows, ["folder", "head loaded", "drafted", "accepted", "output = plain", "error"]), ""]
            hp = next((v.get("head_params") for k, v in mt.items() if isinstance(v, dict) and "4bit" in k and v.get("head_params")), None)
            if hp:
                out += ["The head as MTPLX builds it from the 4-bit sidecar (`model.mtp` parameters):", "",
                        _table([[f"`{k}`", v[0], v[1].replace("mlx.core.", "")] for k, v in sorted(hp.items())], ["parameter", "shape", "dtype"]), ""]
            cmp_ = mt.get("head_preds_vs_llama_cpp")
            if cmp_:
                variants = {
                    "equal_if_head_not_prefilled": "the head not prefilled over the prompt",
                    "equal_with_zero_hidden_first_pair": "llama.cpp's extra first pair (first prompt token, zero hidden)",
                    "equal_if_final_norm_is_layernorm": "the final norm applied as LayerNorm",
                    "equal_with_zero_hidden_first_pair_and_layernorm": "the zero first pair and the LayerNorm",
                    "equal_with_carried_first_pair": "llama.cpp's first pair as it runs: zero hidden on the server's first "
                                                     "request, then the previous request's last pending hidden",
                    "equal_with_carried_first_pair_and_layernorm": "that carried first pair and the LayerNorm",
                    "equal_with_llama_cpp_history": "the emulated history with repeated and rejected pairs",
                    "equal_with_llama_cpp_history_and_layernorm": "that history and the LayerNorm",
                }
                out += [f"Drafts, token by token: MTPLX's head (float32 folder) against llama-server's (f32 MTP-only file): "
                        f"{cmp_['equal']}/{cmp_['compared']} equal ({', '.join(cmp_['per_prompt'])}); where they differ the MLX "
                        f"margins are {[d['mlx_margin'] for d in cmp_['differ']]} (median margin {cmp_['median_margin']:.3g}).", "",
                        "The same MLX head under other assumptions about what llama.cpp computes (equal drafts out of "
                        f"{cmp_['compared']}):", "",
                        _table([[text, cmp_[key]] for key, text in variants.items() if key in cmp_], ["MLX variant", "equal"]), ""]
    mv = res.get("mlx_vlm")
    if mv:
        out += ["### mlx-vlm 0.7.10 (its own venv)", ""]
        src = mv.get("source", {}) if mv.get("ok") else {}
        if not src:
            out += ["failed: " + str(mv.get("error"))[-800:], ""]
        else:
            out += [f"`get_mtp_splitter` → `{src.get('splitter')}` (drafter `model_type` `{src.get('draft_model_type')}`); "
                    f"`load_drafter(source)`: " + (f"`{src['loaded']['class']}`, kind `{src['loaded']['kind']}`" if src.get("loaded")
                                                   else f"fails: `{src.get('load_error')}`") + ".", ""]
            if src.get("draft_keys"):
                out += ["Drafter keys it prepares from the source:", "",
                        _table([[f"`{k}`", v[0], v[1].replace("mlx.core.", "")] for k, v in src["draft_keys"].items()], ["key", "shape", "dtype"]), ""]
            if "plain" in src or "decode_error" in src:
                out += [f"Decoding against the 4-bit target: drafted {src.get('drafted')}, accepted {src.get('accepted')}, output = plain: "
                        f"{src.get('identical_to_plain')} {src.get('decode_error', '')}", ""]
    return "\n".join(out) + "\n"
