"""TargetConfig and DrafterConfig: Hugging Face ``config.json`` dicts, parsed, validated, explained.

Reading order: :func:`resolve_rope_theta` (the one rule every RoPE base goes through), then
:meth:`TargetConfig.from_hf` (find the text config, pick the family, one parser per family), then
:meth:`DrafterConfig.from_hf` and :meth:`DrafterConfig.validate_against`. ``docs/config.md`` lists
every field with the config keys it comes from and the checkpoints it was checked against.

Conventions used throughout:

- Layer types are ``"full_attention"``, ``"sliding_attention"`` and ``"linear_attention"`` (a Gated
  DeltaNet layer, spec/gdn.md §3).
- A sliding window ``W`` follows HF: it includes the query's own position, so a causal query at
  absolute position q sees keys k with ``q - k < W`` (``q - k <= W - 1``).
- Nothing structural is invented. A missing key is a :class:`~dflash_ref.errors.ConfigError` that
  names the key, says where it was looked for and how to fix it. The few secondary keys that take
  a default (``attention_bias``, ``tie_word_embeddings``, ...) take transformers' class default for
  that family and are listed in ``defaults_used``, so ``describe()`` shows them.
- A RoPE base is never defaulted (spec/dflash.md §7.4: a silent 1e6 for a 1e7 drafter collapsed
  long-context acceptance). The single exception is opt-in: ``TargetConfig.from_hf(...,
  hf_defaults=True)`` for Gemma 3, whose published multimodal ``config.json`` files omit
  ``rope_theta`` and leave transformers to fill it from ``Gemma3TextConfig``; each value filled
  that way is recorded in ``defaults_used``.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from dflash_ref.errors import ConfigError

FULL = "full_attention"
SLIDING = "sliding_attention"
LINEAR = "linear_attention"
LAYER_TYPES = (FULL, SLIDING, LINEAR)

FAMILIES = ("qwen3", "qwen3_next", "qwen3_5", "gemma3", "gemma4")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu")
ROPE_TYPES = ("default", "linear", "proportional")
EMBEDDING_DTYPES = ("bfloat16", "float16", "float32")
DRAFTER_LAYOUTS = ("zlab", "hf_assistant")
SWA_CONVENTIONS = ("causal_block", "noncausal_window", "bidirectional", "ignore")

SUPPORTED_TARGETS = (
    "Qwen3 dense (model_type qwen3, Qwen3ForCausalLM); "
    "Qwen3-Next (qwen3_next, Qwen3NextForCausalLM); "
    "Qwen3.5 / Qwen3.6 (qwen3_5 or qwen3_5_moe with text_config, qwen3_5_text, qwen3_5_moe_text); "
    "Gemma 3 text (gemma3_text, or gemma3 with text_config); "
    "Gemma 4 text without per-layer embeddings, KV sharing, MoE or double-wide MLP "
    "(gemma4_text, or gemma4 with text_config)"
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
_DRAFTER_ARCHITECTURES = ("DFlashDraftModel", "DFlash2DraftModel")

# transformers' Gemma3TextConfig class defaults for the keys that Google's published multimodal
# Gemma 3 config.json files leave out (their text_config lists only the sizes, rope_scaling and
# sliding_window). Used only with hf_defaults=True, and every use is recorded in defaults_used.
GEMMA3_TEXT_HF_DEFAULTS = MappingProxyType({
    "vocab_size": 262_208,
    "head_dim": 256,
    "num_key_value_heads": 4,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "max_position_embeddings": 131_072,
})

_MISSING = object()


# ---------------------------------------------------------------------------------- small helpers


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float, np.integer, np.floating))
            and not isinstance(v, (bool, np.bool_)))


class _Fields:
    """Typed reads from one config dict that say where a bad value came from.

    ``null`` counts as missing. A missing key takes, in order: the family's transformers default
    from ``hf_table`` if ``use_hf_table`` (recorded), the ``default`` argument (recorded), or raises
    a ConfigError naming the key, where it was looked for, and the fix.
    """

    def __init__(self, d: Mapping, where: str, hf_table: Mapping | None = None,
                 use_hf_table: bool = False, hf_class: str = "") -> None:
        self.d = d
        self.where = where
        self.hf_table = hf_table or {}
        self.use_hf_table = use_hf_table
        self.hf_class = hf_class
        self.defaults_used: list[str] = []

    def has(self, key: str) -> bool:
        return self.d.get(key) is not None

    def missing_hint(self, key: str) -> str:
        if key in self.hf_table:
            return (f" transformers fills {key}={self.hf_table[key]!r} from {self.hf_class}; add "
                    f"it to the config, or pass hf_defaults=True to accept transformers' class "
                    f"defaults (each one is then listed in defaults_used).")
        return ""

    def raw(self, key: str, default: Any = _MISSING, hint: str = "") -> Any:
        v = self.d.get(key)
        if v is not None:
            return v
        if self.use_hf_table and key in self.hf_table:
            v = self.hf_table[key]
            self.defaults_used.append(f"{key}={v!r} ({self.hf_class} default)")
            return v
        if default is not _MISSING:
            if default is not None:
                self.defaults_used.append(f"{key}={default!r} (default)")
            return default
        raise ConfigError(f"{self.where}: required key {key!r} is missing or null.{hint}"
                          f"{self.missing_hint(key)}")

    def int(self, key: str, default: Any = _MISSING, *, minimum: int = 1, hint: str = "") -> Any:
        v = self.raw(key, default, hint)
        if v is None:
            return None
        if not _is_int(v):
            raise ConfigError(f"{self.where}: {key} must be an integer, got {v!r} "
                              f"({type(v).__name__}).")
        if v < minimum:
            raise ConfigError(f"{self.where}: {key} must be >= {minimum}, got {v}.")
        return int(v)

    def float(self, key: str, default: Any = _MISSING, *, positive: bool = True,
              hint: str = "") -> Any:
        v = self.raw(key, default, hint)
        if v is None:
            return None
        if not _is_number(v) or not math.isfinite(float(v)):
            raise ConfigError(f"{self.where}: {key} must be a finite number, got {v!r}.")
        if positive and not float(v) > 0:
            raise ConfigError(f"{self.where}: {key} must be > 0, got {v}.")
        return float(v)

    def bool(self, key: str, default: Any = _MISSING) -> Any:
        v = self.raw(key, default)
        if v is None:
            return None
        if not isinstance(v, (bool, np.bool_)):
            raise ConfigError(f"{self.where}: {key} must be true or false, got {v!r}.")
        return bool(v)

    def str(self, key: str, default: Any = _MISSING, choices: Sequence[str] | None = None) -> Any:
        v = self.raw(key, default)
        if v is None:
            return None
        if not isinstance(v, str):
            raise ConfigError(f"{self.where}: {key} must be a string, got {v!r}.")
        if choices is not None and v not in choices:
            raise ConfigError(f"{self.where}: {key}={v!r} is not supported; supported: "
                              f"{', '.join(choices)}.")
        return v


def _int_list(v: Any, what: str, where: str) -> tuple[int, ...]:
    if not isinstance(v, (list, tuple)) or not all(_is_int(x) for x in v):
        raise ConfigError(f"{where}: {what} must be a list of integers, got {v!r}.")
    return tuple(int(x) for x in v)


def _layer_type_list(v: Any, n_layers: int, allowed: Sequence[str], where: str,
                     key: str = "layer_types") -> tuple[str, ...]:
    if not isinstance(v, (list, tuple)) or not all(isinstance(t, str) for t in v):
        raise ConfigError(f"{where}: {key} must be a list of strings, got {v!r}.")
    if len(v) != n_layers:
        raise ConfigError(f"{where}: {key} has {len(v)} entries but num_hidden_layers is "
                          f"{n_layers}; they must match one entry per layer.")
    bad = sorted({t for t in v if t not in allowed})
    if bad:
        raise ConfigError(f"{where}: {key} contains {bad}; this layout allows only "
                          f"{list(allowed)}.")
    return tuple(v)


def _interval_layer_types(n_layers: int, interval: int, periodic: str, every: str) -> tuple:
    """HF's rule: layer i is ``every`` iff (i + 1) % interval == 0, else ``periodic``."""
    return tuple(every if (i + 1) % interval == 0 else periodic for i in range(n_layers))


