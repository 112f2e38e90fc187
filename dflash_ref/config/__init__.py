"""TargetConfig and DrafterConfig: Hugging Face ``config.json`` dicts, parsed, validated, explained;
and the tensor schemas they imply.

Reading order: :func:`~dflash_ref.config.rope.resolve_rope_theta` (the one rule every RoPE base
goes through), then :meth:`TargetConfig.from_hf <dflash_ref.config.target.TargetConfig.from_hf>`
(find the text config, pick the family, one parser per family), then
:meth:`DrafterConfig.from_hf <dflash_ref.config.drafter.DrafterConfig.from_hf>` and
:meth:`DrafterConfig.validate_against <dflash_ref.config.drafter.DrafterConfig.validate_against>`,
and last the schemas in :mod:`dflash_ref.config.schema`. ``docs/config.md`` lists every field
with the config keys it comes from and the checkpoints it was checked against.

Modules, bottom to top:

- :mod:`~dflash_ref.config.fields`: layer-type names and other constants, the typed ``_Fields``
  reader, small validators, ``round_to_dtype`` / ``embedding_scale_for``;
- :mod:`~dflash_ref.config.rope`: ``resolve_rope_theta``, ``RopeSpec``, rope parameter parsing;
- :mod:`~dflash_ref.config.families`: which family a config.json is, fields all families share;
- :mod:`~dflash_ref.config.qwen`, :mod:`~dflash_ref.config.gemma`: one parser per family
  (``GDNDims`` / ``MoEDims`` live with the Qwen hybrids);
- :mod:`~dflash_ref.config.target`: ``TargetConfig``;
- :mod:`~dflash_ref.config.drafter_keys`: drafter key aliases, layout, SWA layers,
  ``build_target_layer_ids``;
- :mod:`~dflash_ref.config.drafter`: ``DrafterConfig``, ``KeyVisibility``;
- :mod:`~dflash_ref.config.schema`: ``expected_tensors``, ``drafter_expected_tensors``,
  ``gdn_expected_tensors``.

Conventions used throughout:

- Layer types are ``"full_attention"``, ``"sliding_attention"`` and ``"linear_attention"`` (a Gated
  DeltaNet layer, docs/gdn.md).
- A sliding window ``W`` follows HF: it includes the query's own position, so a causal query at
  absolute position q sees keys k with ``q - k < W`` (``q - k <= W - 1``).
- Nothing structural is invented. A missing key is a :class:`~dflash_ref.errors.ConfigError` that
  names the key, says where it was looked for and how to fix it. The few secondary keys that take
  a default (``attention_bias``, ``tie_word_embeddings``, ...) take transformers' class default for
  that family and are listed in ``defaults_used``, so ``describe()`` shows them.
- A RoPE base is never defaulted (docs/config.md, "The RoPE-base rule": a silent 1e6 for a 1e7
  drafter collapsed long-context acceptance). The single exception is opt-in:
  ``TargetConfig.from_hf(..., hf_defaults=True)`` for Gemma 3, whose published multimodal
  ``config.json`` files omit ``rope_theta`` and leave transformers to fill it from
  ``Gemma3TextConfig``; each value filled that way is recorded in ``defaults_used``.
"""

from dflash_ref.config.drafter import DrafterConfig, KeyVisibility
from dflash_ref.config.drafter_keys import DFLASH2_KEYS, build_target_layer_ids
from dflash_ref.config.families import SUPPORTED_TARGETS
from dflash_ref.config.fields import (
    DRAFTER_LAYOUTS,
    EMBEDDING_DTYPES,
    FAMILIES,
    FULL,
    LAYER_TYPES,
    LINEAR,
    ROPE_TYPES,
    SLIDING,
    SUPPORTED_ACTIVATIONS,
    SWA_CONVENTIONS,
    embedding_scale_for,
    round_to_dtype,
)
from dflash_ref.config.gemma import GEMMA3_TEXT_HF_DEFAULTS, GEMMA4_UNSUPPORTED
from dflash_ref.config.qwen import GDNDims, MoEDims
from dflash_ref.config.rope import RopeSpec, resolve_rope_theta
from dflash_ref.config.schema import (
    drafter_expected_tensors,
    expected_tensors,
    gdn_expected_tensors,
)
from dflash_ref.config.target import TargetConfig

__all__ = [
    "DFLASH2_KEYS",
    "DRAFTER_LAYOUTS",
    "EMBEDDING_DTYPES",
    "FAMILIES",
    "FULL",
    "GEMMA3_TEXT_HF_DEFAULTS",
    "GEMMA4_UNSUPPORTED",
    "LAYER_TYPES",
    "LINEAR",
    "ROPE_TYPES",
    "SLIDING",
    "SUPPORTED_ACTIVATIONS",
    "SUPPORTED_TARGETS",
    "SWA_CONVENTIONS",
    "DrafterConfig",
    "GDNDims",
    "KeyVisibility",
    "MoEDims",
    "RopeSpec",
    "TargetConfig",
    "build_target_layer_ids",
    "drafter_expected_tensors",
    "embedding_scale_for",
    "expected_tensors",
    "gdn_expected_tensors",
    "resolve_rope_theta",
    "round_to_dtype",
]
