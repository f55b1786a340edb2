"""Train the tiny GLM-4.5-style model (``glm4_moe``) and its NextN head, so that llama.cpp's
acceptance with a head mtpforge wrote means something (random weights accept ~0%).

The trunk is mlx-lm's own ``glm4_moe.Model`` at the shapes of ``synth.glm4_moe`` (a dense first
layer, a MoE layer), trained as a language model on the synthetic corpus, in float32 (the CPU
build runs unquantized expert stacks only in float32). The NextN layer is then trained, trunk
frozen, exactly as llama.cpp's GLM4_MOE MTP graph (``src/models/glm4-moe.cpp``, ``graph_mtp``)
runs it:

    h_t   = the trunk's hidden state after ``output_norm`` (llama.cpp's ``t_h_nextn``)
    x     = eh_proj(concat([enorm(embed_tokens(x[t+1])), hnorm(h_t)]))
    x     = DecoderLayer(x)                    # mlx-lm's glm4_moe.DecoderLayer, the MoE kind
    logit = shared_head.head(shared_head.norm(x))   # drafts x[t+2]

The NextN layer is mtpforge's own head (``decoder/nextn.py``, what ``verify`` builds): one head
implementation for the decoder, this trainer and the tests. ``embed_tokens`` and
``shared_head.head`` are GLM-4.5's own copies of the trunk's embedding and
``lm_head`` (frozen, written beside the head as the release does). GLM's norms are raw: the
weight multiplies as stored, so the head is exported without any shift.
"""

from __future__ import annotations

import json
import platform
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from .glm4_moe import _glm_tokenizer, _trunk_shapes, nextn_shapes, tiny_glm4_moe_config
from .train import (BaseTrainSettings, _fit, _schedule, batches, encode_stream, heldout_prompts, train_backbone,
                    training_corpus)
from .write import write_hf_checkpoint

FOLDER = "tiny-glm4_moe-trained"


@dataclass
class GlmTrainSettings(BaseTrainSettings):
    """The GLM model's settings: the base's (the NextN layer always trains on the post-norm
    hidden state, as llama.cpp runs it), and the spread of the head's initial norms."""

    #: log-normal spread of the head's initial norm weights. Released norms are far from
    #: uniform; near all-ones a +1 shift is close to a uniform x2 that the next RMSNorm partly
    #: absorbs, which blunts the negative test (a Qwen-minded +1 written into GLM's raw norms).
    #: Measured at 50 + 50 steps in llama-server: the shift cost 6.4 points from all-ones
    #: norms (gain 1), 8.1 from this start.
    head_norm_spread: float = 0.7


@dataclass
class GlmTrainResult:
    model: nn.Module
    head: nn.Module
    config: dict[str, Any]
    settings: GlmTrainSettings
    backbone_seconds: float = 0.0
    head_seconds: float = 0.0
    backbone_losses: list[tuple[int, float]] = field(default_factory=list)
    head_losses: list[tuple[int, float]] = field(default_factory=list)


def make_head(args: Any) -> nn.Module:
    """The product's NextN head (decoder/nextn.py: mlx-lm's ``glm4_moe.DecoderLayer`` at index N,
    a MoE layer, with the NextN tensors around it), up to ``shared_head.norm``: the vocabulary
    projection is the frozen ``shared_head.head``, the trunk's lm_head copy. Its input
    projection's weights are drawn before the layer's, the order the committed model was made
    in, so the same seed gives the same model."""
    from mlx_lm.models import glm4_moe

    from mtpforge.decoder.nextn import nextn_head

    eh_proj = nn.Linear(2 * args.hidden_size, args.hidden_size, bias=False)
    head = nextn_head(glm4_moe.DecoderLayer, args, own_head=False)
    head.eh_proj = eh_proj
    return head


# --- model --------------------------------------------------------------------------------


def build_trunk(config: dict[str, Any]) -> nn.Module:
    """mlx-lm's own glm4_moe model for the config, float32."""
    from mlx_lm.models import glm4_moe

    return glm4_moe.Model(glm4_moe.ModelArgs.from_dict(config))


def _parts(model: nn.Module) -> Any:
    """Where mlx-lm's model of the family keeps its inner model and embedding (``model.model`` /
    ``embed_tokens``; Nemotron-H's ``model.backbone`` / ``embeddings``): the family's ``MlxBackbone``."""
    from mtpforge.families import FAMILIES

    return next(s for s in FAMILIES.values() if model.args.model_type in s.model_types).mlx_backbone


