"""Train the tiny MiMo-V2-Flash-shaped model (``mimo_v2_flash``) and its MTP layers, so that
llama.cpp's acceptance with a head mtpforge wrote means something (random weights accept ~0%).

The trunk is mlx-lm's own ``mimo_v2_flash.Model`` at the shapes of ``synth.mimo_v2_flash`` (a
dense full-attention layer, a MoE sliding-window layer with sinks), trained as a language model
on the synthetic corpus in float32. Then MTP layer 0 is trained, trunk frozen, as llama.cpp's
``mimo2`` MTP graph (``src/models/mimo2.cpp``, ``graph_mtp``) runs it:

    h_t   = the trunk's hidden state BEFORE ``output_norm`` (mimo2's ``t_h_nextn``)
    x     = eh_proj(concat([enorm(embed_tokens(x[t+1])), hnorm(h_t)]))
    x     = DecoderLayer(x)           # mlx-lm's mimo_v2_flash.DecoderLayer, dense, sliding-window
    logit = lm_head(final_layernorm(x))   # drafts x[t+2]

llama-server drafts one token per step here (depth 1: ``nextn_layer_offset`` 0), so only layer 0
is trained; layers 1 and 2 are written as copies of it (the release's count, which the converter
hard-codes). Norms are raw, exported as trained.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from .family_common import build_family_tokenizer, write_generation_config
from .mimo_v2_flash import N_MTP, TRAINED_VOCAB, tensor_specs, tiny_config
from .train import _fit, _schedule, batches, encode_stream, heldout_prompts, train_backbone, training_corpus
from .train_glm import GlmTrainSettings, greedy, unstack_experts
from .write import write_hf_checkpoint

FOLDER = "tiny-mimo_v2_flash-trained"


def settings(**given: Any) -> GlmTrainSettings:
    """GLM-4.5's settings, shortened (the committed model: a few minutes on a busy 2-core machine)."""
    return GlmTrainSettings(**{"backbone_steps": 300, "head_steps": 200, "seq_len": 64, "corpus_docs": 4000, **given})


def _args(config: dict[str, Any]) -> Any:
    from mlx_lm.models import mimo_v2_flash

    # mlx-lm's args require the shared-expert count, which MiMo-V2 has none of
    return mimo_v2_flash.ModelArgs.from_dict({**config, "n_shared_experts": None})


def make_mtp_layer(args: Any) -> nn.Module:
    """One MTP layer as the release names its tensors: mlx-lm's dense sliding-window
    ``DecoderLayer`` with ``enorm``, ``hnorm``, ``eh_proj`` and ``final_layernorm`` around it."""
    from mlx_lm.models import mimo_v2_flash
    from mlx_lm.models.base import create_attention_mask

    class MtpLayer(mimo_v2_flash.DecoderLayer):
        def __init__(self) -> None:
            super().__init__(args, is_moe=False, is_sliding_window=True)
            h, eps = args.hidden_size, args.layernorm_epsilon
            self.enorm, self.hnorm = nn.RMSNorm(h, eps=eps), nn.RMSNorm(h, eps=eps)
            self.eh_proj = nn.Linear(2 * h, h, bias=False)
            self.final_layernorm = nn.RMSNorm(h, eps=eps)

        def __call__(self, hidden: mx.array, emb: mx.array) -> mx.array:  # type: ignore[override]
            x = self.eh_proj(mx.concatenate([self.enorm(emb), self.hnorm(hidden)], axis=-1))
            mask = create_attention_mask(x, None, window_size=args.sliding_window_size)
            return self.final_layernorm(super().__call__(x, mask))

    return MtpLayer()


def trunk_hidden(model: nn.Module, tokens: mx.array) -> mx.array:
    """The trunk's last hidden state before its final norm: what mimo2 hands the MTP layer."""
    from mlx_lm.models.base import create_attention_mask

    lm = model.model
    h = lm.embed_tokens(tokens)
    full = create_attention_mask(h, None)
    swa = create_attention_mask(h, None, window_size=lm.sliding_window_size)
    for layer in lm.layers:
        h = layer(h, swa if layer.is_sliding_window else full)
    return h


def head_loss(model: nn.Module, head: nn.Module, batch: mx.array, s: GlmTrainSettings) -> mx.array:
    """Drafting x[t+2] from (h[t], x[t+1]): distillation on the frozen trunk's own t+2
    distribution plus a little cross-entropy on the data."""
    pre = mx.stop_gradient(trunk_hidden(model, batch))
    teacher = mx.stop_gradient(model.lm_head(model.model.norm(pre[:, 1:])))
    e = mx.stop_gradient(model.model.embed_tokens(batch[:, 1:]))
    logits = model.lm_head(head(pre[:, :-1], e))
    logp = nn.log_softmax(logits, axis=-1)
    distill = -(mx.softmax(teacher, axis=-1) * logp).sum(axis=-1).mean()
    ce = nn.losses.cross_entropy(logits[:, :-1], batch[:, 2:], reduction="mean")
    return s.distill_weight * distill + s.ce_weight * ce


