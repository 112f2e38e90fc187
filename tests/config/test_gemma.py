"""TargetConfig of the Gemma families: Gemma 3 text (published sparse configs, transformers-5
rope_parameters, softcaps, embedding dtype) and dense Gemma 4 text (refused features by name).

Fixtures are published config.json dicts (tests/config/configs.py); expected values are
hand-computed from those numbers, never produced by dflash_ref.config itself.
"""

from __future__ import annotations

import math

import pytest

from dflash_ref.config import (
    GEMMA3_TEXT_HF_DEFAULTS,
    TargetConfig,
)
from dflash_ref.errors import ConfigError
from tests.config.configs import (
    FULL,
    SLIDING,
    gemma3_27b_it_published,
    gemma3_27b_text,
    gemma4_31b,
    raises,
)


def test_gemma3_27b_text():
    cfg = TargetConfig.from_hf(gemma3_27b_text())
    assert cfg.family == "gemma3" and cfg.weight_prefix == "model."
    # (i + 1) % 6 == 0 -> global: layers 5, 11, ..., 59 (10 of 62).
    assert cfg.layers_of_type(FULL) == tuple(range(5, 62, 6))
    assert len(cfg.layers_of_type(SLIDING)) == 52 and cfg.sliding_window == 1024
    glob, loc = cfg.rope_for(5), cfg.rope_for(0)
    assert (glob.theta, glob.rope_type, glob.factor) == (1e6, "linear", 8.0)
    assert (loc.theta, loc.rope_type, loc.factor) == (1e4, "default", 1.0)
    assert glob.rotary_dim == loc.rotary_dim == 128
    assert cfg.attention_scale == pytest.approx(168 ** -0.5)
    assert cfg.embedding_scale == 73.5
    assert cfg.embedding_scale_exact == pytest.approx(73.3212111, abs=1e-6)
    assert cfg.embedding_dtype == "bfloat16"
    assert cfg.norm_offset == 1.0 and cfg.use_pre_post_ffn_norms and cfg.qk_norm
    assert cfg.hidden_act == "gelu_pytorch_tanh"
    assert cfg.final_logit_softcapping is None and cfg.attn_logit_softcapping is None
    assert cfg.tie_word_embeddings and "tie_word_embeddings=True (default)" in cfg.defaults_used


def test_gemma3_transformers5_rope_parameters_by_layer_type():
    raw = gemma3_27b_text()
    for key in ("rope_theta", "rope_local_base_freq", "rope_scaling", "sliding_window_pattern"):
        del raw[key]
    raw["layer_types"] = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(62)]
    raw["rope_parameters"] = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    cfg = TargetConfig.from_hf(raw)
    assert (cfg.rope_for(5).theta, cfg.rope_for(5).factor) == (1e6, 8.0)
    assert (cfg.rope_for(0).theta, cfg.rope_for(0).factor) == (1e4, 1.0)


def test_gemma3_sliding_layers_never_take_the_global_theta():
    raw = gemma3_27b_text()
    del raw["rope_local_base_freq"]
    with raises("rope_local_base_freq.* must not be used"):
        TargetConfig.from_hf(raw)


def test_gemma3_softcaps_and_float32_embedding():
    raw = gemma3_27b_text()
    raw.update(final_logit_softcapping=30.0, attn_logit_softcapping=50.0, torch_dtype="float32",
               hidden_size=3840)
    cfg = TargetConfig.from_hf(raw)
    assert (cfg.final_logit_softcapping, cfg.attn_logit_softcapping) == (30.0, 50.0)
    assert cfg.embedding_scale == pytest.approx(math.sqrt(3840), rel=1e-7)
    raw["torch_dtype"] = "bfloat16"
    assert TargetConfig.from_hf(raw).embedding_scale == 62.0


def test_gemma3_published_sparse_config_needs_explicit_opt_in():
    with pytest.raises(ConfigError) as exc:
        TargetConfig.from_hf(gemma3_27b_it_published())
    msg = str(exc.value)
    assert "vocab_size" in msg and "262208" in msg and "hf_defaults=True" in msg


def test_gemma3_missing_rope_theta_names_the_hf_default_but_fails():
    raw = gemma3_27b_text()
    del raw["rope_theta"]
    with raises("rope_parameters.rope_theta.*hf_defaults=True"):
        TargetConfig.from_hf(raw)


def test_gemma3_published_sparse_config_with_hf_defaults():
    cfg = TargetConfig.from_hf(gemma3_27b_it_published(), hf_defaults=True)
    assert cfg.weight_prefix == "language_model.model."
    assert "model.language_model." in cfg.weight_prefix_candidates
    assert cfg.vocab_size == GEMMA3_TEXT_HF_DEFAULTS["vocab_size"] == 262208
    assert cfg.rope_for(5).theta == 1e6 and cfg.rope_for(5).factor == 8.0
    assert cfg.rope_for(0).theta == 1e4
    assert cfg.head_dim == 128 and cfg.attention_scale == pytest.approx(168 ** -0.5)
    recorded = "; ".join(cfg.defaults_used)
    assert "rope_theta=1000000.0 (Gemma3TextConfig default)" in recorded
    assert "rope_local_base_freq=10000.0 (Gemma3TextConfig default)" in recorded
    assert "defaults used" in cfg.describe()