def trunk_hidden(model: nn.Module, tokens: mx.array) -> mx.array:
    """The trunk's final hidden state after its norm: what llama.cpp hands the NextN layer."""
    return getattr(model, _parts(model).inner)(tokens)


def trunk_embed(model: nn.Module, tokens: mx.array) -> mx.array:
    """The trunk's embedding of ``tokens`` (the head's input beside the hidden state)."""
    parts = _parts(model)
    return getattr(getattr(model, parts.inner), parts.embed)(tokens)


def init_head(model: nn.Module, settings: GlmTrainSettings) -> nn.Module:
    """A fresh NextN layer with spread norm weights (seeded; see ``head_norm_spread``)."""
    head = make_head(model.args)
    rng = np.random.default_rng(settings.seed + 3)
    norms = [head.enorm, head.hnorm, head.input_layernorm, head.post_attention_layernorm, head.shared_head.norm]
    for norm in norms:
        gain = settings.head_mlp_gain if norm is head.post_attention_layernorm else 1.0
        w = gain * np.exp(settings.head_norm_spread * rng.standard_normal(norm.weight.shape))
        norm.weight = mx.array(w.astype(np.float32))
    return head


# --- training -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Feed:
    """How a family's MTP layer sees the trunk, the one thing its training and its depth-1
    measurement differ in between families: which hidden state it is fed (``hidden``: after the
    trunk's final norm for GLM and the MLA shapes, before it for MiMo-V2-Flash), the trunk's own
    next-token logits from that state (``teacher``), and whether the layer projects with an
    output of its own (Step-3.5's ``shared_head.output``) or with the trunk's ``lm_head``."""

    hidden: Callable[[nn.Module, mx.array], mx.array] = trunk_hidden
    teacher: Callable[[nn.Module, mx.array], mx.array] = lambda model, h: model.lm_head(h)  # noqa: E731
    own_output: bool = False
    #: the trunk's embedding of the tokens beside the hidden state
    embed: Callable[[nn.Module, mx.array], mx.array] = trunk_embed

    def logits(self, model: nn.Module, head: nn.Module, h: mx.array, e: mx.array) -> mx.array:
        out = head(h, e)
        return out if self.own_output else model.lm_head(out)


#: the post-norm state into a head that projects with the trunk's lm_head (llama.cpp's ``t_h_nextn``)
POST_NORM = Feed()


def head_loss(model: nn.Module, head: nn.Module, batch: mx.array, settings: GlmTrainSettings,
              feed: Feed = POST_NORM) -> mx.array:
    """Drafting x[t+2] from (h[t], x[t+1]): distillation on the frozen trunk's own t+2
    distribution (its logits at t+1) plus a little cross-entropy on the data."""
    h = mx.stop_gradient(feed.hidden(model, batch))
    teacher = mx.stop_gradient(feed.teacher(model, h[:, 1:]))
    e = mx.stop_gradient(feed.embed(model, batch[:, 1:]))
    logits = feed.logits(model, head, h[:, :-1], e)
    logp = nn.log_softmax(logits, axis=-1)
    distill = -(mx.softmax(teacher, axis=-1) * logp).sum(axis=-1).mean()
    ce = nn.losses.cross_entropy(logits[:, :-1], batch[:, 2:], reduction="mean")
    return settings.distill_weight * distill + settings.ce_weight * ce


def train_head(model: nn.Module, head: nn.Module, stream: np.ndarray, settings: GlmTrainSettings,
               log: Callable[[str], None] | None = None, feed: Feed = POST_NORM) -> tuple[list[tuple[int, float]], float]:
    """Train ``head`` with the trunk frozen."""
    model.eval()
    model.freeze()
    head.train()
    opt = optim.AdamW(learning_rate=_schedule(settings.head_lr, settings.head_steps), weight_decay=settings.weight_decay)
    fn = nn.value_and_grad(head, lambda hd, b: head_loss(model, hd, b, settings, feed))
    out = _fit(head, opt, lambda step, batch: fn(head, batch), batches(stream, settings, settings.seed + 2),
               settings.head_steps, "head", log)
    head.eval()
    model.unfreeze()
    return out