def round_to_dtype(x: float, dtype: str) -> float:
    """Round ``x`` as torch does for ``torch.tensor(x).to(dtype)``: float64 -> float32 -> dtype.

    Both narrowing steps round to nearest, ties to even. bfloat16 keeps the top 16 bits of the
    float32 pattern (8 exponent bits, 7 stored mantissa bits), so between 64 and 128 its spacing is
    0.5: sqrt(5376) = 73.32 -> 73.5.
    """
    if dtype not in EMBEDDING_DTYPES:
        raise ConfigError(f"cannot round to dtype {dtype!r}; supported: {EMBEDDING_DTYPES}")
    f32 = np.float32(x)
    if dtype == "float32":
        return float(f32)
    if dtype == "float16":
        return float(np.float16(f32))
    bits = int(np.array(f32, dtype=np.float32).view(np.uint32))
    if (bits & 0x7F800000) == 0x7F800000:  # inf / nan: truncate, keep the class
        return float(np.array(bits & 0xFFFF0000, dtype=np.uint32).view(np.float32))
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round half to even
    return float(np.array(rounded, dtype=np.uint32).view(np.float32))


def embedding_scale_for(hidden_size: int, dtype: str = "bfloat16") -> float:
    """Gemma's embedding normaliser: sqrt(hidden_size) rounded to the embedding dtype.

    HF multiplies the looked-up rows by ``embed_scale.to(weight.dtype)``, so a bf16 checkpoint is
    scaled by the bf16-rounded value (spec/dflash.md §4.2): bf16 sqrt(5376) = 73.32 -> 73.5,
    sqrt(3840) = 61.97 -> 62.0, sqrt(2816) = 53.07 -> 53.0.
    """
    return round_to_dtype(math.sqrt(hidden_size), dtype)


# ---------------------------------------------------------------------------------- RoPE


def _theta_value(v: Any, key: str, where: str) -> float:
    if not _is_number(v) or not math.isfinite(float(v)) or not float(v) > 0:
        raise ConfigError(f"{where}: {key} must be a positive finite number, got {v!r}.")
    return float(v)


def resolve_rope_theta(cfg: Mapping, where: str = "config.json",
                       layer_type: str | None = None) -> float:
    """The RoPE base of a config dict, by one rule (spec/dflash.md §7.4, spec/kvflash_gate.md §7).

    Order, first non-null value wins:

    0. only when ``layer_type`` is given: ``rope_parameters[layer_type].rope_theta`` (the
       transformers-5 dict keyed by layer type, e.g. Gemma 3/4);
    1. ``rope_parameters.rope_theta`` (nested, transformers >= 5);
    2. top-level ``rope_theta`` (4.x-era configs).

    A null value falls through to the next place. A genuine 1e6 is accepted like any other value.
    Missing everywhere is a ConfigError: there is no default, because the converter bug this
    guards against was exactly a silent 1e6 for drafters trained at 1e7.

    Args:
        cfg: one config dict (the text config for multimodal targets).
        where: names the dict in error messages, e.g. "drafter config.json".
        layer_type: look in the per-layer-type entry first.
    Returns:
        theta as a float.
    """
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{where}: expected a config dict, got {type(cfg).__name__}.")
    rp = cfg.get("rope_parameters")
    if rp is not None and not isinstance(rp, Mapping):
        raise ConfigError(f"{where}: rope_parameters must be a dict, got {rp!r}.")
    if layer_type is not None and rp is not None and isinstance(rp.get(layer_type), Mapping):
        v = rp[layer_type].get("rope_theta")
        if v is not None:
            return _theta_value(v, f"rope_parameters.{layer_type}.rope_theta", where)
    if rp is not None and rp.get("rope_theta") is not None:
        return _theta_value(rp["rope_theta"], "rope_parameters.rope_theta", where)
    if cfg.get("rope_theta") is not None:
        return _theta_value(cfg["rope_theta"], "rope_theta", where)
    looked = "rope_parameters.rope_theta (nested, transformers >= 5) and top-level rope_theta"
    if layer_type is not None:
        looked = f"rope_parameters.{layer_type}.rope_theta, " + looked
    raise ConfigError(
        f"{where}: no RoPE base: {looked} are all missing or null. Add one, e.g. "
        f'"rope_parameters": {{"rope_theta": 10000000.0}} or "rope_theta": 1000000.0, with the '
        f"value the model was trained with. dflash-ref never assumes a default: a silently "
        f"defaulted 1e6 for a 1e7 model runs without error and collapses long-context accuracy.")


@dataclass(frozen=True)
class RopeSpec:
    """RoPE of one layer type (NEOX rotate-half; spec/dflash.md §4.6).

    - ``rope_type="default"``: ``inv_freq_i = theta^(-2i/rotary_dim)``, i < rotary_dim/2; the
      first ``rotary_dim`` channels of a head are rotated as two halves of ``rotary_dim / 2``
      (``rotate_half_span == rotary_dim``); channels ``rotary_dim..head_dim`` pass through.
      ``dflash_ref.ops.rope.rope(x, pos, theta, rotary_dim)`` is exactly this.
    - ``"linear"``: as default, with every ``inv_freq`` divided by ``factor`` (Gemma 3 global
      layers: factor 8).
    - ``"proportional"`` (Gemma 4 global layers): ``inv_freq_i = theta^(-2i/head_dim)`` for
      ``i < rotary_dim/2`` and 0 for the other ``(head_dim - rotary_dim)/2`` frequencies, divided
      by ``factor``; the rotation pairs channel i with ``i + head_dim/2`` across the whole head
      (``rotate_half_span == head_dim``). Not the same as default partial rotary.

    ``mrope_section`` (Qwen3.5) is recorded for completeness: with text-only positions all three
    M-RoPE streams carry the same position, which reduces to the plain rotation above.
    """

    theta: float
    rope_type: str
    factor: float
    head_dim: int
    partial_rotary_factor: float
    rotary_dim: int
    rotate_half_span: int
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False


def _rope_params(cfg: Mapping, layer_type: str | None) -> Mapping:
    """The rope_parameters entry that applies to ``layer_type`` (keyed dict or flat dict)."""
    rp = cfg.get("rope_parameters")
    if not isinstance(rp, Mapping):
        return {}
    if layer_type is not None and isinstance(rp.get(layer_type), Mapping):
        return rp[layer_type]
    if any(isinstance(v, Mapping) for v in rp.values()):  # keyed dict without this layer type
        return {k: v for k, v in rp.items() if not isinstance(v, Mapping)}
    return rp


