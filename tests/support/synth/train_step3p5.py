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

from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .step3p5 import FLOAT32, TRAINED_VOCAB, tensor_specs, tiny_config
from .train_family import Recipe, train_and_write
from .train_glm import Feed, GlmTrainSettings


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


#: the post-norm state into step 0, which projects with its own ``shared_head.output``
FEED = Feed(own_output=True)


def release_name(k: str) -> str:
    for mine, theirs in _RELEASE_NAMES:
        if mine in k:
            return k.replace(mine, theirs)
    return k


def hf_tensors(model: nn.Module, head: nn.Module, config: dict[str, Any]) -> dict[str, mx.array]:
    """The release layout: mlx-lm's names back to the release's, the head under
    ``model.layers.{N}.``, every norm zero-centred (held - 1)."""
    n = config["num_hidden_layers"]
    trunk = {release_name(k): v for k, v in tree_flatten(model.parameters())}
    mtp = {f"model.layers.{n}.{k}": v for k, v in tree_flatten(head.parameters())}
    return {k: (v - 1 if k.endswith("norm.weight") else v) for k, v in {**trunk, **mtp}.items()}


def build_trained(out_root: str | Path, s: GlmTrainSettings, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Train and write ``out_root/tiny-step3p5-trained`` (float32); returns the record."""
    from mlx_lm.models import step3p5

    return train_and_write(out_root, Recipe(
        FOLDER, "step3p5", tiny_config(torch_dtype="float32"),
        model=lambda config: step3p5.Model(step3p5.ModelArgs.from_dict(config)),
        head=lambda model: make_mtp_layer(model.args, model.lm_head), export=hf_tensors, specs=tensor_specs,
        head_notes={"hidden": "post-norm",
                    "layers": "one appended layer (model.layers.2); shared_head.output is the trunk's lm_head, frozen"},
        head_key="mtp", feed=FEED, trained_vocab=TRAINED_VOCAB, extra={"float32_tensors": list(FLOAT32)}), s, log)
