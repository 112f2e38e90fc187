"""The Qwen family parsers: Qwen3 dense, and the Qwen3-Next / Qwen3.5 hybrids with their GDN and
MoE sizes (:class:`GDNDims`, :class:`MoEDims`).

Each ``_parse_*`` takes the text config's :class:`~dflash_ref.config.fields._Fields`, the family
and the outer config.json, and returns the keyword arguments of
:class:`~dflash_ref.config.target.TargetConfig` that the family decides.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dflash_ref.config.families import _activation, _common, _no_gemma, _tie
from dflash_ref.config.fields import (
    _MISSING,
    FULL,
    LINEAR,
    SLIDING,
    _Fields,
    _int_list,
    _interval_layer_types,
    _layer_type_list,
)
from dflash_ref.config.rope import (
    _make_rope,
    _rope_params,
    _rope_scaling,
    _theta_value,
    resolve_rope_theta,
)
from dflash_ref.errors import ConfigError


@dataclass(frozen=True)
class GDNDims:
    """Gated DeltaNet layer sizes (docs/gdn.md, "5. The layer"; huggingface/transformers
    ``src/transformers/models/qwen3_next/modeling_qwen3_next.py``).

    H = num_key_heads, HV = num_value_heads (a multiple of H), dk / dv head dims, conv kernel K.
    ``projection_layout``: "qkvz_ba_grouped" (Qwen3-Next: in_proj_qkvz / in_proj_ba grouped per
    key head) or "qkv_z_b_a" (Qwen3.5: separate in_proj_qkv, in_proj_z, in_proj_b, in_proj_a).
    ``norm_offset`` is 0.0: the GDN gated output norm multiplies by plain w, unlike the (1+w)
    norms everywhere else in these models (docs/gdn.md, "5. The layer").
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
        """r = HV / H, value heads sharing one key head (docs/gdn.md, "4. GQA: the grouped vs tiled
        pitfall")."""
        return self.num_value_heads // self.num_key_heads


@dataclass(frozen=True)
class MoEDims:
    """Sparse MLP sizes as the config states them (Qwen3-Next, Qwen3.5 MoE, Gemma 4 MoE).

    ``kind`` says which block the layers use (models/moe.py): ``"qwen"`` (routed experts plus a
    sigmoid-gated shared expert, in place of the dense MLP) or ``"gemma4"`` (router with its own
    norm and per-expert scales, experts beside the dense MLP). Gemma 4 calls the top-k
    ``top_k_experts``; it is stored as ``num_experts_per_tok`` here.
    """

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int | None
    decoder_sparse_step: int
    mlp_only_layers: tuple[int, ...]
    norm_topk_prob: bool
    kind: str = "qwen"

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` has a sparse block (HF Qwen2-MoE rule: not listed in
        ``mlp_only_layers`` and ``(layer + 1) % decoder_sparse_step == 0``)."""
        return (layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)


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


def _refuse_keys_qwen35_moe_ignores(f: _Fields, mlp_only) -> None:
    """transformers' Qwen3.5-MoE (``models/qwen3_5_moe/modeling_qwen3_5_moe.py``) reads neither
    ``decoder_sparse_step`` / ``mlp_only_layers`` (every layer is sparse) nor ``norm_topk_prob``
    (``Qwen3_5MoeTopKRouter`` always renormalises the top-k). A Qwen3.5 config that sets one of
    them to anything else would run differently here and there: refused (docs/conventions.md,
    "MoE: which layers are sparse, and norm_topk_prob")."""
    found = {"decoder_sparse_step": f.int("decoder_sparse_step", 1),
             "mlp_only_layers": list(mlp_only), "norm_topk_prob": f.bool("norm_topk_prob", True)}
    odd = {k: v for k, v in found.items() if v != {"decoder_sparse_step": 1, "mlp_only_layers": [],
                                                     "norm_topk_prob": True}[k]}
    if odd:
        raise ConfigError(
            f"{f.where}: {', '.join(f'{k}={v!r}' for k, v in odd.items())} in a Qwen3.5 MoE "
            "config; transformers' Qwen3.5-MoE ignores these keys (every layer sparse, top-k "
            "weights renormalised), so the checkpoint's intent is unclear; expected "
            "decoder_sparse_step 1, no mlp_only_layers and norm_topk_prob true: remove the keys "
            "(or, for a Qwen3-Next model, which honours them, set model_type 'qwen3_next')")


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
                          f"multiple of linear_num_key_heads {gdn.num_key_heads} (the GQA map "
                          f"of the GDN recurrence needs an integer heads-per-key-head ratio).")
    moe = None
    if (f.int("num_experts", None, minimum=0) or 0) > 0:
        mlp_only = f.d.get("mlp_only_layers") or []
        if family == "qwen3_5":
            _refuse_keys_qwen35_moe_ignores(f, mlp_only)
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
