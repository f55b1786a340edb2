"""Train the bundled tiny Qwen3.5-architecture models and their MTP heads, on the CPU, in minutes.

Acceptance rates only mean something on a model whose next tokens are predictable and whose head
learned to predict them: random weights accept almost nothing and prove little. So this trains,
with mlx and mlx-lm's own ``qwen3_5`` / ``qwen3_5_moe`` model classes in float32:

1. a byte-level BPE (``synth.tokenizer``) on a generated templated corpus (no third-party text);
2. the backbone on next-token prediction (both layer kinds: Gated DeltaNet and gated attention);
3. the MTP head (``decoder.head.MTPHead``, the codebase's one head) with the backbone frozen, on
   token t+2: distillation on the backbone's own t+2 distribution (its logits at t+1), which
   measured ~10 points better than plain cross-entropy (docs/SPEC.md §4), plus a little cross-entropy on
   the data. The head sees the post-norm and the pre-norm hidden state in turn, so both variants
   a runtime may feed (docs/SPEC.md §3) draft well.

Float32 throughout: on the CPU build unquantized expert stacks (``gather_mm``) run only in float32.
Export to the Hugging Face layout lives in ``export.py``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from .config import EOS_ID, tiny_config
from .tokenizer import default_corpus

if TYPE_CHECKING:  # the loop and the corpus also serve trainers run where mtpforge's decoder (mlx-lm) is not
    from mtpforge.decoder.head import MTPHead

#: Bundled variants: folder name -> synthetic variant. The MoE one is Qwen3.6-style (fused
#: experts in the head too); its config is indistinguishable from Qwen3.5 MoE.
VARIANT_OF: dict[str, str] = {"qwen3_5": "qwen3_5", "qwen3_5_moe": "qwen3_6_moe"}

#: Every projection's input dimension is a multiple of 64, so the real ``mlx_lm.convert`` can
#: quantize all of them with group size 64 (the demo's 4-bit target).
_BASE: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "full_attention_interval": 2,  # layers 0, 2 Gated DeltaNet; 1, 3 gated attention
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 32,
    "linear_num_value_heads": 2,
    "linear_value_head_dim": 32,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
}
_DENSE: dict[str, Any] = {"intermediate_size": 192}
_MOE: dict[str, Any] = {
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
}


def model_config(name: str, **overrides: Any) -> dict[str, Any]:
    """config.json of bundled model ``name`` (``qwen3_5`` or ``qwen3_5_moe``)."""
    extra = _MOE if name == "qwen3_5_moe" else _DENSE
    return tiny_config(VARIANT_OF[name], **{**_BASE, **extra, **overrides})


@dataclass
class BaseTrainSettings:
    """What decides the trained weights of every bundled tiny model (recorded in training.json):
    the corpus, the batches, the two phases' steps and rates, the head's objective."""

    seed: int = 0
    corpus_docs: int = 12000
    heldout_docs: int = 200
    seq_len: int = 128
    batch_size: int = 16
    backbone_steps: int = 600
    backbone_lr: float = 3e-3
    head_steps: int = 400
    head_lr: float = 3e-3
    distill_weight: float = 1.0
    ce_weight: float = 0.25
    head_mlp_gain: float = 4.0  # initial gain of the head's post_attention_layernorm: see train()
    weight_decay: float = 0.01


@dataclass
class TrainSettings(BaseTrainSettings):
    """The Qwen models' settings: the base's, and which backbone state trains the head."""

    head_hidden: str = "mix"  # post | pre | mix


@dataclass
class TrainResult:
    model: nn.Module
    head: MTPHead
    config: dict[str, Any]
    settings: TrainSettings
    backbone_seconds: float = 0.0
    head_seconds: float = 0.0
    backbone_losses: list[tuple[int, float]] = field(default_factory=list)
    head_losses: list[tuple[int, float]] = field(default_factory=list)


# --- data ---------------------------------------------------------------------------------


def training_corpus(settings: BaseTrainSettings) -> list[str]:
    """Generated documents the backbone and the tokenizer learn from."""
    return default_corpus(settings.corpus_docs, seed=settings.seed)


def heldout_corpus(settings: BaseTrainSettings) -> list[str]:
    """Documents from another seed: new combinations of the same templates, never trained on."""
    return default_corpus(settings.heldout_docs, seed=settings.seed + 10_007)


def encode_stream(tokenizer: Any, docs: Sequence[str]) -> np.ndarray:
    """All documents as one token stream, each followed by a newline, as text would run on."""
    ids = [tokenizer.encode(d + "\n").ids for d in docs]
    return np.concatenate([np.asarray(i, dtype=np.int32) for i in ids])


def batches(stream: np.ndarray, settings: BaseTrainSettings, seed: int):
    """Endless random windows of ``seq_len + 1`` tokens (inputs and shifted targets)."""
    rng = np.random.RandomState(seed)
    n = len(stream) - settings.seq_len - 1
    while True:
        starts = rng.randint(0, n, size=settings.batch_size)
        yield mx.array(np.stack([stream[s : s + settings.seq_len + 1] for s in starts]))


def heldout_prompts(tokenizer: Any, settings: BaseTrainSettings, n: int = 24, prompt_docs: int = 2) -> list[list[int]]:
    """Prompts from held-out text: a few whole documents and the start of the next one."""
    docs = heldout_corpus(settings)
    out = []
    for i in range(n):
        chunk = docs[i * (prompt_docs + 1) : (i + 1) * (prompt_docs + 1)]
        last = chunk[-1]
        text = "\n".join(chunk[:-1]) + "\n" + last[: max(4, len(last) // 3)]
        out.append(tokenizer.encode(text).ids)
    return out


# --- forward passes -----------------------------------------------------------------------


def backbone_states(model: nn.Module, tokens: mx.array) -> tuple[mx.array, mx.array]:
    """(pre-norm, post-norm) final hidden states of an mlx-lm Qwen3.5 model, no cache.

    mlx-lm returns only the normed state; the pre-norm one (what mlx-lm #990 feeds its head) needs
    the layer loop run here, with mlx-lm's own layers and masks.
    """
    from mlx_lm.models.base import create_attention_mask, create_ssm_mask

    inner = model.language_model.model
    h = inner.embed_tokens(tokens)
    fa_mask = create_attention_mask(h, None)
    ssm_mask = create_ssm_mask(h, None)
    for layer in inner.pipeline_layers:
        h = layer(h, mask=ssm_mask if layer.is_linear else fa_mask)
    return h, inner.norm(h)


def lm_head(model: nn.Module) -> Callable[[mx.array], mx.array]:
    lm = model.language_model
    if lm.args.tie_word_embeddings:
        return lm.model.embed_tokens.as_linear
    return lm.lm_head


def embed(model: nn.Module) -> nn.Module:
    return model.language_model.model.embed_tokens


# --- training -----------------------------------------------------------------------------


def build_model(config: dict[str, Any]) -> nn.Module:
    """mlx-lm's own model class for the config, float32."""
    import importlib

    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    return arch.Model(arch.ModelArgs.from_dict(config))


def _schedule(lr: float, steps: int) -> Any:
    warm = max(1, steps // 20)
    return optim.join_schedules(
        [optim.linear_schedule(lr / 20, lr, warm), optim.cosine_decay(lr, steps - warm, lr / 20)], [warm]
    )


def _log(msg: str, log: Callable[[str], None] | None) -> None:
    if log is not None:
        log(msg)


def _fit(
    module: nn.Module, opt: optim.Optimizer, step_loss: Callable[[int, mx.array], tuple[mx.array, Any]],
    data: Iterator[mx.array], steps: int, label: str, log: Callable[[str], None] | None,
) -> tuple[list[tuple[int, float]], float]:
    """The one training loop: clipped AdamW steps, a smoothed loss sampled every 50 steps.
    Returns ((step, loss) samples, seconds)."""
    losses: list[tuple[int, float]] = []
    t0 = time.perf_counter()
    run = 0.0
    for step in range(1, steps + 1):
        loss, grads = step_loss(step, next(data))
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        opt.update(module, grads)
        mx.eval(module.parameters(), opt.state, loss)
        run = float(loss) if step == 1 else 0.95 * run + 0.05 * float(loss)
        if step % 50 == 0 or step == steps:
            losses.append((step, round(run, 4)))
            _log(f"{label} step {step}/{steps} loss {run:.3f} ({time.perf_counter() - t0:.0f} s)", log)
    return losses, time.perf_counter() - t0


def train_backbone(
    model: nn.Module, stream: np.ndarray, settings: BaseTrainSettings, log: Callable[[str], None] | None = None
) -> tuple[list[tuple[int, float]], float]:
    """Next-token cross-entropy. Returns ((step, loss) samples, seconds)."""
    model.train()
    opt = optim.AdamW(learning_rate=_schedule(settings.backbone_lr, settings.backbone_steps),
                      weight_decay=settings.weight_decay)

    def loss_fn(m: nn.Module, batch: mx.array) -> mx.array:
        logits = m(batch[:, :-1])
        return nn.losses.cross_entropy(logits, batch[:, 1:], reduction="mean")

    step_fn = nn.value_and_grad(model, loss_fn)
    out = _fit(model, opt, lambda step, batch: step_fn(model, batch), batches(stream, settings, settings.seed + 1),
               settings.backbone_steps, "backbone", log)
    model.eval()
    return out


def head_loss(
    model: nn.Module, head: MTPHead, batch: mx.array, settings: TrainSettings, hidden: str
) -> mx.array:
    """Loss of drafting x[t+2] from (H[t], x[t+1]) against the frozen backbone."""
    pre, post = backbone_states(model, batch)
    proj = lm_head(model)
    teacher = mx.stop_gradient(proj(post[:, 1:]))  # the backbone's own distribution of x[t+2]
    h = mx.stop_gradient(post if hidden == "post" else pre)[:, :-1]
    e = mx.stop_gradient(embed(model)(batch[:, 1:]))
    logits = proj(head(h, e))
    logp = nn.log_softmax(logits, axis=-1)
    distill = -(mx.softmax(teacher, axis=-1) * logp).sum(axis=-1).mean()
    ce = nn.losses.cross_entropy(logits[:, :-1], batch[:, 2:], reduction="mean")
    loss = settings.distill_weight * distill + settings.ce_weight * ce
    return loss


def train_head(
    model: nn.Module, head: MTPHead, stream: np.ndarray, settings: TrainSettings,
    log: Callable[[str], None] | None = None,
) -> tuple[list[tuple[int, float]], float]:
    """Train ``head`` on the frozen ``model``. ``mix`` alternates post- and pre-norm hidden."""
    model.eval()
    model.freeze()
    head.train()
    opt = optim.AdamW(learning_rate=_schedule(settings.head_lr, settings.head_steps), weight_decay=settings.weight_decay)
    fns = {v: nn.value_and_grad(head, lambda hd, b, v=v: head_loss(model, hd, b, settings, v)) for v in ("post", "pre")}

    def step_loss(step: int, batch: mx.array) -> tuple[mx.array, Any]:
        variant = settings.head_hidden if settings.head_hidden != "mix" else ("post", "pre")[step % 2]
        return fns[variant](head, batch)

    out = _fit(head, opt, step_loss, batches(stream, settings, settings.seed + 2), settings.head_steps, "head", log)
    head.eval()
    model.unfreeze()
    return out


def text_args(model: nn.Module) -> Any:
    return model.language_model.args


def train(
    name: str, tokenizer: Any, settings: TrainSettings, log: Callable[[str], None] | None = None
) -> TrainResult:
    """Backbone, then head, for bundled model ``name``; deterministic for a given seed."""
    config = model_config(name)
    mx.random.seed(settings.seed)
    np.random.seed(settings.seed)
    stream = encode_stream(tokenizer, training_corpus(settings))
    _log(f"{name}: {len(stream)} training tokens, vocab {tokenizer.get_vocab_size()}", log)
    model = build_model(config)
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    _log(f"{name}: backbone {n_params} parameters", log)
    b_losses, b_sec = train_backbone(model, stream, settings, log)
    from mtpforge.decoder.head import MTPHead

    head = MTPHead("qwen3_5", text_args(model), 1)  # qwen3_5_moe builds the same layer class
    # The head's SwiGLU starts in its nonlinear regime. With unit-gain inputs a tiny head's gate
    # and up activations stay small, where silu(g)*u ~ g*u/2 ~ silu(u)*g: a conversion that swaps
    # the gate and up halves (or scrambles the experts) then costs only a few points and no
    # acceptance test could catch it. Released heads are far from that regime. Measured on the
    # dense model: gate/up swapped 88% -> 75% at gain 1, 89% -> 42% at gain 4, same acceptance.
    mlp_norm = head.layers[0].post_attention_layernorm
    mlp_norm.weight = mx.full(mlp_norm.weight.shape, settings.head_mlp_gain)
    h_losses, h_sec = train_head(model, head, stream, settings, log)
    return TrainResult(model, head, config, settings, b_sec, h_sec, b_losses, h_losses)


# --- measurement --------------------------------------------------------------------------


def greedy(model: nn.Module, prompt: Sequence[int], n_new: int, stop: int | None = EOS_ID) -> list[int]:
    """Plain greedy continuation with mlx-lm's caches."""
    cache = model.make_cache()
    logits = model(mx.array([list(prompt)]), cache=cache)
    out: list[int] = []
    for _ in range(n_new):
        tok = int(mx.argmax(logits[0, -1]).item())
        out.append(tok)
        if stop is not None and tok == stop:
            break
        logits = model(mx.array([[tok]]), cache=cache)
    return out


def draft_acceptance(
    model: nn.Module, head: MTPHead, prompts: Sequence[Sequence[int]], n_new: int = 48, hidden: str = "post"
) -> dict[str, Any]:
    """Greedy acceptance at depth 1, measured along the greedy path.

    Under greedy verification the emitted text is plain greedy decoding, and a depth-1 draft of
    x[t+2] from (H[t], x[t+1]) is accepted iff it equals the greedy token, with the head's cache
    holding every earlier position. So drafting at every generated position of the greedy
    sequence (head run over the whole sequence, causally) gives the decoder's acceptance without
    a decoder; the real ``verify`` measures the same thing with the speculative loop.
    """
    drafted = accepted = 0
    for prompt in prompts:
        gen = greedy(model, prompt, n_new)
        seq = mx.array([list(prompt) + gen])
        pre, post = backbone_states(model, seq)
        h = post if hidden == "post" else pre
        drafts = mx.argmax(lm_head(model)(head(h[:, :-1], embed(model)(seq[:, 1:]))), axis=-1)[0]
        p = len(prompt)
        # The first draft follows prefill: from H[p-1] and x[p] (the first greedy token), for x[p+1].
        d = np.array(drafts[p - 1 : seq.shape[1] - 2])
        want = np.array(seq[0, p + 1 :])
        drafted += len(want)
        accepted += int((d == want).sum())
    return {"drafted": drafted, "accepted": accepted, "acceptance": round(accepted / max(drafted, 1), 4), "hidden": hidden}


def settings_dict(settings: TrainSettings) -> dict[str, Any]:
    return asdict(settings)


def param_count(module: nn.Module) -> int:
    return int(sum(v.size for _, v in tree_flatten(module.parameters())))


__all__ = [
    "TrainResult", "TrainSettings", "VARIANT_OF", "backbone_states", "build_model", "draft_acceptance",
    "embed", "greedy", "heldout_prompts", "lm_head", "model_config", "param_count", "settings_dict", "train",
    "training_corpus",
]