def _make_rope(theta: float, params: Mapping, head_dim: int, where: str, *,
               partial_rotary_factor: float = 1.0, allow_proportional: bool = False) -> RopeSpec:
    rope_type = params.get("rope_type") or params.get("type") or "default"
    allowed = ROPE_TYPES if allow_proportional else ROPE_TYPES[:2]
    if rope_type not in allowed:
        raise ConfigError(
            f"{where}: rope_type {rope_type!r} is not supported here; supported: "
            f"{list(allowed)}. (YaRN and the other context-extension schemes are not implemented; "
            f"remove the scaling block to run at the trained context length.)")
    factor = params.get("factor")
    if rope_type == "linear" and factor is None:
        raise ConfigError(f"{where}: rope_type 'linear' needs a 'factor'.")
    factor = 1.0 if factor is None else _theta_value(factor, "rope factor", where)
    if rope_type == "default":
        factor = 1.0
    prf = partial_rotary_factor
    if not 0.0 < prf <= 1.0:
        raise ConfigError(f"{where}: partial_rotary_factor must be in (0, 1], got {prf}.")
    if rope_type == "proportional":
        rotary_dim = 2 * int(prf * head_dim // 2)
        span = head_dim
    else:
        rotary_dim = int(head_dim * prf)
        span = rotary_dim
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ConfigError(f"{where}: head_dim {head_dim} x partial_rotary_factor {prf} gives "
                          f"rotary_dim {rotary_dim}; it must be a positive even number.")
    section = params.get("mrope_section")
    if section is not None:
        section = _int_list(section, "rope_parameters.mrope_section", where)
    return RopeSpec(theta=theta, rope_type=rope_type, factor=factor, head_dim=head_dim,
                    partial_rotary_factor=prf, rotary_dim=rotary_dim, rotate_half_span=span,
                    mrope_section=section,
                    mrope_interleaved=bool(params.get("mrope_interleaved", False)))


# ---------------------------------------------------------------------------------- target


@dataclass(frozen=True)
class GDNDims:
    """Gated DeltaNet layer sizes (spec/gdn.md §3.1, §3.5).

    H = num_key_heads, HV = num_value_heads (a multiple of H), dk / dv head dims, conv kernel K.
    ``projection_layout``: "qkvz_ba_grouped" (Qwen3-Next: in_proj_qkvz / in_proj_ba grouped per
    key head) or "qkv_z_b_a" (Qwen3.5: separate in_proj_qkv, in_proj_z, in_proj_b, in_proj_a).
    ``norm_offset`` is 0.0: the GDN gated output norm multiplies by plain w, unlike the (1+w)
    norms everywhere else in these models (spec/gdn.md §3.4).
    """

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel_dim: int
    projection_layout: str
    norm_offset: float = 0.0

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels through the short conv: q, k and v (2 * key_dim + value_dim)."""
        return 2 * self.key_dim + self.value_dim

    @property
    def heads_per_key_head(self) -> int:
        """r = HV / H, value heads sharing one key head (spec/gdn.md §1.5)."""
        return self.num_value_heads // self.num_key_heads


@dataclass(frozen=True)
class MoEDims:
    """Sparse MLP sizes as the config states them (Qwen3-Next, Qwen3.5 MoE). Recorded so that
    model code can refuse an MoE checkpoint by name rather than run it as dense."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int | None
    decoder_sparse_step: int
    mlp_only_layers: tuple[int, ...]
    norm_topk_prob: bool


@dataclass(frozen=True)
class TargetConfig:
    """A target model's text config, in the terms the reference model code uses.

    Build with :meth:`from_hf`. Per-layer queries: :meth:`layer_type`, :meth:`rope_for`,
    :meth:`rope_theta_for`, :meth:`head_dim_for`, :meth:`num_key_value_heads_for`.
    Fields are documented in docs/config.md; the non-obvious ones:

    - ``norm_offset``: 1.0 for the zero-centred (1 + w) RMSNorms of Qwen3-Next/3.5 and Gemma 3;
      0.0 for Qwen3 and Gemma 4 (plain w).
    - ``attention_scale``: softmax scale; head_dim^-0.5 for Qwen, ``query_pre_attn_scalar^-0.5``
      for Gemma 3, 1.0 for Gemma 4 (its q/k norms take the place of the scale).
    - ``embedding_scale``: what the embedding rows are multiplied by, i.e. ``sqrt(hidden_size)``
      rounded to ``embedding_dtype`` (Gemma); None for Qwen. ``embedding_scale_exact`` is the
      unrounded sqrt, kept so the difference stays visible.
    - ``weight_prefix``: prefix of the decoder-stack tensors (``{prefix}layers.{i}.``,
      ``{prefix}embed_tokens.weight``, ``{prefix}norm.weight``); ``weight_prefix_candidates`` are
      the layouts seen for this wrapper, to be confirmed against the checkpoint's tensor names.
    - ``defaults_used``: every key that was absent and took a default, as "key=value (source)".
    """

    family: str
    model_type: str
    architecture: str | None
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int | None
    hidden_act: str
    rms_norm_eps: float
    norm_offset: float
    layer_types: tuple[str, ...]
    sliding_window: int | None
    rope_by_type: Mapping[str, RopeSpec]
    attn_output_gate: bool
    qk_norm: bool
    v_norm: bool
    attention_scale: float
    attention_bias: bool
    attention_k_eq_v: bool
    global_head_dim: int | None
    num_global_key_value_heads: int | None
    embedding_scale: float | None
    embedding_scale_exact: float | None
    embedding_dtype: str | None
    final_logit_softcapping: float | None
    attn_logit_softcapping: float | None
    tie_word_embeddings: bool
    use_pre_post_ffn_norms: bool
    weight_prefix: str
    weight_prefix_candidates: tuple[str, ...]
    lm_head_name: str
    gdn: GDNDims | None
    moe: MoEDims | None
    max_position_embeddings: int | None
    defaults_used: tuple[str, ...] = ()
    raw: Mapping = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_hf(cls, config: Mapping, *, hf_defaults: bool = False) -> TargetConfig:
        """Parse a Hugging Face ``config.json`` dict of a supported target.

        Args:
            config: the whole config.json (multimodal wrappers with ``text_config`` included).
            hf_defaults: Gemma 3 only: fill keys the file omits from transformers'
                ``Gemma3TextConfig`` defaults (:data:`GEMMA3_TEXT_HF_DEFAULTS`), recording each.
        Raises:
            ConfigError: unknown architecture (the message lists the supported ones), a missing
                or malformed key, an unsupported feature.
        """
        if not isinstance(config, Mapping):
            raise ConfigError(f"target config: expected a dict parsed from config.json, got "
                              f"{type(config).__name__}.")
        text, family, where, prefixes, lm_head, arch = _locate_text_config(config)
        parser = {"qwen3": _parse_qwen3, "qwen3_next": _parse_qwen_hybrid,
                  "qwen3_5": _parse_qwen_hybrid, "gemma3": _parse_gemma3,
                  "gemma4": _parse_gemma4}[family]
        table = GEMMA3_TEXT_HF_DEFAULTS if family == "gemma3" else None
        f = _Fields(text, where, table, hf_defaults and family == "gemma3", "Gemma3TextConfig")
        kw = parser(f, family, config)
        model_type = text.get("model_type") or config.get("model_type") or family
        return cls(family=family, model_type=str(model_type), architecture=arch,
                   weight_prefix=prefixes[0], weight_prefix_candidates=prefixes,
                   lm_head_name=lm_head, defaults_used=tuple(f.defaults_used),
                   raw=MappingProxyType(dict(config)), **kw)

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kwargs: Any) -> TargetConfig:
        """:meth:`from_hf` on a config.json file, or on the config.json inside a directory."""
        return cls.from_hf(_read_json(path, "target"), **kwargs)

    def with_weight_prefix(self, prefix: str) -> TargetConfig:
        """A copy with another decoder-stack prefix, after the loader has checked the tensors."""
        return replace(self, weight_prefix=prefix)

    # ------------------------------------------------------------------ per-layer queries

    def _check_layer(self, layer_idx: int) -> None:
        if not _is_int(layer_idx) or not 0 <= layer_idx < self.num_hidden_layers:
            raise IndexError(f"layer {layer_idx} out of range 0..{self.num_hidden_layers - 1}")

    def layer_type(self, layer_idx: int) -> str:
        self._check_layer(layer_idx)
        return self.layer_types[layer_idx]

    def layers_of_type(self, layer_type: str) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == layer_type)

    def rope_for(self, layer_idx: int) -> RopeSpec:
        """RoPE of an attention layer. GDN (linear_attention) layers have none."""
        t = self.layer_type(layer_idx)
        if t == LINEAR:
            raise ConfigError(f"layer {layer_idx} is a linear_attention (GDN) layer; it has no "
                              f"RoPE. Ask rope_for() only for attention layers.")
        return self.rope_by_type[t]

    def rope_theta_for(self, layer_idx: int) -> float:
        return self.rope_for(layer_idx).theta

    def head_dim_for(self, layer_idx: int) -> int:
        """Attention head dim of a layer: Gemma 4 global layers use global_head_dim."""
        if self.layer_type(layer_idx) == FULL and self.global_head_dim is not None:
            return self.global_head_dim
        return self.head_dim

    def num_key_value_heads_for(self, layer_idx: int) -> int:
        """KV heads of a layer: Gemma 4 global layers with attention_k_eq_v use the global count."""
        if (self.layer_type(layer_idx) == FULL and self.attention_k_eq_v
                and self.num_global_key_value_heads is not None):
            return self.num_global_key_value_heads
        return self.num_key_value_heads

    @property
    def partial_rotary_factor(self) -> float:
        """partial_rotary_factor of the full-attention layers (1.0 for full rotary)."""
        return self._full_rope().partial_rotary_factor

    @property
    def rotary_dim(self) -> int:
        """Rotated channels per head in the full-attention layers."""
        return self._full_rope().rotary_dim

    def _full_rope(self) -> RopeSpec:
        if FULL in self.rope_by_type:
            return self.rope_by_type[FULL]
        return next(iter(self.rope_by_type.values()))

    # ------------------------------------------------------------------ summary

    def describe(self) -> str:
        """A short human summary (for ``dflash-ref inspect``)."""
        counts = {t: self.layer_types.count(t) for t in LAYER_TYPES if t in self.layer_types}
        mix = " + ".join(f"{n} {t}" for t, n in counts.items())
        lines = [
            f"{self.family} target ({self.architecture or self.model_type}), decoder tensors "
            f"under {self.weight_prefix!r}",
            f"  {self.num_hidden_layers} layers: {mix}",
            f"  hidden {self.hidden_size}, vocab {self.vocab_size}, ffn "
            f"{self.intermediate_size} ({self.hidden_act})"
            + (f", MoE {self.moe.num_experts} experts top-{self.moe.num_experts_per_tok}"
               if self.moe else ""),
        ]
        attn = (f"  attention: {self.num_attention_heads} q / {self.num_key_value_heads} kv heads "
                f"x {self.head_dim}")
        if self.global_head_dim is not None:
            g_kv = self.num_global_key_value_heads if self.attention_k_eq_v else None
            attn += (f" (global layers: x {self.global_head_dim}"
                     + (f", {g_kv} kv heads, k = v" if g_kv else "") + ")")
        extras = [x for x, on in (("output gate", self.attn_output_gate),
                                  ("q/k norm", self.qk_norm), ("v norm", self.v_norm)) if on]
        attn += ", " + ", ".join(extras + [f"scale {self.attention_scale:.6g}"])
        lines.append(attn)
        if self.sliding_window is not None and SLIDING in self.layer_types:
            lines.append(f"  sliding window {self.sliding_window} (includes the query)")
        for t, r in self.rope_by_type.items():
            desc = f"  rope[{t}]: theta {r.theta:g}, {r.rope_type}"
            if r.factor != 1.0:
                desc += f" factor {r.factor:g}"
            desc += f", rotary {r.rotary_dim}/{r.head_dim}"
            if r.mrope_section:
                desc += f", mrope {list(r.mrope_section)}"
            lines.append(desc)
        if self.gdn is not None:
            g = self.gdn
            lines.append(f"  gdn: {g.num_key_heads} k-heads x {g.key_head_dim}, "
                         f"{g.num_value_heads} v-heads x {g.value_head_dim}, conv "
                         f"{g.conv_kernel_dim}, {g.projection_layout}; gated norm plain w")
        norms = "(1+w)" if self.norm_offset == 1.0 else "w"
        lines.append(f"  norms {norms}, eps {self.rms_norm_eps:g}"
                     + (", pre/post ffn norms" if self.use_pre_post_ffn_norms else "")
                     + f"; tied embeddings: {'yes' if self.tie_word_embeddings else 'no'}")
        if self.embedding_scale is not None:
            lines.append(f"  embedding scale {self.embedding_scale:g} (sqrt({self.hidden_size}) = "
                         f"{self.embedding_scale_exact:.4f} rounded to {self.embedding_dtype}; the "
                         f"rounded value is used)")
        caps = [f"{n} {v:g}" for n, v in (("final logit softcap", self.final_logit_softcapping),
                                          ("attn logit softcap", self.attn_logit_softcapping))
                if v is not None]
        if caps:
            lines.append("  " + ", ".join(caps))
        if self.defaults_used:
            lines.append("  defaults used: " + "; ".join(self.defaults_used))
        return "\n".join(lines)


