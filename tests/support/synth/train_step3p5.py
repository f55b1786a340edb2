"""Train the tiny Step-3.5-shaped model (``step3p5``) and its MTP layer, so that acceptance with
a head mtpforge wrote means something for the appended-layer shape (random weights accept ~0%).

The trunk is mlx-lm's own ``step3p5.Model`` at the shapes of ``synth.step3p5`` (a dense
full-attention layer, a MoE sliding-window layer with the head-wise attention gate), trained as a
language model on the synthetic corpus in float32. Then the appended layer ``model.layers.{N}`` is
trained, trunk frozen, as the runtimes run step 0 (docs/families/step3p5.md):

    h_t   = the trunk's hidden state after its final norm
    z     = eh_proj(concat([enorm(embed_tokens(x[t+1])), hnorm(h_t)]))
    z     = Step3p5DecoderLayer(z)          # mlx-lm's layer at index N: dense, sliding-window
    logit = shared_head.output(shared_head.norm(z))   # drafts x[t+2]

``shared_head.output`` starts as a copy of the trunk's ``lm_head`` and stays frozen, so a runtime
that projects with the trunk's output instead drafts the same tokens. One MTP layer (the tiny
default; depth 1 is what llama-server and the conformance lanes draft). mlx-lm's norms multiply
as held (its ``sanitize`` adds 1 to the release's zero-centred weights), so the export subtracts
1 from every norm: the folder is stored as the release stores it.
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
from .step3p5 import FLOAT32, TRAINED_VOCAB, tensor_specs, tiny_config
from .train import _fit, _schedule, batches, encode_stream, heldout_prompts, train_backbone, training_corpus
from .train_glm import GlmTrainSettings, greedy
from .write import write_hf_checkpoint

FOLDER = "tiny-step3p5-trained"

#: mlx-lm's parameter names -> the release's (the inverse of ``step3p5.sanitize``)
_RELEASE_NAMES = ((".mlp.switch_mlp.", ".moe."), (".mlp.gate.gate.", ".moe.gate."),
                  (".mlp.gate.router_bias", ".moe.router_bias"), (".mlp.share_expert.", ".share_expert."))


def settings(**given: Any) -> GlmTrainSettings:
    """GLM-4.5's settings, shortened as MiMo-V2-Flash's (a few minutes on a busy 2-core machine)."""
    return GlmTrainSettings(**{"backbone_steps": 300, "head_steps": 200, "seq_len": 64, "corpus_docs": 4000, **given})


def make_mtp_layer(args: Any, lm_head: nn.Linear) -> nn.Module:
    """Step 0 as the release names its tensors: mlx-lm's ``Step3p5DecoderLayer`` at index N with
    ``enorm``, ``hnorm``, ``eh_proj`` and ``transformer.shared_head.{norm,output}`` around it."""
    from mlx_lm.models import step3p5
    from mlx_lm.models.base import create_attention_mask

    h, eps, n = args.hidden_size, args.rms_norm_eps, args.num_hidden_layers

    class SharedHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = step3p5.ZeroCenteredRMSNorm(h, eps=eps)
            self.output = nn.Linear(h, args.vocab_size, bias=False)
            self.output.weight = mx.array(lm_head.weight)

    class Transformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared_head = SharedHead()

    class MtpLayer(step3p5.Step3p5DecoderLayer):
        def __init__(self) -> None:
            super().__init__(args, layer_idx=n)
            self.enorm = step3p5.ZeroCenteredRMSNorm(h, eps=eps)
            self.hnorm = step3p5.ZeroCenteredRMSNorm(h, eps=eps)
            self.eh_proj = nn.Linear(2 * h, h, bias=False)
            self.transformer = Transformer()
            self.transformer.shared_head.output.freeze()

        def __call__(self, hidden: mx.array, emb: mx.array) -> mx.array:  # type: ignore[override]
            z = self.eh_proj(mx.concatenate([self.enorm(emb), self.hnorm(hidden)], axis=-1))
            mask = create_attention_mask(z, None, window_size=args.sliding_window)
            z = super().__call__(z, mask=mask)
            return self.transformer.shared_head.output(self.transformer.shared_head.norm(z))

    return MtpLayer()


def head_loss(model: nn.Module, head: nn.Module, batch: mx.array, s: GlmTrainSettings) -> mx.array:
    """Drafting x[t+2] from (h[t], x[t+1]): distillation on the frozen trunk's own t+2
    distribution plus a little cross-entropy on the data."""
    post = mx.stop_gradient(model.model(batch))
    teacher = mx.stop_gradient(model.lm_head(post[:, 1:]))
    e = mx.stop_gradient(model.model.embed_tokens(batch[:, 1:]))
    logits = head(post[:, :-1], e)
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
        post = model.model(seq)
        drafts = mx.argmax(head(post[:, :-1], model.model.embed_tokens(seq[:, 1:])), axis=-1)[0]
        p = len(prompt)
        d, want = np.array(drafts[p - 1 : seq.shape[1] - 2]), np.array(seq[0, p + 1 :])
        drafted += len(want)
        accepted += int((d == want).sum())
    return {"drafted": drafted, "accepted": accepted, "acceptance": round(accepted / max(drafted, 1), 4)}


def release_name(k: str) -> str:
    for mine, theirs in _RELEASE_NAMES:
        if mine in k:
            return k.replace(mine, theirs)
    return k


def hf_tensors(model: nn.Module, head: nn.Module, config: dict[str, Any]) -> dict[str, mx.array]:
    """The release layout, float32: mlx-lm's names back to the release's, the head under
    ``model.layers.{N}.``, every norm zero-centred (held - 1); checked against the builder's table
    of names and shapes."""
    n = config["num_hidden_layers"]
    trunk = {release_name(k): v for k, v in tree_flatten(model.parameters())}
    mtp = {f"model.layers.{n}.{k}": v for k, v in tree_flatten(head.parameters())}
    tensors = {k: (v - 1 if k.endswith("norm.weight") else v) for k, v in {**trunk, **mtp}.items()}
    want = {k: spec[0] for k, spec in tensor_specs(config).items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if got != want:
        raise ValueError(f"export does not match the release layout: {sorted(set(got) ^ set(want))[:6]}")
    out = {k: v.astype(mx.float32) for k, v in tensors.items()}
    mx.eval(out)
    return out


def build_trained(out_root: str | Path, s: GlmTrainSettings, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Train and write ``out_root/tiny-step3p5-trained`` (float32); returns the record."""
    from mlx_lm.models import step3p5
    from tokenizers import Tokenizer

    folder = Path(out_root) / FOLDER
    config = tiny_config(torch_dtype="float32")
    mx.random.seed(s.seed)
    np.random.seed(s.seed)
    with tempfile.TemporaryDirectory(prefix="mtpforge-step3p5-tok-") as tokdir:
        build_family_tokenizer(Path(tokdir), TRAINED_VOCAB, (), eos="<|im_end|>")
        tok = Tokenizer.from_file(str(Path(tokdir) / "tokenizer.json"))
        stream = encode_stream(tok, training_corpus(s))
        model = step3p5.Model(step3p5.ModelArgs.from_dict(config))
        b_losses, b_sec = train_backbone(model, stream, s, log)
        head = make_mtp_layer(model.args, model.lm_head)
        h_losses, h_sec = train_head(model, head, stream, s, log)
        acc = draft_acceptance(model, head, heldout_prompts(tok, s))
        if log:
            log(f"step3p5: trained (float32) depth-1 acceptance {acc['acceptance']:.3f}")
        write_hf_checkpoint(folder, config, hf_tensors(model, head, config), n_shards=2, tokenizer_dir=Path(tokdir))
    write_generation_config(folder, config)
    record = {"model": FOLDER, "architecture": "step3p5", "settings": asdict(s), "float32_tensors": list(FLOAT32),
              "trunk": {"seconds": round(b_sec, 1), "loss": b_losses[-1]},
              "mtp": {"seconds": round(h_sec, 1), "loss": h_losses[-1], "hidden": "post-norm",
                      "layers": "one appended layer (model.layers.2); shared_head.output is the trunk's lm_head, frozen"},
              "acceptance_float32_mlx": acc}
    (folder / "training.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return record
