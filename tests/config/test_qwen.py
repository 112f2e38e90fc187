"""TargetConfig of the Qwen families: Qwen3 dense, Qwen3.5 (text and multimodal, MoE) and
Qwen3-Next, with their GDN sizes and layer patterns.

Fixtures are published config.json dicts (tests/config/configs.py); expected values are
hand-computed from those numbers, never produced by dflash_ref.config itself.
"""

from __future__ import annotations

import math

import pytest

from dflash_ref.config import (
    TargetConfig,
)
from tests.config.configs import (
    FULL,
    LINEAR,
    SLIDING,
    qwen3_4b,
    qwen3_8b,
    qwen3_next_80b,
    qwen35_9b,
    qwen35_9b_text,
    qwen35_layer_types,
    raises,
)


def test_qwen3_8b():
    cfg = TargetConfig.from_hf(qwen3_8b())
    assert (cfg.family, cfg.architecture, cfg.weight_prefix) == ("qwen3", "Qwen3ForCausalLM",
                                                                 "model.")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (4096, 36, 151936)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (32, 8, 128)
    assert cfg.intermediate_size == 12288 and cfg.hidden_act == "silu"
    assert cfg.layer_types == (FULL,) * 36 and cfg.sliding_window is None
    assert all(cfg.rope_theta_for(i) == 1e6 for i in range(36))
    assert cfg.rotary_dim == 128 and cfg.partial_rotary_factor == 1.0
    assert cfg.attention_scale == pytest.approx(1 / math.sqrt(128))
    assert cfg.norm_offset == 0.0 and cfg.qk_norm and not cfg.attn_output_gate
    assert cfg.embedding_scale is None and cfg.final_logit_softcapping is None
    assert cfg.tie_word_embeddings is False and cfg.gdn is None and cfg.moe is None
    assert cfg.lm_head_name == "lm_head.weight"
    assert cfg.raw["vocab_size"] == 151936


def test_qwen3_4b_is_tied():
    assert TargetConfig.from_hf(qwen3_4b()).tie_word_embeddings is True


def test_qwen3_nested_rope_parameters_win():
    raw = qwen3_8b()
    raw["rope_parameters"] = {"rope_theta": 5000000, "rope_type": "default"}
    assert TargetConfig.from_hf(raw).rope_theta_for(0) == 5e6


def test_qwen3_missing_rope_theta_is_an_error():
    raw = qwen3_8b()
    del raw["rope_theta"]
    with raises("rope_parameters.rope_theta .* top-level rope_theta"):
        TargetConfig.from_hf(raw)


def test_qwen3_yarn_is_refused_by_name():
    raw = qwen3_8b()
    raw["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0,
                           "original_max_position_embeddings": 32768}
    with raises("rope_type 'yarn' is not supported.*default"):
        TargetConfig.from_hf(raw)


def test_qwen3_sliding_layers_follow_max_window_layers():
    raw = qwen3_8b()
    raw.update(use_sliding_window=True, sliding_window=4096, max_window_layers=30)
    cfg = TargetConfig.from_hf(raw)
    assert cfg.layer_types == (FULL,) * 30 + (SLIDING,) * 6 and cfg.sliding_window == 4096


# ---------------------------------------------------------------------------------- Qwen3.5 / Next


