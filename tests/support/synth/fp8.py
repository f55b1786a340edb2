"""A block-FP8 release of a synthetic source, as DeepSeek and Qwen publish them: every 2-D MTP
projection stored as F8_E4M3 with ``<name>_scale_inv`` (F32, one scale per 128x128 block, the
block's largest magnitude / 448), norms and routers left in bf16. Written byte for byte (header
then data), so the test files hold exactly the dtypes the real releases do.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Callable

import mlx.core as mx
import numpy as np

from mtpforge.checkpoint.safetensors_header import read_local_header
from mtpforge.checkpoint.tensors import to_mx

BLOCK = 128
E4M3_MAX = 448.0
INDEX = "model.safetensors.index.json"


def _fp8(w: np.ndarray) -> tuple[bytes, np.ndarray]:
    """FP8 codes of ``w`` [out, in] and its inverse block scales."""
    o, i = w.shape
    bo, bi = -(-o // BLOCK), -(-i // BLOCK)
    scale = np.ones((bo, bi), np.float32)
    q = np.empty_like(w, dtype=np.float32)
    for a in range(bo):
        for b in range(bi):
            blk = w[a * BLOCK:(a + 1) * BLOCK, b * BLOCK:(b + 1) * BLOCK]
            s = float(np.abs(blk).max()) / E4M3_MAX or 1.0
            scale[a, b] = s
            q[a * BLOCK:(a + 1) * BLOCK, b * BLOCK:(b + 1) * BLOCK] = blk / s
    codes = np.array(mx.to_fp8(mx.array(q)), dtype=np.uint8)
    return codes.tobytes(), scale


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]], metadata: dict[str, str]) -> None:
    header: dict[str, object] = {"__metadata__": metadata}
    off = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for _, _, data in tensors.values():
            f.write(data)


def _qwen_projection(name: str) -> bool:
    return name.startswith("mtp.") and not name.endswith(("mlp.gate.weight", "shared_expert_gate.weight"))


#: what DeepSeek's FP8 releases say in config.json (llama.cpp's converter dequantizes by it)
FP8_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [BLOCK, BLOCK]}


def to_block_fp8(hf: Path, dst: Path, fp8: Callable[[str], bool] = _qwen_projection, announce: bool = False,
                 encode: Callable[[str, np.ndarray], tuple[np.ndarray, np.ndarray] | None] | None = None) -> Path:
    """A copy of ``hf`` whose 2-D tensors named by ``fp8`` (default: Qwen's MTP projections) are
    block-FP8; ``announce`` also writes the release's ``quantization_config`` into config.json.
    ``encode(name, w)``: a release's own layout for a tensor (the values to store as E4M3 and
    their inverse scales), None for the plain 128x128 blocks."""
    shutil.copytree(hf, dst)
    idx = json.loads((dst / INDEX).read_text())
    if announce:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, "quantization_config": FP8_CONFIG}, indent=2))
    for shard in sorted(dst.glob("*.safetensors")):
        h = read_local_header(shard, shard.name)
        if not any(fp8(k) for k in h.tensors):
            continue
        raw = shard.read_bytes()
        out: dict[str, tuple[str, list[int], bytes]] = {}
        for name, info in sorted(h.tensors.items(), key=lambda kv: kv[1].begin):
            data = raw[info.begin:info.end]
            if fp8(name) and len(info.shape) == 2:
                w = np.array(to_mx(info, data).astype(mx.float32))
                own = encode(name, w) if encode is not None else None
                if own is not None:
                    codes, scale = np.array(mx.to_fp8(mx.array(own[0])), dtype=np.uint8).tobytes(), own[1]
                else:
                    codes, scale = _fp8(w)
                out[name] = ("F8_E4M3", list(info.shape), codes)
                out[f"{name}_scale_inv"] = ("F32", list(scale.shape), scale.tobytes())
                idx["weight_map"][f"{name}_scale_inv"] = shard.name
            else:
                out[name] = (info.dtype, list(info.shape), data)
        write_safetensors(shard, out, h.metadata or {"format": "pt"})
    (dst / INDEX).write_text(json.dumps(idx, indent=2))
    return dst


__all__ = ["FP8_CONFIG", "to_block_fp8", "write_safetensors"]
