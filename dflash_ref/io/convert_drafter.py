"""DFlash drafter: z-lab checkpoint -> GGUF in both public namings (docs/formats.md, "Drafter:
z-lab checkpoint -> GGUF"; Luce-Org/lucebox ``server/scripts/convert_dflash_to_gguf.py``,
ggml-org/llama.cpp ``convert_hf_to_gguf.py``). The way back is
:mod:`dflash_ref.io.drafter_from_gguf`; the target-model side lives in
:mod:`dflash_ref.io.convert_target`.

Reading order:

1. :func:`~dflash_ref.io.convert_common.tensor_type`: the storage rule. Every 1-D tensor (norms)
   and every conv kernel is F32; matrices take the requested type when their rows hold whole
   quantization blocks.
2. :func:`drafter_config_from_checkpoint`: config.json checked against the tensor shapes, the
   shapes winning (intermediate size from ``gate_proj``, layer count from the largest
   ``layers.N``, head_dim from ``k_proj`` when config.json lacks it, capture count from ``fc``).
   The RoPE base goes through :func:`~dflash_ref.config.resolve_rope_theta`: nested
   ``rope_parameters.rope_theta``, then top-level ``rope_theta``, else the conversion fails.
3. :func:`drafter_metadata`: the GGUF keys of each naming, side by side::

       what                  llama.cpp (arch "dflash")        lucebox (arch "*-dflash-draft")
       target layers         dflash.target_layers = ids + 1   {arch}.dflash.target_layer_ids = ids
       capture count C       len(target_layers)               {arch}.dflash.n_target_layers
       block size B          dflash.block_size                {arch}.dflash.block_size
       mask token            tokenizer.ggml.mask_token_id     {arch}.dflash.mask_token_id
       sizes, eps, rope      {arch}.embedding_length, block_count, feed_forward_length,
                             attention.head_count(_kv), attention.key_length/value_length,
                             attention.layer_norm_rms_epsilon, rope.freq_base (both namings)
       sliding window        {arch}.attention.sliding_window + sliding_window_pattern (both)
       causal override       {arch}.attention.causal (is_causal / dflash_config.causal; both)
       draft head            {arch}.logit_scale = output_multiplier, {arch}.final_logit_softcapping
                             = the drafter's cap, else the target's (both; llama.cpp's keys)
       DFlash 2 sizes        dflash.conv_kernel_size, conv_group_size, selector_rank,
                             selector_top_k (llama.cpp only: lucebox has no DFlash 2 names)

   **The +1 convention.** HF id i means "the output of decoder layer i". llama.cpp stores i + 1
   and taps the *input* of that layer, the same tensor; lucebox stores i and taps the output.
   Reading a file with the other convention shifts every feature by one layer and every shape
   still fits (docs/conventions.md, "Lessons from the seeds"), so the loader checks the arch,
   never guesses.
4. :func:`convert_drafter`: the whole conversion, with a progress bar on large checkpoints.

Drafter norms are stored raw in both namings (the z-lab drafter multiplies by w; docs/formats.md,
"DFlash drafter names"); the "+1" that llama.cpp bakes into Qwen3.5 / Gemma norms concerns target
models only.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dflash_ref.config import (
    FULL,
    SLIDING,
    DrafterConfig,
    TargetConfig,
    drafter_expected_tensors,
    resolve_rope_theta,
)
from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.convert_common import (
    FILE_TYPE,
    ggml_type_name,
    tensor_type,
    transformer_keys,
    write_converted,
)
from dflash_ref.io.draft_vocab import D2T, HEAD, d2t_from_checkpoint
from dflash_ref.io.names import (
    CONF_W,
    DSPARK_HEAD_PREFIXES,
    canonical_hf_name,
    dspark_head_shapes,
    flavour_of_arch,
    hf_to_gguf,
)
from dflash_ref.io.safetensors_io import open_checkpoint
from dflash_ref.io.vocab_gguf import tokenizer_metadata
from dflash_ref.io.writing import Replace, replace_any

# User-facing naming -> the flavour of dflash_ref.io.names.
NAMINGS = {"llama.cpp": "dflash", "dflash": "dflash", "lucebox": "lucebox"}
LUCEBOX_ARCHS = {"qwen": "qwen35-dflash-draft", "gemma": "gemma4-dflash-draft"}

_HF_LAYER = re.compile(r"^layers\.(\d+)\.")


# ---------------------------------------------------------------------------------- HF side


def _shape_rule(fixed: dict, key: str, value: int, source: str) -> None:
    """Set ``fixed[key] = value`` from the weights; warn when config.json said otherwise."""
    old = fixed.get(key)
    if old is not None and old != value:
        warnings.warn(f"drafter config.json says {key}={old!r} but {source}; the weights win: "
                      f"{key}={value}", stacklevel=3)
    fixed[key] = value


def drafter_config_from_checkpoint(config: Mapping, shapes: Mapping[str, tuple[int, ...]],
                                   target: TargetConfig | None = None) -> DrafterConfig:
    """The DrafterConfig of a z-lab checkpoint, with tensor shapes as ground truth.

    docs/formats.md ("Drafter: z-lab checkpoint -> GGUF"): intermediate size = ``gate_proj``
    rows; layer count = 1 + the largest ``layers.N``; head_dim = ``k_proj`` rows / kv heads when
    config.json has none, and ``kv_heads * head_dim`` must equal the ``k_proj`` rows; the capture
    count C = ``fc`` columns / hidden (explicit ``target_layer_ids`` of another length are an
    error, because which layers to tap cannot be derived from a weight). The RoPE base is never
    defaulted.

    Args:
        config: the parsed config.json.
        shapes: tensor name -> PyTorch [out, in] shape.
        target: when given, the drafter is also checked against this target.
    """
    where = "drafter config.json"
    if not isinstance(config, Mapping):
        raise FormatError("the drafter checkpoint has no config.json; the converter reads every "
                          "size and the RoPE base from it (docs/formats.md, Converter)")
    resolve_rope_theta(config, where)  # fails with the reason before anything else is done
    fixed = dict(config)
    layers = sorted({int(m.group(1)) for n in shapes if (m := _HF_LAYER.match(n))})
    if not layers:
        raise FormatError(f"the checkpoint has no layers.N.* tensors; found {sorted(shapes)[:6]}; "
                          f"is it a z-lab DFlash drafter?")
    _shape_rule(fixed, "num_hidden_layers", layers[-1] + 1,
                f"the largest layer tensor is layers.{layers[-1]}")
    for name in ("layers.0.self_attn.k_proj.weight", "layers.0.mlp.gate_proj.weight", "fc.weight"):
        if name not in shapes:
            raise FormatError(f"the drafter checkpoint lacks {name}; a z-lab drafter has fc, "
                              f"hidden_norm, norm and layers.N.* (docs/formats.md)")
    gate = shapes["layers.0.mlp.gate_proj.weight"]
    _shape_rule(fixed, "intermediate_size", int(gate[0]),
                f"layers.0.mlp.gate_proj.weight is {list(gate)}")
    k_rows = int(shapes["layers.0.self_attn.k_proj.weight"][0])
    n_kv = fixed.get("num_key_value_heads")
    if not isinstance(n_kv, int) or n_kv < 1:
        raise ConfigError(f"{where}: num_key_value_heads must be a positive integer, got {n_kv!r}")
    if fixed.get("head_dim") is None:
        fixed["head_dim"] = k_rows // n_kv
    if n_kv * fixed["head_dim"] != k_rows:
        raise ConfigError(f"{where}: num_key_value_heads {n_kv} x head_dim {fixed['head_dim']} = "
                          f"{n_kv * fixed['head_dim']}, but layers.0.self_attn.k_proj.weight has "
                          f"{k_rows} rows; the config does not describe these weights")
    cfg = DrafterConfig.from_hf(fixed)
    if cfg.layout != "zlab":
        raise ConfigError(f"{where}: layout {cfg.layout!r} has no published GGUF naming; the "
                          f"converter takes z-lab DFlashDraftModel / DFlash2DraftModel "
                          f"checkpoints")
    fc = shapes[cfg.fc_name]
    if target is not None:
        return cfg.validate_against(target, fc_shape=tuple(int(x) for x in fc))
    return cfg._reconcile_fc(tuple(int(x) for x in fc), cfg.num_target_layers or 0)


def drafter_shape_problems(shapes: Mapping[str, tuple], cfg: DrafterConfig) -> list[str]:
    """Every way the tensors differ from what ``cfg`` implies (empty when they agree); the
    published codebook spelling without ``.weight`` counts as its ``.weight`` form."""
    shapes = {canonical_hf_name(n): s for n, s in shapes.items()}
    expected = drafter_expected_tensors(cfg)
    problems = []
    if cfg.kind == "dspark":  # the Markov / confidence heads: checked among themselves
        heads = {n: s for n, s in shapes.items() if n.startswith(DSPARK_HEAD_PREFIXES)}
        problems += dspark_head_shapes(heads, cfg.hidden_size, cfg.vocab_size)
        shapes = {n: s for n, s in shapes.items() if n not in heads}
    extra = sorted(set(shapes) - set(expected))
    if extra:
        problems.append(
            f"tensors dflash-ref's drafter does not implement: {extra[:6]}"
            f"{' ...' if len(extra) > 6 else ''} (biases, attention sinks, own embeddings, a "
            f"d2t or lm_head without draft_vocab_size in config.json); converting without them "
            f"would give a GGUF that runs differently from the checkpoint")
    for name, shape in expected.items():
        if name not in shapes:
            problems.append(f"missing tensor {name}")
        elif tuple(shapes[name]) != shape:
            problems.append(f"tensor {name} has shape {list(shapes[name])}, expected "
                            f"{list(shape)} from config.json and the other tensors")
    return problems


def _check_tensor_names(shapes: Mapping[str, tuple], cfg: DrafterConfig) -> None:
    problems = drafter_shape_problems(shapes, cfg)
    if problems:
        raise FormatError(f"the drafter checkpoint does not match its config: {problems[0]}"
                          + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))


def _load_target_config(target) -> TargetConfig | None:
    if target is None or isinstance(target, TargetConfig):
        return target
    return TargetConfig.from_file(target)


# ---------------------------------------------------------------------------------- metadata


def lucebox_arch(target: TargetConfig | None) -> str:
    """lucebox's arch string: ``gemma4-dflash-draft`` for Gemma targets, else ``qwen35-...``."""
    if target is not None and target.family.startswith("gemma"):
        return LUCEBOX_ARCHS["gemma"]
    return LUCEBOX_ARCHS["qwen"]


