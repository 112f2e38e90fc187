"""TargetConfig / DrafterConfig parsing: every supported layout, the RoPE-base rule, the default
target-layer formula, Gemma's embedding scale, the drafter's attention conventions, and errors.

Fixtures are config.json dicts written out here from the published field names (spec/dflash.md
§1, spec/gdn.md §3.5, transformers' config classes); expected values are hand-computed from those
numbers, never produced by dflash_ref.config itself.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.config import (
    GEMMA3_TEXT_HF_DEFAULTS,
    DrafterConfig,
    TargetConfig,
    build_target_layer_ids,
    embedding_scale_for,
    resolve_rope_theta,
    round_to_dtype,
)
from dflash_ref.errors import ConfigError, DFlashRefError

FULL, SLIDING, LINEAR = "full_attention", "sliding_attention", "linear_attention"

# ---------------------------------------------------------------------------------- fixtures


def qwen3_8b() -> dict:
    """Qwen/Qwen3-8B config.json (transformers 4.51 era, top-level rope_theta)."""
    return {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
        "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
        "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
        "vocab_size": 151936,
    }


def qwen3_4b() -> dict:
    cfg = qwen3_8b()
    cfg.update(hidden_size=2560, intermediate_size=9728, tie_word_embeddings=True)
    return cfg


def qwen35_layer_types(n: int) -> list[str]:
    return [FULL if i % 4 == 3 else LINEAR for i in range(n)]


def qwen35_9b_text() -> dict:
    """text_config of Qwen/Qwen3.5-9B (spec/gdn.md §3.5 sizes; nested rope_parameters)."""
    return {
        "model_type": "qwen3_5_text", "attention_bias": False, "attn_output_gate": True,
        "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 12288, "layer_types": qwen35_layer_types(32),
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_value_head_dim": 128, "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144, "mtp_num_hidden_layers": 1, "num_attention_heads": 16,
        "num_hidden_layers": 32, "num_key_value_heads": 4, "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10],
                            "partial_rotary_factor": 0.25, "rope_theta": 10000000,
                            "rope_type": "default"},
        "tie_word_embeddings": False, "vocab_size": 248320,
    }


def qwen35_9b() -> dict:
    """The multimodal wrapper: text config nested, weights under model.language_model."""
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "text_config": qwen35_9b_text(), "tie_word_embeddings": False,
        "vision_config": {"depth": 27, "hidden_size": 1152, "model_type": "qwen3_5"},
        "image_token_id": 248056, "transformers_version": "4.57.0.dev0",
    }


def qwen3_next_80b() -> dict:
    """Qwen/Qwen3-Next-80B-A3B: no layer_types, full_attention_interval, top-level theta, MoE."""
    return {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "attention_bias": False, "decoder_sparse_step": 1, "full_attention_interval": 4,
        "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5120,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_value_head_dim": 128,
        "max_position_embeddings": 262144, "mlp_only_layers": [], "moe_intermediate_size": 512,
        "norm_topk_prob": True, "num_attention_heads": 16, "num_experts": 512,
        "num_experts_per_tok": 10, "num_hidden_layers": 48, "num_key_value_heads": 2,
        "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 10000000, "shared_expert_intermediate_size": 512,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 151936,
    }


def gemma3_27b_text() -> dict:
    """A complete Gemma 3 27B text config: pattern 6, local base 10000, linear x8 on globals."""
    return {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "attention_bias": False, "attn_logit_softcapping": None, "final_logit_softcapping": None,
        "head_dim": 128, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 5376,
        "intermediate_size": 21504, "max_position_embeddings": 131072,
        "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "rope_theta": 1000000.0,
        "sliding_window": 1024, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
        "vocab_size": 262208,
    }


def gemma3_27b_it_published() -> dict:
    """google/gemma-3-27b-it as published: a sparse text_config, the rest left to transformers."""
    return {
        "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
        "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
        "mm_tokens_per_image": 256, "model_type": "gemma3",
        "text_config": {
            "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
            "model_type": "gemma3_text", "num_attention_heads": 32, "num_hidden_layers": 62,
            "num_key_value_heads": 16, "query_pre_attn_scalar": 168,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024,
        },
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
        "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"},
    }


def gemma4_layer_types(n: int) -> list[str]:
    return [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(n)]


def gemma4_31b() -> dict:
    """google/gemma-4-31B-it: dense Gemma 4, keyed rope_parameters, K = V on global layers."""
    return {
        "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
        "text_config": {
            "model_type": "gemma4_text", "attention_bias": False, "attention_k_eq_v": True,
            "dtype": "bfloat16", "enable_moe_block": False, "final_logit_softcapping": 30.0,
            "global_head_dim": 512, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 5376, "hidden_size_per_layer_input": None,
            "intermediate_size": 21504, "layer_types": gemma4_layer_types(60),
            "max_position_embeddings": 262144, "num_attention_heads": 32,
            "num_global_key_value_heads": 4, "num_hidden_layers": 60, "num_key_value_heads": 16,
            "num_kv_shared_layers": 0, "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                   "rope_type": "proportional"},
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
            },
            "sliding_window": 1024, "tie_word_embeddings": True, "use_double_wide_mlp": False,
            "vocab_size": 262144,
        },
        "tie_word_embeddings": True,
    }


def zlab_qwen3_8b_drafter() -> dict:
    """z-lab/Qwen3-8B-DFlash-b16 (spec/dflash.md §1 table)."""
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "attention_bias": False,
        "block_size": 16, "dflash_config": {"mask_token_id": 151669,
                                            "target_layer_ids": [1, 9, 17, 25, 33]},
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
        "layer_types": [FULL] * 5, "max_position_embeddings": 40960, "num_attention_heads": 32,
        "num_hidden_layers": 5, "num_key_value_heads": 8, "num_target_layers": 36,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": False, "use_sliding_window": False,
        "vocab_size": 151936,
    }


def zlab_swa_drafter() -> dict:
    """A Qwen3.6-35B-A3B-style drafter: 6 layers [SWA x5, FULL], theta 1e7 nested under
    rope_parameters, and a stale top-level 1e6 (the lucebox bug, spec/dflash.md §7.4)."""
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
        "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 10, 20, 29, 37]},
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
        "layer_types": [SLIDING] * 5 + [FULL], "num_attention_heads": 32,
        "num_hidden_layers": 6, "num_key_value_heads": 8, "num_target_layers": 40,
        "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"},
        "rope_theta": 1000000, "sliding_window": 2048, "use_sliding_window": True,
        "vocab_size": 248320,
    }


def zlab_gemma4_31b_drafter() -> dict:
    """gemma-4-31B-it drafter (spec/dflash.md §1): 5 layers, 6 captures, SWA [T,T,T,T,F]."""
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
        "dflash_config": {"mask_token_id": 4, "target_layer_ids": [1, 12, 23, 35, 46, 57]},
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 5376, "intermediate_size": 16384,
        "layer_types": [SLIDING] * 4 + [FULL], "num_attention_heads": 32,
        "num_hidden_layers": 5, "num_key_value_heads": 8, "num_target_layers": 60,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 2048,
        "use_sliding_window": True, "vocab_size": 262144,
    }


def hf_assistant_drafter() -> dict:
    """z-lab/dflash tests/fixtures/assistant-config.json (muse_glimmer_assistant)."""
    return {
        "architectures": ["MuseGlimmerAssistantModel"], "attention_dropout": 0, "block_size": 16,
        "bos_token_id": 200000, "dtype": "bfloat16", "eos_token_id": 200001, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 6656, "intermediate_size": 19968,
        "layer_types": [SLIDING] * 5, "mask_token_id": 201818, "max_position_embeddings": 131072,
        "model_type": "muse_glimmer_assistant", "num_attention_heads": 32,
        "num_hidden_layers": 5, "num_key_value_heads": 8, "pad_token_id": 200018,
        "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
        "sliding_window": 2048, "target_layer_ids": [1, 13, 25, 37, 49],
        "transformers_version": "5.15.0.dev0",
    }


def raises(match: str):
    return pytest.raises(ConfigError, match=match)


# ---------------------------------------------------------------------------------- rope_theta


def test_rope_theta_nested_wins_over_top_level():
    cfg = {"rope_parameters": {"rope_theta": 10000000}, "rope_theta": 1000000}
    assert resolve_rope_theta(cfg) == 1e7


def test_rope_theta_top_level_legacy():
    assert resolve_rope_theta({"rope_theta": 1000000, "rope_scaling": None}) == 1e6


def test_rope_theta_genuine_1e6_accepted_nested_and_top_level():
    assert resolve_rope_theta({"rope_parameters": {"rope_theta": 1000000.0}}) == 1e6
    assert resolve_rope_theta({"rope_theta": 1000000.0}) == 1e6


def test_rope_theta_null_falls_through():
    cfg = {"rope_parameters": {"rope_theta": None, "rope_type": "default"}, "rope_theta": 5e5}
    assert resolve_rope_theta(cfg) == 5e5
    cfg = {"rope_parameters": None, "rope_theta": 10000}
    assert resolve_rope_theta(cfg) == 1e4


def test_rope_theta_int_becomes_float():
    theta = resolve_rope_theta({"rope_theta": 10000000})
    assert isinstance(theta, float) and theta == 1e7


@pytest.mark.parametrize("cfg", [
    {}, {"rope_parameters": {}}, {"rope_parameters": None, "rope_theta": None},
    {"rope_parameters": {"rope_theta": None}},
])
def test_rope_theta_missing_fails_naming_both_keys(cfg):
    with pytest.raises(ConfigError) as exc:
        resolve_rope_theta(cfg, where="drafter config.json")
    msg = str(exc.value)
    assert "drafter config.json" in msg
    assert "rope_parameters.rope_theta" in msg and "top-level rope_theta" in msg
    assert "Add one" in msg and "never assumes a default" in msg


def test_rope_theta_per_layer_type_entry():
    # transformers-5 keyed dict with a null flat theta (a Gemma-4-based drafter's config).
    cfg = {"rope_parameters": {"full_attention": {"rope_theta": 1000000},
                               "sliding_attention": {"rope_theta": 10000},
                               "rope_theta": None}}
    assert resolve_rope_theta(cfg, layer_type=FULL) == 1e6
    assert resolve_rope_theta(cfg, layer_type=SLIDING) == 1e4
    with raises("rope_parameters.rope_theta"):
        resolve_rope_theta(cfg)  # no layer type: only the flat places count


@pytest.mark.parametrize("bad", ["1e7", -1.0, 0, True, float("inf")])
def test_rope_theta_rejects_non_positive_or_non_numeric(bad):
    with raises("positive finite number"):
        resolve_rope_theta({"rope_theta": bad})


# ---------------------------------------------------------------------------------- layer ids


@pytest.mark.parametrize("L, D, expected", [
    (36, 5, [1, 9, 17, 25, 33]),
    (64, 5, [1, 16, 31, 46, 61]),
    (60, 6, [1, 12, 23, 35, 46, 57]),
    (28, 5, [1, 7, 13, 19, 25]),
])
def test_build_target_layer_ids_spec_examples(L, D, expected):
    assert build_target_layer_ids(L, D) == expected


@pytest.mark.parametrize("L", [1, 2, 7, 36, 64])
def test_build_target_layer_ids_single_draft_layer_is_middle(L):
    assert build_target_layer_ids(L, 1) == [L // 2]


def test_build_target_layer_ids_rounds_half_to_even():
    # L = 7, D = 3: points 1, 1 + 3/2 = 2.5, 4. round(2.5) = 2 (half to even; half-up gives 3).
    assert build_target_layer_ids(7, 3) == [1, 2, 4]
    # L = 9, D = 3: points 1, 3.5, 6. round(3.5) = 4 (even, same as half-up here).
    assert build_target_layer_ids(9, 3) == [1, 4, 6]


def test_build_target_layer_ids_errors():
    with raises("list target_layer_ids explicitly"):
        build_target_layer_ids(6, 4)  # layers 1..3 cannot hold 4 distinct captures
    with raises("positive integers"):
        build_target_layer_ids(0, 5)
    with raises("positive integers"):
        build_target_layer_ids(36, 0)


@given(st.integers(5, 400), st.data())
def test_build_target_layer_ids_properties(L, data):
    D = data.draw(st.integers(2, min(L - 3, 64)))
    ids = build_target_layer_ids(L, D)
    assert len(ids) == D
    assert ids[0] == 1 and ids[-1] == L - 3
    assert all(a < b for a, b in zip(ids, ids[1:]))


# ---------------------------------------------------------------------------------- embed scale


def test_gemma_embedding_scale_rounding_values_from_spec():
    # spec/dflash.md §4.2: bf16 sqrt(5376) = 73.32 -> 73.5; sqrt(3840) -> 62.0; sqrt(2816) -> 53.0.
    assert embedding_scale_for(5376) == 73.5
    assert embedding_scale_for(3840) == 62.0
    assert embedding_scale_for(2816) == 53.0
    # float16 keeps 10 mantissa bits: spacing 1/16 in [64, 128): 73.3212 -> 73.3125.
    assert embedding_scale_for(5376, "float16") == 73.3125
    assert embedding_scale_for(5376, "float32") == pytest.approx(math.sqrt(5376), rel=1e-7)


def test_bfloat16_rounding_ties_to_even():
    # bf16 keeps 7 mantissa bits: near 1 the spacing is 2^-7.
    assert round_to_dtype(1 + 2 ** -8, "bfloat16") == 1.0  # halfway, even is 1.0
    assert round_to_dtype(1 + 3 * 2 ** -8, "bfloat16") == 1 + 2 ** -6  # halfway, even is up
    assert round_to_dtype(1 + 2 ** -8 + 2 ** -12, "bfloat16") == 1 + 2 ** -7  # above half
    with raises("cannot round"):
        round_to_dtype(1.0, "int8")


# ---------------------------------------------------------------------------------- Qwen3


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


# ---------------------------------------------------------------------------------- Gemma 3


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


def test_gemma4_small_models_refused_by_feature_name():
    raw = gemma4_31b()
    raw["text_config"].update(hidden_size_per_layer_input=256, num_kv_shared_layers=20)
    with pytest.raises(ConfigError) as exc:
        TargetConfig.from_hf(raw)
    msg = str(exc.value)
    assert "per-layer embeddings" in msg and "KV sharing" in msg and "gemma-4-31B" in msg


def test_gemma4_missing_ple_key_means_transformers_default_256():
    raw = gemma4_31b()
    del raw["text_config"]["hidden_size_per_layer_input"]
    with raises("transformers' default 256.*set it to 0"):
        TargetConfig.from_hf(raw)


def test_gemma4_moe_refused():
    raw = gemma4_31b()
    raw["text_config"]["enable_moe_block"] = True
    with raises("enable_moe_block=true .*mixture of experts"):
        TargetConfig.from_hf(raw)


def test_gemma4_last_layer_forced_to_full_with_warning():
    raw = gemma4_31b()
    raw["text_config"]["num_hidden_layers"] = 4
    raw["text_config"]["layer_types"] = [SLIDING] * 4
    with pytest.warns(UserWarning, match="forces it to full_attention"):
        cfg = TargetConfig.from_hf(raw)
    assert cfg.layer_types == (SLIDING,) * 3 + (FULL,)


# ---------------------------------------------------------------------------------- target errors


def test_unknown_architecture_lists_supported():
    with pytest.raises(ConfigError) as exc:
        TargetConfig.from_hf({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    msg = str(exc.value)
    assert "'llama'" in msg and "not a supported target" in msg
    assert "Qwen3" in msg and "Gemma 3" in msg and "Gemma 4" in msg


def test_unknown_multimodal_wrapper():
    with raises("multimodal model_type 'llava'"):
        TargetConfig.from_hf({"model_type": "llava", "text_config": {"model_type": "llama"}})


def test_drafter_config_given_as_target():
    with raises("DrafterConfig.from_hf"):
        TargetConfig.from_hf(zlab_qwen3_8b_drafter())


def test_model_type_and_architecture_disagree():
    raw = qwen3_8b()
    raw["architectures"] = ["Gemma3ForCausalLM"]
    with raises("model_type says qwen3 but architectures"):
        TargetConfig.from_hf(raw)


def test_not_a_dict():
    with raises("expected a dict"):
        TargetConfig.from_hf([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize("mutate, match", [
    (lambda c: c.pop("hidden_size"), "required key 'hidden_size' is missing"),
    (lambda c: c.update(hidden_size="4096"), "hidden_size must be an integer"),
    (lambda c: c.update(num_key_value_heads=5), "not a multiple of num_key_value_heads 5"),
    (lambda c: c.update(rms_norm_eps=-1e-6), "rms_norm_eps must be > 0"),
    (lambda c: c.update(hidden_act="relu"), "hidden_act='relu' is not supported"),
    (lambda c: c.update(layer_types=[FULL] * 35), "35 entries but num_hidden_layers is 36"),
    (lambda c: c.update(layer_types=[LINEAR] * 36), "allows only"),
    (lambda c: c.update(architectures="Qwen3ForCausalLM"), "architectures must be a list"),
])
def test_bad_qwen3_configs(mutate, match):
    raw = qwen3_8b()
    mutate(raw)
    with raises(match):
        TargetConfig.from_hf(raw)


def test_config_error_is_a_dflash_ref_error_and_value_error():
    with pytest.raises(DFlashRefError):
        TargetConfig.from_hf({})
    with pytest.raises(ValueError):
        TargetConfig.from_hf({})


def test_target_config_is_frozen_and_describes_itself():
    cfg = TargetConfig.from_hf(gemma3_27b_text())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.hidden_size = 1  # type: ignore[misc]
    text = cfg.describe()
    assert "gemma3" in text and "52 sliding_attention" in text and "73.5" in text
    assert "rope[full_attention]: theta 1e+06, linear factor 8" in text
    assert "qwen3_5" in TargetConfig.from_hf(qwen35_9b()).describe()
    assert cfg.with_weight_prefix("x.").weight_prefix == "x."


def test_from_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(qwen3_8b()))
    assert TargetConfig.from_file(tmp_path).hidden_size == 4096
    assert TargetConfig.from_file(tmp_path / "config.json").hidden_size == 4096
    with raises("does not exist"):
        TargetConfig.from_file(tmp_path / "nope")
    (tmp_path / "bad.json").write_text("{")
    with raises("not valid JSON"):
        DrafterConfig.from_file(tmp_path / "bad.json")


# ---------------------------------------------------------------------------------- drafter


def test_zlab_qwen3_8b_drafter():
    d = DrafterConfig.from_hf(zlab_qwen3_8b_drafter())
    assert d.layout == "zlab" and d.fc_name == "fc.weight"
    assert d.hidden_norm_name == "hidden_norm.weight"
    assert d.target_layer_ids == (1, 9, 17, 25, 33) and d.target_layer_ids_source == "config"
    assert d.n_capture == 5 and d.block_size == 16 and d.mask_token_id == 151669
    assert (d.hidden_size, d.num_hidden_layers, d.intermediate_size) == (4096, 5, 12288)
    assert (d.num_attention_heads, d.num_key_value_heads, d.head_dim) == (32, 8, 128)
    assert d.rms_norm_eps == 1e-6 and d.vocab_size == 151936 and not d.attention_bias
    assert d.rope_theta == 1e6 and d.layer_types == (FULL,) * 5
    assert not any(d.is_causal_for(i) for i in range(5))
    assert d.visibility(0).max_back is None and d.visibility(0).max_ahead is None
    assert d.causal_override is None and d.input_embedding_scale is None


def test_zlab_drafter_default_ids_from_formula():
    raw = zlab_qwen3_8b_drafter()
    del raw["dflash_config"]["target_layer_ids"]
    d = DrafterConfig.from_hf(raw)
    assert d.target_layer_ids == (1, 9, 17, 25, 33) and d.target_layer_ids_source == "formula"


def test_zlab_drafter_keys_at_top_level():
    raw = zlab_qwen3_8b_drafter()
    raw.update(raw.pop("dflash_config"))
    d = DrafterConfig.from_hf(raw)
    assert d.layout == "zlab" and d.mask_token_id == 151669


def test_drafter_key_in_two_places_must_agree():
    raw = zlab_qwen3_8b_drafter()
    raw["dflash_config"]["block_size"] = 8
    with raises("dflash_config.block_size=8 but block_size=16"):
        DrafterConfig.from_hf(raw)
    raw["dflash_config"]["block_size"] = 16
    assert DrafterConfig.from_hf(raw).block_size == 16


def test_swa_drafter_nested_theta_and_causal_block_default():
    d = DrafterConfig.from_hf(zlab_swa_drafter())
    assert d.rope_theta == 1e7  # nested wins over the stale top-level 1e6
    assert d.swa_convention == "causal_block" and d.sliding_window == 2048
    assert [d.is_causal_for(i) for i in range(6)] == [True] * 5 + [False]
    v = d.visibility(0)
    assert (v.max_back, v.max_ahead) == (2047, 0)
    q = 5000
    assert v.visible(q, q) and v.visible(q, q - 2047) and not v.visible(q, q - 2048)
    assert not v.visible(q, q + 1)  # later noise positions are hidden in a causal block
    full = d.visibility(5)
    assert full.visible(q, 0) and full.visible(q, q + 15)


@pytest.mark.parametrize("conv, back, ahead", [
    ("noncausal_window", 2047, 2047),
    ("bidirectional", 2048, 2048),
    ("ignore", None, None),
])
def test_swa_conventions(conv, back, ahead):
    d = DrafterConfig.from_hf(zlab_swa_drafter(), swa_convention=conv)
    v = d.visibility(0)
    assert (v.max_back, v.max_ahead) == (back, ahead)
    assert not d.is_causal_for(0)


def test_bidirectional_window_is_inclusive():
    v = DrafterConfig.from_hf(zlab_swa_drafter(), swa_convention="bidirectional").visibility(0)
    q = 5000
    # |q - k| <= W on both sides (masking_utils sliding_window_bidirectional_overlay).
    assert v.visible(q, q - 2048) and not v.visible(q, q - 2049)
    assert v.visible(q, q + 2048) and not v.visible(q, q + 2049)


def test_causal_overrides():
    raw = zlab_swa_drafter()
    raw["is_causal"] = True
    d = DrafterConfig.from_hf(raw)
    assert d.causal_override is True and d.is_causal_for(5)
    assert (d.visibility(5).max_back, d.visibility(5).max_ahead) == (None, 0)
    raw = zlab_swa_drafter()
    raw["dflash_config"]["causal"] = False
    d = DrafterConfig.from_hf(raw)
    assert not d.is_causal_for(0)
    assert (d.visibility(0).max_back, d.visibility(0).max_ahead) == (2047, 2047)
    raw["is_causal"] = True
    with raises("dflash_config.causal=False but is_causal=True"):
        DrafterConfig.from_hf(raw)


def test_mimo_style_use_swa_without_layer_types():
    raw = zlab_qwen3_8b_drafter()
    del raw["layer_types"]
    raw["dflash_config"].update(use_swa=True, swa_window_size=1024, attention_sink_bias=True)
    d = DrafterConfig.from_hf(raw)
    assert d.layer_types == (SLIDING,) * 5 and d.sliding_window == 1024
    assert d.attention_sink_bias


def test_hf_assistant_drafter():
    d = DrafterConfig.from_hf(hf_assistant_drafter())
    assert d.layout == "hf_assistant" and d.swa_convention == "bidirectional"
    assert d.fc_name == "encoder.fc.weight"
    assert d.hidden_norm_name == "encoder.output_norm_enc.weight"
    assert d.vocab_size is None and d.rope_theta == 5e5 and d.rms_norm_eps == 1e-5
    assert d.target_layer_ids == (1, 13, 25, 37, 49) and d.block_size == 16
    assert (d.visibility(0).max_back, d.visibility(0).max_ahead) == (2048, 2048)


def test_hf_assistant_defaults_all_sliding_window_2048():
    raw = hf_assistant_drafter()
    del raw["layer_types"], raw["sliding_window"]
    d = DrafterConfig.from_hf(raw)
    assert d.layer_types == (SLIDING,) * 5 and d.sliding_window == 2048
    assert "sliding_window=2048 (assistant default)" in d.defaults_used
    assert "sliding window 2048, convention bidirectional" in d.describe()


def test_use_sliding_window_false_with_sliding_layers_warns():
    raw = zlab_swa_drafter()
    raw["use_sliding_window"] = False
    with pytest.warns(UserWarning, match="swa_convention='ignore'"):
        DrafterConfig.from_hf(raw)


@pytest.mark.parametrize("mutate, match", [
    (lambda c: c.pop("rope_theta"), "no RoPE base"),
    (lambda c: c["dflash_config"].pop("mask_token_id"), "mask_token_id is missing"),
    (lambda c: c.pop("block_size"), "block_size is missing"),
    (lambda c: (c["dflash_config"].pop("target_layer_ids"), c.pop("num_target_layers")),
     "no target_layer_ids and no num_target_layers"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[1, 9, 9]), "distinct non-negative"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[1, 40]), "num_target_layers is 36"),
    (lambda c: c.update(layer_types=[SLIDING] * 5), "no window size"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
    (lambda c: c.update(mask_token_id=151669, vocab_size=1000), "outside vocab_size 1000"),
    (lambda c: c.update(architectures=["DFlash2DraftModel"]), "DFlash2DraftModel"),
    (lambda c: c.update(architectures=["Qwen3ForCausalLM"]), "TargetConfig.from_hf"),
])
def test_bad_drafter_configs(mutate, match):
    raw = zlab_qwen3_8b_drafter()
    mutate(raw)
    with raises(match):
        DrafterConfig.from_hf(raw)


def test_drafter_layout_must_be_detectable_or_given():
    raw = zlab_qwen3_8b_drafter()
    del raw["auto_map"], raw["architectures"]
    raw.update(raw.pop("dflash_config"))
    with raises("Pass layout='zlab'"):
        DrafterConfig.from_hf(raw)
    assert DrafterConfig.from_hf(raw, layout="zlab").layout == "zlab"
    with raises("unknown"):
        DrafterConfig.from_hf(raw, layout="eagle")
    with raises("swa_convention 'causal' is unknown"):
        DrafterConfig.from_hf(zlab_swa_drafter(), swa_convention="causal")


# ---------------------------------------------------------------------------------- validate


def test_validate_matching_pair_returns_self():
    d = DrafterConfig.from_hf(zlab_qwen3_8b_drafter())
    t = TargetConfig.from_hf(qwen3_8b())
    assert d.validate_against(t) is d
    assert d.validate_against(t, fc_shape=(4096, 20480)) is d  # [H, 5 * H]
    assert d.noise_embedding_scale(t) == 1.0


def test_validate_hidden_and_vocab_mismatch():
    d = DrafterConfig.from_hf(zlab_qwen3_8b_drafter())
    with raises("drafter hidden_size 4096 != target hidden_size 2560"):
        d.validate_against(TargetConfig.from_hf(qwen3_4b()))
    raw = qwen3_8b()
    raw["vocab_size"] = 152064
    with raises("drafter vocab_size 151936 != target vocab_size 152064"):
        d.validate_against(TargetConfig.from_hf(raw))


def test_validate_ids_must_fit_the_target():
    raw = zlab_qwen3_8b_drafter()
    raw["dflash_config"]["target_layer_ids"] = [1, 16, 31, 46, 61]  # a 64-layer target's ids
    raw["num_target_layers"] = 64
    with pytest.warns(UserWarning, match="64-layer target"):
        with raises(r"include \[46, 61\], beyond the target's layers 0..35"):
            DrafterConfig.from_hf(raw).validate_against(TargetConfig.from_hf(qwen3_8b()))


def test_validate_last_layer_is_refused():
    raw = zlab_qwen3_8b_drafter()
    raw["dflash_config"]["target_layer_ids"] = [2, 10, 18, 26, 35]
    with raises("last layer 35.*final-normed"):
        DrafterConfig.from_hf(raw).validate_against(TargetConfig.from_hf(qwen3_8b()))


def test_validate_formula_drafter_for_another_depth_is_an_error():
    raw = zlab_qwen3_8b_drafter()
    del raw["dflash_config"]["target_layer_ids"]
    raw["num_target_layers"] = 64
    with raises("64-layer target .* default target_layer_ids depend on it"):
        DrafterConfig.from_hf(raw).validate_against(TargetConfig.from_hf(qwen3_8b()))


def test_validate_mask_outside_target_vocab():
    raw = zlab_qwen3_8b_drafter()
    del raw["vocab_size"]
    raw["dflash_config"]["mask_token_id"] = 151936
    with raises("mask_token_id 151936 is outside the target vocabulary"):
        DrafterConfig.from_hf(raw).validate_against(TargetConfig.from_hf(qwen3_8b()))


def test_validate_fc_shapes():
    d = DrafterConfig.from_hf(zlab_qwen3_8b_drafter())
    t = TargetConfig.from_hf(qwen3_8b())
    with raises("input width 20481 is not a multiple of hidden_size 4096"):
        d.validate_against(t, fc_shape=(4096, 20481))
    with raises("is it transposed"):
        d.validate_against(t, fc_shape=(20480, 4096))
    with raises("implies 6 captured layers but target_layer_ids lists 5"):
        d.validate_against(t, fc_shape=(4096, 6 * 4096))
    with raises("two positive ints"):
        d.validate_against(t, fc_shape=(4096,))


def test_validate_fc_wins_over_formula_with_warning():
    raw = zlab_qwen3_8b_drafter()
    del raw["dflash_config"]["target_layer_ids"]
    d = DrafterConfig.from_hf(raw)
    t = TargetConfig.from_hf(qwen3_8b())
    with pytest.warns(UserWarning, match="implies 6 captured layers"):
        fixed = d.validate_against(t, fc_shape=(4096, 6 * 4096))
    # (36, 6): step 32/5 = 6.4 -> 1, 7.4, 13.8, 20.2, 26.6, 33 -> [1, 7, 14, 20, 27, 33].
    assert fixed.target_layer_ids == (1, 7, 14, 20, 27, 33)
    assert fixed.target_layer_ids_source == "fc_shape" and fixed.n_capture == 6
    assert d.target_layer_ids == (1, 9, 17, 25, 33)  # the original is untouched


def test_gemma4_drafter_against_gemma4_target():
    d = DrafterConfig.from_hf(zlab_gemma4_31b_drafter())
    t = TargetConfig.from_hf(gemma4_31b())
    assert d.n_capture == 6 and d.num_hidden_layers == 5
    assert d.rope_theta == 1e6  # genuine 1e6 for Gemma 4 drafters
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert d.validate_against(t, fc_shape=(5376, 6 * 5376)) is d
    assert d.noise_embedding_scale(t) == 73.5
    raw = zlab_gemma4_31b_drafter()
    raw["dflash_config"]["input_embedding_scale"] = 2.0
    assert DrafterConfig.from_hf(raw).noise_embedding_scale(t) == 2.0


def test_hf_assistant_without_vocab_validates_against_target_vocab():
    d = DrafterConfig.from_hf(hf_assistant_drafter())
    target = copy.deepcopy(qwen3_8b())
    target.update(hidden_size=6656, num_hidden_layers=52, vocab_size=202048,
                  num_attention_heads=52, num_key_value_heads=4)
    t = TargetConfig.from_hf(target)
    assert d.validate_against(t) is d
    target["vocab_size"] = 200000  # mask 201818 no longer fits
    with raises("outside the target vocabulary"):
        d.validate_against(TargetConfig.from_hf(target))


def test_drafter_describe_and_frozen():
    d = DrafterConfig.from_hf(zlab_swa_drafter())
    text = d.describe()
    assert "zlab layout" in text and "[1, 10, 20, 29, 37]" in text and "causal_block" in text
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.block_size = 8  # type: ignore[misc]
    with pytest.raises(IndexError):
        d.is_causal_for(6)