def train(tokenizer: Any, settings: GlmTrainSettings, log: Callable[[str], None] | None = None) -> GlmTrainResult:
    """Trunk, then NextN head; deterministic for a given seed (same BLAS, same thread count)."""
    config = tiny_glm4_moe_config(tokenizer.get_vocab_size())
    mx.random.seed(settings.seed)
    np.random.seed(settings.seed)
    stream = encode_stream(tokenizer, training_corpus(settings))
    if log:
        log(f"glm4_moe: {len(stream)} training tokens, vocab {tokenizer.get_vocab_size()}")
    model = build_trunk(config)
    b_losses, b_sec = train_backbone(model, stream, settings, log)
    head = init_head(model, settings)
    h_losses, h_sec = train_head(model, head, stream, settings, log)
    return GlmTrainResult(model, head, config, settings, b_sec, h_sec, b_losses, h_losses)


# --- measurement --------------------------------------------------------------------------


def greedy(model: nn.Module, prompt: Sequence[int], n_new: int) -> list[int]:
    """Plain greedy continuation with the model's own cache — its ``make_cache``, which is what
    mlx-lm's ``make_prompt_cache`` takes first (a trainer's wrapper of an mlx-vlm model has one,
    where mlx-lm is not installed) — and no stop token: the corpus never ends."""
    if hasattr(model, "make_cache"):
        cache = model.make_cache()
    else:
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(model)
    logits = model(mx.array([list(prompt)]), cache=cache)
    out: list[int] = []
    for _ in range(n_new):
        tok = int(mx.argmax(logits[0, -1]).item())
        out.append(tok)
        logits = model(mx.array([[tok]]), cache=cache)
    return out


def draft_acceptance(model: nn.Module, head: nn.Module, prompts: Sequence[Sequence[int]], n_new: int = 48,
                     feed: Feed = POST_NORM) -> dict[str, Any]:
    """Depth-1 greedy acceptance along the greedy path (a draft of x[t+2] from h[t], x[t+1] is
    accepted iff it equals the greedy token): what llama-server's draft counters measure."""
    drafted = accepted = 0
    for prompt in prompts:
        seq = mx.array([list(prompt) + greedy(model, prompt, n_new)])
        h = feed.hidden(model, seq)
        drafts = mx.argmax(feed.logits(model, head, h[:, :-1], feed.embed(model, seq[:, 1:])), axis=-1)[0]
        p = len(prompt)
        d, want = np.array(drafts[p - 1 : seq.shape[1] - 2]), np.array(seq[0, p + 1 :])
        drafted += len(want)
        accepted += int((d == want).sum())
    return {"drafted": drafted, "accepted": accepted, "acceptance": round(accepted / max(drafted, 1), 4)}


# --- export -------------------------------------------------------------------------------


def unstack_experts(params: dict[str, mx.array]) -> dict[str, mx.array]:
    """mlx-lm's stacked ``switch_mlp.{proj}`` [E, ...] -> the release's per-expert
    ``experts.{e}.{proj}`` (the inverse of glm4_moe.sanitize)."""
    out: dict[str, mx.array] = {}
    for k, v in params.items():
        if ".switch_mlp." in k:
            pre, proj = k.split(".switch_mlp.")
            out.update({f"{pre}.experts.{e}.{proj}": v[e] for e in range(v.shape[0])})
        else:
            out[k] = v
    return out


def hf_tensors(model: nn.Module, head: nn.Module, config: dict[str, Any]) -> dict[str, mx.array]:
    """The release layout: trunk under ``model.``/``lm_head``, the NextN layer under
    ``model.layers.{N}.`` with GLM-4.5's own head and embedding copies; norms raw; float32.
    Checked against ``synth.glm4_moe``'s table of names and shapes."""
    n = config["num_hidden_layers"]
    trunk = unstack_experts(dict(tree_flatten(model.parameters())))
    p = f"model.layers.{n}."
    # the head's parameters are the release's bare keys already (decoder/nextn.py)
    nextn = {p + k: v for k, v in unstack_experts(dict(tree_flatten(head.parameters()))).items()}
    nextn.update({p + "shared_head.head.weight": trunk["lm_head.weight"],
                  p + "embed_tokens.weight": trunk["model.embed_tokens.weight"]})
    tensors = {**trunk, **nextn}
    shapes = _trunk_shapes(config)
    return checked_export(tensors, {**shapes, **nextn_shapes(config, shapes, True)})


