"""Self-check of an exported tiny model: what the demo and the tests will do to it, measured.

The bundled model is only useful if it survives the real journey: ``mlx_lm.load`` of the HF folder
(which shifts the norms back) must decode as the trained model did, and ``mlx_lm.convert`` (which
drops the head) followed by ``add_mtp`` must give a head that still drafts well on the converted
backbone, in bf16 and after 4-bit group-64 quantization. This measures exactly that, with mlx-lm's
loader, mtpforge's own head reader (``layouts.read``) and ``decoder.head.build_head``.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import mlx.core as mx
import mlx.nn as nn

from mtpforge.decoder.head import MTPHead, build_head
from mtpforge.community import convert_to_mlx
from .train import draft_acceptance, greedy


def load_backbone(folder: str | Path) -> nn.Module:
    """mlx-lm's model for ``folder``, computing in float32 as a CPU decoder does (docs/SPEC.md §4)."""
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(folder))
    model.set_dtype(mx.float32)
    model.eval()
    return model


def load_head(target: str | Path, model: nn.Module) -> MTPHead:
    """The head ``add_mtp`` wrote into ``target``, read back by mtpforge's canonical reader."""
    from mtpforge.layouts.read import load_head_weights

    hw = load_head_weights(target)
    return build_head(hw.family, model.language_model.args, hw.tensors, hw.quant)


def max_weight_diff(a: nn.Module, b: nn.Module) -> float:
    """Largest per-tensor difference relative to the tensor's largest value. bf16 keeps 8
    significant bits, so a faithful round trip stays under 2^-8; any layout or norm mistake
    (a missing shift, a transposed conv, swapped gate/up halves) is far above it."""
    from mlx.utils import tree_flatten

    pa, pb = dict(tree_flatten(a.parameters())), dict(tree_flatten(b.parameters()))
    if set(pa) != set(pb):
        raise RuntimeError(f"parameters differ: {sorted(set(pa) ^ set(pb))[:5]}")
    return max(float(mx.abs(pa[k] - pb[k]).max() / mx.maximum(mx.abs(pa[k]).max(), 1e-6)) for k in pa)


def greedy_identity(
    trained: nn.Module, loaded: nn.Module, prompts: Sequence[Sequence[int]], n_new: int = 48
) -> dict[str, Any]:
    """How many greedy continuations of the reloaded folder equal the trained model's, and the
    share of equal tokens up to the first difference (bf16 rounding of weights may flip a close
    argmax; a wrong norm or layout flips nearly all of them)."""
    same = 0
    agree = total = 0
    for p in prompts:
        a, b = greedy(trained, p, n_new), greedy(loaded, p, n_new)
        same += a == b
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        agree += n
        total += len(a)
    worst = max_weight_diff(trained, loaded)
    seq = mx.array([list(prompts[0])])
    la, lb = trained(seq), loaded(seq)
    rel = float(mx.abs(la - lb).max() / mx.abs(la).max())
    return {"prompts": len(prompts), "identical": same, "prefix_agreement": round(agree / max(total, 1), 4),
            "max_logit_diff_relative": round(rel, 5), "max_weight_diff_relative": round(worst, 5)}