# ---------------------------------------------------------------------------------- Gemma 4


def test_gemma4_31b():
    cfg = TargetConfig.from_hf(gemma4_31b())
    assert cfg.family == "gemma4" and cfg.weight_prefix == "model.language_model."
    assert cfg.layers_of_type(FULL) == tuple(range(5, 60, 6))
    assert (cfg.head_dim_for(0), cfg.head_dim_for(5)) == (256, 512)
    assert (cfg.num_key_value_heads_for(0), cfg.num_key_value_heads_for(5)) == (16, 4)
    glob, loc = cfg.rope_for(5), cfg.rope_for(0)
    # proportional: 2 * int(0.25 * 512 // 2) = 128 rotated channels, pairs span the 512 head.
    assert (glob.theta, glob.rope_type, glob.rotary_dim, glob.rotate_half_span) == (
        1e6, "proportional", 128, 512)
    assert (loc.theta, loc.rope_type, loc.rotary_dim) == (1e4, "default", 256)
    assert cfg.attention_scale == 1.0 and cfg.v_norm and cfg.attention_k_eq_v
    assert cfg.norm_offset == 0.0 and cfg.use_pre_post_ffn_norms
    assert cfg.final_logit_softcapping == 30.0 and cfg.embedding_scale == 73.5
    assert cfg.hidden_act == "gelu_pytorch_tanh" and cfg.tie_word_embeddings


def test_gemma4_small_models_ple_and_kv_sharing():
    # E2B-like: the last 20 layers reuse the K/V of the last earlier layer of their type (HF
    # Gemma4TextConfig.kv_sharing_modes); PLE and the double-wide MLP of the sharing layers.
    raw = gemma4_31b()
    raw["text_config"].update(hidden_size_per_layer_input=256, num_kv_shared_layers=20,
                              vocab_size_per_layer_input=262144, use_double_wide_mlp=True)
    cfg = TargetConfig.from_hf(raw)
    g = cfg.gemma4
    assert g.hidden_size_per_layer_input == 256 and g.num_kv_shared_layers == 20
    # layers 0..39 own their K/V; 40..59 read layer 35 (last full < 40) or 39 (last sliding)
    assert g.kv_sources[:40] == (None,) * 40
    assert {cfg.kv_source_for(i) for i in range(40, 60)} == {35, 39}
    # full layers are 5, 11, ..., 59 (every 6th): 41 and 53 are full, 40 and 42 sliding
    assert (cfg.kv_source_for(40), cfg.kv_source_for(41), cfg.kv_source_for(42)) == (39, 35, 39)
    assert cfg.kv_source_for(53) == 35 and cfg.kv_source_for(59) == 35
    assert (cfg.mlp_width_for(39), cfg.mlp_width_for(40)) == (21504, 2 * 21504)


def test_gemma4_bidirectional_attention_refused():
    raw = gemma4_31b()
    raw["text_config"]["use_bidirectional_attention"] = "all"
    with raises("use_bidirectional_attention='all' is not implemented"):
        TargetConfig.from_hf(raw)


def test_gemma4_missing_ple_key_means_transformers_default_256():
    raw = gemma4_31b()
    del raw["text_config"]["hidden_size_per_layer_input"]
    cfg = TargetConfig.from_hf(raw)
    assert cfg.gemma4.hidden_size_per_layer_input == 256
    assert any("hidden_size_per_layer_input=256 (Gemma4TextConfig default; set it to 0"
               in d for d in cfg.defaults_used)


def test_gemma4_moe_block():
    raw = gemma4_31b()
    raw["text_config"]["enable_moe_block"] = True
    with raises("'num_experts' is missing"):
        TargetConfig.from_hf(raw)
    raw["text_config"].update(num_experts=128, top_k_experts=8, moe_intermediate_size=704)
    m = TargetConfig.from_hf(raw).moe
    assert (m.kind, m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (
        "gemma4", 128, 8, 704)


def test_gemma4_per_layer_config_as_transformers_5_saves_it():
    # transformers 5.x writes the resolved per_layer_config (layer -> head_dim, KV heads)
    # instead of global_head_dim / num_global_key_value_heads; it wins when present.
    raw = gemma4_31b()
    t = raw["text_config"]
    del t["global_head_dim"], t["num_global_key_value_heads"]
    t["per_layer_config"] = {str(i): {"head_dim": 384, "num_key_value_heads": 2}
                             for i in range(5, 60, 6)}
    cfg = TargetConfig.from_hf(raw)
    assert (cfg.head_dim_for(5), cfg.num_key_value_heads_for(5)) == (384, 2)
    assert (cfg.head_dim_for(0), cfg.num_key_value_heads_for(0)) == (256, 16)
    t["per_layer_config"]["0"] = {"head_dim": 128}
    with raises("per_layer_config overrides"):
        TargetConfig.from_hf(raw)


def test_gemma4_last_layer_forced_to_full_with_warning():
    raw = gemma4_31b()
    raw["text_config"]["num_hidden_layers"] = 4
    raw["text_config"]["layer_types"] = [SLIDING] * 4
    with pytest.warns(UserWarning, match="forces it to full_attention"):
        cfg = TargetConfig.from_hf(raw)
    assert cfg.layer_types == (SLIDING,) * 3 + (FULL,)