def checked_export(tensors: dict[str, mx.array], want: dict[str, tuple[int, ...]]) -> dict[str, mx.array]:
    """The export in float32, exactly the release's names and shapes ``want`` (a trainer that
    drifts from the release's layout fails here, not in a runtime)."""
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if got != want:
        raise ValueError(f"export does not match the release layout: {sorted(set(got) ^ set(want))[:6]}")
    out = {k: v.astype(mx.float32) for k, v in tensors.items()}
    mx.eval(out)
    return out


def build_trained(out_root: str | Path, settings: GlmTrainSettings,
                  log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Train and write ``out_root/tiny-glm4_moe-trained``; returns the training record."""
    from tokenizers import Tokenizer

    folder = Path(out_root) / FOLDER
    with tempfile.TemporaryDirectory(prefix="mtpforge-glm-tok-") as tokdir:
        _glm_tokenizer(Path(tokdir))
        tok = Tokenizer.from_file(str(Path(tokdir) / "tokenizer.json"))
        result = train(tok, settings, log)
        prompts = heldout_prompts(tok, settings)
        acc = draft_acceptance(result.model, result.head, prompts)
        if log:
            log(f"glm4_moe: trained (float32) depth-1 acceptance {acc['acceptance']:.3f}")
        tensors = hf_tensors(result.model, result.head, result.config)
        write_hf_checkpoint(folder, result.config, tensors, n_shards=2, tokenizer_dir=tokdir)
    record = {
        "model": FOLDER, "architecture": "glm4_moe", "seed": settings.seed, "settings": asdict(settings),
        "parameters": {k: int(sum(v.size for _, v in tree_flatten(m.parameters())))
                       for k, m in (("trunk", result.model), ("nextn", result.head))},
        "trunk": {"steps": settings.backbone_steps, "seconds": round(result.backbone_seconds, 1),
                  "loss": result.backbone_losses},
        "nextn": {"steps": settings.head_steps, "seconds": round(result.head_seconds, 1), "loss": result.head_losses,
                  "hidden": "post-norm (llama.cpp's t_h_nextn)",
                  "objective": f"{settings.distill_weight} x distillation on the trunk's t+2 distribution + "
                               f"{settings.ce_weight} x cross-entropy on x[t+2]"},
        "acceptance_float32_mlx": {"how": f"greedy, depth 1, {len(prompts)} held-out prompts x 48 new tokens", **acc},
        "machine": {"platform": platform.platform(), "mlx": mx.__version__},
    }
    (folder / "training.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (folder / "README.md").write_text(model_card(record), encoding="utf-8")
    if log:
        log(f"glm4_moe: exported to {folder} ({sum(p.stat().st_size for p in folder.iterdir())} bytes)")
    return record


def model_card(record: dict[str, Any]) -> str:
    """A short README.md: what this is, how it was made, what it measured."""
    s, a = record["settings"], record["acceptance_float32_mlx"]
    return f"""# {record['model']}

A tiny GLM-4.5-style model (`glm4_moe`: a dense first layer, a MoE layer with a sigmoid router,
its correction bias and one shared expert) with its NextN (MTP) layer, trained from scratch by
`scripts/train_tiny_glm.py` on the generated templated corpus of `tests/support/synth/tokenizer.py`
(no third-party text). It knows nothing useful; it exists so that llama.cpp's MTP acceptance
with a head mtpforge wrote can tell a right head from a wrong one (random weights accept ~0%).

- Hugging Face layout of GLM-4.5: per-expert tensors, the NextN layer at `model.layers.2.` with
  its own `shared_head.head` and `embed_tokens` (copies of the trunk's), raw norms, float32.
- {record['parameters']['trunk']:,} trunk and {record['parameters']['nextn']:,} NextN parameters (without the copies).
- Trunk: {s['backbone_steps']} steps of next-token cross-entropy (final loss {record['trunk']['loss'][-1][1]}).
  NextN: {s['head_steps']} steps with the trunk frozen (final loss {record['nextn']['loss'][-1][1]}), fed the trunk's
  post-norm hidden state as llama.cpp's GLM4_MOE MTP graph is: {record['nextn']['objective']}.
- Seed {record['seed']}; `training.json` has the settings and loss curves.

Greedy depth-1 acceptance in mlx, float32, held-out prompts: {a['acceptance']:.1%}
({a['accepted']}/{a['drafted']}). llama.cpp's figures: docs/families/glm4_moe.md.
"""
