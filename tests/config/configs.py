"""Published config.json dicts shared by the config tests, written out here from the published
field names (docs/config.md; transformers' config classes; z-lab/dflash ``dflash/model.py``), and
the ``raises`` helper. Not a test module.
"""

from __future__ import annotations

import pytest

from dflash_ref.errors import ConfigError

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
    """text_config of Qwen/Qwen3.5-9B (its published sizes; nested rope_parameters)."""
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
    """z-lab/Qwen3-8B-DFlash-b16 (its published config.json)."""
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
    rope_parameters, and a stale top-level 1e6 (the lucebox bug;
    docs/config.md, "The RoPE-base rule")."""
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
    """gemma-4-31B-it drafter (its published config.json): 5 layers, 6 captures, SWA [T,T,T,T,F]."""
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