def _read_json(path: str | os.PathLike, what: str) -> dict:
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, "config.json")
    try:
        with open(p, encoding="utf-8") as fh:
            d = json.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{what} config: {p} does not exist; pass the path of config.json "
                          f"or of the checkpoint directory that holds it.") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what} config: {p} is not valid JSON ({exc}).") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{what} config: {p} holds a {type(d).__name__}, not a JSON object.")
    return d


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
    n_heads = f.int("num_attention_heads")
    n_kv = f.int("num_key_value_heads")
    if n_heads % n_kv:
        raise ConfigError(f"{f.where}: num_attention_heads {n_heads} is not a multiple of "
                          f"num_key_value_heads {n_kv} (grouped-query attention needs that).")
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
                attn_logit_softcapping=None, use_pre_post_ffn_norms=False, gdn=None, moe=None)
    base.update(overrides)
    return base


def _parse_qwen3(f: _Fields, family: str, outer: Mapping) -> dict:
    """Qwen3 dense: Llama-like with per-head q/k RMSNorm, plain-w norms, full rotary."""
    kw = _common(f)
    n = kw["num_hidden_layers"]
    head_dim = f.int("head_dim")
    use_swa = f.bool("use_sliding_window", False)
    window = f.int("sliding_window", None) if use_swa else None
    if f.has("layer_types"):
        layer_types = _layer_type_list(f.d["layer_types"], n, (FULL, SLIDING), f.where)
        if SLIDING in layer_types and window is None:
            window = f.int("sliding_window", hint=" layer_types marks sliding_attention layers, "
                           "so the window size is needed.")
    else:
        # transformers Qwen3Config: sliding iff a window is in use and i >= max_window_layers.
        mwl = f.int("max_window_layers", n, minimum=0) if window is not None else n
        layer_types = tuple(SLIDING if window is not None and i >= mwl else FULL
                            for i in range(n))
    theta = resolve_rope_theta(f.d, f.where)
    rope = _make_rope(theta, _rope_scaling(f.d), head_dim, f.where)
    kw.update(
        head_dim=head_dim,
        intermediate_size=f.int("intermediate_size"),
        hidden_act=_activation(f, "hidden_act"),
        norm_offset=0.0,
        layer_types=layer_types,
        sliding_window=window,
        rope_by_type=MappingProxyType({t: rope for t in dict.fromkeys(layer_types)}),
        attn_output_gate=False,
        qk_norm=True,
        attention_scale=head_dim ** -0.5,
        tie_word_embeddings=_tie(f, outer, False),
        **_no_gemma(),
    )
    return kw


def _rope_scaling(d: Mapping) -> Mapping:
    """Flat rope params: rope_parameters (transformers 5) or the 4.x rope_scaling block."""
    params = _rope_params(d, None)
    if params:
        return params
    rs = d.get("rope_scaling")
    if rs is None:
        return {}
    if not isinstance(rs, Mapping):
        raise ConfigError(f"config.json: rope_scaling must be a dict or null, got {rs!r}.")
    return rs


