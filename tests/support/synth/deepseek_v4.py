"""A tiny DeepSeek-V4 (``deepseek_v4``, ``DeepseekV4ForCausalLM``) in the release's own layout and
formats, MTP layer included.

The release does not use Hugging Face's ``model.layers.*`` names: the trunk is ``embed`` /
``layers.{i}.{attn,ffn,hc_*}`` / ``norm`` / ``head`` / ``hc_head_*``, and the MTP head sits
under ``mtp.0.`` — a whole decoder layer (manifold-constrained hyper-connections ``hc_attn_*`` /
``hc_ffn_*``, MLA-style attention with a low-rank query, one shared key/value ``wkv``, attention
sinks and the grouped output projection ``wo_a`` / ``wo_b``, a sqrt-softplus-routed MoE with a
shared expert) plus the embedding and hidden projections ``e_proj`` / ``h_proj`` (llama.cpp's
converter concatenates them into ``eh_proj``), their norms, the head's own ``norm`` and its own
``hc_head_*``. Trunk layers compress their key/value cache (``compress_ratios``: 4 brings a
compressor and the indexer, 128 a compressor only); the first ``num_hash_layers`` route by a
token-to-expert table ``ffn.gate.tid2eid``.

Formats, as the release stores them: the dense projections F8_E4M3 with one E8M0 exponent
(``F8_E8M0``, ue8m0) per 128x128 block in ``<name>.scale``; the routed experts FP4 (e2m1), two
values a byte (``I8``), one E8M0 exponent per 32 values along the row in ``<name>.scale``;
hyper-connection tensors, sinks, ``ape`` and the router bias F32; the rest bf16.
``build_deepseek_v4(dense="bf16")`` keeps the dense projections bf16 (the experts stay FP4:
llama.cpp's converter reads routed experts only packed, writing them to MXFP4 as they are).

The MTP layer does not compress (``compress_ratios``'s last entry is 0); llama.cpp's MTP graph
refuses a hash-routed MTP layer, and the release's is not.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any, Mapping

import mlx.core as mx
import numpy as np

from .family_common import build_family_tokenizer, scratch_dir, write_generation_config
from .fp8 import write_safetensors

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
TRAINED_VOCAB = 503
BLOCK = 128  # the dense FP8 scale block (rows and columns)
FP4_GROUP = 32  # values per E8M0 exponent in a packed expert row
E4M3_MAX = 448.0
INDEX = "model.safetensors.index.json"

#: config.json, spelled as the release spells it (tiny values; the release: 43 layers, hidden 4096)
CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "vocab_size": 512,
    "hidden_size": 64,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "qk_rope_head_dim": 16,
    "q_lora_rank": 32,
    "o_groups": 2,
    "o_lora_rank": 16,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-06,
    "num_hash_layers": 1,
    "swiglu_limit": 10.0,
    "sliding_window": 16,
    "compress_ratios": [4, 128, 0],
    "compress_rope_theta": 160000.0,
    "index_n_heads": 2,
    "index_head_dim": 64,
    "index_topk": 4,
    "num_nextn_predict_layers": 1,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "max_position_embeddings": 4096,
    "hidden_act": "silu",
    "bos_token_id": 503,
    "eos_token_id": 504,
    "pad_token_id": 504,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "expert_dtype": "fp4",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "scale_fmt": "ue8m0", "weight_block_size": [BLOCK, BLOCK]},
}

#: the layer's dense projections the release stores block-FP8 (name suffix -> stored so)
FP8_SUFFIXES = ("attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight", "attn.wo_b.weight",
                "attn.indexer.wq_b.weight", "shared_experts.w1.weight", "shared_experts.w2.weight",
                "shared_experts.w3.weight", "e_proj.weight", "h_proj.weight")
#: tensors the release keeps F32 (name suffix)
F32_SUFFIXES = ("attn_sink", "ape", "gate.bias", "hc_attn_fn", "hc_attn_base", "hc_attn_scale", "hc_ffn_fn",
                "hc_ffn_base", "hc_ffn_scale", "hc_head_fn", "hc_head_base", "hc_head_scale")


def tiny_config(**overrides: Any) -> dict[str, Any]:
    return {**json.loads(json.dumps(CONFIG)), **overrides}


def layer_shapes(c: dict[str, Any], ratio: int, hashed: bool) -> dict[str, tuple[int, ...]]:
    """One decoder layer's float tensors (bare names, torch order) for compression ``ratio``."""
    h, nh, d, rq = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]
    og, orank, hc, e, im = c["o_groups"], c["o_lora_rank"], c["hc_mult"], c["n_routed_experts"], c["moe_intermediate_size"]
    ish = im * c["n_shared_experts"]
    mix = (2 + hc) * hc
    s: dict[str, tuple[int, ...]] = {
        "attn_norm.weight": (h,), "ffn_norm.weight": (h,), "attn.attn_sink": (nh,),
        "attn.wq_a.weight": (rq, h), "attn.q_norm.weight": (rq,), "attn.wq_b.weight": (nh * d, rq),
        "attn.wkv.weight": (d, h), "attn.kv_norm.weight": (d,),
        "attn.wo_a.weight": (og * orank, nh * d // og), "attn.wo_b.weight": (h, og * orank),
        "ffn.gate.weight": (e, h), "ffn.gate.bias": (e,),
        "ffn.shared_experts.w1.weight": (ish, h), "ffn.shared_experts.w3.weight": (ish, h),
        "ffn.shared_experts.w2.weight": (h, ish),
    }
    for part in ("attn", "ffn"):
        s |= {f"hc_{part}_fn": (mix, hc * h), f"hc_{part}_base": (mix,), f"hc_{part}_scale": (3,)}
    if ratio:
        coff = 2 if ratio == 4 else 1
        s |= {"attn.compressor.wkv.weight": (coff * d, h), "attn.compressor.wgate.weight": (coff * d, h),
              "attn.compressor.ape": (ratio, coff * d), "attn.compressor.norm.weight": (d,)}
    if ratio == 4:
        n, di = c["index_n_heads"], c["index_head_dim"]
        s |= {"attn.indexer.wq_b.weight": (n * di, rq), "attn.indexer.weights_proj.weight": (n, h),
              "attn.indexer.compressor.wkv.weight": (2 * di, h), "attn.indexer.compressor.wgate.weight": (2 * di, h),
              "attn.indexer.compressor.ape": (ratio, 2 * di), "attn.indexer.compressor.norm.weight": (di,)}
    return s


def expert_shapes(c: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """One routed expert's weights (unpacked [out, in]): w1 gate, w3 up, w2 down."""
    h, im = c["hidden_size"], c["moe_intermediate_size"]
    return {"w1": (im, h), "w3": (im, h), "w2": (h, im)}


def mtp_shapes(c: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The MTP head's own tensors besides its decoder layer (bare names under ``mtp.{k}.``)."""
    h, hc = c["hidden_size"], c["hc_mult"]
    return {"e_proj.weight": (h, h), "h_proj.weight": (h, h), "enorm.weight": (h,), "hnorm.weight": (h,),
            "norm.weight": (h,), "hc_head_fn": (hc, hc * h), "hc_head_base": (hc,), "hc_head_scale": (1,)}


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng((seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 62))


def _draw(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Values for one float tensor: norms around 1, scales small and positive, the rest ~N(0, 1/fan_in)."""
    r = _rng(seed, name)
    if name.endswith("norm.weight"):
        return (1.0 + 0.1 * r.standard_normal(shape)).astype(np.float32)
    if name.endswith(("_scale", "_base")):
        return (0.5 + 0.1 * r.standard_normal(shape)).astype(np.float32)
    if name.endswith(("embed.weight", "head.weight")):
        return r.standard_normal(shape).astype(np.float32)
    fan_in = shape[-1] if len(shape) > 1 else 1
    return (r.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def bf16_bytes(w: np.ndarray) -> bytes:
    """float32 -> bf16, rounded to nearest even (as torch and MLX cast)."""
    u = np.ascontiguousarray(w, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()


def fp8_e8m0(w: np.ndarray) -> tuple[bytes, np.ndarray]:
    """E4M3 codes of ``w`` [out, in] and one E8M0 exponent byte per 128x128 block (ue8m0: the
    block's largest magnitude / 448 rounded up to a power of two)."""
    o, i = w.shape
    bo, bi = -(-o // BLOCK), -(-i // BLOCK)
    exps = np.zeros((bo, bi), np.uint8)
    q = np.empty_like(w, dtype=np.float32)
    for a in range(bo):
        for b in range(bi):
            blk = w[a * BLOCK:(a + 1) * BLOCK, b * BLOCK:(b + 1) * BLOCK]
            e = int(np.ceil(np.log2(max(float(np.abs(blk).max()), 1e-30) / E4M3_MAX)))
            exps[a, b] = e + 127
            q[a * BLOCK:(a + 1) * BLOCK, b * BLOCK:(b + 1) * BLOCK] = blk / np.float32(2.0 ** e)
    return np.array(mx.to_fp8(mx.array(q)), dtype=np.uint8).tobytes(), exps


def fp4_packed(name: str, shape: tuple[int, int], seed: int) -> tuple[bytes, bytes]:
    """A routed expert as the release packs it: random e2m1 codes (two a byte, element 2i in the
    low nibble) and one E8M0 exponent per 32 values (around 2^-3, so values stay O(1); the down
    projection's around 2^-16, so the experts add little to the residual: ``_drafting``)."""
    r = _rng(seed, name)
    o, i = shape
    codes = r.integers(0, 16, size=(o, i), dtype=np.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    low = 110 if name.endswith(".w2") else 123
    exps = r.integers(low, low + 4, size=(o, i // FP4_GROUP), dtype=np.uint8)
    return packed.tobytes(), exps.tobytes()


def _drafting(name: str, w: np.ndarray, seed: int) -> np.ndarray:
    """Values that make the MTP layer draft: sublayer outputs are small (``wo_b``, the shared
    expert's ``w2``), so every residual stream stays mostly the input embedding and the trunk's
    next token is nearly a function of the current one; the head reads the embedding half
    (``e_proj`` the identity plus noise, ``h_proj`` small), reduces its streams and normalizes as
    the trunk does (the trunk's ``hc_head_*`` and ``norm``), so it predicts that function of
    token t+1, i.e. token t+2. A head whose halves were swapped would not (a random head is
    accepted nowhere, so it shows neither)."""
    if name.endswith(("attn.wo_b.weight", "shared_experts.w2.weight")):
        return w * np.float32(0.01)
    if not name.startswith("mtp."):
        return w
    bare = name.split(".", 2)[2]
    if bare == "enorm.weight":
        return np.ones_like(w)
    if bare == "e_proj.weight":
        return (np.eye(w.shape[0], dtype=np.float32) + np.float32(0.01) * w).astype(np.float32)
    if bare == "h_proj.weight":
        return w * np.float32(0.01)
    if bare in ("norm.weight", "hc_head_fn", "hc_head_base", "hc_head_scale"):
        return _draw(bare, w.shape, seed)  # the trunk's own
    return w


def _tensors(c: dict[str, Any], seed: int, dense: str) -> dict[str, tuple[str, list[int], bytes]]:
    """Every tensor of the checkpoint, as (safetensors dtype, shape, bytes)."""
    n, ratios, nhash = c["num_hidden_layers"], c["compress_ratios"], c["num_hash_layers"]
    v, h, hc, e, k = c["vocab_size"], c["hidden_size"], c["hc_mult"], c["n_routed_experts"], c["num_experts_per_tok"]
    floats: dict[str, tuple[int, ...]] = {"embed.weight": (v, h), "norm.weight": (h,), "head.weight": (v, h),
                                          "hc_head_fn": (hc, hc * h), "hc_head_base": (hc,), "hc_head_scale": (1,)}
    prefixes = [f"layers.{i}." for i in range(n)] + [f"mtp.{j}." for j in range(c["num_nextn_predict_layers"])]
    out: dict[str, tuple[str, list[int], bytes]] = {}
    for li, p in enumerate(prefixes):
        floats |= {p + k2: s for k2, s in layer_shapes(c, ratios[li], li < nhash).items()}
        if p.startswith("mtp."):
            floats |= {p + k2: s for k2, s in mtp_shapes(c).items()}
        if li < nhash:
            r = _rng(seed, p + "tid2eid")
            table = np.stack([r.permutation(e)[:k] for _ in range(v)]).astype(np.int32)
            out[p + "ffn.gate.tid2eid"] = ("I32", [v, k], table.tobytes())
        _fp4_experts(out, c, p, e, seed)
    for name, shape in floats.items():
        _store(out, name, _drafting(name, _draw(name, shape, seed), seed), dense == "fp8" and name.endswith(FP8_SUFFIXES))
    return out


def _fp4_experts(out: dict[str, tuple[str, list[int], bytes]], c: dict[str, Any], p: str, experts: int,
                 seed: int) -> None:
    """Layer ``p``'s routed experts as the release stores them: FP4 codes two a byte, an E8M0
    exponent per 32 values."""
    for x in range(experts):
        for w, shape in expert_shapes(c).items():
            name = f"{p}ffn.experts.{x}.{w}"
            packed, exps = fp4_packed(name, shape, seed)
            out[name + ".weight"] = ("I8", [shape[0], shape[1] // 2], packed)
            out[name + ".scale"] = ("F8_E8M0", [shape[0], shape[1] // FP4_GROUP], exps)


def _store(out: dict[str, tuple[str, list[int], bytes]], name: str, w: np.ndarray, fp8: bool) -> None:
    """One float tensor as the release stores it: FP8 with its E8M0 ``.scale`` (``fp8``), F32 for
    the kinds kept in float32, bf16 otherwise."""
    if fp8:
        codes, exps = fp8_e8m0(w)
        out[name] = ("F8_E4M3", list(w.shape), codes)
        out[name.removesuffix(".weight") + ".scale"] = ("F8_E8M0", list(exps.shape), exps.tobytes())
    elif name.endswith(F32_SUFFIXES):
        out[name] = ("F32", list(w.shape), w.tobytes())
    else:
        out[name] = ("BF16", list(w.shape), bf16_bytes(w))


def build_deepseek_v4(out_dir: str | Path, *, seed: int = 0, dense: str = "fp8", n_shards: int = 2,
                      **overrides: Any) -> Path:
    """Write the tiny DeepSeek-V4 checkpoint into ``out_dir`` and return it. ``dense``: ``fp8``
    (the release: block-FP8 with E8M0 scales) or ``bf16``; the routed experts are FP4 either way.
    The MTP tensors share the last shard with trunk tensors, as the release's do."""
    if dense not in ("fp8", "bf16"):
        raise ValueError(f"dense must be fp8 or bf16, not {dense!r}")
    config = tiny_config(**overrides)
    if dense == "bf16":
        config.pop("quantization_config")
    return _write(Path(out_dir), config, _tensors(config, seed, dense), n_shards)


def _write(out: Path, config: dict[str, Any], tensors: dict[str, tuple[str, list[int], bytes]], n_shards: int = 2) -> Path:
    """The checkpoint's shards (sorted names split evenly: ``mtp.*`` shares the last shard with
    trunk tensors, as the release's do), index, config, tokenizer and generation config."""
    out.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)  # "embed", "head", "hc_*", "layers.*", "mtp.*", "norm": mtp shares the last shard
    per = -(-len(names) // n_shards)
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(n_shards):
        shard = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        chunk = {k: tensors[k] for k in names[s * per:(s + 1) * per]}
        write_safetensors(out / shard, chunk, {"format": "pt"})
        weight_map |= {k: shard for k in chunk}
        total += sum(len(b) for _, _, b in chunk.values())
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    with scratch_dir() as tmp:
        ids = build_family_tokenizer(Path(tmp), TRAINED_VOCAB, (BOS, EOS), eos=EOS, bos=BOS)
        assert (ids[BOS], ids[EOS]) == (config["bos_token_id"], config["eos_token_id"]), ids
        for f in Path(tmp).iterdir():
            (out / f.name).write_bytes(f.read_bytes())
    write_generation_config(out, config)
    return out


def build_deepseek_v4_bf16(out_dir: str | Path, **kwargs: Any) -> Path:
    """The tiny checkpoint with bf16 dense projections (its experts FP4, as llama.cpp's converter
    reads them only so): the variant whose values a test can edit in place."""
    return build_deepseek_v4(out_dir, dense="bf16", **kwargs)


def head_keys(folder: Path) -> list[str]:
    """The source keys of the MTP head (``mtp.*``)."""
    return sorted(k for k in json.loads((folder / INDEX).read_text())["weight_map"] if k.startswith("mtp."))




# ----------------------------------------------------------------------------- DSpark

#: the DSpark drafter's config keys (read by llama.cpp's converter ``--dspark``), tiny values:
#: drafts per block, the trunk layers whose hidden states feed ``main_proj`` (0-based; the GGUF
#: states them + 1), the token that fills a block's undrafted slots
DSPARK_CONFIG: dict[str, Any] = {"dspark_block_size": 4, "dspark_target_layer_ids": [0, 1],
                                 "dspark_noise_token_id": 505}
#: the Markov head's rank: in the tensors only, as in the released configs seen (the converter and
#: mtpforge read it from ``markov_w1``'s header)
MARKOV_RANK = 64


def dspark_root_shapes(c: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The drafter's tensors outside its stages (bare names; the release keeps them under the
    first stage's prefix ``mtp.0.``, where the converter takes them from any stage): ``main_proj``
    reads the target layers' hidden states side by side, ``main_norm`` normalizes its output,
    ``norm`` / ``hc_head_*`` close the last stage, the Markov head is a rank-R bigram bias on the
    draft logits and the confidence head scores a drafted position from [hidden | markov]."""
    h, hc, v, r = c["hidden_size"], c["hc_mult"], c["vocab_size"], MARKOV_RANK
    t = len(c["dspark_target_layer_ids"])
    return {"main_proj.weight": (h, t * h), "main_norm.weight": (h,), "norm.weight": (h,),
            "hc_head_fn": (hc, hc * h), "hc_head_base": (hc,), "hc_head_scale": (1,),
            "markov_head.markov_w1.weight": (v, r), "markov_head.markov_w2.weight": (v, r),
            "confidence_head.proj.weight": (1, h + r)}


#: the fitted Markov head's code length: its bias is ``MARKOV_GAIN²`` for the bigram's next token
MARKOV_GAIN = 12.0


def _markov(c: dict[str, Any], bigrams: Mapping[int, int], seed: int) -> dict[str, np.ndarray]:
    """A Markov head that drafts ``bigrams`` (token -> the token the trunk writes after it):
    every token a random unit code of the rank's length (``markov_w1``: code x gain), each next
    token the sum of its predecessors' codes (``markov_w2``), so the bias ``w2 · w1[prev]`` is
    gain² on the bigram's next token and about gain² / sqrt(rank) elsewhere — larger than the
    untrained stages' logits, so the draft is the bigram chain."""
    v, r = c["vocab_size"], MARKOV_RANK
    codes = _rng(seed, "markov-codes").standard_normal((v, r)).astype(np.float32)
    codes /= np.linalg.norm(codes, axis=1, keepdims=True)
    w2 = np.zeros((v, r), np.float32)
    for prev, nxt in bigrams.items():
        w2[nxt] += codes[prev]
    g = np.float32(MARKOV_GAIN)
    return {"mtp.0.markov_head.markov_w1.weight": codes * g, "mtp.0.markov_head.markov_w2.weight": w2 * g}


def _dspark_tensors(c: dict[str, Any], stages: int, seed: int, dense: str,
                    bigrams: Mapping[int, int] | None = None) -> dict[str, tuple[str, list[int], bytes]]:
    """The drafter's ``mtp.*`` tensors: ``stages`` (three by default: not the trunk's layer
    count) uncompressed, unhashed DeepSeek-V4 decoder layers (``mtp.{s}.``, each with its FP4
    experts) and the root tensors under ``mtp.0.``."""
    out: dict[str, tuple[str, list[int], bytes]] = {}
    floats: dict[str, tuple[int, ...]] = {"mtp.0." + k: s for k, s in dspark_root_shapes(c).items()}
    for s in range(stages):
        p = f"mtp.{s}."
        floats |= {p + k: shape for k, shape in layer_shapes(c, 0, False).items()}
        _fp4_experts(out, c, p, c["n_routed_experts"], seed)
    fitted = _markov(c, bigrams, seed) if bigrams else {}
    for name, shape in floats.items():
        w = fitted[name] if name in fitted else _draw(name, shape, seed)
        _store(out, name, w, dense == "fp8" and name.endswith((*FP8_SUFFIXES, "main_proj.weight")))
    return out


def build_deepseek_v4_dspark(out_dir: str | Path, *, seed: int = 0, stages: int = 3, dense: str = "fp8",
                             bigrams: Mapping[int, int] | None = None, **overrides: Any) -> Path:
    """A tiny ``-DSpark`` release: the DeepSeek-V4 trunk with the DSpark drafter in ``mtp.*``
    instead of the MTP layer (``num_nextn_predict_layers`` 0) and the ``dspark_*`` config keys
    (``dense="bf16"``: the dense projections bf16, the variant a test can edit in place). The
    stages are untrained; ``bigrams`` (what the trunk writes after each token, measured by
    decoding with it: its trunk does not depend on them) fit the Markov head so that it drafts."""
    config = tiny_config(num_nextn_predict_layers=0, compress_ratios=CONFIG["compress_ratios"][:-1],
                         **DSPARK_CONFIG, **overrides)
    if dense == "bf16":
        config.pop("quantization_config")
    return _write(Path(out_dir), config, _tensors(config, seed, dense) | _dspark_tensors(config, stages, seed, dense, bigrams))


__all__ = ["CONFIG", "DSPARK_CONFIG", "build_deepseek_v4", "build_deepseek_v4_bf16", "build_deepseek_v4_dspark",
           "head_keys", "tiny_config"]