def drafter_metadata(cfg: DrafterConfig, naming: str, arch: str, ggml_type: str,
                     target: TargetConfig | None = None) -> dict[str, Any]:
    """Every GGUF key of a drafter in ``naming`` ("llama.cpp" or "lucebox"); see module doc.

    Keys carry the arch prefix. Layer-id arrays are INT32 (write_gguf types int lists so),
    counts UINT32, eps / rope base / softcap FLOAT32, the sliding-window pattern a BOOL array.
    """
    flavour = NAMINGS[naming]
    a = arch + "."
    ids = list(cfg.target_layer_ids)
    md: dict[str, Any] = {
        "general.name": f"DFlash-Draft-{cfg.hidden_size}h-{cfg.num_hidden_layers}L-{ggml_type}",
        **transformer_keys(arch, cfg, FILE_TYPE[ggml_type]),
    }
    if cfg.max_position_embeddings is not None:
        md[a + "context_length"] = cfg.max_position_embeddings
    vocab = cfg.vocab_size or (target.vocab_size if target is not None else None)
    if vocab is not None:
        md[a + "vocab_size"] = vocab
    if flavour == "dflash":  # upstream llama.cpp: input taps, ids + 1 (src/models/dflash.cpp)
        md[a + "target_layers"] = [i + 1 for i in ids]
        md[a + "block_size"] = cfg.block_size
        md["tokenizer.ggml.mask_token_id"] = cfg.mask_token_id
        md[a + "target_hidden_size"] = cfg.hidden_size
    else:  # lucebox: output taps, raw ids (convert_dflash_to_gguf.py)
        md[a + "dflash.n_target_layers"] = len(ids)
        md[a + "dflash.block_size"] = cfg.block_size
        md[a + "dflash.mask_token_id"] = cfg.mask_token_id
        md[a + "dflash.target_layer_ids"] = ids
    # RoPE: one base per layer type; sliding layers get freq_base_swa if theirs differs.
    full = cfg.rope_by_type.get(FULL) or next(iter(cfg.rope_by_type.values()))
    md[a + "rope.freq_base"] = full.theta
    if SLIDING in cfg.rope_by_type and cfg.rope_by_type[SLIDING].theta != full.theta:
        md[a + "rope.freq_base_swa"] = cfg.rope_by_type[SLIDING].theta
    if full.rope_type == "linear":
        md[a + "rope.scaling.type"] = "linear"
        md[a + "rope.scaling.factor"] = full.factor
    if SLIDING in cfg.layer_types:
        md[a + "attention.sliding_window"] = cfg.sliding_window
        md[a + "attention.sliding_window_pattern"] = [t == SLIDING for t in cfg.layer_types]
    if cfg.causal_override is not None:
        md[a + "attention.causal"] = cfg.causal_override
    if cfg.kind == "dflash2":  # llama.cpp's LLM_KV_DFLASH_* keys (src/models/dflash.cpp)
        md.update({a + k: int(v) for k, v in cfg.dflash2.items()})
    # The block embedding scale and the draft head: the drafter's own keys, else the target's
    # (the drafter runs through the target's embedding and lm_head).
    scale = cfg.input_embedding_scale
    if scale is None and target is not None and target.embedding_scale is not None:
        scale = target.embedding_scale
    if scale is not None:
        md[a + "embedding_scale"] = scale
    if cfg.output_multiplier is not None:
        md[a + "logit_scale"] = cfg.output_multiplier
    cap = cfg.final_logit_softcapping  # 0 is kept: "no cap", even under a capped target
    if cap is None and target is not None and target.final_logit_softcapping:
        cap = target.final_logit_softcapping
    if cap is not None:
        md[a + "final_logit_softcapping"] = cap
    return md