def _parse_qwen_hybrid(f: _Fields, family: str, outer: Mapping) -> dict:
    """Qwen3-Next / Qwen3.5: 3 GDN layers per full-attention layer, (1+w) norms, gated attention."""
    kw = _common(f)
    n = kw["num_hidden_layers"]
    interval = f.int("full_attention_interval", None)
    if f.has("layer_types"):
        layer_types = _layer_type_list(f.d["layer_types"], n, (FULL, LINEAR), f.where)
        if interval is not None and layer_types != _interval_layer_types(n, interval, LINEAR,
                                                                         FULL):
            warnings.warn(f"{f.where}: layer_types disagrees with full_attention_interval "
                          f"{interval}; transformers uses layer_types, and so does dflash-ref.",
                          stacklevel=3)
    elif interval is not None:
        layer_types = _interval_layer_types(n, interval, LINEAR, FULL)
    else:
        raise ConfigError(f"{f.where}: neither layer_types nor full_attention_interval is given, "
                          f"so which layers are GDN is unknown. Add \"full_attention_interval\": 4 "
                          f"(every published Qwen3-Next/3.5 config) or the layer_types list.")
    if FULL not in layer_types:
        raise ConfigError(f"{f.where}: no full_attention layer in layer_types; a hybrid model "
                          f"needs at least one.")
    head_dim = f.int("head_dim")
    params = _rope_params(f.d, None)
    if params.get("partial_rotary_factor") is not None:
        prf = _theta_value(params["partial_rotary_factor"], "partial_rotary_factor", f.where)
    else:
        prf = f.float("partial_rotary_factor", 0.25)
    theta = resolve_rope_theta(f.d, f.where)
    rope = _make_rope(theta, _rope_scaling(f.d), head_dim, f.where, partial_rotary_factor=prf)
    gate = f.bool("attn_output_gate", True)
    gdn = GDNDims(
        num_key_heads=f.int("linear_num_key_heads"),
        num_value_heads=f.int("linear_num_value_heads"),
        key_head_dim=f.int("linear_key_head_dim"),
        value_head_dim=f.int("linear_value_head_dim"),
        conv_kernel_dim=f.int("linear_conv_kernel_dim"),
        projection_layout="qkvz_ba_grouped" if family == "qwen3_next" else "qkv_z_b_a",
    )
    if gdn.num_value_heads % gdn.num_key_heads:
        raise ConfigError(f"{f.where}: linear_num_value_heads {gdn.num_value_heads} is not a "
                          f"multiple of linear_num_key_heads {gdn.num_key_heads} (spec/gdn.md "
                          f"§1.5 needs an integer heads-per-key-head ratio).")
    moe = None
    if (f.int("num_experts", None, minimum=0) or 0) > 0:
        mlp_only = f.d.get("mlp_only_layers") or []
        moe = MoEDims(
            num_experts=f.int("num_experts"),
            num_experts_per_tok=f.int("num_experts_per_tok"),
            moe_intermediate_size=f.int("moe_intermediate_size"),
            shared_expert_intermediate_size=f.int("shared_expert_intermediate_size", None,
                                                  minimum=0),
            decoder_sparse_step=f.int("decoder_sparse_step", 1),
            mlp_only_layers=_int_list(mlp_only, "mlp_only_layers", f.where),
            norm_topk_prob=f.bool("norm_topk_prob", True),
        )
    kw.update(
        head_dim=head_dim,
        intermediate_size=f.int("intermediate_size", None if moe else _MISSING),
        hidden_act=_activation(f, "hidden_act"),
        norm_offset=1.0,
        layer_types=layer_types,
        sliding_window=None,
        rope_by_type=MappingProxyType({FULL: rope}),
        attn_output_gate=gate,
        qk_norm=True,
        attention_scale=head_dim ** -0.5,
        tie_word_embeddings=_tie(f, outer, False),
        **_no_gemma(gdn=gdn, moe=moe),
    )
    return kw


def _embedding(f: _Fields, outer: Mapping, hidden: int) -> dict:
    dtype = None
    for d in (f.d, outer):
        for key in ("torch_dtype", "dtype"):
            if dtype is None and d.get(key) is not None:
                dtype = d[key]
    if dtype is None:
        dtype = "bfloat16"
        f.defaults_used.append("embedding dtype=bfloat16 (no torch_dtype/dtype in the config; "
                               "every published Gemma checkpoint is bf16)")
    if dtype not in EMBEDDING_DTYPES:
        raise ConfigError(f"{f.where}: torch_dtype/dtype {dtype!r} is not one of "
                          f"{EMBEDDING_DTYPES}; the Gemma embedding scale is rounded to it.")
    return dict(embedding_scale=embedding_scale_for(hidden, dtype),
                embedding_scale_exact=math.sqrt(hidden), embedding_dtype=dtype)


def _parse_gemma3(f: _Fields, family: str, outer: Mapping) -> dict:
    """Gemma 3 text: 5 sliding : 1 global, two RoPE bases, (1+w) norms, sandwich FFN norms."""
    kw = _common(f)
    n = kw["num_hidden_layers"]
    if f.has("layer_types"):
        layer_types = _layer_type_list(f.d["layer_types"], n, (FULL, SLIDING), f.where)
    else:
        pattern = f.int("sliding_window_pattern", hint=" Without layer_types it decides which "
                        "layers are global (6 in every published Gemma 3).")
        layer_types = _interval_layer_types(n, pattern, SLIDING, FULL)
    head_dim = f.int("head_dim")
    # Global layers: rope_parameters.full_attention, then the usual nested/top-level rule.
    try:
        theta_full = resolve_rope_theta(f.d, f.where, layer_type=FULL)
    except ConfigError as exc:
        if not (f.use_hf_table and "rope_theta" in f.hf_table):
            raise ConfigError(f"{exc}{f.missing_hint('rope_theta')}") from None
        theta_full = f.float("rope_theta")
    full_params = _rope_params(f.d, FULL) or _rope_scaling(f.d)
    # Local layers: rope_parameters.sliding_attention, then rope_local_base_freq. Never the
    # global rope_theta: 1e6 in place of 1e4 would be silently wrong.
    rp = f.d.get("rope_parameters")
    sliding_entry = rp.get(SLIDING) if isinstance(rp, Mapping) else None
    if isinstance(sliding_entry, Mapping) and sliding_entry.get("rope_theta") is not None:
        theta_local = _theta_value(sliding_entry["rope_theta"],
                                   "rope_parameters.sliding_attention.rope_theta", f.where)
        local_params = sliding_entry
    else:
        theta_local = f.float("rope_local_base_freq", hint=" It is the RoPE base of the sliding "
                              "layers (10000.0 in every published Gemma 3); the global "
                              "rope_theta must not be used for them.")
        local_params = {}
    rope = {FULL: _make_rope(theta_full, full_params, head_dim, f.where),
            SLIDING: _make_rope(theta_local, local_params, head_dim, f.where)}
    qpas = f.float("query_pre_attn_scalar")
    kw.update(
        head_dim=head_dim,
        intermediate_size=f.int("intermediate_size"),
        hidden_act=_activation(f, "hidden_activation", "hidden_act"),
        norm_offset=1.0,
        layer_types=layer_types,
        sliding_window=f.int("sliding_window"),
        rope_by_type=MappingProxyType({t: rope[t] for t in dict.fromkeys(layer_types)}),
        attn_output_gate=False,
        qk_norm=True,
        attention_scale=qpas ** -0.5,
        tie_word_embeddings=_tie(f, outer, True),
        **_no_gemma(
            final_logit_softcapping=f.float("final_logit_softcapping", None),
            attn_logit_softcapping=f.float("attn_logit_softcapping", None),
            use_pre_post_ffn_norms=True,
            **_embedding(f, outer, kw["hidden_size"]),
        ),
    )
    return kw


# Gemma 4 features with no counterpart in the reference model; each is refused by name.
GEMMA4_UNSUPPORTED = (
    "per-layer embeddings (hidden_size_per_layer_input > 0: gemma-4-E2B/E4B)",
    "KV sharing across layers (num_kv_shared_layers > 0: E2B/E4B)",
    "mixture-of-experts blocks (enable_moe_block: 26B-A4B)",
    "double-wide MLP (use_double_wide_mlp)",
    "bidirectional attention (use_bidirectional_attention)",
)


