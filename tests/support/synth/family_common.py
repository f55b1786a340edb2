"""Pieces shared by the tiny checkpoints of the non-Qwen MTP families (GLM-4.7-Flash,
Nemotron-H): random tensors from a spec table, and a tokenizer that carries the special tokens a
family's llama.cpp vocabulary code looks up by name.

The tensors are real safetensors written by ``write.write_hf_checkpoint`` (the same writer as the
Qwen checkpoints), so a family's checkpoint is sharded, indexed and tokenized the same way.
"""

from __future__ import annotations

import json
import math
import tempfile
import zlib
from pathlib import Path
from typing import Any, Sequence

import mlx.core as mx

from .tokenizer import build_tokenizer

#: name -> (shape, kind, loc, scale); kind "norm" draws loc + scale * N(0, 1), "linear" scale * N(0, 1)
Spec = tuple[tuple[int, ...], str, float, float]


def linear(out_dim: int, in_dim: int, gain: float = 1.0) -> Spec:
    return ((out_dim, in_dim), "linear", 0.0, gain / math.sqrt(in_dim))


def raw_norm(n: int) -> Spec:
    """A norm weight stored raw (applied as ``w * x̂``): values around 1."""
    return ((n,), "norm", 1.0, 0.1)


def random_tensors(specs: dict[str, Spec], *, seed: int, dtype: mx.Dtype = mx.bfloat16,
                   float32: Sequence[str] = ()) -> dict[str, mx.array]:
    """One tensor per spec, each from its own key (the seed and a CRC of its name), so adding a
    tensor does not change the others. Names ending in one of
    ``float32`` stay float32, as the releases keep them."""
    out: dict[str, mx.array] = {}
    for name in sorted(specs):
        shape, kind, loc, scale = specs[name]
        key = mx.random.key((seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 62))
        if kind == "embed":
            v = mx.random.normal(shape, mx.float32, key=key)
        elif kind == "zeros":
            v = mx.zeros(shape, mx.float32)
        elif kind == "ones":
            v = mx.ones(shape, mx.float32)
        elif kind == "uniform":
            v = mx.random.uniform(low=loc, high=scale, shape=shape, key=key)
        else:
            v = mx.random.normal(shape, mx.float32, loc=loc, scale=scale, key=key)
        out[name] = v if any(name.endswith(s) for s in float32) else v.astype(dtype)
    mx.eval(out)
    return out


def echo_head_tensors(specs: dict[str, Spec], config: dict[str, Any], *, seed: int, float32: Sequence[str] = (),
                      damped: tuple[str, ...] = ("o_proj.weight", "down_proj.weight")) -> dict[str, mx.array]:
    """A random model whose NextN layers (``model.layers.{N + k}``: ``eh_proj``, ``enorm``,
    ``final_layernorm``) draft. The trunk's residual stream is mostly its input embedding, so its
    next token is nearly a function of the current one; a head that reads the embedding half of
    ``eh_proj`` (identity there, small noise elsewhere), adds little in its attention and MLP (the
    ``damped`` output projections scaled by 0.05) and ends in the trunk's final norm predicts that
    function of token t+1, i.e. token t+2. Its drafts are accepted where the trunk is that
    function; a block that read the halves of ``eh_proj`` the other way round, or lost its final
    norm, would not be (a random head is accepted nowhere, so it shows neither)."""
    specs = dict(specs)
    h, n = config["hidden_size"], config["num_hidden_layers"]
    heads = [f"model.layers.{n + k}." for k in range(int(config.get("num_nextn_predict_layers") or 0))]
    for p in heads:
        specs[p + "enorm.weight"] = ((h,), "ones", 0.0, 0.0)
        for key, (shape, kind, loc, scale) in list(specs.items()):
            if key.startswith(p) and key.endswith(damped):
                specs[key] = (shape, kind, loc, scale * 0.05)
    t = random_tensors(specs, seed=seed, float32=float32)
    for p in heads:
        echo = mx.concatenate([mx.eye(h), mx.zeros((h, h))], axis=1) + 0.01 * t[p + "eh_proj.weight"].astype(mx.float32)
        t[p + "eh_proj.weight"] = echo.astype(mx.bfloat16)
        t[p + "final_layernorm.weight"] = t["model.norm.weight"]
    return t


