"""Where a drafter's DFlash keys come from: the ``dflash_config`` block or the top level, under
each stack's aliases; the layout (z-lab or transformers assistant); the sliding layers and window;
and the default captured target layers (:func:`build_target_layer_ids`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from dflash_ref.config.families import _ARCHITECTURES, DSPARK_ARCHITECTURES, _architectures
from dflash_ref.config.fields import (
    DRAFTER_LAYOUTS,
    FULL,
    SLIDING,
    _Fields,
    _is_int,
    _layer_type_list,
)
from dflash_ref.errors import ConfigError


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The default captured target layers when a drafter config lists none (docs/config.md,
    "target_layer_ids"; z-lab/dflash ``dflash/model.py``).

    With L = num_target_layers and D = num_draft_layers:
    - D == 1: ``[L // 2]``;
    - else ``id_i = int(round(1 + i * (L - 4) / (D - 1)))`` for i = 0..D-1, Python ``round``
      (half to even): first id 1, last id L - 3, so the final (normed) layer is never tapped.
    Examples: (36, 5) -> [1, 9, 17, 25, 33]; (64, 5) -> [1, 16, 31, 46, 61];
    (60, 6) -> [1, 12, 23, 35, 46, 57]; (28, 5) -> [1, 7, 13, 19, 25].

    The HF reference computes the same list without checks; here a target too shallow for D
    distinct layers (L - 4 < D - 1, which would repeat layers) is a ConfigError.
    """
    L, D = num_target_layers, num_draft_layers
    if not _is_int(L) or not _is_int(D) or L < 1 or D < 1:
        raise ConfigError(f"build_target_layer_ids needs positive integers, got "
                          f"num_target_layers={L!r}, num_draft_layers={D!r}.")
    if D == 1:
        return [L // 2]
    start, end = 1, L - 3
    span = end - start
    if span < D - 1:
        raise ConfigError(f"build_target_layer_ids: a {L}-layer target has only {max(span + 1, 0)}"
                          f" layers in 1..L-3, fewer than the {D} distinct captures the formula "
                          f"needs; list target_layer_ids explicitly in the drafter config.")
    return [int(round(start + i * span / (D - 1))) for i in range(D)]


def _pos_int(v: Any, key: str, where: str, minimum: int = 1) -> int:
    if not _is_int(v) or v < minimum:
        raise ConfigError(f"{where}: {key} must be an integer >= {minimum}, got {v!r}.")
    return int(v)


def _dflash_value(config: Mapping, where: str, *keys: str) -> tuple[Any, str | None]:
    """A DFlash key from ``dflash_config`` (first) or the top level, under any alias.

    Returns (value, "path.of.key") or (None, None). Two places holding different values is a
    ConfigError: which one a runtime reads differs between stacks (docs/formats.md,
    "Converter"; Luce-Org/lucebox ``server/scripts/convert_dflash_to_gguf.py``).
    """
    dc = config.get("dflash_config") or {}
    found = [(f"dflash_config.{k}", dc[k]) for k in keys if dc.get(k) is not None]
    found += [(k, config[k]) for k in keys if config.get(k) is not None]
    if not found:
        return None, None
    path, value = found[0]
    clash = [(p, v) for p, v in found[1:] if v != value]
    if clash:
        raise ConfigError(f"{where}: {path}={value!r} but {clash[0][0]}={clash[0][1]!r}; "
                          f"remove one so the value is unambiguous.")
    return value, path


def _drafter_layout(config: Mapping, layout: str | None, where: str) -> str:
    archs = _architectures(config, where)
    if any(a in _ARCHITECTURES for a in archs):
        raise ConfigError(f"{where}: architectures {archs} is a target model; parse it with "
                          f"TargetConfig.from_hf.")
    if layout is not None:
        if layout not in DRAFTER_LAYOUTS:
            raise ConfigError(f"drafter layout {layout!r} is unknown; choose one of "
                              f"{DRAFTER_LAYOUTS}.")
        return layout
    model_type = config.get("model_type") or ""
    if str(model_type).endswith("_assistant") or any(a.endswith("AssistantModel")
                                                     for a in archs):
        return "hf_assistant"
    auto_map = config.get("auto_map") or {}
    if ("dflash_config" in config or "DFlashDraftModel" in archs
            or any("dflash" in str(v).lower() for v in dict(auto_map).values())):
        return "zlab"
    raise ConfigError(f"{where}: cannot tell the drafter layout (no dflash_config, no "
                      f"DFlashDraftModel architecture, no *_assistant model_type; model_type "
                      f"{model_type!r}, architectures {archs}). Pass layout='zlab' or "
                      f"layout='hf_assistant'.")


def _drafter_swa(config: Mapping, f: _Fields, layout: str, n_layers: int,
                 where: str) -> tuple[tuple[str, ...], int | None]:
    """layer_types and sliding_window of a drafter (docs/config.md, "Sliding layers:
    `swa_convention`"; docs/drafter.md, "Sliding-window drafter layers")."""
    use_swa, _ = _dflash_value(config, where, "use_swa")
    if f.has("layer_types"):
        layer_types = _layer_type_list(config["layer_types"], n_layers, (FULL, SLIDING), where)
    elif layout == "hf_assistant":
        layer_types = (SLIDING,) * n_layers
        f.defaults_used.append("layer_types=all sliding_attention (assistant default)")
    elif use_swa:
        layer_types = (SLIDING,) * n_layers
    else:
        layer_types = (FULL,) * n_layers
    window, window_key = _dflash_value(config, where, "sliding_window", "swa_window_size")
    if window is None and SLIDING in layer_types and layout == "hf_assistant":
        window = 2048
        f.defaults_used.append("sliding_window=2048 (assistant default)")
    if SLIDING in layer_types:
        if window is None:
            raise ConfigError(f"{where}: layer_types has sliding_attention layers but no window "
                              f"size (looked for sliding_window and dflash_config."
                              f"swa_window_size). Add it (2048 for the published SWA drafters).")
        window = _pos_int(window, window_key or "sliding_window", where)
        if (config.get("use_sliding_window") is False and layout == "zlab"
                and f.has("layer_types")):
            warnings.warn(f"{where}: use_sliding_window is false but layer_types has sliding "
                          f"layers and a window of {window}. transformers' Qwen3Config drops the "
                          f"window when use_sliding_window is false, so an HF run would attend "
                          f"fully; dflash-ref applies the window (pass swa_convention='ignore' to "
                          f"match that HF run).", stacklevel=3)
    elif window is not None:
        window = _pos_int(window, window_key or "sliding_window", where)
    return layer_types, window


DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
"""The DFlash 2 sizes (z-lab ``dflash`` 0.1.0, ``DFlash2DraftModel``; docs/drafter.md,
"DFlash 2")."""


def _drafter_kind(config: Mapping, where: str) -> str:
    """"dflash2" for a ``DFlash2DraftModel`` architecture, "dspark" for a DSpark one
    (:data:`DSPARK_ARCHITECTURES`; models/dspark.py), else "dflash"."""
    archs = _architectures(config, where)
    if "DFlash2DraftModel" in archs:
        return "dflash2"
    return "dspark" if any(a in DSPARK_ARCHITECTURES for a in archs) else "dflash"


def _dflash2_sizes(config: Mapping, where: str, hidden: int,
                   vocab: int | None) -> dict[str, int]:
    """The four DFlash 2 sizes of :data:`DFLASH2_KEYS`, checked (``conv_group_size`` divides
    hidden_size; ``selector_top_k`` at most the vocabulary)."""
    out = {}
    for key in DFLASH2_KEYS:
        v, _ = _dflash_value(config, where, key)
        if v is None:
            raise ConfigError(f"{where}: DFlash2DraftModel needs {key} (looked in dflash_config "
                              f"and at the top level); the release's DFlash 2 configs carry "
                              f"all of {DFLASH2_KEYS}.")
        out[key] = _pos_int(v, key, where)
    if hidden % out["conv_group_size"]:
        raise ConfigError(f"{where}: conv_group_size {out['conv_group_size']} does not divide "
                          f"hidden_size {hidden}; the convolution kernel is per group of "
                          f"channels.")
    if vocab is not None and out["selector_top_k"] > vocab:
        raise ConfigError(f"{where}: selector_top_k {out['selector_top_k']} exceeds vocab_size "
                          f"{vocab}.")
    return out


def _head_keys(config: Mapping, where: str) -> tuple[float | None, float | None]:
    """``output_multiplier`` and ``final_logit_softcapping`` of a drafter (None when absent).

    The release multiplies the draft logits by the first, then caps them with the second when it
    is positive (``DFlashDraftModel.compute_logits``); a cap of 0 or null means no cap.
    """
    out = []
    for key in ("output_multiplier", "final_logit_softcapping"):
        v, _ = _dflash_value(config, where, key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ConfigError(f"{where}: {key} must be a number, got {v!r}.")
        out.append(None if v is None else float(v))
    return out[0], out[1]


def _draft_vocab_size(config: Mapping, where: str, kind: str, vocab: int | None) -> int | None:
    """``draft_vocab_size`` Vd (top level or ``dflash_config``), None when absent: a reduced
    draft vocabulary needs the target's ``vocab_size`` beside it (d2t's ids are checked against
    it) and 1 <= Vd <= vocab_size; DFlash drafters only (DFlash 2's selector and DSpark's Markov
    head read the full vocabulary here)."""
    v, key = _dflash_value(config, where, "draft_vocab_size")
    if v is None:
        return None
    v = _pos_int(v, key, where)
    if vocab is None:
        raise ConfigError(f"{where}: {key} {v} needs vocab_size (the target's vocabulary, which "
                          f"d2t maps into) beside it; add vocab_size.")
    if v > vocab:
        raise ConfigError(f"{where}: {key} {v} exceeds vocab_size {vocab}; a draft vocabulary is "
                          f"a subset of the target's.")
    if kind != "dflash":
        raise ConfigError(f"{where}: a reduced draft vocabulary ({key}) is implemented for "
                          f"DFlashDraftModel drafters, not {kind!r}; remove {key} and the "
                          f"drafter's lm_head / d2t to use the target's head.")
    return v
