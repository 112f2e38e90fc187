"""Target models: HF checkpoint <-> GGUF with llama.cpp's names, values and metadata.

:func:`read_gguf_target` is what :meth:`TargetModel.from_gguf
<dflash_ref.models.target.TargetModel.from_gguf>` uses: it turns a GGUF of arch ``qwen3``,
``qwen35`` or ``gemma3`` (the names ``gguf.MODEL_ARCH`` gives Qwen3, Qwen3.5 and Gemma 3) back
into an HF ``config.json`` dict and HF-named float32 weights, so the model code is the same one
``from_pretrained`` runs. :func:`convert_target` is its inverse, written for tests and tiny
models; it follows llama.cpp's ``convert_hf_to_gguf.py`` value by value:

=====================  =========================================================================
what                   llama.cpp stores (and :func:`read_gguf_target` undoes)
=====================  =========================================================================
(1 + w) RMSNorms       ``w + 1`` baked in, so the runtime multiplies by the stored value (Qwen3.5,
                       Gemma 3). The GDN gated norm ``linear_attn.norm`` is plain w: no shift.
                       Qwen3 norms are plain w: no shift.
``A_log``              ``ssm_a = -exp(A_log)``; read back as ``log(-ssm_a)``.
``dt_bias``            ``ssm_dt.bias``.
``conv1d.weight``      ``[conv_dim, 1, K]`` squeezed to NumPy ``[conv_dim, K]``
                       (ggml {K, conv_dim}).
GDN value heads        reordered from HF's grouped order (value head h uses key head h // r) to
                       ggml's tiled order (h % H) when r = HV / H > 1: the v rows of
                       ``in_proj_qkv``, ``in_proj_z``, ``in_proj_a``/``b``, ``A_log``, ``dt_bias``,
                       the v channels of ``conv1d`` and the v columns of ``out_proj``
                       (docs/gdn.md, "4. GQA: the grouped vs tiled pitfall").
q / k projections      **not permuted**: llama.cpp permutes q/k rows only for its "normal" (GPT-J
                       style, adjacent-pair) RoPE of the llama arch. Qwen and Gemma use NEOX
                       rotate-half RoPE, as HF does, so the rows stay as they are.
``q_proj`` (Qwen3.5)   the fused [query | gate] rows per head, unchanged (``attn_q``).
tied lm_head           no ``output.weight``; the runtime uses ``token_embd``.
=====================  =========================================================================

Metadata that llama.cpp hard-codes for Gemma 3 (the sliding pattern 6, the local RoPE base 10000,
the attention scale) is also written as keys (``attention.sliding_window_pattern``,
``rope.freq_base_swa``, ``attention.scale``, ``embedding_scale``) so that tiny models with other
values survive the round trip; a file without them gets llama.cpp's values
(:mod:`dflash_ref.io.llama_cpp_defaults`).
"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from dflash_ref.config import FULL, LINEAR, SLIDING, TargetConfig
from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.convert_common import (
    FILE_TYPE,
    ggml_type_name,
    meta,
    tensor_type,
    transformer_keys,
    write_converted,
)
from dflash_ref.io.gguf_io import GGUFFile, open_gguf
from dflash_ref.io.llama_cpp_defaults import LLAMA_CPP_DEFAULTS_KEY, gemma3_config, head_dims
from dflash_ref.io.safetensors_io import open_checkpoint
from dflash_ref.io.vocab_gguf import tokenizer_metadata
from dflash_ref.io.writing import Replace, replace_any

# Our family -> llama.cpp arch (gguf.MODEL_ARCH_NAMES) and back.
GGUF_ARCH = {"qwen3": "qwen3", "qwen3_5": "qwen35", "gemma3": "gemma3"}
FAMILY_OF_ARCH = {v: k for k, v in GGUF_ARCH.items()}

GLOBAL_NAMES = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}
LM_HEAD = "output.weight"
_ATTENTION = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# Per-layer HF suffix (after "{prefix}layers.N.") -> GGUF suffix (after "blk.N."), per family.
# tests/io/test_convert_target.py checks every entry against gguf.get_tensor_name_map.
LAYER_NAMES: dict[str, dict[str, str]] = {
    "qwen3": {**_ATTENTION, "post_attention_layernorm.weight": "ffn_norm.weight"},
    "qwen3_5": {
        **_ATTENTION,
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
        "linear_attn.in_proj_z.weight": "attn_gate.weight",
        "linear_attn.in_proj_b.weight": "ssm_beta.weight",
        "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
        "linear_attn.A_log": "ssm_a",
        "linear_attn.conv1d.weight": "ssm_conv1d.weight",
        "linear_attn.dt_bias": "ssm_dt.bias",
        "linear_attn.norm.weight": "ssm_norm.weight",
        "linear_attn.out_proj.weight": "ssm_out.weight",
    },
    "gemma3": {
        **_ATTENTION,
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight": "ffn_norm.weight",
        "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    },
}

_GGUF_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")

# ---------------------------------------------------------------------------------- transforms


def swap_head_axes(x: np.ndarray, axis: int, n_outer: int, n_inner: int,
                   width: int) -> np.ndarray:
    """View ``axis`` of x as [n_outer, n_inner, width] and swap the first two: [n_inner, n_outer,
    width]. GDN value heads grouped -> tiled: (n_outer, n_inner) = (H, r); tiled -> grouped:
    (r, H). The same call with the arguments swapped undoes it."""
    x = np.moveaxis(np.asarray(x), axis, 0)
    rest = x.shape[1:]
    y = x.reshape(n_outer, n_inner, width, *rest).swapaxes(0, 1)  # [n_inner, n_outer, width, ...]
    return np.moveaxis(y.reshape(n_outer * n_inner * width, *rest), 0, axis)


def _reorder_v(cfg: TargetConfig, suffix: str, x: np.ndarray, to_gguf: bool) -> np.ndarray:
    """The GDN value-head permutation of one tensor (grouped <-> tiled; docs/gdn.md)."""
    g = cfg.gdn
    H, r, dv = g.num_key_heads, g.heads_per_key_head, g.value_head_dim
    if r == 1:
        return x
    outer, inner = (H, r) if to_gguf else (r, H)
    qk = 2 * g.key_dim  # q and k rows/channels come first and stay in place
    name = suffix[len("linear_attn."):]
    if name in ("in_proj_qkv.weight", "conv1d.weight"):
        return np.concatenate([x[:qk], swap_head_axes(x[qk:], 0, outer, inner, dv)], axis=0)
    if name == "in_proj_z.weight":
        return swap_head_axes(x, 0, outer, inner, dv)
    if name in ("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias"):
        return swap_head_axes(x, 0, outer, inner, 1)
    if name == "out_proj.weight":
        return swap_head_axes(x, 1, outer, inner, dv)
    return x


def _norm_shift(cfg: TargetConfig, suffix: str) -> float:
    """1.0 for the (1 + w) norms llama.cpp bakes the +1 into; 0.0 otherwise."""
    if cfg.norm_offset == 0.0 or not suffix.endswith("norm.weight"):
        return 0.0
    return 0.0 if suffix == "linear_attn.norm.weight" else cfg.norm_offset


def to_gguf_value(cfg: TargetConfig, suffix: str, x: np.ndarray) -> np.ndarray:
    """An HF tensor (name relative to the layer, or a global name) as llama.cpp stores it."""
    x = np.asarray(x, dtype=np.float32)
    if suffix.startswith("linear_attn."):
        x = _reorder_v(cfg, suffix, x, to_gguf=True)
        if suffix == "linear_attn.A_log":
            x = -np.exp(x)
        elif suffix == "linear_attn.conv1d.weight":
            x = x.reshape(x.shape[0], x.shape[-1])  # [conv_dim, 1, K] -> [conv_dim, K]
    return x + np.float32(_norm_shift(cfg, suffix))


def from_gguf_value(cfg: TargetConfig, suffix: str, x: np.ndarray, where: str) -> np.ndarray:
    """The inverse of :func:`to_gguf_value`: a stored GGUF tensor back to its HF value."""
    x = np.asarray(x, dtype=np.float32) - np.float32(_norm_shift(cfg, suffix))
    if suffix.startswith("linear_attn."):
        if suffix == "linear_attn.A_log":
            if np.any(x >= 0):
                raise FormatError(f"{where}: ssm_a must be -exp(A_log) < 0 everywhere; found "
                                  f"values >= 0 (was A_log stored raw?)")
            x = np.log(-x)
        elif suffix == "linear_attn.conv1d.weight":
            x = x.reshape(x.shape[0], 1, x.shape[-1])  # [conv_dim, K] -> [conv_dim, 1, K]
        x = _reorder_v(cfg, suffix, x, to_gguf=False)
    return x


# ---------------------------------------------------------------------------------- HF -> GGUF


def _check_convertible(cfg: TargetConfig) -> None:
    """Refuse, by name, what this converter does not write (never write a wrong file)."""
    problems = []
    if cfg.family not in GGUF_ARCH:
        problems.append(f"family {cfg.family} (supported: {sorted(GGUF_ARCH)})")
    if cfg.moe is not None or cfg.attention_bias:
        problems.append("mixture-of-experts MLPs / attention biases")
    if cfg.family == "qwen3" and SLIDING in cfg.layer_types:
        problems.append("Qwen3 sliding-window layers (llama.cpp's qwen3 arch has none)")
    if cfg.family == "qwen3_5":
        if not cfg.attn_output_gate:
            problems.append("Qwen3.5 without the attention output gate")
        if _hybrid_interval(cfg) is None:
            problems.append(f"layer_types {list(cfg.layer_types)} that full_attention_interval "
                            f"cannot express")
    if cfg.family == "gemma3" and cfg.attn_logit_softcapping:
        problems.append("attn_logit_softcapping (removed in Gemma 3; llama.cpp asserts it off)")
    if problems:
        raise ConfigError(f"convert_target cannot write this {cfg.family} target: "
                          f"{'; '.join(problems)}")


def _hybrid_interval(cfg: TargetConfig) -> int | None:
    """full_attention_interval n such that layer i is full iff (i + 1) % n == 0, or None."""
    n = cfg.layer_types.index(FULL) + 1
    rule = tuple(FULL if (i + 1) % n == 0 else LINEAR for i in range(cfg.num_hidden_layers))
    return n if rule == cfg.layer_types else None


def target_metadata(cfg: TargetConfig, arch: str, ggml_type: str) -> dict[str, Any]:
    """The llama.cpp keys of a ``qwen3`` / ``qwen35`` / ``gemma3`` target (arch-prefixed)."""
    a = arch + "."
    full = cfg.rope_by_type[FULL] if FULL in cfg.rope_by_type else next(
        iter(cfg.rope_by_type.values()))
    md: dict[str, Any] = {
        "general.name": cfg.architecture or cfg.family,
        **transformer_keys(arch, cfg, FILE_TYPE[ggml_type]),
        a + "rope.freq_base": full.theta,
        a + "vocab_size": cfg.vocab_size,
    }
    if cfg.max_position_embeddings is not None:
        md[a + "context_length"] = cfg.max_position_embeddings
    if full.rope_type == "linear":
        md[a + "rope.scaling.type"] = "linear"
        md[a + "rope.scaling.factor"] = full.factor
    if cfg.family == "qwen3_5":
        g = cfg.gdn
        md.update({
            a + "ssm.conv_kernel": g.conv_kernel_dim,
            a + "ssm.state_size": g.key_head_dim,
            a + "ssm.group_count": g.num_key_heads,
            a + "ssm.time_step_rank": g.num_value_heads,
            a + "ssm.inner_size": g.value_dim,
            a + "full_attention_interval": _hybrid_interval(cfg),
            a + "rope.dimension_count": full.rotary_dim,
        })
        if full.mrope_section:
            md[a + "rope.dimension_sections"] = (list(full.mrope_section) + [0, 0, 0, 0])[:4]
    if cfg.family == "gemma3":
        if cfg.sliding_window:  # llama.cpp's converter also omits it without sliding layers
            md[a + "attention.sliding_window"] = cfg.sliding_window
        md[a + "attention.sliding_window_pattern"] = [t == SLIDING for t in cfg.layer_types]
        if SLIDING in cfg.rope_by_type:
            md[a + "rope.freq_base_swa"] = cfg.rope_by_type[SLIDING].theta
        md[a + "attention.scale"] = cfg.attention_scale
        md[a + "embedding_scale"] = cfg.embedding_scale
        if cfg.final_logit_softcapping:
            md[a + "final_logit_softcapping"] = cfg.final_logit_softcapping
    return md


def _weight_prefix(cfg: TargetConfig, names) -> str:
    for p in cfg.weight_prefix_candidates:
        if f"{p}embed_tokens.weight" in names:
            return p
    raise FormatError(f"no {{prefix}}embed_tokens.weight for any of the prefixes "
                      f"{list(cfg.weight_prefix_candidates)}; found e.g. {sorted(names)[:4]}")


def convert_target(src_dir, out_path, qtype: str = "f32", *, fallback: str | None = None,
                   progress: bool | None = None, replace: Replace = replace_any) -> Path:
    """Write a Qwen3 / Qwen3.5 / Gemma 3 checkpoint directory as a llama.cpp-style GGUF.

    Norms, ``ssm_a``, ``ssm_dt.bias`` and ``ssm_conv1d`` are F32; other matrices are ``qtype``
    (see :func:`~dflash_ref.io.convert_common.tensor_type` for ``fallback``). Unsupported
    features are a ConfigError naming them. ``replace``: which existing file at ``out_path`` may
    be replaced (default any; :mod:`dflash_ref.io.writing`). Returns the written path.
    """
    ggml_type = ggml_type_name(qtype)
    ckpt = open_checkpoint(src_dir)
    if ckpt.config is None:
        raise FormatError(f"{src_dir} has no config.json; expected a Hugging Face model directory")
    cfg = TargetConfig.from_hf(ckpt.config)
    _check_convertible(cfg)
    p = _weight_prefix(cfg, set(ckpt))
    cfg = cfg.with_weight_prefix(p)
    layer_names = LAYER_NAMES[cfg.family]
    plan: list[tuple[str, str, str]] = []  # (hf name, suffix for the transforms, gguf name)
    for hf_suffix, g_name in GLOBAL_NAMES.items():
        plan.append((p + hf_suffix, hf_suffix, g_name))
    if not cfg.tie_word_embeddings:
        plan.append((cfg.lm_head_name, "lm_head.weight", LM_HEAD))
    for i in range(cfg.num_hidden_layers):
        L = f"{p}layers.{i}."
        for name in sorted(n for n in ckpt if n.startswith(L)):
            suffix = name[len(L):]
            if suffix not in layer_names:
                raise FormatError(f"tensor {name}: no llama.cpp {GGUF_ARCH[cfg.family]} name for "
                                  f"{suffix!r}; known: {sorted(layer_names)}")
            plan.append((name, suffix, f"blk.{i}.{layer_names[suffix]}"))
    missing = [h for h, _, _ in plan if h not in ckpt]
    if missing:
        raise FormatError(f"{src_dir} lacks tensors the config needs, e.g. {missing[:3]}")
    skipped = sorted(set(ckpt) - {h for h, _, _ in plan})
    if skipped:  # e.g. MTP heads or a vision tower: not part of the text model
        warnings.warn(f"convert_target: {len(skipped)} tensor(s) outside the {cfg.family} text "
                      f"model are not written, e.g. {skipped[:3]}", stacklevel=2)
    loaders, types, n_weights = {}, {}, 0
    for hf, suffix, g_name in plan:
        loaders[g_name] = lambda h=hf, s=suffix: to_gguf_value(cfg, s, ckpt.load(h))
        shape = ckpt.info(hf).shape
        if suffix == "linear_attn.conv1d.weight":
            shape = (shape[0], shape[-1])
        types[g_name] = tensor_type(g_name, shape, ggml_type, fallback)
        n_weights += int(np.prod(shape))
    arch = GGUF_ARCH[cfg.family]
    md = target_metadata(cfg, arch, ggml_type) | tokenizer_metadata(src_dir, cfg.vocab_size)
    return write_converted(out_path, arch, loaders, types, md, n_weights, progress, replace)


# ---------------------------------------------------------------------------------- GGUF -> HF


def target_config_dict_from_gguf(g: GGUFFile) -> dict:
    """An HF ``config.json`` dict (flat text config) describing a target GGUF."""
    family = FAMILY_OF_ARCH.get(g.arch)
    name = g.path.name
    if family is None:
        raise FormatError(f"{name}: arch {g.arch!r} is not a target arch dflash-ref loads; "
                          f"supported: {sorted(FAMILY_OF_ARCH)} (gguf.MODEL_ARCH names of Qwen3, "
                          f"Qwen3.5 and Gemma 3). Qwen3-Next (qwen3next) GGUFs are MoE and store "
                          f"regrouped projections; they are not supported")
    if "token_embd.weight" not in g:
        raise FormatError(f"{name}: no token_embd.weight tensor")
    vocab, hidden = g.tensor_info("token_embd.weight").numpy_shape
    n_layers = meta(g, "block_count", "int")
    n_embd, n_head = meta(g, "embedding_length", "int"), meta(g, "attention.head_count", "int")
    taken: list[str] = []  # llama.cpp's values for absent keys (TargetConfig.defaults_used)
    head_dim, n_kv = head_dims(g, n_embd, n_head, taken)
    config: dict[str, Any] = {
        "hidden_size": n_embd,
        "num_hidden_layers": n_layers,
        "vocab_size": vocab,  # the rows llama.cpp kept (Gemma drops out-of-vocabulary rows)
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "intermediate_size": meta(g, "feed_forward_length", "int"),
        "rms_norm_eps": meta(g, "attention.layer_norm_rms_epsilon", "float"),
        "max_position_embeddings": meta(g, "context_length", "int", None),
        "tie_word_embeddings": LM_HEAD not in g,
        "attention_bias": False,
        LLAMA_CPP_DEFAULTS_KEY: taken,
    }
    if config["hidden_size"] != hidden:
        raise FormatError(f"{name}: embedding_length {config['hidden_size']} but token_embd.weight "
                          f"rows have {hidden} weights")
    theta = meta(g, "rope.freq_base", "float", None)
    if theta is None:  # never defaulted (llama.cpp would take 10000, wrong for every release)
        raise FormatError(f"{name}: no key {g.arch_key('rope.freq_base')!r}; llama.cpp falls "
                          f"back to 10000 (src/llama-model.cpp), which is not the base of any "
                          f"Qwen3 or Gemma 3 release (1e6). dflash-ref never defaults a RoPE "
                          f"base: add the key (gguf-set-metadata) with the model's rope_theta")
    scaling = None
    if meta(g, "rope.scaling.type", "str", "none") == "linear":
        scaling = {"rope_type": "linear", "factor": meta(g, "rope.scaling.factor", "float")}
    if family == "qwen3":
        config.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_act="silu",
                      rope_theta=theta, rope_scaling=scaling)
    elif family == "qwen3_5":
        inner, n_v = meta(g, "ssm.inner_size", "int"), meta(g, "ssm.time_step_rank", "int")
        rope = {"rope_type": "default", "rope_theta": theta,
                "partial_rotary_factor": meta(g, "rope.dimension_count", "int") / head_dim}
        sections = meta(g, "rope.dimension_sections", "ints", None)
        if sections is not None:
            rope.update(mrope_section=[s for s in sections[:3]], mrope_interleaved=True)
        config.update(
            architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_act="silu",
            full_attention_interval=meta(g, "full_attention_interval", "int"),
            attn_output_gate=True,
            linear_num_key_heads=meta(g, "ssm.group_count", "int"),
            linear_num_value_heads=n_v,
            linear_key_head_dim=meta(g, "ssm.state_size", "int"),
            linear_value_head_dim=inner // max(n_v, 1),
            linear_conv_kernel_dim=meta(g, "ssm.conv_kernel", "int"),
            rope_parameters=rope)
    else:  # gemma3: where a key is absent, llama.cpp's LLM_ARCH_GEMMA3 hparams
        config.update(gemma3_config(g, n_layers, n_embd, n_head, head_dim, taken),
                      rope_theta=theta, rope_scaling=scaling)
    return config


def hf_names_of_gguf_target(g: GGUFFile, cfg: TargetConfig) -> dict[str, tuple[str, str]]:
    """Every tensor of a target GGUF -> (its HF name under ``cfg.weight_prefix``, the suffix
    :func:`from_gguf_value` takes). Unknown tensors are a FormatError."""
    p = cfg.weight_prefix
    hf_of = {v: k for k, v in LAYER_NAMES[cfg.family].items()}
    names = {}
    for name in g.tensor_names:
        if name == LM_HEAD:
            names[name] = (cfg.lm_head_name, "lm_head.weight")
        elif name in GLOBAL_NAMES.values():
            suffix = next(k for k, v in GLOBAL_NAMES.items() if v == name)
            names[name] = (p + suffix, suffix)
        else:
            m = _GGUF_LAYER.match(name)
            if not m or m.group(2) not in hf_of:
                raise FormatError(f"{g.path.name}: tensor {name!r} has no HF counterpart in the "
                                  f"{g.arch} layout dflash-ref reads")
            suffix = hf_of[m.group(2)]
            names[name] = (f"{p}layers.{m.group(1)}.{suffix}", suffix)
    return names


def target_config_of_gguf(g: GGUFFile) -> tuple[dict, TargetConfig]:
    """(HF config.json dict, TargetConfig) of a target GGUF, without the loader's warnings."""
    config = target_config_dict_from_gguf(g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the loader warns again when it builds the model
        return config, TargetConfig.from_hf(config)


def read_gguf_target(path) -> tuple[dict, dict]:
    """(HF config.json dict, HF-named float32 weights) of a ``qwen3``/``qwen35``/``gemma3`` GGUF.

    Every stored value is mapped back by :func:`from_gguf_value` (norm -1, ``log(-ssm_a)``,
    conv reshape, value heads tiled -> grouped). Unknown tensors are a FormatError.
    """
    g = open_gguf(path)
    config, cfg = target_config_of_gguf(g)
    weights = {}
    names = hf_names_of_gguf_target(g, cfg).items()
    # Dequantizing a real model takes tens of seconds: a progress bar, on a terminal only.
    for name, (hf, suffix) in tqdm(names, desc=f"loading {g.path.name}", unit="tensor",
                                   disable=not sys.stderr.isatty(), leave=False):
        weights[hf] = from_gguf_value(cfg, suffix, g.load(name), f"{g.path.name}: {name}")
    return config, weights