# ---------------------------------------------------------------------------------- conversion


def _write_order(hf_name: str) -> tuple:
    """Layers by index (then name), whole-model tensors (the DFlash 2 selector) after them."""
    m = _HF_LAYER.match(hf_name)
    return (0, int(m.group(1)), hf_name) if m else (1, 0, hf_name)


def convert_drafter(src_dir, out_path, qtype: str = "bf16", naming: str = "llama.cpp",
                    target=None, *, arch: str | None = None, fallback: str | None = None,
                    progress: bool | None = None, replace: Replace = replace_any) -> Path:
    """Convert a z-lab DFlash or DFlash 2 drafter (``config.json`` + safetensors) to GGUF.

    DFlash 2 (``DFlash2DraftModel``) adds the convolution and selector tensors and four size keys
    in llama.cpp's names (docs/formats.md, "DFlash drafter names"); the lucebox naming has none
    and refuses it. The published codebook spelling without ``.weight`` is read too.

    Args:
        src_dir: the drafter directory.
        out_path: the .gguf file to write.
        qtype: matrix storage, one of :data:`~dflash_ref.io.convert_common.QTYPES` (norms are
            F32 whatever this says).
        naming: "llama.cpp" (arch ``dflash``, target ids + 1) or "lucebox"
            (arch ``*-dflash-draft``, raw ids; DFlash only).
        target: the target's directory, config.json or TargetConfig (optional). It checks the
            pairing and supplies what the target decides: the embedding scale and final logit
            softcap (Gemma), the vocabulary size, and lucebox's arch string.
        arch: override the lucebox arch string (llama.cpp's is always ``dflash``).
        fallback: the type for matrices whose rows do not hold whole ``qtype`` blocks.
        progress: a tqdm bar; None shows one from 50M weights on.
        replace: which existing file at ``out_path`` may be replaced (default any;
            :mod:`dflash_ref.io.writing`).
    Returns:
        the written path.
    """
    if naming not in NAMINGS:
        raise ConfigError(f"unknown naming {naming!r}; choose 'llama.cpp' or 'lucebox'")
    flavour = NAMINGS[naming]
    ggml_type = ggml_type_name(qtype)
    target_cfg = _load_target_config(target)
    ckpt = open_checkpoint(src_dir)
    stored = {canonical_hf_name(n): n for n in ckpt}  # HF name -> the checkpoint's spelling
    shapes = {n: ckpt.info(s).shape for n, s in stored.items()}
    cfg = drafter_config_from_checkpoint(ckpt.config, shapes, target_cfg)
    _check_tensor_names(shapes, cfg)
    if cfg.kind == "dspark" and flavour != "dflash":
        raise ConfigError("the lucebox naming has no DSpark heads; use naming='llama.cpp'")
    if cfg.kind == "dflash2" and flavour != "dflash":
        raise ConfigError(
            "the lucebox naming has no DFlash 2 tensors: its converter (Luce-Org/lucebox "
            "server/scripts/convert_dflash_to_gguf.py) skips the convolution and selector "
            "tensors it cannot name, so the file would run as plain DFlash. Use "
            "naming='llama.cpp' (arch 'dflash', which llama.cpp reads as DFlash 2; "
            "docs/formats.md, \"DFlash drafter names\")")
    if cfg.draft_vocab_size is not None and flavour != "dflash":
        raise ConfigError("the lucebox naming has no reduced draft vocabulary (d2t); use "
                          "naming='llama.cpp', whose dflash arch reads d2t and output.weight")
    if flavour == "dflash":
        if arch not in (None, "dflash"):
            raise ConfigError(f"the llama.cpp naming uses arch 'dflash', not {arch!r}")
        arch = "dflash"
    else:
        arch = arch or lucebox_arch(target_cfg)
        if flavour_of_arch(arch) != "lucebox":
            raise ConfigError(f"lucebox arch strings end in '-dflash-draft', got {arch!r}")
    # lucebox's write order: the encoder (fc, hidden_norm), the output norm, then blk.i in order;
    # the DFlash 2 selector last.
    order = [cfg.fc_name, cfg.hidden_norm_name, "norm.weight"]
    order += sorted((n for n in shapes if n not in order), key=_write_order)
    loaders, types = {}, {}
    for hf_name in (n for n in order if n != D2T):
        g_name = HEAD.get(hf_name) or hf_to_gguf(hf_name, flavour)  # lm_head: a reduced head
        loaders[g_name] = lambda n=stored[hf_name]: ckpt.load(n)
        types[g_name] = tensor_type(g_name, shapes[hf_name], ggml_type, fallback)
    if cfg.draft_vocab_size is not None:  # d2t as llama.cpp reads it: I64 absolute target ids
        ids = d2t_from_checkpoint(ckpt, cfg.draft_vocab_size, cfg.vocab_size, str(src_dir))
        loaders[D2T], types[D2T] = (lambda: ids), "I64"
    metadata = drafter_metadata(cfg, naming, arch, ggml_type, target_cfg)
    if cfg.kind == "dspark":  # llama.cpp's DSparkModel keys (conversion/qwen.py)
        metadata[f"{arch}.sample_from_anchor"] = True
        metadata[f"{arch}.has_confidence_head"] = CONF_W in shapes
    if isinstance(target, (str, Path)):  # the target's vocabulary, as llama.cpp's converter;
        # the drafter's own keys (its mask token) win, as there
        metadata = {**tokenizer_metadata(target, metadata.get(f"{arch}.vocab_size")), **metadata}
    n_weights = sum(int(np.prod(s)) for s in shapes.values())
    return write_converted(out_path, arch, loaders, types, metadata, n_weights, progress,
                           replace)


__all__ = [
    "convert_drafter",
    "drafter_config_from_checkpoint",
    "drafter_metadata",
    "drafter_shape_problems",
    "lucebox_arch",
]