def _parse_gemma4(f: _Fields, family: str, outer: Mapping) -> dict:
    """Gemma 4 text (dense, e.g. 31B): Gemma 3's layout with a wider global head, K = V on global
    layers, proportional RoPE, plain-w norms, a scale-free v norm and attention scale 1.0."""
    problems = []
    # transformers' Gemma4TextConfig default is 256 (on) for a missing key; an explicit null or 0
    # turns per-layer embeddings off (the 31B config has null).
    if "hidden_size_per_layer_input" in f.d:
        ple = f.d["hidden_size_per_layer_input"]
    else:
        ple = 256
    if ple:
        problems.append(f"hidden_size_per_layer_input={ple} (per-layer embeddings; a missing key "
                        f"means transformers' default 256; set it to 0 if the checkpoint has no "
                        f"embed_tokens_per_layer tensor)")
    if f.int("num_kv_shared_layers", 0, minimum=0):
        problems.append(f"num_kv_shared_layers={f.d['num_kv_shared_layers']} (KV sharing)")
    if f.bool("enable_moe_block", False):
        problems.append("enable_moe_block=true (mixture of experts)")
    if f.bool("use_double_wide_mlp", False):
        problems.append("use_double_wide_mlp=true")
    if f.d.get("use_bidirectional_attention") is not None:
        problems.append(f"use_bidirectional_attention={f.d['use_bidirectional_attention']!r}")
    if problems:
        raise ConfigError(f"{f.where}: this Gemma 4 checkpoint uses features dflash-ref does not "
                          f"implement: {'; '.join(problems)}. Supported: the dense Gemma 4 text "
                          f"layout (e.g. gemma-4-31B). Not supported: "
                          f"{'; '.join(GEMMA4_UNSUPPORTED)}.")
    kw = _common(f)
    n = kw["num_hidden_layers"]
    if f.has("layer_types"):
        layer_types = list(_layer_type_list(f.d["layer_types"], n, (FULL, SLIDING), f.where))
    else:
        pattern = f.int("sliding_window_pattern", 6)
        layer_types = list(_interval_layer_types(n, pattern, SLIDING, FULL))
    if layer_types[-1] != FULL:
        warnings.warn(f"{f.where}: the last layer is {layer_types[-1]}; transformers' Gemma 4 "
                      f"forces it to full_attention, and so does dflash-ref.", stacklevel=3)
        layer_types[-1] = FULL
    layer_types = tuple(layer_types)
    head_dim = f.int("head_dim")
    global_head_dim = f.int("global_head_dim", 512)
    k_eq_v = f.bool("attention_k_eq_v", False)
    n_global_kv = f.int("num_global_key_value_heads", None) if k_eq_v else None
    if n_global_kv is not None and kw["num_attention_heads"] % n_global_kv:
        raise ConfigError(f"{f.where}: num_attention_heads {kw['num_attention_heads']} is not a "
                          f"multiple of num_global_key_value_heads {n_global_kv}.")
    rope = {}
    for t, hd in ((SLIDING, head_dim), (FULL, global_head_dim)):
        if t not in layer_types:
            continue
        params = _rope_params(f.d, t)
        prf = params.get("partial_rotary_factor")
        prf = 1.0 if prf is None else _theta_value(prf, f"rope_parameters.{t}.partial_rotary_"
                                                        f"factor", f.where)
        rope[t] = _make_rope(resolve_rope_theta(f.d, f.where, layer_type=t), params, hd, f.where,
                             partial_rotary_factor=prf, allow_proportional=True)
    kw.update(
        head_dim=head_dim,
        intermediate_size=f.int("intermediate_size"),
        hidden_act=_activation(f, "hidden_activation", "hidden_act"),
        norm_offset=0.0,
        layer_types=layer_types,
        sliding_window=f.int("sliding_window"),
        rope_by_type=MappingProxyType({t: rope[t] for t in dict.fromkeys(layer_types)}),
        attn_output_gate=False,
        qk_norm=True,
        attention_scale=1.0,
        tie_word_embeddings=_tie(f, outer, True),
        **_no_gemma(
            v_norm=True,
            attention_k_eq_v=k_eq_v,
            global_head_dim=global_head_dim,
            num_global_key_value_heads=n_global_kv,
            final_logit_softcapping=f.float("final_logit_softcapping", None),
            attn_logit_softcapping=f.float("attn_logit_softcapping", None),
            use_pre_post_ffn_norms=True,
            **_embedding(f, outer, kw["hidden_size"]),
        ),
    )
    return kw


# ---------------------------------------------------------------------------------- drafter


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The default captured target layers when a drafter config lists none (spec/dflash.md §1).

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


@dataclass(frozen=True)
class KeyVisibility:
    """Which keys a drafter noise query sees in one layer, by absolute positions.

    A key at k is visible from a query at q iff
    ``(max_back is None or q - k <= max_back) and (max_ahead is None or k - q <= max_ahead)``.
    Context keys always lie before the block, so only max_back can hide them; noise keys are hidden
    by ``max_ahead`` (0 = causal within the block) or, for huge blocks, by the window.
    """

    max_back: int | None
    max_ahead: int | None

    def visible(self, q: int, k: int) -> bool:
        if self.max_back is not None and q - k > self.max_back:
            return False
        return self.max_ahead is None or k - q <= self.max_ahead


