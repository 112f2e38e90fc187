"""DFlash drafter GGUF -> z-lab ``config.json`` dict + HF-named float32 weights, for both public
namings (the way back from :mod:`dflash_ref.io.convert_drafter`).

Reading order:

1. ``_capture_ids``: the HF ``target_layer_ids`` of the file. llama.cpp's ``dflash`` arch stores
   ids + 1 (the input of layer i + 1 is the output of HF layer i), so 1 is subtracted, and a value
   below 1 means the file was written with raw ids; lucebox's ``*-dflash-draft`` stores raw ids.
   The ``fc`` width decides the capture count C; a lucebox file without ids takes the default
   formula for the given target (with a warning).
2. :func:`drafter_config_dict_from_gguf`: metadata -> a z-lab ``config.json`` dict (sizes, eps,
   RoPE base - missing is an error, never a default -, sliding pattern and window, causal flag,
   embedding scale, the draft head's ``logit_scale`` / ``final_logit_softcapping``), checked
   against the target's embedding scale when one is given. A llama.cpp file is DFlash 2
   (``DFlash2DraftModel``) when it holds a conv / selector tensor or a DFlash 2 size key
   (:func:`_dflash2_sizes`); every one of the four sizes is then required.
3. :func:`read_gguf_drafter`: that dict and the dequantized weights under HF names;
   :meth:`DFlashDrafter.from_gguf <dflash_ref.models.drafter.DFlashDrafter.from_gguf>` feeds them
   to the same constructor as ``from_pretrained``. :func:`drafter_config_from_gguf` is the
   config alone (for ``dflash-ref inspect``).

Key names of both namings: docs/formats.md ("Drafter: GGUF -> ``DFlashDrafter.from_gguf(path,
target)``"); public sources: ggml-org/llama.cpp ``src/models/dflash.cpp`` and Luce-Org/lucebox
``server/scripts/convert_dflash_to_gguf.py``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from dflash_ref.config import (
    DFLASH2_KEYS,
    FULL,
    SLIDING,
    DrafterConfig,
    TargetConfig,
    build_target_layer_ids,
    drafter_expected_tensors,
)
from dflash_ref.errors import FormatError
from dflash_ref.io.convert_common import meta
from dflash_ref.io.draft_vocab import D2T, HEAD, d2t_from_gguf, offsets
from dflash_ref.io.gguf_io import GGUFFile, open_gguf
from dflash_ref.io.names import (
    DSPARK_HEAD_PREFIXES,
    flavour_of_arch,
    gguf_to_hf,
    hf_to_gguf,
    is_dflash2_tensor,
    is_dspark_tensor,
)


def _capture_ids(g: GGUFFile, flavour: str, c_w: int, target: TargetConfig | None) -> list[int]:
    """HF target_layer_ids of a drafter GGUF, reconciled with the fc width (C_w captures)."""
    name = g.path.name
    if flavour == "dflash":
        stored = meta(g, "target_layers", "ints")
        if min(stored) < 1:
            raise FormatError(
                f"{name}: dflash.target_layers {stored} holds a value below 1, but the llama.cpp "
                f"naming stores HF ids + 1 (the input of layer i + 1 = the output of HF layer i); "
                f"this file was probably written with raw ids, which llama.cpp would read one "
                f"layer early. Re-convert it")
        ids = [i - 1 for i in stored]  # the +1 convention, undone
        if len(ids) != c_w:
            raise FormatError(f"{name}: dflash.target_layers lists {len(ids)} layers but fc "
                              f"implies {c_w} captures; the file is inconsistent")
        return ids
    count = meta(g, "dflash.n_target_layers", "int", None)
    if count is not None and count != c_w:
        warnings.warn(f"{name}: dflash.n_target_layers is {count} but fc implies {c_w} captured "
                      f"layers; the weights win (C = {c_w})", stacklevel=3)
    ids = meta(g, "dflash.target_layer_ids", "ints", None)
    if ids is None:
        if target is None:
            raise FormatError(f"{name}: no dflash.target_layer_ids; pass the target so the "
                              f"default ids for {c_w} captures can be computed")
        ids = build_target_layer_ids(target.num_hidden_layers, c_w)
        warnings.warn(f"{name}: no dflash.target_layer_ids; using the default formula for a "
                      f"{target.num_hidden_layers}-layer target and {c_w} captures: {ids}",
                      stacklevel=3)
    if len(ids) != c_w:
        raise FormatError(f"{name}: dflash.target_layer_ids lists {len(ids)} layers {ids} but fc "
                          f"implies {c_w} captures; which layers to tap cannot be derived from "
                          f"the weight")
    return list(ids)


def _dflash2_sizes(g: GGUFFile, flavour: str) -> dict[str, int] | None:
    """The four DFlash 2 sizes of a llama.cpp file, or None for a DFlash file.

    llama.cpp switches to DFlash 2 on ``selector_hidden.weight`` (src/models/dflash.cpp); here
    any DFlash 2 tensor or size key does, so a file missing the selector projection is reported
    as an incomplete DFlash 2 drafter rather than as a DFlash drafter with unknown tensors.
    """
    if flavour != "dflash":
        return None
    if (not any(map(is_dflash2_tensor, g.tensor_names))
            and all(g.get(k) is None for k in DFLASH2_KEYS)):
        return None
    missing = [g.arch_key(k) for k in DFLASH2_KEYS if g.get(k) is None]
    if missing:
        raise FormatError(f"{g.path.name}: a DFlash 2 drafter (it has conv / selector tensors or "
                          f"size keys) needs {[g.arch_key(k) for k in DFLASH2_KEYS]}, but "
                          f"{missing} are missing; re-convert it from the checkpoint")
    return {k: meta(g, k, "int") for k in DFLASH2_KEYS}


def drafter_config_dict_from_gguf(g: GGUFFile, target: TargetConfig | None = None) -> dict:
    """A z-lab ``config.json`` dict describing a drafter GGUF of either naming.

    Metadata gives the sizes; the fc weight gives the capture count (a disagreeing count key is
    a warning, a width that is not a multiple of hidden is an error). ``target``, when given,
    supplies default ids for a lucebox file without them, and is checked against the file's
    softcap and embedding scale.
    """
    flavour = flavour_of_arch(g.arch)
    name = g.path.name
    if flavour is None:
        raise FormatError(f"{name}: arch {g.arch!r} is not a DFlash drafter; expected 'dflash' "
                          f"(llama.cpp) or '*-dflash-draft' (lucebox)")
    fc_name = hf_to_gguf("fc.weight", flavour)
    if fc_name not in g:
        raise FormatError(f"{name}: no {fc_name} tensor; found {g.tensor_names[:6]}")
    H = meta(g, "embedding_length", "int")
    fc_rows, fc_cols = g.tensor_info(fc_name).numpy_shape
    if fc_rows != H or fc_cols % H:
        raise FormatError(f"{name}: {fc_name} has NumPy shape [{fc_rows}, {fc_cols}] (ggml "
                          f"{{{fc_cols}, {fc_rows}}}); it must be [H, C*H] with H = "
                          f"embedding_length = {H}, and {fc_cols} is not C*{H}")
    ids = _capture_ids(g, flavour, fc_cols // H, target)
    n_layers = meta(g, "block_count", "int")
    block = "block_size" if flavour == "dflash" else "dflash.block_size"
    mask = "tokenizer.ggml.mask_token_id" if flavour == "dflash" else "dflash.mask_token_id"
    config: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": H, "num_hidden_layers": n_layers,
        "num_attention_heads": meta(g, "attention.head_count", "int"),
        "num_key_value_heads": meta(g, "attention.head_count_kv", "int"),
        "head_dim": meta(g, "attention.key_length", "int"),
        "intermediate_size": meta(g, "feed_forward_length", "int"),
        "hidden_act": "silu",
        "rms_norm_eps": meta(g, "attention.layer_norm_rms_epsilon", "float"),
        "rope_theta": meta(g, "rope.freq_base", "float"),  # missing: an error, never a default
        "max_position_embeddings": meta(g, "context_length", "int", None),
        "vocab_size": meta(g, "vocab_size", "int", None),
        "block_size": meta(g, block, "int"),
        "dflash_config": {"mask_token_id": meta(g, mask, "int"),
                          "target_layer_ids": ids},
    }
    value_length = meta(g, "attention.value_length", "int", config["head_dim"])
    if value_length != config["head_dim"]:
        raise FormatError(f"{name}: attention.value_length {value_length} != key_length "
                          f"{config['head_dim']}; DFlash drafters use one head_dim")
    pattern = meta(g, "attention.sliding_window_pattern", "bools", None)
    if pattern is not None:
        if len(pattern) != n_layers:
            raise FormatError(f"{name}: attention.sliding_window_pattern has {len(pattern)} "
                              f"entries for {n_layers} layers")
        config["layer_types"] = [SLIDING if p else FULL for p in pattern]
        window = meta(g, "attention.sliding_window", "int", None)
        if any(pattern) and not window:
            raise FormatError(f"{name}: attention.sliding_window_pattern marks sliding layers "
                              f"but attention.sliding_window is missing or 0")
        config["sliding_window"] = window or None
    swa_theta = meta(g, "rope.freq_base_swa", "float", None)
    if swa_theta is not None:
        config["rope_parameters"] = {FULL: {"rope_theta": config["rope_theta"]},
                                     SLIDING: {"rope_theta": swa_theta}}
    if meta(g, "rope.scaling.type", "str", "none") == "linear":
        config["rope_scaling"] = {"rope_type": "linear",
                                  "factor": meta(g, "rope.scaling.factor", "float")}
    causal = meta(g, "attention.causal", "bool", None)
    if causal is not None:
        config["dflash_config"]["causal"] = causal
    scale = meta(g, "embedding_scale", "float", None)
    if scale is not None:
        config["dflash_config"]["input_embedding_scale"] = scale
    # The draft head (docs/drafter.md, "Head"): the cap the file states is the one its logits get.
    for key, hf_key in (("logit_scale", "output_multiplier"),
                        ("final_logit_softcapping", "final_logit_softcapping")):
        value = meta(g, key, "float", None)
        if value is not None:
            config["dflash_config"][hf_key] = value
    sizes = _dflash2_sizes(g, flavour)
    if sizes is not None:
        config["architectures"] = ["DFlash2DraftModel"]
        config["dflash_config"].update(sizes)
    if D2T in g:  # a reduced draft vocabulary: output.weight holds the draft rows
        config["draft_vocab_size"] = int(g.tensor_info(D2T).numpy_shape[0])
        tokens = g.get("tokenizer.ggml.tokens")  # llama.cpp's n_vocab, when no key says V
        config["vocab_size"] = (config["vocab_size"] or (target and target.vocab_size)
                                or (len(tokens) if isinstance(tokens, list) else None))
    if any(map(is_dspark_tensor, g.tensor_names)):  # llama.cpp: markov_w1.weight loads DSpark
        config["architectures"] = ["DSparkDraftModel"]
        config["sample_from_anchor"] = meta(g, "sample_from_anchor", "bool", True)
    _check_target_scale(g, target, scale)
    return config


def _check_target_scale(g: GGUFFile, target: TargetConfig | None, scale: float | None) -> None:
    if target is None:
        return
    if scale is not None and target.embedding_scale is not None and not np.isclose(
            scale, target.embedding_scale, rtol=1e-6):
        warnings.warn(f"{g.path.name}: embedding_scale {scale:g} differs from the target's "
                      f"{target.embedding_scale:g}; the file's value is used for the block "
                      f"embeddings", stacklevel=4)


def read_gguf_drafter(path, target: TargetConfig | None = None) -> tuple[dict, dict]:
    """(z-lab config.json dict, HF-named float32 weights) of a drafter GGUF of either naming.

    Tensors are mapped back to HF names (:func:`dflash_ref.io.names.gguf_to_hf`) and
    dequantized. ``token_embd`` / ``output`` (the target's, which llama.cpp files may carry) are
    skipped, but a file with ``d2t`` has its own reduced head in ``output.weight``: it becomes
    ``lm_head.weight`` and d2t's absolute ids the directory's offsets (io/draft_vocab.py), d2t
    checked before any weight is read. Tensors the drafter does not implement are a
    FormatError.
    """
    g = open_gguf(path)
    config = drafter_config_dict_from_gguf(g, target)
    flavour = flavour_of_arch(g.arch)
    reduced = D2T in g  # then output.weight is the drafter's own head, else the target's
    carried = ("token_embd.weight",) if reduced else ("token_embd.weight", "output.weight")
    head = {v: k for k, v in HEAD.items()} if reduced else {}
    names = {head.get(n) or gguf_to_hf(n, flavour): n for n in g.tensor_names
             if n not in carried}
    expected = drafter_expected_tensors(DrafterConfig.from_hf(config))
    if "DSparkDraftModel" in config["architectures"]:  # the heads (shapes: models/dspark.py)
        expected.update({h: g.tensor_info(names[h]).numpy_shape for h in names
                         if h.startswith(DSPARK_HEAD_PREFIXES)})
    extra = sorted(names[h] for h in set(names) - set(expected))
    if extra:
        raise FormatError(f"{g.path.name}: tensors {extra[:6]} are not part of the DFlash drafter "
                          f"dflash-ref implements (fc.scale, attn_sinks, biases), or lie "
                          f"beyond block_count {config['num_hidden_layers']}")
    missing = [hf_to_gguf(h, flavour) for h in expected if h not in names]
    if missing:
        kind = "a DFlash 2" if "DFlash2DraftModel" in config["architectures"] else "a DFlash"
        more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        raise FormatError(f"{g.path.name} lacks tensor(s) {missing[:4]}{more} of {kind} drafter "
                          f"in the {flavour} naming; is the file complete? it has "
                          f"{len(g.tensor_names)} tensors")
    if not reduced:
        return config, {hf: g.load(names[hf], shape=shape) for hf, shape in expected.items()}
    ids = d2t_from_gguf(g, config["vocab_size"])  # checked before any weight is read
    weights = {hf: g.load(names[hf], shape=shape) for hf, shape in expected.items() if hf != D2T}
    return config, {**weights, D2T: offsets(ids)}  # the directory's form: offsets


def drafter_config_from_gguf(path, target: TargetConfig | None = None,
                             swa_convention: str | None = None) -> DrafterConfig:
    """The DrafterConfig of a drafter GGUF (for ``dflash-ref inspect``; no weights read)."""
    g = open_gguf(path)
    return DrafterConfig.from_hf(drafter_config_dict_from_gguf(g, target),
                                 swa_convention=swa_convention)


__all__ = [
    "drafter_config_dict_from_gguf",
    "drafter_config_from_gguf",
    "read_gguf_drafter",
]