def train_head(model: nn.Module, head: nn.Module, stream: np.ndarray, s: GlmTrainSettings,
               log: Callable[[str], None] | None) -> tuple[list[tuple[int, float]], float]:
    model.eval()
    model.freeze()
    head.train()
    opt = optim.AdamW(learning_rate=_schedule(s.head_lr, s.head_steps), weight_decay=s.weight_decay)
    fn = nn.value_and_grad(head, lambda hd, b: head_loss(model, hd, b, s))
    out = _fit(head, opt, lambda step, batch: fn(head, batch), batches(stream, s, s.seed + 2), s.head_steps, "mtp", log)
    head.eval()
    model.unfreeze()
    return out


def draft_acceptance(model: nn.Module, head: nn.Module, prompts: Sequence[Sequence[int]], n_new: int = 48) -> dict[str, Any]:
    """Depth-1 greedy acceptance along the greedy path (what llama-server's counters measure)."""
    drafted = accepted = 0
    for prompt in prompts:
        seq = mx.array([list(prompt) + greedy(model, prompt, n_new)])
        pre = trunk_hidden(model, seq)
        drafts = mx.argmax(model.lm_head(head(pre[:, :-1], model.model.embed_tokens(seq[:, 1:]))), axis=-1)[0]
        p = len(prompt)
        d, want = np.array(drafts[p - 1 : seq.shape[1] - 2]), np.array(seq[0, p + 1 :])
        drafted += len(want)
        accepted += int((d == want).sum())
    return {"drafted": drafted, "accepted": accepted, "acceptance": round(accepted / max(drafted, 1), 4)}


def hf_tensors(model: nn.Module, head: nn.Module, config: dict[str, Any]) -> dict[str, mx.array]:
    """The release layout, float32: the trunk's experts one by one, MTP layer 0 under
    ``model.mtp.layers.0.`` and its copies under ``.1.`` / ``.2.``; checked against the builder's
    table of names and shapes."""
    trunk = unstack_experts(dict(tree_flatten(model.parameters())))
    mtp = dict(tree_flatten(head.parameters()))
    tensors = {**trunk, **{f"model.mtp.layers.{k}.{n}": v for k in range(N_MTP) for n, v in mtp.items()}}
    want = {k: spec[0] for k, spec in tensor_specs(config).items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if got != want:
        raise ValueError(f"export does not match the release layout: {sorted(set(got) ^ set(want))[:6]}")
    out = {k: v.astype(mx.float32) for k, v in tensors.items()}
    mx.eval(out)
    return out


def build_trained(out_root: str | Path, s: GlmTrainSettings, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Train and write ``out_root/tiny-mimo_v2_flash-trained`` (float32); returns the record."""
    from mlx_lm.models import mimo_v2_flash
    from tokenizers import Tokenizer

    folder = Path(out_root) / FOLDER
    config = tiny_config(torch_dtype="float32")
    mx.random.seed(s.seed)
    np.random.seed(s.seed)
    with tempfile.TemporaryDirectory(prefix="mtpforge-mimo-tok-") as tokdir:
        build_family_tokenizer(Path(tokdir), TRAINED_VOCAB, (), eos="<|im_end|>")
        tok = Tokenizer.from_file(str(Path(tokdir) / "tokenizer.json"))
        stream = encode_stream(tok, training_corpus(s))
        model = mimo_v2_flash.Model(_args(config))
        b_losses, b_sec = train_backbone(model, stream, s, log)
        head = make_mtp_layer(model.args)
        h_losses, h_sec = train_head(model, head, stream, s, log)
        acc = draft_acceptance(model, head, heldout_prompts(tok, s))
        if log:
            log(f"mimo_v2_flash: trained (float32) depth-1 acceptance {acc['acceptance']:.3f}")
        write_hf_checkpoint(folder, config, hf_tensors(model, head, config), n_shards=2, tokenizer_dir=Path(tokdir))
    write_generation_config(folder, config)
    record = {"model": FOLDER, "architecture": "mimo_v2_flash", "settings": asdict(s),
              "trunk": {"seconds": round(b_sec, 1), "loss": b_losses[-1]},
              "mtp": {"seconds": round(h_sec, 1), "loss": h_losses[-1], "hidden": "pre-norm (mimo2's t_h_nextn)",
                      "layers": "layer 0 trained; layers 1 and 2 are copies of it"},
              "acceptance_float32_mlx": acc}
    (folder / "training.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return record