def build_family_tokenizer(folder: Path, trained_size: int, extra_special: Sequence[str],
                           *, eos: str | None = None, bos: str | None = None) -> dict[str, int]:
    """The synthetic byte-level BPE (``tokenizer.build_tokenizer``, ``trained_size`` tokens) with
    ``extra_special`` appended as special tokens (ids ``trained_size``...), as a release's
    tokenizer.json carries its role tokens. Returns the extra tokens' ids."""
    build_tokenizer(None, trained_size, folder)
    tj_path, tc_path = folder / "tokenizer.json", folder / "tokenizer_config.json"
    tj = json.loads(tj_path.read_text(encoding="utf-8"))
    tc = json.loads(tc_path.read_text(encoding="utf-8"))
    vocab = tj["model"]["vocab"]
    next_id = max([*vocab.values(), *(t["id"] for t in tj["added_tokens"])]) + 1
    if next_id != trained_size:
        raise ValueError(f"the tokenizer trained {next_id} tokens, not {trained_size}")
    ids: dict[str, int] = {}
    for tok in extra_special:
        ids[tok] = next_id
        tj["added_tokens"].append({"id": next_id, "content": tok, "single_word": False, "lstrip": False,
                                   "rstrip": False, "normalized": False, "special": True})
        tc["added_tokens_decoder"][str(next_id)] = {"content": tok, "lstrip": False, "normalized": False,
                                                    "rstrip": False, "single_word": False, "special": True}
        next_id += 1
    if eos:
        tc["eos_token"] = eos
    if bos:
        tc["bos_token"] = bos
    tj_path.write_text(json.dumps(tj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tc_path.write_text(json.dumps(tc, indent=2) + "\n", encoding="utf-8")
    return ids


def write_family_checkpoint(out_dir: str | Path, config: dict[str, Any], tensors: dict[str, mx.array],
                            tokenizer_dir: Path, *, n_shards: int = 2, mtp_shards: int = 1) -> Path:
    """``write.write_hf_checkpoint`` with a prepared tokenizer (config.json keys as given)."""
    from .write import write_hf_checkpoint

    return write_hf_checkpoint(out_dir, config, tensors, n_shards=n_shards, mtp_shards=mtp_shards,
                               tokenizer_dir=tokenizer_dir)


def build_random_checkpoint(out_dir: str | Path, config: dict[str, Any], specs: dict[str, Spec], *, seed: int,
                            float32: Any, trained_vocab: int, eos: str, n_shards: int = 2) -> Path:
    """A family's tiny checkpoint with random weights: ``specs`` drawn (``seed``; the names in
    ``float32`` kept float32), the synthetic tokenizer, the shards with the head on the last one,
    generation_config.json. The families whose tokenizer has no extra special tokens share it."""
    tensors = random_tensors(specs, seed=seed, float32=float32)
    with scratch_dir() as tmp:
        build_family_tokenizer(Path(tmp), trained_vocab, (), eos=eos)
        out = write_family_checkpoint(out_dir, config, tensors, Path(tmp), n_shards=n_shards, mtp_shards=1)
    write_generation_config(out, config)
    return out


def write_generation_config(folder: Path, config: dict[str, Any]) -> None:
    """generation_config.json with the config's own eos list (the Qwen writer assumes one id)."""
    eos = config.get("eos_token_id")
    gc = {"do_sample": False, "eos_token_id": eos, "pad_token_id": config.get("pad_token_id", 0),
          "transformers_version": config.get("transformers_version", "5.0.0.dev0")}
    if config.get("bos_token_id") is not None:
        gc["bos_token_id"] = config["bos_token_id"]
    (folder / "generation_config.json").write_text(json.dumps(gc, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def scratch_dir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="mtpforge-synth-")
