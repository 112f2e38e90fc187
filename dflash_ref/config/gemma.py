"""The Gemma family parsers: Gemma 3 text and Gemma 4 text (dense, PLE + KV sharing, MoE).

Both: sliding and global layers with their own RoPE bases, sandwich FFN norms, softcaps, and the
embedding scale sqrt(hidden_size) rounded to the checkpoint dtype (``_embedding``). Gemma 3's
published multimodal configs omit keys that transformers fills from ``Gemma3TextConfig``
(:data:`GEMMA3_TEXT_HF_DEFAULTS`, used only on request); Gemma 4 features with no counterpart in
the reference model are refused by name (:data:`GEMMA4_UNSUPPORTED`); what Gemma 4 adds is
recorded in :class:`Gemma4Dims` (and :class:`~dflash_ref.config.qwen.MoEDims` for its MoE block).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dflash_ref.config.families import _activation, _common, _no_gemma, _tie
from dflash_ref.config.fields import (
    EMBEDDING_DTYPES,
    FULL,
    SLIDING,
    _Fields,
    _interval_layer_types,
    _layer_type_list,
    embedding_scale_for,
)
from dflash_ref.config.qwen import MoEDims
from dflash_ref.config.rope import (
    _make_rope,
    _rope_params,
    _rope_scaling,
    _theta_value,
    resolve_rope_theta,
)
from dflash_ref.errors import ConfigError

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


# Gemma 4 features with no counterpart in the reference model; each is refused by name.
GEMMA4_UNSUPPORTED = (
    "bidirectional attention (use_bidirectional_attention)",
)


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
        # without sliding layers (a GGUF with no window key) the window is not needed
        sliding_window=(f.int("sliding_window") if SLIDING in layer_types
                        else f.int("sliding_window", None)),
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


@dataclass(frozen=True)
class Gemma4Dims:
    """What a Gemma 4 text config adds beyond Gemma 3's layout (huggingface/transformers
    ``src/transformers/models/gemma4/modeling_gemma4.py``; docs/target.md, "Families").

    - ``hidden_size_per_layer_input`` P (0: none) and ``vocab_size_per_layer_input``: the
      per-layer embeddings (PLE) of the small variants; one [vocab, L * P] table.
    - ``kv_sources[i]``: the layer whose keys and values layer i attends over, or None for its own.
      The last ``num_kv_shared_layers`` layers reuse those of the last earlier layer of the same
      type (HF ``Gemma4TextConfig.kv_sharing_modes``).
    - ``use_double_wide_mlp``: the KV-sharing layers' MLPs are twice ``intermediate_size`` wide.
    """

    hidden_size_per_layer_input: int
    vocab_size_per_layer_input: int
    num_kv_shared_layers: int
    use_double_wide_mlp: bool
    kv_sources: tuple[int | None, ...]

    def mlp_width(self, layer: int, intermediate_size: int) -> int:
        wide = self.use_double_wide_mlp and self.kv_sources[layer] is not None
        return intermediate_size * (2 if wide else 1)


def _kv_sources(layer_types, n_shared: int, where: str) -> tuple[int | None, ...]:
    """HF ``kv_sharing_modes``: layer i >= n - n_shared reads the K/V of the last layer before
    n - n_shared with the same type."""
    n = len(layer_types)
    first = n - n_shared
    if n_shared and not 0 < first:
        raise ConfigError(f"{where}: num_kv_shared_layers {n_shared} leaves no layer to share from "
                          f"({n} layers).")
    out = []
    for i, t in enumerate(layer_types):
        if i < first:
            out.append(None)
            continue
        src = [j for j in range(first) if layer_types[j] == t]
        if not src:
            raise ConfigError(f"{where}: KV-sharing layer {i} ({t}) has no earlier {t} layer to "
                              f"share keys and values with.")
        out.append(src[-1])
    return tuple(out)


def _global_attention(f: _Fields, layer_types, k_eq_v: bool) -> tuple[int, int | None]:
    """(global head dim, global KV heads or None) of the full-attention layers.

    Published configs state ``global_head_dim`` / ``num_global_key_value_heads``; configs saved
    by transformers >= 5.x state the resolved ``per_layer_config`` instead (layer index ->
    ``head_dim`` and, with attention_k_eq_v, ``num_key_value_heads``), which wins when present.
    """
    plc = f.d.get("per_layer_config")
    if isinstance(plc, Mapping) and plc:
        full = [i for i, t in enumerate(layer_types) if t == FULL]
        entries = {json.dumps(dict(plc.get(str(i)) or plc.get(i) or {}), sort_keys=True)
                   for i in full}
        if len(entries) != 1:
            raise ConfigError(f"{f.where}: per_layer_config differs between full-attention layers "
                              f"({sorted(entries)}); dflash-ref supports one global layout.")
        entry = json.loads(entries.pop())
        extra = set(entry) - {"head_dim", "num_key_value_heads"}
        if extra or any(k not in {str(i) for i in full} for k in map(str, plc)):
            raise ConfigError(f"{f.where}: per_layer_config overrides {sorted(extra) or 'a '}"
                              f"sliding layer; supported: head_dim and num_key_value_heads of "
                              f"the full-attention layers.")
        if "head_dim" not in entry:
            raise ConfigError(f"{f.where}: per_layer_config has no head_dim for the global layers.")
        return int(entry["head_dim"]), entry.get("num_key_value_heads") if k_eq_v else None
    n_global_kv = f.int("num_global_key_value_heads", None) if k_eq_v else None
    return f.int("global_head_dim", 512), n_global_kv


def _parse_gemma4(f: _Fields, family: str, outer: Mapping) -> dict:
    """Gemma 4 text: Gemma 3's layout with a wider global head, K = V on global layers,
    proportional RoPE, plain-w norms, a scale-free v norm and attention scale 1.0; the small
    variants add per-layer embeddings, KV sharing and a double-wide MLP, 26B-A4B an MoE block."""
    if f.d.get("use_bidirectional_attention") is not None:
        raise ConfigError(f"{f.where}: use_bidirectional_attention="
                          f"{f.d['use_bidirectional_attention']!r} is not implemented (text "
                          f"targets are causal); remove the key or set it to null.")
    # transformers' Gemma4TextConfig default is 256 (on) for a missing key; an explicit null or 0
    # turns per-layer embeddings off (the 31B config has null).
    if "hidden_size_per_layer_input" in f.d:
        ple = f.d["hidden_size_per_layer_input"] or 0
    else:
        ple = 256
        f.defaults_used.append("hidden_size_per_layer_input=256 (Gemma4TextConfig default; "
                               "set it to 0 if the checkpoint has no embed_tokens_per_layer)")
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
    k_eq_v = f.bool("attention_k_eq_v", False)
    global_head_dim, n_global_kv = _global_attention(f, layer_types, k_eq_v)
    if n_global_kv is not None and kw["num_attention_heads"] % n_global_kv:
        raise ConfigError(f"{f.where}: num_attention_heads {kw['num_attention_heads']} is not a "
                          f"multiple of num_global_key_value_heads {n_global_kv}.")
    n_shared = f.int("num_kv_shared_layers", 0, minimum=0)
    moe = None
    if f.bool("enable_moe_block", False):
        moe = MoEDims(num_experts=f.int("num_experts"), num_experts_per_tok=f.int("top_k_experts"),
                      moe_intermediate_size=f.int("moe_intermediate_size"),
                      shared_expert_intermediate_size=None, decoder_sparse_step=1,
                      mlp_only_layers=(), norm_topk_prob=True, kind="gemma4")
    gemma4 = Gemma4Dims(
        hidden_size_per_layer_input=int(ple),
        vocab_size_per_layer_input=(f.int("vocab_size_per_layer_input", 262_144) if ple else 0),
        num_kv_shared_layers=n_shared,
        use_double_wide_mlp=f.bool("use_double_wide_mlp", False),
        kv_sources=_kv_sources(layer_types, n_shared, f.where))
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
            moe=moe,
            gemma4=gemma4,
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