@dataclass(frozen=True)
class DrafterConfig:
    """A DFlash drafter config (spec/dflash.md §1, §4.9).

    Two layouts: ``"zlab"`` (z-lab ``DFlashDraftModel`` checkpoints: ``fc`` / ``hidden_norm``
    tensors, DFlash keys at the top level or under ``dflash_config``) and ``"hf_assistant"``
    (transformers-native assistant models such as ``muse_glimmer_assistant``: ``encoder.fc`` /
    ``encoder.output_norm_enc``, keys at the top level, all layers sliding by default, window
    2048).

    Attention in sliding layers follows ``swa_convention`` (see :meth:`visibility` and
    docs/config.md): ``"causal_block"`` (default for zlab: the z-lab reference, vLLM and lucebox),
    ``"noncausal_window"``, ``"bidirectional"`` (default for hf_assistant) or ``"ignore"``.
    ``causal_override`` (``is_causal`` / ``dflash_config.causal``) sets causality for every layer.
    """

    layout: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    hidden_act: str
    rms_norm_eps: float
    vocab_size: int | None
    attention_bias: bool
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    target_layer_ids_source: str
    num_target_layers: int | None
    layer_types: tuple[str, ...]
    sliding_window: int | None
    swa_convention: str
    causal_override: bool | None
    rope_by_type: Mapping[str, RopeSpec]
    input_embedding_scale: float | None
    attention_sink_bias: bool
    max_position_embeddings: int | None
    defaults_used: tuple[str, ...] = ()
    raw: Mapping = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_hf(cls, config: Mapping, *, layout: str | None = None,
                swa_convention: str | None = None) -> DrafterConfig:
        """Parse a drafter ``config.json`` dict.

        Args:
            config: the drafter's config.json.
            layout: "zlab" or "hf_assistant"; detected when None (``dflash_config`` or a
                ``DFlashDraftModel`` architecture -> zlab; a ``*_assistant`` model_type or
                ``*AssistantModel`` architecture -> hf_assistant).
            swa_convention: one of :data:`SWA_CONVENTIONS`; None picks the layout's default.
        """
        if not isinstance(config, Mapping):
            raise ConfigError(f"drafter config: expected a dict parsed from config.json, got "
                              f"{type(config).__name__}.")
        where = "drafter config.json"
        layout = _drafter_layout(config, layout, where)
        dc = config.get("dflash_config")
        if dc is not None and not isinstance(dc, Mapping):
            raise ConfigError(f"{where}: dflash_config must be a dict, got {dc!r}.")
        f = _Fields(config, where)
        hidden = f.int("hidden_size")
        n_layers = f.int("num_hidden_layers")
        n_heads = f.int("num_attention_heads")
        n_kv = f.int("num_key_value_heads")
        if n_heads % n_kv:
            raise ConfigError(f"{where}: num_attention_heads {n_heads} is not a multiple of "
                              f"num_key_value_heads {n_kv}.")
        head_dim = f.int("head_dim")
        hidden_act = f.str("hidden_act", "silu", choices=("silu",))

        block_size, _ = _dflash_value(config, where, "block_size", "draft_block_size")
        if block_size is None:
            raise ConfigError(f"{where}: block_size is missing (looked for dflash_config."
                              f"block_size and top-level block_size); it is the number of tokens "
                              f"per draft block (16 for the published drafters).")
        block_size = _pos_int(block_size, "block_size", where)
        mask_id, _ = _dflash_value(config, where, "mask_token_id")
        if mask_id is None:
            raise ConfigError(f"{where}: mask_token_id is missing (looked for dflash_config."
                              f"mask_token_id and top level); it is the target-vocabulary id whose "
                              f"embedding row fills the block (151669 for Qwen3, 248070 for "
                              f"Qwen3.5).")
        mask_id = _pos_int(mask_id, "mask_token_id", where, minimum=0)
        vocab = f.int("vocab_size", None)
        if vocab is not None and mask_id >= vocab:
            raise ConfigError(f"{where}: mask_token_id {mask_id} is outside vocab_size {vocab}.")

        n_target, _ = _dflash_value(config, where, "num_target_layers", "n_target_layers")
        n_target = None if n_target is None else _pos_int(n_target, "num_target_layers", where)
        ids, ids_key = _dflash_value(config, where, "target_layer_ids",
                                     "aux_hidden_state_layer_ids")
        if ids is not None:
            ids = _int_list(ids, ids_key, where)
            if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
                raise ConfigError(f"{where}: {ids_key} must be distinct non-negative layer ids, "
                                  f"got {list(ids)}.")
            if n_target is not None and max(ids) >= n_target:
                raise ConfigError(f"{where}: {ids_key} {list(ids)} reaches layer {max(ids)} but "
                                  f"num_target_layers is {n_target}.")
            source = "config"
        elif n_target is not None:
            ids = tuple(build_target_layer_ids(n_target, n_layers))
            source = "formula"
        else:
            raise ConfigError(f"{where}: no target_layer_ids and no num_target_layers, so the "
                              f"captured target layers are unknown. Add dflash_config."
                              f"target_layer_ids, or num_target_layers for the default formula "
                              f"(spec/dflash.md §1).")

        layer_types, window = _drafter_swa(config, f, layout, n_layers, where)
        causal, _ = _dflash_value(config, where, "causal", "is_causal")
        if causal is not None and not isinstance(causal, bool):
            raise ConfigError(f"{where}: is_causal / dflash_config.causal must be true or false, "
                              f"got {causal!r}.")
        if swa_convention is None:
            swa_convention = "bidirectional" if layout == "hf_assistant" else "causal_block"
        elif swa_convention not in SWA_CONVENTIONS:
            raise ConfigError(f"swa_convention {swa_convention!r} is unknown; choose one of "
                              f"{SWA_CONVENTIONS} (docs/config.md explains each).")

        rope = {}
        for t in dict.fromkeys(layer_types):
            theta = resolve_rope_theta(config, where, layer_type=t)
            rope[t] = _make_rope(theta, _rope_params(config, t) or _rope_scaling(config),
                                 head_dim, where)
        scale, _ = _dflash_value(config, where, "input_embedding_scale")
        if scale is not None:
            scale = _theta_value(scale, "input_embedding_scale", where)
        sink, _ = _dflash_value(config, where, "attention_sink_bias")
        return cls(
            layout=layout, hidden_size=hidden, num_hidden_layers=n_layers,
            num_attention_heads=n_heads, num_key_value_heads=n_kv, head_dim=head_dim,
            intermediate_size=f.int("intermediate_size"), hidden_act=hidden_act,
            rms_norm_eps=f.float("rms_norm_eps"), vocab_size=vocab,
            attention_bias=f.bool("attention_bias", False), block_size=block_size,
            mask_token_id=mask_id, target_layer_ids=ids, target_layer_ids_source=source,
            num_target_layers=n_target, layer_types=layer_types, sliding_window=window,
            swa_convention=swa_convention, causal_override=causal,
            rope_by_type=MappingProxyType(rope), input_embedding_scale=scale,
            attention_sink_bias=bool(sink), max_position_embeddings=f.int(
                "max_position_embeddings", None),
            defaults_used=tuple(f.defaults_used), raw=MappingProxyType(dict(config)))

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kwargs: Any) -> DrafterConfig:
        """:meth:`from_hf` on a config.json file, or on the config.json inside a directory."""
        return cls.from_hf(_read_json(path, "drafter"), **kwargs)

    # ------------------------------------------------------------------ queries

    @property
    def n_capture(self) -> int:
        """C: captured target layers; the fc input width is C * hidden_size."""
        return len(self.target_layer_ids)

    @property
    def fc_name(self) -> str:
        return "encoder.fc.weight" if self.layout == "hf_assistant" else "fc.weight"

    @property
    def hidden_norm_name(self) -> str:
        return ("encoder.output_norm_enc.weight" if self.layout == "hf_assistant"
                else "hidden_norm.weight")

    def rope_theta_for(self, layer_idx: int) -> float:
        return self.rope_by_type[self._layer_type(layer_idx)].theta

    @property
    def rope_theta(self) -> float:
        """The RoPE base, when every layer shares one (all published drafters)."""
        thetas = {r.theta for r in self.rope_by_type.values()}
        if len(thetas) != 1:
            raise ConfigError(f"drafter layer types use different RoPE bases {sorted(thetas)}; "
                              f"ask rope_theta_for(layer_idx).")
        return thetas.pop()

    def _layer_type(self, layer_idx: int) -> str:
        if not _is_int(layer_idx) or not 0 <= layer_idx < self.num_hidden_layers:
            raise IndexError(f"drafter layer {layer_idx} out of range "
                             f"0..{self.num_hidden_layers - 1}")
        return self.layer_types[layer_idx]

    def is_causal_for(self, layer_idx: int) -> bool:
        """Whether noise queries of this layer are causal within the block.

        ``causal_override`` wins for every layer. Otherwise only sliding layers under
        "causal_block" are causal; full layers are non-causal (spec/dflash.md §4.3).
        """
        t = self._layer_type(layer_idx)
        if self.causal_override is not None:
            return self.causal_override
        return t == SLIDING and self.swa_convention == "causal_block"

    def visibility(self, layer_idx: int) -> KeyVisibility:
        """The key-visibility rule of one layer (absolute positions; W = sliding_window).

        ===================  ====================================  ==========================
        convention           sliding layer: max_back / max_ahead   default causality
        ===================  ====================================  ==========================
        causal_block         W - 1 / (0 if causal else W - 1)      sliding causal
        noncausal_window     W - 1 / (0 if causal else W - 1)      non-causal
        bidirectional        W / (0 if causal else W)              non-causal
        ignore               None / (0 if causal else None)        non-causal
        ===================  ====================================  ==========================

        Full layers: max_back None, max_ahead 0 if causal else None.
        """
        causal = self.is_causal_for(layer_idx)
        ahead_if_open = None
        back = None
        if self.layer_types[layer_idx] == SLIDING and self.swa_convention != "ignore":
            w = self.sliding_window
            back = w if self.swa_convention == "bidirectional" else w - 1
            ahead_if_open = back
        return KeyVisibility(max_back=back, max_ahead=0 if causal else ahead_if_open)

    def noise_embedding_scale(self, target: TargetConfig) -> float:
        """Scale for the block's embedding rows: the drafter's input_embedding_scale if the
        config gives one, else the target's embedding scale (Gemma: bf16-rounded sqrt(H);
        spec/dflash.md §4.2), else 1.0."""
        if self.input_embedding_scale is not None:
            return self.input_embedding_scale
        return 1.0 if target.embedding_scale is None else target.embedding_scale

    # ------------------------------------------------------------------ validation

    def validate_against(self, target: TargetConfig,
                         fc_shape: Sequence[int] | None = None) -> DrafterConfig:
        """Check this drafter fits ``target`` (and its ``fc`` weight); return the config to use.

        Checks: equal hidden size and vocabulary (the drafter borrows the target's embedding and
        lm_head); every target_layer_id inside the target and not its last layer (HF's last
        hidden state is the final-normed one); mask_token_id inside the target vocabulary; the fc
        weight [H, C*H]. Shapes are ground truth: when fc implies another capture count C than
        the config and the ids came from the default formula, the ids are recomputed for C with a
        warning; explicit ids that disagree with fc are an error.

        Returns:
            self, or a corrected copy (use the return value).
        """
        where = "drafter vs target"
        if self.hidden_size != target.hidden_size:
            raise ConfigError(f"{where}: drafter hidden_size {self.hidden_size} != target "
                              f"hidden_size {target.hidden_size}. The drafter reuses the target's "
                              f"embedding and lm_head, so they must match: use the drafter "
                              f"trained for this target.")
        if self.vocab_size is not None and self.vocab_size != target.vocab_size:
            raise ConfigError(f"{where}: drafter vocab_size {self.vocab_size} != target "
                              f"vocab_size {target.vocab_size}; the drafter predicts over the "
                              f"target's vocabulary, so pair it with the target it was trained "
                              f"for.")
        if self.mask_token_id >= target.vocab_size:
            raise ConfigError(f"{where}: mask_token_id {self.mask_token_id} is outside the "
                              f"target vocabulary ({target.vocab_size}); fix dflash_config."
                              f"mask_token_id.")
        n = target.num_hidden_layers
        cfg = self
        if self.num_target_layers is not None and self.num_target_layers != n:
            msg = (f"{where}: the drafter was configured for a {self.num_target_layers}-layer "
                   f"target (num_target_layers) but the target has {n} layers")
            if self.target_layer_ids_source == "formula":
                raise ConfigError(msg + "; the default target_layer_ids depend on it, so this "
                                  "pairing is wrong (or add explicit target_layer_ids).")
            warnings.warn(msg + "; the explicit target_layer_ids are used.", stacklevel=2)
        if fc_shape is not None:
            cfg = cfg._reconcile_fc(fc_shape, n)
        bad = [i for i in cfg.target_layer_ids if i >= n]
        if bad:
            raise ConfigError(f"{where}: target_layer_ids {list(cfg.target_layer_ids)} include "
                              f"{bad}, beyond the target's layers 0..{n - 1}; this drafter "
                              f"belongs to a deeper target.")
        if n - 1 in cfg.target_layer_ids:
            raise ConfigError(f"{where}: target_layer_ids include the last layer {n - 1}. HF's "
                              f"hidden_states entry for it is the final-normed output, not the "
                              f"raw layer output dflash-ref captures (spec/dflash.md §3); the "
                              f"ids are probably shifted by one (GGUF '+1' ids?).")
        return cfg

    def _reconcile_fc(self, fc_shape: Sequence[int], n_target: int) -> DrafterConfig:
        if (not isinstance(fc_shape, Sequence) or len(fc_shape) != 2
                or not all(_is_int(x) and x > 0 for x in fc_shape)):
            raise ConfigError(f"fc weight shape must be two positive ints [H, C*H], got "
                              f"{fc_shape!r}.")
        out_dim, in_dim = (int(x) for x in fc_shape)
        H = self.hidden_size
        if out_dim != H:
            raise ConfigError(f"{self.fc_name} has {out_dim} output rows but hidden_size is {H}; "
                              f"the weight is [H, C*H] (PyTorch [out, in]) - is it transposed, or "
                              f"from another drafter?")
        if in_dim % H:
            raise ConfigError(f"{self.fc_name} input width {in_dim} is not a multiple of "
                              f"hidden_size {H}; it must be C*H for C captured layers.")
        c_w = in_dim // H
        if c_w == self.n_capture:
            return self
        if self.target_layer_ids_source == "config":
            raise ConfigError(f"{self.fc_name} [{out_dim}, {in_dim}] implies {c_w} captured "
                              f"layers but target_layer_ids lists {self.n_capture} "
                              f"({list(self.target_layer_ids)}); which layers to tap cannot be "
                              f"derived from the weight. Fix target_layer_ids in the config.")
        n_t = self.num_target_layers if self.num_target_layers is not None else n_target
        ids = tuple(build_target_layer_ids(n_t, c_w))
        warnings.warn(f"{self.fc_name} [{out_dim}, {in_dim}] implies {c_w} captured layers, not "
                      f"{self.n_capture} from the default formula with num_hidden_layers; the "
                      f"weight wins: target_layer_ids = {list(ids)}.", stacklevel=3)
        return replace(self, target_layer_ids=ids, target_layer_ids_source="fc_shape")

    # ------------------------------------------------------------------ summary

    def describe(self) -> str:
        """A short human summary (for ``dflash-ref inspect``)."""
        counts = {t: self.layer_types.count(t) for t in (FULL, SLIDING) if t in self.layer_types}
        mix = " + ".join(f"{n} {t}" for t, n in counts.items())
        if len({r.theta for r in self.rope_by_type.values()}) == 1:
            thetas = f"{self.rope_theta:g}"
        else:
            thetas = ", ".join(f"{t} {r.theta:g}" for t, r in self.rope_by_type.items())
        lines = [
            f"DFlash drafter ({self.layout} layout): {self.num_hidden_layers} layers ({mix}), "
            f"hidden {self.hidden_size}, ffn {self.intermediate_size}",
            f"  attention: {self.num_attention_heads} q / {self.num_key_value_heads} kv heads x "
            f"{self.head_dim}; rope theta {thetas}",
            f"  block {self.block_size}, mask id {self.mask_token_id}, captures "
            f"{list(self.target_layer_ids)} ({self.target_layer_ids_source}), fc "
            f"[{self.hidden_size}, {self.n_capture * self.hidden_size}]",
        ]
        if SLIDING in self.layer_types:
            lines.append(f"  sliding window {self.sliding_window}, convention "
                         f"{self.swa_convention}")
        if self.causal_override is not None:
            lines.append(f"  causal override: {self.causal_override} (all layers)")
        if self.input_embedding_scale is not None:
            lines.append(f"  input embedding scale {self.input_embedding_scale:g}")
        if self.defaults_used:
            lines.append("  defaults used: " + "; ".join(self.defaults_used))
        return "\n".join(lines)


def _pos_int(v: Any, key: str, where: str, minimum: int = 1) -> int:
    if not _is_int(v) or v < minimum:
        raise ConfigError(f"{where}: {key} must be an integer >= {minimum}, got {v!r}.")
    return int(v)


def _dflash_value(config: Mapping, where: str, *keys: str) -> tuple[Any, str | None]:
    """A DFlash key from ``dflash_config`` (first) or the top level, under any alias.

    Returns (value, "path.of.key") or (None, None). Two places holding different values is a
    ConfigError: which one a runtime reads differs between stacks (spec/kvflash_gate.md §7).
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
    if "DFlash2DraftModel" in archs:
        raise ConfigError(f"{where}: DFlash2DraftModel (selector / convolution heads) is not "
                          f"supported; supported drafters: DFlashDraftModel (z-lab layout) and "
                          f"transformers-native DFlash assistant models.")
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
    """layer_types and sliding_window of a drafter (spec/dflash.md §1, §4.9)."""
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
