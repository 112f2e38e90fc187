"""Tiny checkpoints in the real layouts, built deterministically from a seed.

Tests and notebooks use these instead of downloads: each is a directory with
a Hugging Face ``config.json`` (the same fields a published checkpoint has) and
``model.safetensors`` (or shards with ``model.safetensors.index.json``) with HF tensor names,
loaded through the same ``from_pretrained`` a real checkpoint goes through.

Weights are random but well-conditioned: matrices ~ N(0, 1/fan_in), so activations keep unit
scale through the layers and logits are decisive (few near-ties).

The demo checkpoints shipped in ``dflash_ref/data/demo`` are not built here: they are trained by
``scripts/train_demo_pair.py`` (docs/training.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

TINY_FAMILIES = ("qwen3", "qwen3_5", "gemma3")


def tiny_target_config(family: str = "qwen3", **overrides) -> dict:
    """A small HF config.json dict for ``family`` ("qwen3" | "qwen3_5" | "gemma3")."""
    common = {
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "attention_bias": False,
        "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
    }
    if family == "qwen3":
        cfg = {
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **common,
            "hidden_act": "silu", "rope_theta": 1000000.0, "rope_scaling": None,
            "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": None,
        }
    elif family == "qwen3_5":
        cfg = {
            "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", **common,
            "head_dim": 32, "hidden_act": "silu", "tie_word_embeddings": False,
            "layer_types": ["linear_attention", "linear_attention", "linear_attention",
                            "full_attention"],
            "full_attention_interval": 4, "attn_output_gate": True,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
            "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                                "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                                "mrope_interleaved": True},
        }
    elif family == "gemma3":
        cfg = {
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", **common,
            "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 16,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": None,
            "sliding_window": 8, "sliding_window_pattern": 2,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "final_logit_softcapping": 30.0, "attn_logit_softcapping": None,
            "tie_word_embeddings": True,
        }
    else:
        raise ValueError(f"unknown tiny family {family!r}; choose from {TINY_FAMILIES}")
    cfg.update(overrides)
    return cfg


def tiny_weights(shapes: dict[str, tuple[int, ...]], seed: int, norm_offset: float) -> dict:
    """Random weights for every ``name -> shape`` (HF [out, in] layout), deterministic in seed."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("A_log"):
            w = np.log(rng.uniform(1.0, 8.0, shape))
        elif name.endswith("dt_bias"):
            w = rng.normal(0.0, 0.5, shape)
        elif name.endswith("conv1d.weight"):
            w = rng.normal(0.0, 1.0 / np.sqrt(shape[-1]), shape)
        elif len(shape) == 1:  # norm weights: raw w around 1 (or around 0 for (1+w) norms)
            w = (1.0 - norm_offset) + rng.normal(0.0, 0.1, shape)
            if name.endswith("linear_attn.norm.weight"):  # GDN gated norm is always plain w
                w = 1.0 + rng.normal(0.0, 0.1, shape)
        elif "embed_tokens" in name:
            w = rng.normal(0.0, 1.0, shape)
        else:
            w = rng.normal(0.0, 1.0 / np.sqrt(shape[1]), shape)
        out[name] = w.astype(np.float32)
    return out


def write_tiny_target(path, family: str = "qwen3", seed: int = 0, dtype: str | None = None,
                      shard_size: int | None = None, **overrides) -> Path:
    """Write a tiny ``family`` target checkpoint into ``path``; returns the directory.

    ``dtype`` ("bfloat16", "float16", "float32") sets the storage; ``shard_size`` (bytes) writes
    shards plus ``model.safetensors.index.json``; ``overrides`` replace config.json fields.
    """
    from dflash_ref.config import TargetConfig, expected_tensors
    from dflash_ref.io.safetensors_io import write_safetensors

    config = tiny_target_config(family, **overrides)
    cfg = TargetConfig.from_hf(config)
    tensors = tiny_weights(expected_tensors(cfg), seed, cfg.norm_offset)
    if dtype is not None:
        config["torch_dtype"] = dtype
    return write_safetensors(path, tensors, config=config, shard_size=shard_size, dtype=dtype,
                             overwrite=True)


def tiny_drafter_config(target_config: dict, block_size: int = 8, num_hidden_layers: int = 2,
                        target_layer_ids=(0, 2), mask_token_id: int = 255,
                        layout: str = "zlab", **overrides) -> dict:
    """A drafter config.json dict for a tiny target, in the z-lab layout (``dflash_config``)
    or the HF DFlash-assistant layout (DFlash keys at the top level)."""
    text = target_config.get("text_config", target_config)
    theta = text.get("rope_theta") or text.get("rope_parameters", {}).get("rope_theta", 1e6)
    cfg = {
        "hidden_size": text["hidden_size"], "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 2 * text["hidden_size"], "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "vocab_size": text["vocab_size"], "rope_theta": theta,
        "rope_scaling": None, "max_position_embeddings": 4096, "attention_bias": False,
        "tie_word_embeddings": False, "torch_dtype": "float32",
        "num_target_layers": text["num_hidden_layers"], "block_size": block_size,
        "layer_types": ["full_attention"] * num_hidden_layers,
        "sliding_window": None, "use_sliding_window": False,
    }
    if layout == "zlab":
        cfg.update({
            "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
            "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
            "dflash_config": {"mask_token_id": mask_token_id,
                              "target_layer_ids": list(target_layer_ids)},
        })
    elif layout == "hf_assistant":
        cfg.update({
            "architectures": ["MuseGlimmerAssistantModel"], "model_type": "muse_glimmer_assistant",
            "mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids),
        })
    else:
        raise ValueError(f"unknown drafter layout {layout!r}; choose 'zlab' or 'hf_assistant'")
    cfg.update(overrides)
    return cfg


def write_tiny_drafter(path, target_dir, seed: int = 1, dtype: str | None = None,
                       **config_kw) -> Path:
    """Write a tiny drafter for the tiny target in ``target_dir`` into ``path``."""
    import json

    from dflash_ref.config import DrafterConfig, drafter_expected_tensors
    from dflash_ref.io.safetensors_io import write_safetensors

    target_config = json.loads((Path(target_dir) / "config.json").read_text())
    config = tiny_drafter_config(target_config, **config_kw)
    cfg = DrafterConfig.from_hf(config)
    tensors = tiny_weights(drafter_expected_tensors(cfg), seed, norm_offset=0.0)
    return write_safetensors(path, tensors, config=config, dtype=dtype, overwrite=True)
