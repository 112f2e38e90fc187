"""Which target family a ``config.json`` describes, and the fields all families share.

- The family tables: text ``model_type`` -> family, multimodal wrapper -> (family, weight-prefix
  candidates, lm_head name), ``architectures`` -> family; ``SUPPORTED_TARGETS`` for messages.
- ``_locate_text_config``: find the text config (top level or ``text_config``), pick the family,
  and check ``model_type`` and ``architectures`` agree.
- ``_common``, ``_tie``, ``_activation``, ``_no_gemma``: fields read the same way in every family
  parser (:mod:`dflash_ref.config.qwen`, :mod:`dflash_ref.config.gemma`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dflash_ref.config.fields import SUPPORTED_ACTIVATIONS, _Fields
from dflash_ref.errors import ConfigError

SUPPORTED_TARGETS = (
    "Qwen3 dense (model_type qwen3, Qwen3ForCausalLM); "
    "Qwen3-Next (qwen3_next, Qwen3NextForCausalLM); "
    "Qwen3.5 / Qwen3.6 (qwen3_5 or qwen3_5_moe with text_config, qwen3_5_text, qwen3_5_moe_text); "
    "Gemma 3 text (gemma3_text, or gemma3 with text_config); "
    "Gemma 4 text, dense, PLE + KV sharing or MoE (gemma4_text, or gemma4 with text_config)"
)

# Text-config model_type -> family.
_TEXT_MODEL_TYPES = {
    "qwen3": "qwen3",
    "qwen3_next": "qwen3_next",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe_text": "qwen3_5",
    "gemma3_text": "gemma3",
    "gemma4_text": "gemma4",
}
# Multimodal wrapper model_type -> (family, weight-prefix candidates, lm_head tensor name).
# The first candidate is the layout of the checkpoints published with that wrapper; the loader
# must confirm it against the tensor names (a re-saved checkpoint may use the other one).
_WRAPPERS = {
    "qwen3_5": ("qwen3_5", ("model.language_model.", "model."), "lm_head.weight"),
    "qwen3_5_moe": ("qwen3_5", ("model.language_model.", "model."), "lm_head.weight"),
    "gemma3": ("gemma3", ("language_model.model.", "model.language_model."),
               "language_model.lm_head.weight"),
    "gemma4": ("gemma4", ("model.language_model.", "language_model.model."), "lm_head.weight"),
}
_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
    "Gemma4ForCausalLM": "gemma4",
    "Gemma4ForConditionalGeneration": "gemma4",
}
# DSpark (DFlash + a Markov head; llama.cpp conversion/qwen.py DSparkModel registers these names)
DSPARK_ARCHITECTURES = ("DSparkDraftModel", "Qwen3DSparkModel")
_DRAFTER_ARCHITECTURES = ("DFlashDraftModel", "DFlash2DraftModel", *DSPARK_ARCHITECTURES)


def _architectures(config: Mapping, where: str) -> list[str]:
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ConfigError(f"{where}: architectures must be a list of strings, got {archs!r}.")
    return archs


def _locate_text_config(config: Mapping):
    """(text dict, family, where, weight-prefix candidates, lm_head name, architecture)."""
    archs = _architectures(config, "target config.json")
    if any(a in _DRAFTER_ARCHITECTURES for a in archs):
        raise ConfigError(f"target config.json: architectures {archs} is a DFlash drafter, not a "
                          f"target; parse it with DrafterConfig.from_hf.")
    arch_families = {_ARCHITECTURES[a] for a in archs if a in _ARCHITECTURES}
    arch = next((a for a in archs if a in _ARCHITECTURES), archs[0] if archs else None)
    outer = config.get("model_type")
    text = config.get("text_config")
    if text is not None:
        if not isinstance(text, Mapping):
            raise ConfigError(f"target config.json: text_config must be a dict, got "
                              f"{type(text).__name__}.")
        where = "target config.json text_config"
        if outer in _WRAPPERS:
            family, prefixes, lm_head = _WRAPPERS[outer]
        elif len(arch_families) == 1 and next(iter(arch_families)) in ("qwen3_5", "gemma3",
                                                                       "gemma4"):
            family = next(iter(arch_families))
            wrapper = {"qwen3_5": "qwen3_5", "gemma3": "gemma3", "gemma4": "gemma4"}[family]
            _, prefixes, lm_head = _WRAPPERS[wrapper]
        else:
            raise ConfigError(f"target config.json: multimodal model_type {outer!r} "
                              f"(architectures {archs}) is not a supported target. Supported: "
                              f"{SUPPORTED_TARGETS}.")
        inner = text.get("model_type")
        if inner is not None and _TEXT_MODEL_TYPES.get(inner) != family:
            raise ConfigError(f"{where}: model_type {inner!r} does not belong to the {outer!r} "
                              f"wrapper (expected a {family} text config).")
    else:
        where = "target config.json"
        family = _TEXT_MODEL_TYPES.get(outer)
        if family is None and outer in _WRAPPERS:  # flattened wrapper type without text_config
            family = _WRAPPERS[outer][0]
        if family is None and len(arch_families) == 1:
            family = next(iter(arch_families))
        if family is None:
            raise ConfigError(f"target config.json: model_type {outer!r} with architectures "
                              f"{archs} is not a supported target. Supported: "
                              f"{SUPPORTED_TARGETS}.")
        prefixes, lm_head = ("model.",), "lm_head.weight"
        text = config
    if arch_families and family not in arch_families:
        raise ConfigError(f"{where}: model_type says {family} but architectures {archs} say "
                          f"{sorted(arch_families)}; fix whichever is wrong.")
    return text, family, where, prefixes, lm_head, arch


def _common(f: _Fields) -> dict:
    """Fields every family has, under the same keys."""
    hidden = f.int("hidden_size")
    n_heads, n_kv = f.head_counts()
    return dict(
        hidden_size=hidden,
        num_hidden_layers=f.int("num_hidden_layers"),
        vocab_size=f.int("vocab_size"),
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv,
        rms_norm_eps=f.float("rms_norm_eps"),
        attention_bias=f.bool("attention_bias", False),
        max_position_embeddings=f.int("max_position_embeddings", None),
    )


def _tie(f: _Fields, outer: Mapping, default: bool) -> bool:
    if f.has("tie_word_embeddings"):
        return f.bool("tie_word_embeddings")
    if outer is not f.d and outer.get("tie_word_embeddings") is not None:
        v = outer["tie_word_embeddings"]
        if not isinstance(v, bool):
            raise ConfigError(f"target config.json: tie_word_embeddings must be true or false, "
                              f"got {v!r}.")
        return v
    return f.bool("tie_word_embeddings", default)


def _activation(f: _Fields, *keys: str) -> str:
    for k in keys:
        if f.has(k):
            return f.str(k, choices=SUPPORTED_ACTIVATIONS)
    return f.str(keys[0], choices=SUPPORTED_ACTIVATIONS)


def _no_gemma(**overrides: Any) -> dict:
    base = dict(v_norm=False, attention_k_eq_v=False, global_head_dim=None,
                num_global_key_value_heads=None, embedding_scale=None,
                embedding_scale_exact=None, embedding_dtype=None, final_logit_softcapping=None,
                attn_logit_softcapping=None, use_pre_post_ffn_norms=False, gdn=None, moe=None,
                gemma4=None)
    base.update(overrides)
    return base
