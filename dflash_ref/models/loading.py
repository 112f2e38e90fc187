"""Reading a target checkpoint into a :class:`~dflash_ref.models.target.TargetModel`, and the
checks that refuse what the model code does not implement (never run it wrong).

``TargetModel.from_pretrained`` and ``TargetModel.from_gguf`` are :func:`from_pretrained` and
:func:`from_gguf`; the constructor calls :func:`target_weights` on the weights it is given.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from dflash_ref.config import TargetConfig, expected_tensors
from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.compare import check_finite_weights
from dflash_ref.io.safetensors_io import check_tensor_shapes, open_checkpoint
from dflash_ref.models.assemble import FUSED_OPS
from dflash_ref.models.moe import fuse_expert_tensors


def from_pretrained(cls, path, backend="numpy", target_layer_ids=None, embedding_scale=None,
                    check_finite: bool = False, fused=FUSED_OPS):
    """Load ``config.json`` + ``*.safetensors`` (single or sharded) from directory ``path``.

    ``embedding_scale`` (Gemma only): None follows HF, sqrt(hidden_size) rounded to the
    checkpoint's ``torch_dtype`` (HF casts its normaliser to the dtype it computes in); a
    dtype name or a number overrides (:meth:`TargetConfig.with_embedding_scale
    <dflash_ref.config.TargetConfig.with_embedding_scale>`; docs/conventions.md).
    ``check_finite``: refuse weights holding NaN or inf, naming the tensors
    (:func:`~dflash_ref.io.compare.check_finite_weights`). ``fused``: as for the class.
    """
    path = Path(path)
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise FormatError(f"{path} has no config.json; expected a Hugging Face model directory")
    config = TargetConfig.from_file(cfg_path)  # a malformed file is named in the error
    config = config.with_embedding_scale(embedding_scale)
    weights = read_checkpoint_weights(path)
    if check_finite:
        check_finite_weights(weights, path)
    config = match_weight_prefix(config, weights)
    return cls(config, weights, backend=backend, target_layer_ids=target_layer_ids, fused=fused)


def from_gguf(cls, path, backend="numpy", target_layer_ids=None, embedding_scale=None,
              check_finite: bool = False, fused=FUSED_OPS):
    """Load a llama.cpp GGUF of arch ``qwen3``, ``qwen35`` or ``gemma3`` (a path, or a file
    already opened with :func:`~dflash_ref.io.gguf_io.open_gguf`).

    :func:`~dflash_ref.io.convert_target.read_gguf_target` undoes what llama.cpp's converter
    baked in (the +1 of (1+w) norms, ``ssm_a = -exp(A_log)``, the tiled GDN value heads) and
    dequantizes, so the forward is the safetensors one up to the storage error. Keys the
    file lacks take llama.cpp's values, each listed in ``config.defaults_used``.

    ``embedding_scale`` (Gemma only): None follows llama.cpp, whose format this is: the
    unrounded float32 ``sqrtf(n_embd)`` (25.298 for the 640-wide 270M, not HF's bf16 25.25);
    a dtype name or a number overrides (docs/conventions.md). ``check_finite``: refuse
    dequantized weights holding NaN or inf, naming the tensors. ``fused``: as for the class.
    """
    from dflash_ref.io.convert_target import read_gguf_target
    from dflash_ref.io.llama_cpp_defaults import LLAMA_CPP_DEFAULTS_KEY

    config_dict, weights = read_gguf_target(path)
    if check_finite:
        check_finite_weights(weights, path)
    config = TargetConfig.from_hf(config_dict)
    taken = tuple(config_dict.get(LLAMA_CPP_DEFAULTS_KEY, ()))
    config = replace(config, defaults_used=config.defaults_used + taken)
    config = config.with_embedding_scale(embedding_scale)
    return cls(config, weights, backend=backend, target_layer_ids=target_layer_ids, fused=fused)


def read_checkpoint_weights(path: Path, skip: tuple[str, ...] = ()) -> dict:
    """Every tensor of the checkpoint directory ``path`` (but those named in ``skip``) as
    float32, with a progress bar on stderr while it reads, when stderr is a terminal (a large
    model reads for seconds)."""
    from tqdm import tqdm

    ckpt = open_checkpoint(path)
    names = tqdm([n for n in ckpt if n not in skip], desc=f"loading {path.name}",
                 unit="tensor", leave=False, disable=not sys.stderr.isatty())
    return {name: ckpt.load(name) for name in names}


def match_weight_prefix(cfg: TargetConfig, weights) -> TargetConfig:
    """Pick the decoder-tensor prefix the checkpoint actually uses among the layouts seen for
    this wrapper (multimodal checkpoints differ: ``model.language_model.`` vs
    ``language_model.model.``); the config's own guess when none matches (errors name it)."""
    for prefix in (cfg.weight_prefix, *cfg.weight_prefix_candidates):
        if f"{prefix}embed_tokens.weight" in weights:
            if prefix != cfg.weight_prefix:
                cfg = cfg.with_weight_prefix(prefix)
            break
    if not cfg.tie_word_embeddings and cfg.lm_head_name not in weights:
        for name in ("lm_head.weight", "language_model.lm_head.weight"):
            if name in weights:
                return replace(cfg, lm_head_name=name)
    return cfg


def target_weights(cfg: TargetConfig, weights: dict) -> dict:
    """``weights`` checked against ``cfg`` (:func:`check_supported`, then every tensor's name and
    shape), an MoE target's expert tensors fused first."""
    check_supported(cfg)
    weights = fuse_expert_tensors(weights) if cfg.moe is not None else weights
    check_tensor_shapes(
        weights, expected_tensors(cfg), f"the {cfg.family} checkpoint",
        hint=f"is weight_prefix {cfg.weight_prefix!r} right and the checkpoint complete?")
    return weights


def check_supported(cfg: TargetConfig) -> None:
    """Refuse, by name, config features the model code does not implement (never run them wrong)."""
    problems = []
    if cfg.moe is not None and cfg.family == "qwen3_next":
        problems.append(f"Qwen3-Next mixture-of-experts MLPs ({cfg.moe.num_experts} experts; "
                        f"the block is implemented and checked for Qwen3.5 MoE and Gemma 4 only)")
    if cfg.attention_bias:
        problems.append("attention_bias")
    if cfg.hidden_act not in ("silu", "gelu_pytorch_tanh"):
        problems.append(f"hidden_act {cfg.hidden_act!r} (silu and gelu_pytorch_tanh are)")
    for i in range(cfg.num_hidden_layers):
        if cfg.layer_types[i] != "linear_attention" and cfg.rope_for(i).rope_type not in (
                "default", "linear", "proportional"):
            problems.append(f"rope_type {cfg.rope_for(i).rope_type!r} (layer {i})")
            break
    if problems:
        raise ConfigError(
            f"{cfg.family} target uses features the reference model does not implement: "
            f"{'; '.join(problems)}. Supported: Qwen3 dense, Qwen3.5 / Qwen3-Next dense-MLP "
            f"hybrids, Qwen3.5 MoE, Gemma 3 text, Gemma 4 text (dense, PLE + KV sharing, MoE)."
        )
