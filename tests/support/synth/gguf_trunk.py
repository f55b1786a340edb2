"""A small GGUF trunk written with gguf-py, for the tests that need one without llama.cpp.

llama.cpp's converter makes the real trunks (tests/gguf_env.py); where it is not built yet, this
one has what mtpforge reads of a trunk: the architecture and size metadata, ``token_embd``,
``output_norm``, ``output`` and a norm per block (so it is a trunk, not an MTP-only file),
in F32 or quantized to Q8_0 as llama-quantize would store them. Its values are not the model's:
it is for add-mtp and inspect, never for decoding.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from mtpforge.families.detect import detect_family
from mtpforge.gguf.gguffile import KV
from mtpforge.gguf.names import ARCH
from mtpforge.gguf.write import OutTensor, array_chunks, write_gguf

U32, STR = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.STRING
Q = gguf.GGMLQuantizationType
FILE_TYPES = {"F32": gguf.LlamaFileType.ALL_F32, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}


def _text(config: dict[str, Any]) -> dict[str, Any]:
    tc = config.get("text_config")
    return tc if isinstance(tc, dict) else config


def trunk_metadata(hf: Path, qtype: str = "F32", name: str = "Tiny-Qwen3_5") -> tuple[str, dict[str, KV]]:
    """The architecture and the metadata llama.cpp's converter would give this model's trunk
    (another family than Qwen3.5's: its architecture, layer count and width only, which is what
    add-mtp checks where a trunk states no more)."""
    config = json.loads((hf / "config.json").read_text())
    tc = _text(config)
    arch = ARCH[detect_family(config) or ""]
    kv = {
        "general.name": KV(name, STR),
        "general.file_type": KV(int(FILE_TYPES[qtype]), U32),
        f"{arch}.block_count": KV(int(tc["num_hidden_layers"]), U32),
        f"{arch}.embedding_length": KV(int(tc["hidden_size"]), U32),
    }
    if arch not in ("qwen35", "qwen35moe"):
        kv["general.quantization_version"] = KV(2, U32)
        return arch, kv
    moe = int(tc.get("num_experts") or 0) > 0
    kv |= {
        f"{arch}.attention.head_count": KV(int(tc["num_attention_heads"]), U32),
        f"{arch}.attention.head_count_kv": KV(int(tc["num_key_value_heads"]), U32),
        f"{arch}.attention.key_length": KV(int(tc.get("head_dim") or tc["hidden_size"] // tc["num_attention_heads"]), U32),
        f"{arch}.feed_forward_length": KV(int(tc.get("intermediate_size") or 0), U32),
    }
    if moe:
        kv[f"{arch}.expert_count"] = KV(int(tc["num_experts"]), U32)
        kv[f"{arch}.expert_feed_forward_length"] = KV(int(tc["moe_intermediate_size"]), U32)
    kv["general.quantization_version"] = KV(2, U32)
    return arch, kv


def _tensor(name: str, a: np.ndarray, qtype: str) -> OutTensor:
    a = a.astype(np.float32)
    if qtype == "F32" or a.ndim < 2:
        return OutTensor(name, Q.F32, tuple(a.shape), a.nbytes, array_chunks(a))
    q = gguf.quants.quantize(a, Q[qtype])
    return OutTensor(name, Q[qtype], tuple(a.shape), q.nbytes, array_chunks(q))


def synthetic_trunk(hf: Path, dst: Path, qtype: str = "F32", name: str = "Tiny-Qwen3_5",
                    kv_edit: dict[str, KV] | None = None) -> Path:
    """Write the trunk of ``hf``'s model to ``dst`` (``kv_edit`` replaces metadata values)."""
    arch, kv = trunk_metadata(hf, qtype, name)
    kv.update(kv_edit or {})
    tc = _text(json.loads((hf / "config.json").read_text()))
    h, v, n = int(tc["hidden_size"]), int(tc["vocab_size"]), int(tc["num_hidden_layers"])
    rng = np.random.default_rng(0)
    tensors = [_tensor("token_embd.weight", rng.standard_normal((v, h)) * 0.02, qtype),
               _tensor("output_norm.weight", np.ones(h), qtype),
               _tensor("output.weight", rng.standard_normal((v, h)) * 0.02, qtype)]
    tensors += [_tensor(f"blk.{i}.attn_norm.weight", np.ones(h), qtype) for i in range(n)]
    dst.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(dst, arch, kv, tensors)
    return dst


__all__ = ["synthetic_trunk", "trunk_metadata"]
