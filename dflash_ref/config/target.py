"""TargetConfig: a target model's text config, parsed by its family's parser, with per-layer
queries (layer type, RoPE, head dim, KV heads) and a human summary.

:meth:`TargetConfig.from_hf` locates the text config and picks the family
(:mod:`dflash_ref.config.families`), then runs one parser per family
(:mod:`dflash_ref.config.qwen`, :mod:`dflash_ref.config.gemma`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from dflash_ref.config.families import _locate_text_config
from dflash_ref.config.fields import (
    EMBEDDING_DTYPES,
    FULL,
    LAYER_TYPES,
    LINEAR,
    SLIDING,
    _Fields,
    _is_int,
    _read_json,
    embedding_scale_for,
)
from dflash_ref.config.gemma import (
    GEMMA3_TEXT_HF_DEFAULTS,
    Gemma4Dims,
    _parse_gemma3,
    _parse_gemma4,
)
from dflash_ref.config.qwen import GDNDims, MoEDims, _parse_qwen3, _parse_qwen_hybrid
from dflash_ref.config.rope import RopeSpec
from dflash_ref.errors import ConfigError


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
      rounded to ``embedding_dtype`` (Gemma; None after :meth:`with_embedding_scale` with a
      number); None for Qwen. ``embedding_scale_exact`` is the
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
    gemma4: Gemma4Dims | None
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

    def with_embedding_scale(self, embedding_scale: float | str | None) -> TargetConfig:
        """A copy with the Gemma embedding scale chosen explicitly (docs/conventions.md, "The
        Gemma embedding scale and its rounding").

        ``embedding_scale``: None keeps the source's rule (a GGUF: llama.cpp's unrounded
        float32 sqrt(H); a safetensors checkpoint: sqrt(H) rounded to its ``torch_dtype``, as HF
        computes in that dtype); a dtype name ("bfloat16", "float16", "float32") rounds
        sqrt(hidden_size) to it; a number is used as it is. Only Gemma targets have a scale.
        """
        if embedding_scale is None:
            return self
        if self.embedding_scale is None:
            raise ConfigError(f"embedding_scale={embedding_scale!r}: a {self.family} target has "
                              f"no embedding scale (only Gemma multiplies its embeddings)")
        if isinstance(embedding_scale, str):
            if embedding_scale not in EMBEDDING_DTYPES:
                raise ConfigError(f"embedding_scale={embedding_scale!r}: a string names the "
                                  f"dtype sqrt(hidden_size) is rounded to, one of "
                                  f"{EMBEDDING_DTYPES}; or pass a number")
            return replace(self, embedding_dtype=embedding_scale,
                           embedding_scale=embedding_scale_for(self.hidden_size,
                                                               embedding_scale))
        value = float(embedding_scale)
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"embedding_scale must be a finite positive number, got {value!r}")
        return replace(self, embedding_scale=value, embedding_dtype=None)

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

    def kv_source_for(self, layer_idx: int) -> int | None:
        """The layer whose K/V cache layer ``layer_idx`` attends over (Gemma 4 KV sharing), or
        None when it keeps its own."""
        self._check_layer(layer_idx)
        return None if self.gemma4 is None else self.gemma4.kv_sources[layer_idx]

    def mlp_width_for(self, layer_idx: int) -> int | None:
        """Dense MLP width of a layer (Gemma 4 double-wide MLP on KV-sharing layers); None when
        the layer has no dense MLP (a Qwen MoE layer)."""
        self._check_layer(layer_idx)
        if self.moe is not None and self.moe.kind == "qwen" and self.moe.is_moe_layer(layer_idx):
            return None
        if self.gemma4 is None:
            return self.intermediate_size
        return self.gemma4.mlp_width(layer_idx, self.intermediate_size)

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
            how = (f"rounded to {self.embedding_dtype}; the rounded value is used"
                   if self.embedding_dtype else "the scale was set explicitly")
            lines.append(f"  embedding scale {self.embedding_scale:g} (sqrt({self.hidden_size}) = "
                         f"{self.embedding_scale_exact:.4f}; {how})")
        caps = [f"{n} {v:g}" for n, v in (("final logit softcap", self.final_logit_softcapping),
                                          ("attn logit softcap", self.attn_logit_softcapping))
                if v is not None]
        if caps:
            lines.append("  " + ", ".join(caps))
        if self.defaults_used:
            lines.append("  defaults used: " + "; ".join(self.defaults_used))
        return "\n".join(lines)
