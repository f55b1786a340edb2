"""The synthetic checkpoints look like the releases (names, shapes, config keys, shard layout,
norm convention), load in real mlx-lm in both forms, and are deterministic."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest

from mtpforge.checkpoint.safetensors_header import read_local_header
from mtpforge.families.tables import expected_head
from tests.support.synth import (
    EOS_ID,
    build_hf_variant,
    build_tokenizer,
    convert_to_mlx,
    mtp_tensor_names,
    random_hf_tensors,
    text_config,
    tiny_config,
    write_hf_checkpoint,
)
from tests.checkers import folder_state, load_all
from tests.fixtures_checkpoints import all_variants

PREFIX = {"qwen3_5": "model.language_model.", "qwen3_5_moe": "model.language_model.",
          "qwen3_6_moe": "model.language_model.", "qwen3_next": "model."}
HEAD_EXPERTS = {"qwen3_5": "none", "qwen3_5_moe": "per-expert", "qwen3_6_moe": "fused", "qwen3_next": "per-expert"}
TOKENS = [[1, 5, 9, 13, 2, 7, 100, 200, 300, 400]]


def _zero_centred_norm_keys(keys) -> list[str]:
    return [k for k in keys if k.endswith("norm.weight") and ".linear_attn.norm." not in k]


def _logits(folder: Path) -> mx.array:
    import mlx_lm

    model, _ = mlx_lm.load(str(folder))
    model.set_dtype(mx.float32)  # CPU: bf16 matmul is slow and gather_mm is float32-only
    out = model(mx.array(TOKENS))
    mx.eval(out)
    return out


def _corr(a: mx.array, b: mx.array) -> float:
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    return ((a * b).sum() / mx.sqrt((a * a).sum() * (b * b).sum())).item()


# --- configs -------------------------------------------------------------------------------


@all_variants
def test_config_spells_release_keys(variant):
    cfg = tiny_config(variant)
    tc = text_config(cfg)
    assert tc["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert tc["full_attention_interval"] == 4 and tc["num_hidden_layers"] == 4
    assert cfg["tie_word_embeddings"] is False and tc["tie_word_embeddings"] is False
    assert tc["vocab_size"] % 64 == 0 and tc["eos_token_id"] == EOS_ID
    for k in ("hidden_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"):
        assert int(tc.get(k) or 128) % 128 == 0, k
    assert tc["num_attention_heads"] * tc["head_dim"] % 128 == 0
    assert tc["linear_num_value_heads"] * tc["linear_value_head_dim"] % 128 == 0
    if variant == "qwen3_next":
        assert cfg["model_type"] == "qwen3_next" and "text_config" not in cfg
        assert cfg["architectures"] == ["Qwen3NextForCausalLM"]
        assert not any("mtp" in k or "nextn" in k for k in cfg)  # the release declares no count
        assert cfg["mlp_only_layers"] == [] and cfg["decoder_sparse_step"] == 1
        rot = cfg["head_dim"] * cfg["partial_rotary_factor"]
    else:
        moe = variant != "qwen3_5"
        assert cfg["model_type"] == ("qwen3_5_moe" if moe else "qwen3_5")
        assert tc["model_type"] == ("qwen3_5_moe_text" if moe else "qwen3_5_text")
        assert cfg["architectures"] == ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"]
        assert "vision_config" in cfg
        assert tc["mtp_num_hidden_layers"] == 1 and tc["mtp_use_dedicated_embeddings"] is False
        rope = tc["rope_parameters"]
        rot = tc["head_dim"] * rope["partial_rotary_factor"]
        assert sum(rope["mrope_section"]) * 2 == rot
    assert rot == int(rot) and int(rot) % 2 == 0 and tc["head_dim"] >= 32


def test_config_overrides_follow_through():
    cfg = tiny_config("qwen3_5", hidden_size=64, num_hidden_layers=8, head_dim=32, partial_rotary_factor=0.5)
    tc = cfg["text_config"]
    assert tc["hidden_size"] == 64 and len(tc["layer_types"]) == 8
    assert tc["layer_types"].count("full_attention") == 2
    assert tc["rope_parameters"]["partial_rotary_factor"] == 0.5 and sum(tc["rope_parameters"]["mrope_section"]) == 8
    assert "partial_rotary_factor" not in tc
    assert tiny_config("qwen3_5", tie_word_embeddings=True)["tie_word_embeddings"] is True
    with pytest.raises(ValueError, match="rotary"):
        tiny_config("qwen3_5", head_dim=36, partial_rotary_factor=0.25)
    with pytest.raises(ValueError, match="multiple"):
        tiny_config("qwen3_next", linear_num_key_heads=3)
    with pytest.raises(ValueError, match="unknown variant"):
        tiny_config("llama")


# --- tensors --------------------------------------------------------------------------------


@all_variants
def test_head_names_and_shapes_match_the_spec(variant):
    cfg = tiny_config(variant)
    t = random_hf_tensors(cfg)
    tc = text_config(cfg)
    h, d, e = tc["hidden_size"], tc["head_dim"], tc.get("num_experts", 0)
    head = {k[4:]: tuple(t[k].shape) for k in mtp_tensor_names(t)}
    assert mtp_tensor_names(t) == sorted(k for k in t if k.startswith("mtp."))
    assert not any(".mtp." in k for k in t)  # top-level prefix, never model.language_model.mtp.
    assert head["fc.weight"] == (h, 2 * h)
    for k in ("pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight",
              "layers.0.input_layernorm.weight", "layers.0.post_attention_layernorm.weight"):
        assert head[k] == (h,)
    assert head["layers.0.self_attn.q_proj.weight"] == (2 * tc["num_attention_heads"] * d, h)
    assert head["layers.0.self_attn.k_proj.weight"] == (tc["num_key_value_heads"] * d, h)
    assert head["layers.0.self_attn.o_proj.weight"] == (h, tc["num_attention_heads"] * d)
    assert head["layers.0.self_attn.q_norm.weight"] == head["layers.0.self_attn.k_norm.weight"] == (d,)
    fmt = HEAD_EXPERTS[variant]
    if fmt == "none":
        assert len(head) == 15
        assert head["layers.0.mlp.down_proj.weight"] == (h, tc["intermediate_size"])
    else:
        im = tc["moe_intermediate_size"]
        assert head["layers.0.mlp.gate.weight"] == (e, h)
        assert head["layers.0.mlp.shared_expert_gate.weight"] == (1, h)
        assert head["layers.0.mlp.shared_expert.down_proj.weight"] == (h, tc["shared_expert_intermediate_size"])
        if fmt == "fused":
            assert head["layers.0.mlp.experts.gate_up_proj"] == (e, 2 * im, h)
            assert head["layers.0.mlp.experts.down_proj"] == (e, h, im)
            assert not any(".experts.0." in k for k in head)
        else:
            assert head[f"layers.0.mlp.experts.{e - 1}.gate_proj.weight"] == (im, h)
            assert head["layers.0.mlp.experts.0.down_proj.weight"] == (h, im)
            assert not any(k.endswith("gate_up_proj") for k in head)
    # the project's own table agrees
    assert head == expected_head(cfg, 1, None if fmt == "none" else fmt)


@all_variants
def test_backbone_in_source_layout(variant):
    cfg = tiny_config(variant)
    tc = text_config(cfg)
    t = random_hf_tensors(cfg)
    p = PREFIX[variant]
    assert not any(not (k.startswith((p, "mtp.")) or k == "lm_head.weight") for k in t)
    assert t["lm_head.weight"].shape == t[p + "embed_tokens.weight"].shape == (tc["vocab_size"], tc["hidden_size"])
    c = 2 * tc["linear_num_key_heads"] * tc["linear_key_head_dim"] + tc["linear_num_value_heads"] * tc["linear_value_head_dim"]
    for i in range(3):
        assert t[f"{p}layers.{i}.linear_attn.conv1d.weight"].shape == (c, 1, tc["linear_conv_kernel_dim"])
        assert t[f"{p}layers.{i}.linear_attn.A_log"].dtype == mx.float32
    assert f"{p}layers.3.self_attn.q_proj.weight" in t and f"{p}layers.3.linear_attn.A_log" not in t
    assert {v.dtype for k, v in t.items() if not k.endswith("A_log")} == {mx.bfloat16}
    if variant == "qwen3_next":
        assert f"{p}layers.0.linear_attn.in_proj_qkvz.weight" in t and f"{p}layers.0.linear_attn.in_proj_ba.weight" in t
        assert t[f"{p}layers.0.mlp.experts.7.up_proj.weight"].shape == (tc["moe_intermediate_size"], tc["hidden_size"])
    else:
        assert f"{p}layers.0.linear_attn.in_proj_qkv.weight" in t and f"{p}layers.0.linear_attn.in_proj_a.weight" in t
        if variant != "qwen3_5":
            e, im, h = tc["num_experts"], tc["moe_intermediate_size"], tc["hidden_size"]
            assert t[f"{p}layers.0.mlp.experts.gate_up_proj"].shape == (e, 2 * im, h)
            assert t[f"{p}layers.0.mlp.experts.down_proj"].shape == (e, h, im)
            assert not any(".experts.0." in k for k in t if not k.startswith("mtp."))


@all_variants
def test_norms_are_zero_centred_except_the_gated_norm(variant):
    t = {k: v.astype(mx.float32) for k, v in random_hf_tensors(tiny_config(variant)).items()}
    norms = _zero_centred_norm_keys(t)
    assert len(norms) >= 12
    for k in norms:
        assert t[k].mean().item() < 0.9, k  # raw: applied as x̂·(1+w), never ≈ 1
        if not k.endswith(("q_norm.weight", "k_norm.weight")):
            assert t[k].min().item() < 0, k
    gated = [k for k in t if ".linear_attn.norm." in k]
    assert len(gated) == 3
    for k in gated:
        assert abs(t[k].mean().item() - 1.0) < 0.1 and t[k].min().item() > 0
    # The traps of docs/SPEC.md §4: raw q/k norms above 0.5, correctly shifted pre_fc norms below it.
    assert t["mtp.layers.0.self_attn.q_norm.weight"].mean().item() > 0.5
    assert (t["mtp.pre_fc_norm_embedding.weight"] + 1).mean().item() < 0.5


def test_layout_choice_leaves_other_tensors_identical():
    a = random_hf_tensors(tiny_config("qwen3_5_moe"))
    b = random_hf_tensors(tiny_config("qwen3_6_moe"))
    common = set(a) & set(b)
    assert len(common) > 50
    assert all(mx.array_equal(a[k], b[k]).item() for k in common)
    differ = set(a) ^ set(b)
    assert differ and all(k.startswith("mtp.layers.0.mlp.experts.") for k in differ)
    c = random_hf_tensors(tiny_config("qwen3_5_moe"), seed=1)
    assert not mx.array_equal(a["lm_head.weight"], c["lm_head.weight"]).item()
    assert "mtp.fc.weight" not in random_hf_tensors(tiny_config("qwen3_5", mtp_num_hidden_layers=0))
    assert "lm_head.weight" not in random_hf_tensors(tiny_config("qwen3_5", tie_word_embeddings=True))


# --- files ----------------------------------------------------------------------------------


@all_variants
def test_shards_mix_head_and_backbone_in_the_last_two(synth, variant):
    hf = synth.hf(variant)
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    shards = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert sorted(set(index["weight_map"].values())) == shards
    total = 0
    for s in shards:
        header = read_local_header(hf / s, s)
        assert header.metadata == {"format": "pt"}
        names = set(header.tensors)
        assert names == {k for k, f in index["weight_map"].items() if f == s}
        mtp = {k for k in names if k.startswith("mtp.")}
        assert (len(mtp) > 0) == (s != shards[0]), s
        assert names - mtp, s  # backbone tensors in every shard
        total += sum(i.end - i.begin for i in header.tensors.values())
    assert index["metadata"]["total_size"] == total
    assert json.loads((hf / "config.json").read_text()) == {
        k: v for k, v in tiny_config(variant).items() if not k.startswith("_")
    }
    gen = json.loads((hf / "generation_config.json").read_text())
    assert EOS_ID in gen["eos_token_id"]


def test_single_file_and_chosen_shards(tmp_path):
    one = build_hf_variant("qwen3_5", tmp_path / "one", n_shards=1)
    assert (one / "model.safetensors").is_file() and not (one / "model.safetensors.index.json").exists()
    assert not list(one.glob("model-*"))
    cfg = tiny_config("qwen3_5")
    t = random_hf_tensors(cfg)
    f = write_hf_checkpoint(tmp_path / "fifteen", cfg, t, n_shards=5, mtp_in=[3, 5])
    wm = json.loads((f / "model.safetensors.index.json").read_text())["weight_map"]
    assert {wm[k] for k in mtp_tensor_names(t)} == {"model-00003-of-00005.safetensors", "model-00005-of-00005.safetensors"}
    assert len(set(wm.values())) == 5
    with pytest.raises(ValueError):
        write_hf_checkpoint(tmp_path / "bad", cfg, t, n_shards=3, mtp_shards=4)


def test_rewriting_a_folder_leaves_no_stale_shard(tmp_path):
    build_hf_variant("qwen3_5", tmp_path / "f", n_shards=4, mtp_shards=1)
    build_hf_variant("qwen3_5", tmp_path / "f", n_shards=2)
    assert sorted(p.name for p in (tmp_path / "f").glob("model*.safetensors")) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_output_is_deterministic(tmp_path):
    a = build_hf_variant("qwen3_6_moe", tmp_path / "a")
    b = build_hf_variant("qwen3_6_moe", tmp_path / "b")
    c = build_hf_variant("qwen3_6_moe", tmp_path / "c", seed=1)
    assert folder_state(a) == folder_state(b)
    sa, sc = folder_state(a), folder_state(c)
    assert sa["config.json"] == sc["config.json"] and sa["tokenizer.json"] == sc["tokenizer.json"]
    assert sa["model-00003-of-00003.safetensors"] != sc["model-00003-of-00003.safetensors"]


def test_tokenizer_loads_offline_in_transformers(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    build_tokenizer(None, 512, tmp_path / "default")
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "default"))
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == EOS_ID
    assert 300 < len(tok) <= 512
    text = "The cat sees 42 red balls, naïve café.\n"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode("The cat sees the red ball")) < len("The cat sees the red ball") / 2
    build_tokenizer(["abc abd abe"] * 10, 300, tmp_path / "own")
    own = AutoTokenizer.from_pretrained(str(tmp_path / "own"))
    assert len(own) <= 300 and own.decode(own.encode("abd")) == "abd"
    with pytest.raises(ValueError):
        build_tokenizer(None, 200, tmp_path / "tiny")


# --- mlx-lm, both forms -----------------------------------------------------------------------


@all_variants
def test_mlx_lm_loads_raw_source_and_shifts_its_norms(synth, variant):
    import mlx_lm
    from mlx.utils import tree_flatten

    hf = synth.hf(variant)
    raw = load_all(hf)
    model, tok = mlx_lm.load(str(hf))
    params = dict(tree_flatten(model.parameters()))
    p = PREFIX[variant]
    mp = "language_model.model." if p != "model." else "model."
    for name in ("layers.3.self_attn.q_norm.weight", "layers.0.input_layernorm.weight", "norm.weight"):
        want = raw[p + name].astype(mx.float32) + 1.0
        assert mx.allclose(params[mp + name].astype(mx.float32), want, atol=1e-2).item(), name
    gated = params[mp + "layers.0.linear_attn.norm.weight"]
    assert mx.array_equal(gated, raw[p + "layers.0.linear_attn.norm.weight"]).item()
    assert not any("mtp" in k for k in params)
    assert tok.eos_token_id == EOS_ID


@all_variants
def test_converted_target_lost_its_head_but_keeps_the_declaration(synth, variant):
    hf, tgt = synth.hf(variant), synth.target(variant)
    keys = set(load_all(tgt))
    assert keys and not any("mtp" in k for k in keys)
    cfg = json.loads((tgt / "config.json").read_text())
    if variant == "qwen3_next":
        assert not any("mtp" in k or "nextn" in k for k in cfg)
    else:
        assert cfg["text_config"]["mtp_num_hidden_layers"] == 1
    q = cfg["quantization"]
    assert (q["bits"], q["group_size"], q["mode"]) == (4, 64, "affine") and cfg["quantization_config"] == q
    eights = sorted(k for k, v in q.items() if isinstance(v, dict))
    if variant == "qwen3_5":
        assert eights == []
    else:
        mp = "model." if variant == "qwen3_next" else "language_model.model."
        assert f"{mp}layers.0.mlp.gate" in eights and f"{mp}layers.3.mlp.shared_expert_gate" in eights
        assert all(q[k]["bits"] == 8 for k in eights) and len(eights) == 8
    # converted logits follow the raw source (4-bit noise only): the norm shift was applied once
    assert _corr(_logits(hf), _logits(tgt)) > 0.9


@pytest.mark.parametrize("variant", ["qwen3_5", "qwen3_next"])
def test_source_and_target_tokenize_identically(synth, variant):
    from transformers import AutoTokenizer

    text = "<|im_start|>user\nDoes the robot count 12 + 30 = 42? déjà vu<|im_end|>\n"
    ids = [AutoTokenizer.from_pretrained(str(f)).encode(text) for f in (synth.hf(variant), synth.target(variant))]
    assert ids[0] == ids[1] and ids[0][0] == 1


@all_variants
def test_logits_are_sane(synth, variant):
    out = _logits(synth.target(variant))
    assert out.shape == (1, len(TOKENS[0]), 512)
    assert mx.isfinite(out).all().item()
    assert 0.2 < out.std().item() < 20


def test_unquantized_conversion_and_small_overrides(tmp_path):
    hf = build_hf_variant("qwen3_5_moe", tmp_path / "hf", hidden_size=64, head_dim=32,
                          moe_intermediate_size=64, shared_expert_intermediate_size=64,
                          linear_num_value_heads=2)
    bf16 = convert_to_mlx(hf, tmp_path / "bf16", q_bits=None)
    assert "quantization" not in json.loads((bf16 / "config.json").read_text())
    assert not any(k.endswith(".scales") for k in load_all(bf16))
    q = convert_to_mlx(hf, tmp_path / "q", q_bits=4, q_group_size=64)
    assert any(k.endswith("switch_mlp.gate_proj.scales") for k in load_all(q))
    assert _corr(_logits(hf), _logits(bf16)) > 0.99


def test_fixture_copies_are_independent(make_hf, make_target, synth):
    a, b = make_hf("qwen3_5"), make_hf("qwen3_5")
    assert a != b and folder_state(a) == folder_state(b)
    (a / "config.json").write_text("{}")
    assert folder_state(make_hf("qwen3_5")) == folder_state(synth.hf("qwen3_5"))
    t = make_target("qwen3_next")
    assert folder_state(t) == folder_state(synth.target("qwen3_next"))
