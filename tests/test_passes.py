"""The passes are pure functions over named tensors: each rule of docs/SPEC.md §2/§4 as a unit test."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mtpforge.families.tables import expected_head, is_norm_key
from mtpforge.passes.experts import from_switch_mlp, split_gate_up, to_switch_mlp
from mtpforge.passes.fp8 import dequantize_block_fp8
from mtpforge.passes.norms import shift_norms
from mtpforge.passes.quantize import QSpec, dequantize, quantizable, quantize
from mtpforge.plan import resolve_experts
from mtpforge.runtimes import LAYOUT_WRITES, RUNTIMES, QuantAsk
from mtpforge.runtimes.quant import ROUTER_Q

CFG = {"model_type": "qwen3_5_moe", "text_config": {
    "hidden_size": 64, "num_attention_heads": 2, "head_dim": 32, "num_key_value_heads": 1,
    "intermediate_size": 128, "num_experts": 4, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64}}


def test_exactly_seven_norm_kinds_are_shifted():
    head = {k: mx.zeros(s, dtype=mx.bfloat16) for k, s in expected_head(CFG, 1, "per-expert").items()}
    head["layers.0.linear_attn.norm.weight"] = mx.zeros((4,), dtype=mx.bfloat16)
    out = shift_norms(head)
    shifted = sorted(k for k, v in out.items() if v.size and mx.all(v == 1).item())
    assert shifted == sorted(k for k in head if is_norm_key(k))
    assert len({k.rsplit(".", 2)[-2] if k.startswith("layers") else k for k in shifted}) == 7
    assert "layers.0.linear_attn.norm.weight" not in shifted


def test_shift_rounds_once_from_float32():
    w = mx.array([-0.4423828125, 0.7509765625, -1.0], dtype=mx.bfloat16)
    got = shift_norms({"norm.weight": w})["norm.weight"]
    assert mx.array_equal(got, (w.astype(mx.float32) + 1).astype(mx.bfloat16)).item()


def test_gate_rows_come_first_in_fused_gate_up():
    g = mx.full((3, 5), 1.0)
    u = mx.full((3, 5), 2.0)
    gate, up = split_gate_up(mx.concatenate([g, u], axis=0))
    assert mx.all(gate == 1).item() and mx.all(up == 2).item()


def test_expert_formats_roundtrip_in_order():
    E, I, H = 4, 6, 8
    per = {}
    for e in range(E):
        for p, shp in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            per[f"layers.0.mlp.experts.{e}.{p}.weight"] = mx.full(shp, float(e * 10 + len(p)))
    sw = to_switch_mlp(per)
    assert sw["layers.0.mlp.switch_mlp.gate_proj.weight"].shape == (E, I, H)
    assert [sw["layers.0.mlp.switch_mlp.down_proj.weight"][e, 0, 0].item() for e in range(E)] == [9, 19, 29, 39]
    fused = from_switch_mlp(sw, "fused")
    assert fused["layers.0.mlp.experts.gate_up_proj"].shape == (E, 2 * I, H)
    again = to_switch_mlp(fused)
    for k, v in sw.items():
        assert mx.array_equal(again[k], v).item()
    with pytest.raises(ValueError):
        to_switch_mlp({k: v for k, v in per.items() if ".experts.2." not in k})


def test_quantize_per_expert_equals_whole_stack():
    w = mx.random.normal((3, 8, 128))
    q = QSpec(4, 64)
    whole = quantize(w, q, "bfloat16")
    for e in range(3):
        part = quantize(w[e], q, "bfloat16")
        assert all(mx.array_equal(part[s], whole[s][e]).item() for s in whole)
    err = mx.abs(dequantize(whole, q) - w)
    assert mx.max(err).item() < 0.5


def _qspec(bare, shape, *, layout, family, base, out_fmt, keep_fc, default_q, notes):
    """One module's precision as add-mtp decides it for ``--layout`` alone (the layout's rule)."""
    rule = LAYOUT_WRITES[layout].quant_for(family)
    return rule.predicate(bare, shape, QuantAsk(family, base, default_q, out_fmt, keep_fc, notes))


def test_quantization_policy():
    notes: list[str] = []
    d = QSpec(4, 64)
    kw = dict(base=d, layout="sidecar", family="qwen3_5_moe", out_fmt="switch_mlp", keep_fc=False, default_q=d, notes=notes)
    assert _qspec("layers.0.mlp.gate", (4, 64), **kw) == ROUTER_Q
    assert _qspec("layers.0.mlp.shared_expert_gate", (1, 64), **kw) == ROUTER_Q
    assert _qspec("layers.0.input_layernorm", (64,), **kw) is None
    assert _qspec("fc", (64, 128), **kw) == d
    assert _qspec("fc", (64, 128), **{**kw, "keep_fc": True}) is None
    assert _qspec("layers.0.self_attn.o_proj", (64, 100), **kw) is None and notes
    emb = {**kw, "layout": "embedded", "out_fmt": "per-expert"}
    assert _qspec("layers.0.mlp.experts.3.up_proj", (64, 64), **emb) is None
    vq = {**kw, "layout": "vllm-mlx", "family": "qwen3_next", "base": None}
    assert _qspec("fc", (64, 128), **vq) is None
    assert _qspec("layers.0.self_attn.q_proj", (128, 64), **vq) == d
    assert _qspec("layers.0.mlp.gate", (4, 64), **vq) == ROUTER_Q
    v35 = {**kw, "layout": "vllm-mlx", "out_fmt": "per-expert"}
    assert _qspec("layers.0.mlp.gate", (4, 64), **v35) is None


def test_expert_format_per_layout():
    w = LAYOUT_WRITES
    assert resolve_experts("auto", w["embedded"], "qwen3_5_moe", "per-expert") == "per-expert"
    assert resolve_experts("auto", w["embedded"], "qwen3_5_moe", "fused") == "fused"
    assert resolve_experts("auto", w["sidecar"], "qwen3_5_moe", "fused") == "switch_mlp"
    assert resolve_experts("auto", w["vllm-mlx"], "qwen3_next", "per-expert") == "switch_mlp"
    assert resolve_experts("auto", w["vllm-mlx"], "qwen3_5_moe", "fused") == "fused"
    assert resolve_experts("auto", w["mlx-vlm-drafter"], "qwen3_5_moe", "per-expert") == "switch_mlp"
    assert resolve_experts("switch_mlp", w["embedded"], "qwen3_5_moe", "fused") == "switch_mlp"


def test_expert_format_per_runtime():
    """--runtime keeps only what the runtime loads (vllm-mlx refuses per-expert: "no expert tensors")."""
    assert resolve_experts("auto", RUNTIMES["vllm-mlx"].write, "qwen3_5_moe", "per-expert") == "switch_mlp"
    assert resolve_experts("auto", RUNTIMES["vllm-mlx"].write, "qwen3_5_moe", "fused") == "fused"
    assert resolve_experts("auto", RUNTIMES["mtplx"].write, "qwen3_5_moe", "fused") == "switch_mlp"
    assert resolve_experts("auto", RUNTIMES["exo"].write, "qwen3_5_moe", "per-expert") == "switch_mlp"
    assert resolve_experts("auto", RUNTIMES["mlx-lm-mtp"].write, "qwen3_5_moe", "per-expert") == "per-expert"


def test_quantizable_rules():
    assert not quantizable((64,), QSpec(4, 64))
    assert not quantizable((8, 96), QSpec(4, 64))
    assert quantizable((8, 128), QSpec(4, 64))


def test_block_fp8_dequantization():
    w = mx.random.normal((256, 128)) * 0.1
    scale = mx.array([[0.5], [2.0]])
    codes = mx.to_fp8(w / mx.repeat(scale, 128, axis=0))
    deq = dequantize_block_fp8(np.array(codes), np.array(scale))
    assert deq.shape == w.shape and np.abs(deq - np.array(w)).max() < 0.05


def test_the_fp8_table_is_the_e4m3_format_for_every_byte():
    """The lookup dequantization reads every code as MLX's own FP8 E4M3 conversion does (NaN
    codes 0x7F / 0xFF included), and a ragged edge block takes its scale too."""
    from mtpforge.passes.fp8 import E4M3_TO_F32

    want = np.array(mx.from_fp8(mx.array(np.arange(256, dtype=np.uint8)), dtype=mx.float32))
    assert np.array_equal(E4M3_TO_F32, want, equal_nan=True) and np.isnan(E4M3_TO_F32[[0x7F, 0xFF]]).all()
    codes = np.arange(130 * 3, dtype=np.uint8).reshape(130, 3) % 0x7F
    got = dequantize_block_fp8(codes, np.array([[2.0], [0.5]], np.float32))
    assert np.array_equal(got[:128], E4M3_TO_F32[codes[:128]] * 2) and np.array_equal(got[128:], E4M3_TO_F32[codes[128:]] / 2)


def test_a_large_block_fp8_tensor_converts_in_row_blocks_to_the_same_bytes():
    """headplan.row_blocks splits a large FP8 tensor only at 128-row scale blocks, and each row
    block, decoded with its rows of the scale (block_scale), is the whole tensor's rows: both
    emitters convert DeepSeek-V3's 117 MB o_proj without holding ~2 GB of float32 at once."""
    import numpy as np

    from mtpforge.checkpoint.safetensors_header import TensorInfo
    from mtpforge.headplan import BLOCK_BYTES, SliceRef, block_scale, decode, row_blocks

    rows, cols = 2048, 2048
    scale = mx.random.uniform(1e-4, 1e-3, (rows // 128, cols // 128), key=mx.random.key(1))
    w = mx.random.normal((rows, cols), key=mx.random.key(2)) * mx.repeat(mx.repeat(scale, 128, axis=0), 128, axis=1) * 64
    raw = bytes(memoryview(np.array(mx.to_fp8(w / mx.repeat(mx.repeat(scale, 128, axis=0), 128, axis=1)))))
    info = TensorInfo("w", "f", "F8_E4M3", (rows, cols), 0, len(raw))
    whole = SliceRef("w", 0, len(raw), (rows, cols))
    k = row_blocks(whole, info)
    assert k > 1 and (rows // k) % 128 == 0 and 2 * len(raw) // k <= BLOCK_BYTES
    step = len(raw) // k
    blocks = [np.array(decode(info, raw[j * step:(j + 1) * step], (rows // k, cols), block_scale(scale, j, k, whole.shape)))
              for j in range(k)]
    assert np.array_equal(np.concatenate(blocks), np.array(decode(info, raw, (rows, cols), scale)))
    # a slice that is not its whole tensor, or rows that are not whole scale blocks: one piece
    assert row_blocks(SliceRef("w", step, len(raw), (rows - rows // k, cols)), info) == 1
    odd = TensorInfo("w", "f", "F8_E4M3", (rows + 1, cols), 0, len(raw) + cols)
    assert row_blocks(SliceRef("w", 0, len(raw) + cols, (rows + 1, cols)), odd) == 1


def test_the_peak_memory_estimate_follows_the_conversions_row_blocks() -> None:
    """--dry-run's peak estimate is what the conversion holds: row blocks bound each step, so a
    giant head's estimate is flat in its expert count, as its measured peak is (the estimate had
    taken the largest slice whole, 1.9 GB for a DeepSeek-V3 head measured at 150 MiB), and a
    slice its conversion needs whole counts whole."""
    from mtpforge.checkpoint.safetensors_header import TensorInfo
    from mtpforge.headplan import BLOCK_BYTES, STEP_COPIES, STEPS_AT_ONCE, SliceRef, peak_memory_estimate, step_bytes

    rows, cols = 2048, 7168
    info = TensorInfo("e", "f", "F8_E4M3", (rows, cols), 0, rows * cols)
    expert = SliceRef("e", 0, rows * cols, (rows, cols))
    few, many = [step_bytes(expert, info)] * 8, [step_bytes(expert, info)] * 256
    assert peak_memory_estimate(few) == peak_memory_estimate(many) == STEP_COPIES * STEPS_AT_ONCE * few[0]
    assert few[0] <= 2 * BLOCK_BYTES < rows * cols * 4
    assert step_bytes(expert, info, None) == rows * cols * 4  # whole: a transform needs the matrix
    assert peak_memory_estimate([4, 1], overhead=7) == STEP_COPIES * 5 + 7


@pytest.mark.parametrize("precision", ["f16", "q8_0"])
def test_a_large_block_fp8_kv_b_proj_splits_head_block_by_head_block_to_the_same_bytes(precision: str) -> None:
    """The GGUF split of MLA's kv_b_proj (attn_k_b, attn_v_b) acts head by head, so a large one
    converts in row blocks of whole heads and whole 128-row scale blocks — the bytes of splitting
    the whole matrix — instead of holding the whole float32 matrix and its parts at once (the
    fixed part of a giant head's peak memory)."""
    from mtpforge.checkpoint.safetensors_header import TensorInfo
    from mtpforge.families.spec import Role
    from mtpforge.gguf.head import PRECISIONS, HeadTensor, encoded, tensor_chunks
    from mtpforge.headplan import BLOCK_BYTES, SliceRef, row_blocks
    from mtpforge.passes.mla import split_part, split_unit

    d = {"NH": 32, "NOPE": 128, "VD": 128, "RKV": 512}
    rows, cols = d["NH"] * (d["NOPE"] + d["VD"]), d["RKV"]
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 0x7F, (rows, cols), dtype=np.uint8) | (rng.integers(0, 2, (rows, cols), dtype=np.uint8) << 7)
    scale = rng.uniform(1e-4, 1e-2, (rows // 128, cols // 128)).astype(np.float32)
    blobs = {"kv": codes.tobytes(), "kv_scale_inv": scale.tobytes()}
    entries = {"kv": TensorInfo("kv", "f", "F8_E4M3", (rows, cols), 0, codes.nbytes),
               "kv_scale_inv": TensorInfo("kv_scale_inv", "f", "F32", scale.shape, 0, scale.nbytes)}
    whole = SliceRef("kv", 0, codes.nbytes, (rows, cols))
    unit = split_unit(Role.KV_B_PROJ, d)
    k = row_blocks(whole, entries["kv"], unit)
    assert k > 1 and (rows // k) % 256 == 0 and 2 * codes.nbytes // k <= BLOCK_BYTES
    for j, shape in enumerate([(d["NH"], d["RKV"], d["NOPE"]), (d["NH"], d["VD"], d["RKV"])]):
        t = HeadTensor(f"part{j}", PRECISIONS[precision], shape, [whole], 0.0, split_part(Role.KV_B_PROJ, j, d),
                       transform_unit=unit)
        chunks = list(tensor_chunks(t, entries, lambda info, a, b: blobs[info.name][a:b])())
        assert len(chunks) == k
        want = encoded(split_part(Role.KV_B_PROJ, j, d)(dequantize_block_fp8(codes, scale)), PRECISIONS[precision])
        assert b"".join(bytes(c) for c in chunks) == bytes(want)


@pytest.mark.parametrize("encoding", ["float32", "float16", "bfloat16", "gguf-bf16"])
def test_block_fp8_looked_up_in_a_cast_equals_the_cast_of_its_dequantization(encoding: str) -> None:
    """encode_block_fp8: each block's 256 values cast once, the codes looking them up, is the
    same bits as dequantizing, then casting (the writers' float encodings: MLX's float16 and
    bfloat16, gguf-py's bfloat16 bytes), also past 256 column blocks (wider offsets); where it
    cannot be exact it declines (None) and decode takes the exact path, which still refuses a
    NaN code."""
    import gguf

    from mtpforge.checkpoint.safetensors_header import TensorInfo
    from mtpforge.errors import RefusedError
    from mtpforge.headplan import decode
    from mtpforge.passes.fp8 import encode_block_fp8
    from mtpforge.passes.quantize import cast_float32

    encode = {"gguf-bf16": lambda a: gguf.quants.quantize(a, gguf.GGMLQuantizationType.BF16)}.get(
        encoding, lambda a: cast_float32(a, encoding))
    rng = np.random.default_rng(7)
    for rows, cols in ((256, 384), (128, 128 * 260)):
        codes = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x7E
        scale = rng.uniform(1e-6, 1e2, (rows // 128, cols // 128)).astype(np.float32)
        got = encode_block_fp8(codes, scale, encode)
        want = np.ascontiguousarray(encode(dequantize_block_fp8(codes, scale)))
        assert got is not None and got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert encode_block_fp8(codes[:, :200], scale[:, :1], encode) is None  # not whole blocks
    assert encode_block_fp8(codes, np.full_like(scale, np.inf), encode) is None
    codes[3, 5] = 0xFF
    assert encode_block_fp8(codes, scale, encode) is None
    info = TensorInfo("mtp.w", "f", "F8_E4M3", codes.shape, 0, codes.nbytes)
    with pytest.raises(RefusedError, match="NaN or Inf"):
        decode(info, codes.tobytes(), codes.shape, scale, encode=encode)


def test_block_fp8_looked_up_into_q8_0_equals_gguf_py_quantizing_its_dequantization() -> None:
    """q8_0_block_fp8 (each group's int8 codes looked up by its largest code and each value's
    code) writes gguf-py's Q8_0 bytes of the dequantized matrix: random codes, scales from zero
    through subnormal-making to large and negative, a group of zeros (a zero Q8_0 scale), weights
    as a release's (every group's largest code differs); it declines where the lookup cannot be
    exact, and decode's exact path then refuses a NaN code."""
    import gguf

    from mtpforge.checkpoint.safetensors_header import TensorInfo
    from mtpforge.errors import RefusedError
    from mtpforge.headplan import decode
    from mtpforge.passes.fp8 import E4M3_TO_F32, q8_0_block_fp8

    def q8_0(a: np.ndarray) -> np.ndarray:
        return gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)

    rng = np.random.default_rng(11)
    for rows, cols in ((256, 384), (128, 128 * 9)):
        codes = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x7E
        codes[5, 32:64] = rng.choice([0x00, 0x80], 32)  # a group of (signed) zeros
        scale = rng.uniform(1e-6, 1e2, (rows // 128, cols // 128)).astype(np.float32)
        scale.flat[:4] = [0.0, 1e-38, -3.5, 2.0 ** 10]
        got = q8_0_block_fp8(codes, scale)
        assert got is not None and np.array_equal(got, q8_0(dequantize_block_fp8(codes, scale)))
    # a release's weights: N(0, 1) scaled to each block's largest value, rounded to E4M3
    w = rng.standard_normal((256, 512)).astype(np.float32)
    scale = np.abs(w.reshape(2, 128, 4, 128)).max(axis=(1, 3)) / 448
    x = np.abs(w.reshape(2, 128, 4, 128) / scale[:, None, :, None]).reshape(w.shape)
    codes = np.abs(x[..., None] - E4M3_TO_F32[None, None, :0x7F]).argmin(-1).astype(np.uint8) | ((w < 0) << 7).astype(np.uint8)
    assert np.array_equal(q8_0_block_fp8(codes, scale), q8_0(dequantize_block_fp8(codes, scale)))
    assert q8_0_block_fp8(codes[:, :200], scale[:, :1]) is None  # not whole blocks
    assert q8_0_block_fp8(codes, np.full_like(scale, np.inf)) is None
    codes[3, 5] = 0x7F
    assert q8_0_block_fp8(codes, scale) is None
    info = TensorInfo("mtp.w", "f", "F8_E4M3", codes.shape, 0, codes.nbytes)
    with pytest.raises(RefusedError, match="NaN or Inf"):
        decode(info, codes.tobytes(), codes.shape, scale, encode=q8_0, lookup=q8_0_block_fp8)


def test_kv_b_proj_splits_per_head_into_the_absorbed_key_and_value_matrices():
    """llama.cpp's converter views kv_b_proj [n·(d_nope+d_v), r_kv] per head, keeps the first
    d_nope rows as the key part (transposed: [n, r_kv, d_nope]) and the rest as the value part
    ([n, d_v, r_kv]); the split only moves values, and a wrong shape is refused."""
    import numpy as np

    from mtpforge.families.spec import Role
    from mtpforge.passes.mla import SPLITS, split_kv_b

    d = {"NH": 3, "NOPE": 4, "VD": 5, "RKV": 6}
    w = np.arange(3 * 9 * 6, dtype=np.float32).reshape(27, 6)
    k_b, v_b = split_kv_b(w, d)
    assert k_b.shape == (3, 6, 4) and v_b.shape == (3, 5, 6)
    for h in range(3):
        assert np.array_equal(k_b[h], w[h * 9:h * 9 + 4].T) and np.array_equal(v_b[h], w[h * 9 + 4:(h + 1) * 9])
    assert [tuple(d[s] for s in shape) for _, shape in SPLITS[Role.KV_B_PROJ].parts] == [k_b.shape, v_b.shape]
    with pytest.raises(ValueError):
        split_kv_b(w[:-1], d)


@pytest.mark.parametrize("bits", [None, 4, 8])
def test_the_decoder_splits_kv_b_proj_as_mlx_lms_sanitize_does(bits: int | None) -> None:
    """The bundled decoder's layer is mlx-lm's: ``to_mlx_layer`` turns a stored ``kv_b_proj``
    (float, or a quantized triplet) into exactly the ``embed_q`` / ``unembed_out`` mlx-lm's own
    ``glm4_moe_lite`` sanitize makes of it (and MTPLX's glm_mtp, which repeats that code), and
    leaves every other tensor as it is."""
    import mlx.core as mx
    from mlx_lm.models import glm4_moe_lite as mlm

    from mtpforge.families import FAMILIES
    from mtpforge.families.spec import Role
    from mtpforge.passes.mla import to_mlx_layer

    spec = FAMILIES["glm4_moe_lite"]
    args = mlm.ModelArgs(vocab_size=64, hidden_size=64, intermediate_size=64, moe_intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=2,
                         num_experts_per_tok=1, kv_lora_rank=64, q_lora_rank=64, qk_rope_head_dim=16,
                         qk_nope_head_dim=64, v_head_dim=32)
    w = mx.random.normal((2 * (64 + 32), 64), key=mx.random.key(0)).astype(mx.bfloat16)
    kv_b, other = spec.module(Role.KV_B_PROJ), spec.key(Role.O_PROJ)
    head = {f"{kv_b}.weight": w, other: w[:64]}
    quant = {}
    if bits:
        packed = mx.quantize(w, group_size=64, bits=bits)
        head.update(zip((f"{kv_b}.weight", f"{kv_b}.scales", f"{kv_b}.biases"), packed))
        quant = {kv_b: {"bits": bits, "group_size": 64, "mode": "affine"}}
    theirs = mlm.Model(args).sanitize({f"model.layers.0.{k}": v for k, v in head.items()})
    ours, q = to_mlx_layer(spec, args, head, quant)
    assert {f"model.layers.0.{k}" for k in ours} == set(theirs) and not any(k.startswith(kv_b) for k in ours)
    for k, v in ours.items():
        assert v.dtype == theirs[f"model.layers.0.{k}"].dtype and mx.array_equal(v, theirs[f"model.layers.0.{k}"]), k
    assert set(q) == ({spec.mlx_layer_parts[Role.K_B], spec.mlx_layer_parts[Role.V_B]} if bits else set())


def test_a_rank_sharded_fp8_matrix_is_unsharded_as_its_ranks_stored_it() -> None:
    """MiMo-V2.5's FP8 ``qkv_proj``: the rank count is read from the scale's rows (8 tried first,
    as llama.cpp's converter tries it); each rank is dequantized with its own scale rows and the
    parts regrouped. Real V2.5 widths: 64 heads x 192 + 8 x 192 + 8 x 128 = 14848 rows, 116 scale
    rows = 4 ranks of 29 blocks (8 ranks would need 120)."""
    from mtpforge.passes.fp8 import E4M3_TO_F32, dequantize_by_rank, rank_count

    assert rank_count(14848, 116) == 4 and rank_count(224, 4) == 4 and rank_count(224, 8) == 8
    assert rank_count(224, 2) is None and rank_count(224, 3) is None
    parts, ranks = (8, 4, 4), 2  # two ranks, each holding [q 4 | k 2 | v 2]
    codes = np.arange(16 * 2, dtype=np.uint8).reshape(16, 2) % 100 + 40
    scale = np.array([[2.0], [3.0]], np.float32)  # rank 0's rows x2, rank 1's x3
    w = dequantize_by_rank(codes, scale, parts, ranks)
    vals = E4M3_TO_F32[codes]
    r0, r1 = vals[:8] * 2, vals[8:] * 3
    want = np.concatenate([r0[:4], r1[:4], r0[4:6], r1[4:6], r0[6:], r1[6:]])
    assert np.array_equal(w, want)