def converted_acceptance(
    source: str | Path,
    prompts: Sequence[Sequence[int]],
    *,
    q_bits: int | None,
    trained_head: MTPHead | None = None,
    workdir: str | Path | None = None,
    n_new: int = 48,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``mlx_lm.convert`` (``q_bits`` None = bf16) -> ``add_mtp --precision bf16`` -> acceptance
    at depth 1 with post- and pre-norm hidden states."""
    from mtpforge.pipeline import add_mtp

    with tempfile.TemporaryDirectory(prefix="mtpforge-tiny-check-", dir=workdir) as tmp:
        target = Path(tmp) / ("target-bf16" if q_bits is None else f"target-{q_bits}bit")
        convert_to_mlx(source, target, q_bits=q_bits, q_group_size=64)
        with contextlib.redirect_stdout(io.StringIO()):
            res = add_mtp(source=str(source), target=str(target), precision="bf16", progress=False)
        if res.get("status") != "written":
            raise RuntimeError(f"add_mtp did not write the head: {res}")
        model = load_backbone(target)
        head = load_head(target, model)
        out: dict[str, Any] = {"backbone": "bf16" if q_bits is None else f"{q_bits}-bit group 64", "head": "bf16",
                               "layout": res.get("layout")}
        if trained_head is not None and q_bits is None:
            out["head_max_weight_diff_relative"] = round(max_weight_diff(trained_head, head), 5)
            if out["head_max_weight_diff_relative"] > 2**-7:
                raise RuntimeError(f"the head read back after add_mtp differs from the trained head: {out}")
        for hidden in ("post", "pre"):
            out[hidden] = draft_acceptance(model, head, prompts, n_new=n_new, hidden=hidden)
        out["verify"] = run_verify(target)
        if log:
            log(f"  {out['backbone']} backbone: acceptance post {out['post']['acceptance']:.3f}, pre {out['pre']['acceptance']:.3f}")
        return out


def run_verify(target: Path) -> dict[str, Any]:
    """The product's own ``verify --generate`` on the same target, when it is available: the
    speculative loop itself, with its default prompts. Recorded, never fatal here (the decoder
    is developed separately; this check is about the model)."""
    try:
        from mtpforge.verify import verify
    except ImportError as exc:
        return {"error": f"verify unavailable: {exc}"}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            res = verify(str(target), generate=True, hidden="auto", progress=False)
    except Exception as exc:  # noqa: BLE001 - recorded for the report, not raised
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {k: res.get(k) for k in ("identical", "acceptance", "hidden", "hidden_variants", "drafted", "accepted")}


def source_head(folder: str | Path, model: nn.Module) -> MTPHead:
    """The reference head: float32, straight from the HF folder's tensors (norms shifted by
    provenance), independent of add_mtp."""
    return load_head(folder, model)


def _swap_gate_up(p: dict[str, mx.array]) -> dict[str, mx.array]:
    """What a converter that splits a fused ``gate_up_proj`` the wrong way round produces (for
    the dense head: gate_proj and up_proj exchanged)."""
    fused = any(".switch_mlp." in k for k in p)
    out = dict(p)
    for k in p:
        if "gate_proj" in k and ("switch_mlp" in k or not fused) and "shared_expert" not in k:
            u = k.replace("gate_proj", "up_proj")
            out[k], out[u] = p[u], p[k]
    return out


def _swap_concat(p: dict[str, mx.array]) -> dict[str, mx.array]:
    w = p["fc.weight"]
    h = w.shape[1] // 2
    return {**p, "fc.weight": mx.concatenate([w[:, h:], w[:, :h]], axis=1)}


def _permute_experts(p: dict[str, mx.array]) -> dict[str, mx.array]:
    n = next(v.shape[0] for k, v in p.items() if ".switch_mlp." in k)
    perm = mx.array([(i + 1) % n for i in range(n)])
    return {k: v[perm] if ".switch_mlp." in k else v for k, v in p.items()}


def mutation_acceptance(
    folder: str | Path, prompts: Sequence[Sequence[int]], *, n_new: int = 48, log: Callable[[str], None] | None = None
) -> dict[str, float]:
    """Acceptance of the source head (float32, on mlx-lm's load of the source) with each known
    conversion bug put in on purpose: the figures the mutation tests of issue 4 stand on."""
    from mlx.utils import tree_flatten

    from mtpforge.families.tables import is_norm_key

    model = load_backbone(folder)
    base = dict(tree_flatten(source_head(folder, model).parameters()))
    mutations: dict[str, Callable[[dict[str, mx.array]], dict[str, mx.array]]] = {
        "correct": lambda p: p,
        "norms_not_shifted": lambda p: {k: v - 1.0 if is_norm_key(k) else v for k, v in p.items()},
        "norms_double_shifted": lambda p: {k: v + 1.0 if is_norm_key(k) else v for k, v in p.items()},
        "concat_order_swapped": _swap_concat,
        "gate_up_swapped": _swap_gate_up,
    }
    if any(".switch_mlp." in k for k in base):
        mutations["experts_rotated_by_one"] = _permute_experts
    out: dict[str, float] = {}
    for name, fn in mutations.items():
        head = source_head(folder, model)
        head.load_weights(list(fn(dict(base)).items()))
        out[name] = draft_acceptance(model, head, prompts, n_new=n_new)["acceptance"]
    if log:
        log("  mutations (post-norm acceptance): " + ", ".join(f"{k} {v:.1%}" for k, v in out.items()))
    return out


def check_reload(
    folder: str | Path,
    trained: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    n_new: int = 48,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``mlx_lm`` loads the export as the trained model; raises on a weight mismatch."""
    loaded = load_backbone(folder)
    ident = greedy_identity(trained, loaded, prompts, n_new)
    if log:
        log(f"  mlx_lm.load of the export: {ident['identical']}/{ident['prompts']} greedy continuations identical, "
            f"prefix agreement {ident['prefix_agreement']:.3f}, max logit difference {ident['max_logit_diff_relative']:.2%}, "
            f"max weight difference {ident['max_weight_diff_relative']:.2%} (bf16 rounding)")
    if ident["max_weight_diff_relative"] > 2**-7:
        raise RuntimeError(f"the exported folder does not decode like the trained model: {ident}")
    return ident


def check_converted(
    folder: str | Path,
    prompts: Sequence[Sequence[int]],
    *,
    trained_head: MTPHead | None = None,
    n_new: int = 48,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Acceptance after ``mlx_lm.convert`` (bf16 and 4-bit g64) + ``add_mtp --precision bf16``.
    Without ``trained_head`` the bf16 head read back is compared with the source's own tensors."""
    if trained_head is None:
        trained_head = source_head(folder, load_backbone(folder))
    return {
        "bf16": converted_acceptance(folder, prompts, q_bits=None, trained_head=trained_head, n_new=n_new, log=log),
        "4bit": converted_acceptance(folder, prompts, q_bits=4, n_new=n_new, log=log),
    }