def test_qwen35_multimodal_nesting():
    cfg = TargetConfig.from_hf(qwen35_9b())
    assert cfg.family == "qwen3_5" and cfg.model_type == "qwen3_5_text"
    assert cfg.weight_prefix == "model.language_model." and cfg.lm_head_name == "lm_head.weight"
    assert cfg.layers_of_type(FULL) == (3, 7, 11, 15, 19, 23, 27, 31)
    assert len(cfg.layers_of_type(LINEAR)) == 24
    rope = cfg.rope_for(3)
    assert rope.theta == 1e7 and rope.rotary_dim == 64 and rope.rotate_half_span == 64
    assert rope.mrope_section == (11, 11, 10) and rope.mrope_interleaved
    assert cfg.partial_rotary_factor == 0.25 and cfg.head_dim == 256
    assert cfg.attn_output_gate and cfg.qk_norm and cfg.norm_offset == 1.0
    g = cfg.gdn
    assert (g.num_key_heads, g.num_value_heads, g.key_head_dim, g.value_head_dim) == (16, 32,
                                                                                     128, 128)
    # key_dim = 16*128, value_dim = 32*128, conv_dim = 2*2048 + 4096, r = 32/16.
    assert (g.key_dim, g.value_dim, g.conv_dim, g.heads_per_key_head) == (2048, 4096, 8192, 2)
    assert g.conv_kernel_dim == 4 and g.norm_offset == 0.0 and g.projection_layout == "qkv_z_b_a"
    assert cfg.moe is None and cfg.embedding_scale is None
    with raises("linear_attention .* no RoPE"):
        cfg.rope_for(0)


def test_qwen35_layer_types_derived_from_interval_match_explicit():
    raw = qwen35_9b()
    del raw["text_config"]["layer_types"]
    assert TargetConfig.from_hf(raw).layer_types == tuple(qwen35_layer_types(32))


def test_qwen35_text_only_uses_model_prefix():
    raw = qwen35_9b_text()
    raw["architectures"] = ["Qwen3_5ForCausalLM"]
    cfg = TargetConfig.from_hf(raw)
    assert cfg.family == "qwen3_5" and cfg.weight_prefix == "model."


def test_qwen35_layer_types_disagreeing_with_interval_warn():
    raw = qwen35_9b()
    raw["text_config"]["full_attention_interval"] = 2
    with pytest.warns(UserWarning, match="layer_types disagrees"):
        cfg = TargetConfig.from_hf(raw)
    assert cfg.layer_types == tuple(qwen35_layer_types(32))


def test_qwen3_next_interval_top_level_theta_and_moe():
    cfg = TargetConfig.from_hf(qwen3_next_80b())
    assert cfg.family == "qwen3_next" and cfg.weight_prefix == "model."
    assert cfg.layers_of_type(FULL) == tuple(range(3, 48, 4))
    assert cfg.rope_theta_for(3) == 1e7 and cfg.rotary_dim == 64
    assert cfg.gdn.projection_layout == "qkvz_ba_grouped"
    assert cfg.attn_output_gate and "attn_output_gate=True (default)" in cfg.defaults_used
    assert cfg.moe.num_experts == 512 and cfg.moe.num_experts_per_tok == 10
    assert cfg.moe.shared_expert_intermediate_size == 512


def test_qwen35_moe_wrapper():
    raw = qwen35_9b()
    raw["model_type"] = "qwen3_5_moe"
    raw["architectures"] = ["Qwen3_5MoeForConditionalGeneration"]
    text = raw["text_config"]
    text["model_type"] = "qwen3_5_moe_text"
    del text["intermediate_size"]
    text.update(num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                shared_expert_intermediate_size=512)
    cfg = TargetConfig.from_hf(raw)
    assert cfg.family == "qwen3_5" and cfg.intermediate_size is None
    assert (cfg.moe.num_experts, cfg.moe.num_experts_per_tok) == (256, 8)
    assert "MoE 256 experts top-8" in cfg.describe()
    text["model_type"] = "gemma3_text"
    with raises("does not belong to the 'qwen3_5_moe' wrapper"):
        TargetConfig.from_hf(raw)


def test_hybrid_without_layer_pattern_is_an_error():
    raw = qwen3_next_80b()
    del raw["full_attention_interval"]
    with raises("neither layer_types nor full_attention_interval"):
        TargetConfig.from_hf(raw)


def test_hybrid_value_heads_must_be_a_multiple_of_key_heads():
    raw = qwen3_next_80b()
    raw["linear_num_value_heads"] = 24
    raw["linear_num_key_heads"] = 16
    with raises("linear_num_value_heads 24 is not a multiple"):
        TargetConfig.from_hf(raw)
