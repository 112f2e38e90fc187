"""The target's decoder layer and its parts: norms, attention, the GDN mixer, the feed-forward.

A decoder layer reads like picoGPT's block, for every supported family::

    x = x + post_mix_norm(mixer(input_norm(x)))        # mixer: attention or Gated DeltaNet
    x = x + post_mlp_norm(feed_forward(x))             # norm + MLP, or an MoE block
    x = (x + per_layer_input(x, ple_i)) * layer_scalar # Gemma 4 only (PLE, layer scalar)

Qwen3 / Qwen3.5 have no post norms (identity) and call their pre-MLP norm
``post_attention_layernorm``; Gemma 3 / 4 norm both sides of each sub-block ("sandwich" norms:
``post_attention_layernorm``, ``pre_feedforward_layernorm``, ``post_feedforward_layernorm``).
Norm weights are stored raw; (1 + w) families pass ``offset=1.0`` (``config.norm_offset``).
The feed-forward is ``mlp(pre_mlp_norm(x))``, Qwen3.5 MoE's sparse block in the MLP's place, or
Gemma 4's dense MLP plus its experts (:mod:`dflash_ref.models.moe`); per-layer embeddings are
:mod:`dflash_ref.models.gemma4`'s.

Gemma 4 attention (huggingface/transformers ``models/gemma4/modeling_gemma4.py``,
``Gemma4TextAttention``): ``v = v_proj(u)``, or the raw ``k_proj(u)`` on full layers with
attention_k_eq_v; q and k get their RMS norms (weight w) before RoPE, v a weightless RMS norm;
full layers use proportional RoPE; the scale is 1. A KV-sharing layer has no k/v of its own: it
attends over the K/V its source layer stored in this batch (``batch.kv[source].read()``).

Where K/V live and which mask applies is the batch's KV store's business
(:mod:`dflash_ref.models.kv_store`); where a GDN layer's state lives, its GDN store's
(:mod:`dflash_ref.models.state`). A layer only computes.
"""

from __future__ import annotations

from dflash_ref.models.gdn_layer import PROJECTION_LAYOUTS, GDNConfig, GDNLayer
from dflash_ref.models.gemma4 import (
    PerLayerInput,
    proportional_cos_sin,
    proportional_inv_freq,
    proportional_rope,
)
from dflash_ref.models.moe import Gemma4MoE, QwenSparseMoE, gelu_tanh

# config.gdn.projection_layout -> GDNConfig.layout (the inverse of PROJECTION_LAYOUTS)
GDN_LAYOUTS = {v: k for k, v in PROJECTION_LAYOUTS.items()}


def gdn_config(cfg) -> GDNConfig:
    """The GDN layer sizes of a hybrid target (docs/gdn.md; gated norm eps = rms_norm_eps)."""
    g = cfg.gdn
    return GDNConfig(hidden_size=cfg.hidden_size, num_k_heads=g.num_key_heads,
                     num_v_heads=g.num_value_heads, head_k_dim=g.key_head_dim,
                     head_v_dim=g.value_head_dim, conv_kernel=g.conv_kernel_dim,
                     rms_norm_eps=cfg.rms_norm_eps, layout=GDN_LAYOUTS[g.projection_layout])


class RMSNorm:
    """``rms_norm(x, w, eps, offset)`` over the last axis; ``weight=None`` is the identity."""

    def __init__(self, be, weight, eps: float, offset: float):
        self.be, self.weight, self.eps, self.offset = be, weight, eps, offset

    def __call__(self, x):
        if self.weight is None:
            return x
        return self.be.ops.rms_norm(x, self.weight, self.eps, self.offset)

    def add(self, x, m):
        """``h = x + m`` and ``self(h)``, fused: one ``add_rms_norm`` launch in place of an add and
        a norm that reads h back. Returns (h, normed h), both [T, H]; bit-identical to the pair."""
        if self.weight is None:
            h = x + m
            return h, h
        return self.be.ops.add_rms_norm(m, x, self.weight, self.eps, self.offset)


class Attention:
    """Self-attention of one layer: projections, q/k norms, RoPE, attention, output gate, o_proj.

    ``scale`` is the config's attention scale (Gemma: query_pre_attn_scalar ** -0.5), ``softcap``
    its attention-logit softcap; RoPE uses this layer type's base, rotary dim and linear factor,
    at the batch's positions on the backend (``batch.arrays``: uploaded once per forward; a
    proportional-RoPE table is made there once per batch and shared by the layers of its type).
    """

    def __init__(self, cfg, be, idx: int, w: dict):
        self.be, self.idx, self.w = be, idx, w
        self.n_heads = cfg.num_attention_heads
        self.n_kv, self.d = cfg.num_key_value_heads_for(idx), cfg.head_dim_for(idx)
        self.output_gate = cfg.attn_output_gate
        self.scale, self.softcap = cfg.attention_scale, cfg.attn_logit_softcapping
        self.rope_spec = cfg.rope_for(idx)  # theta, rotary_dim, linear factor of this layer
        self.inv_freq = None  # proportional RoPE (Gemma 4 full layers): its table, on the backend
        if self.rope_spec.rope_type == "proportional":
            self.inv_freq = be.to_backend(proportional_inv_freq(self.rope_spec))  # [d/2]
        self.kv_source = cfg.kv_source_for(idx)  # Gemma 4 KV sharing: read that layer's K/V
        self.v_norm = RMSNorm(be, None, 0.0, 0.0)
        if cfg.v_norm:  # Gemma 4: RMS over d without a weight
            self.v_norm = RMSNorm(be, be.xp.ones(self.d, dtype=be.xp.float32), cfg.rms_norm_eps,
                                  0.0)
        qk_norm = cfg.qk_norm
        self.q_norm = RMSNorm(be, w.get("self_attn.q_norm.weight") if qk_norm else None,
                              cfg.rms_norm_eps, cfg.norm_offset)
        self.k_norm = RMSNorm(be, w.get("self_attn.k_norm.weight") if qk_norm else None,
                              cfg.rms_norm_eps, cfg.norm_offset)

    def rope(self, x, arrays):
        """x [T, h, d] rotated at the batch's positions (``arrays.positions``, on the backend)."""
        r, xp = self.rope_spec, self.be.xp
        if r.rope_type == "proportional":
            cos, sin = arrays.once(("rope", r), lambda: proportional_cos_sin(
                xp, arrays.positions, self.inv_freq))  # [T, 1, d] each, once per batch
            return proportional_rope(xp, x, cos, sin)
        return self.be.ops.rope(xp.ascontiguousarray(x), arrays.positions, r.theta,
                                r.rotary_dim, r.factor)

    def qkv(self, u, arrays, tap):
        """q [T, nh, d], k and v [T, nkv, d] (post-norm, post-RoPE), output gate [T, nh*d]|None.

        ``tap`` sees q and k after the q/k norms, before RoPE ("q", "k") and after it
        ("q_rope", "k_rope"), and v ("v"). A KV-sharing layer returns k = v = None.
        """
        w, T, nh, nkv, d = self.w, u.shape[0], self.n_heads, self.n_kv, self.d
        q = u @ w["self_attn.q_proj.weight"].T  # [T, nh*d] (x2 with an output gate)
        gate = None
        if self.output_gate:  # Qwen3.5 / Qwen3-Next: per head [q (d) | gate (d)]
            q = q.reshape(T, nh, 2 * d)
            q, gate = q[..., :d], q[..., d:].reshape(T, nh * d)
        q = self.q_norm(q.reshape(T, nh, d))  # per head over d, before RoPE
        tap(self.idx, "q", q)
        if self.kv_source is not None:
            q = self.rope(q, arrays)
            tap(self.idx, "q_rope", q)
            return q, None, None, gate
        k = (u @ w["self_attn.k_proj.weight"].T).reshape(T, nkv, d)
        v = k if "self_attn.v_proj.weight" not in w else (
            (u @ w["self_attn.v_proj.weight"].T).reshape(T, nkv, d))  # k_eq_v: the raw k
        k, v = self.k_norm(k), self.v_norm(v)
        tap(self.idx, "k", k)
        q, k = self.rope(q, arrays), self.rope(k, arrays)
        tap(self.idx, "q_rope", q)
        tap(self.idx, "k_rope", k)
        tap(self.idx, "v", v)
        return q, k, v, gate

    def __call__(self, u, batch):
        """u [T, H] -> [T, H] over the layer's KV store in ``batch``."""
        xp = self.be.xp
        q, k, v, gate = self.qkv(u, batch.arrays, batch.tap)
        if self.kv_source is not None:  # what the source layer stored for this batch
            keys, values, mask = batch.kv[self.kv_source].read()
        else:
            keys, values, mask = batch.kv[self.idx].update(k, v)  # everything the batch reads
        o = self.be.ops.attention(q, keys, values, mask, scale=self.scale,
                                  softcap=self.softcap)  # [T, nh, d]
        o = o.reshape(o.shape[0], -1)  # [T, nh*d]
        if gate is not None:
            o = o * (1.0 / (1.0 + xp.exp(-gate)))  # sigmoid output gate
        return o @ self.w["self_attn.o_proj.weight"].T


class GDNMixer:
    """A Gated DeltaNet token mixer; its state and rewind data live in the batch's GDN store."""

    def __init__(self, cfg, be, idx: int, w: dict):
        self.idx = idx
        gdn_w = {k[len("linear_attn."):]: v for k, v in w.items() if k.startswith("linear_attn.")}
        self.layer = GDNLayer(gdn_config(cfg), gdn_w, backend=be)

    def __call__(self, u, batch):
        return batch.gdn[self.idx].run(self.layer, u)


class GatedMLP:
    """``down(act(gate(u)) * up(u))``: SwiGLU (silu) or GeGLU with tanh-approximated GELU."""

    def __init__(self, cfg, be, w: dict):
        self.be, self.w, self.act = be, w, cfg.hidden_act

    def __call__(self, u):
        be, w = self.be, self.w
        g = u @ w["mlp.gate_proj.weight"].T  # [T, F]
        up = u @ w["mlp.up_proj.weight"].T
        if self.act == "silu":
            a = be.ops.swiglu(g, up)
        else:  # gelu_pytorch_tanh (Gemma)
            a = gelu_tanh(be.xp, g) * up
        return a @ w["mlp.down_proj.weight"].T  # [T, H]


class FeedForward:
    """The MLP sub-block before its post norm, for every family (module docstring):

    - dense: ``mlp(u)``, u = ``pre_mlp_norm(x)``;
    - Qwen3.5 MoE: ``moe(u)`` (routed + shared experts in the MLP's place);
    - Gemma 4 MoE: ``post_norm_1(mlp(u)) + experts(x)`` (the experts route on x).
    """

    def __init__(self, cfg, be, idx: int, w: dict, norm):
        self.idx = idx
        self.mlp, self.moe, self.post_norm_1 = None, None, None
        sparse = cfg.moe is not None and cfg.moe.is_moe_layer(idx)
        if sparse and cfg.moe.kind == "qwen":
            self.moe = QwenSparseMoE(cfg, be, idx, w)
            return
        self.mlp = GatedMLP(cfg, be, w)  # its width is the tensors' (Gemma 4 double-wide too)
        if sparse:
            self.moe = Gemma4MoE(cfg, be, idx, w, norm)
            self.post_norm_1 = norm("post_feedforward_layernorm_1.weight")

    def __call__(self, x, u, tap):
        """x [T, H] (the residual stream), u = pre_mlp_norm(x) [T, H] -> [T, H].

        The layer computes u, fused with the residual add that makes x (``RMSNorm.add``)."""
        if self.mlp is None:
            return self.moe(u, tap)
        y = self.mlp(u)
        if self.moe is None:
            return y
        return self.post_norm_1(y) + self.moe(x, tap)


class DecoderLayer:
    """One decoder layer (see the module docstring); ``w`` holds its tensors by HF name."""

    def __init__(self, cfg, be, idx: int, w: dict):
        self.idx, self.kind, self.w = idx, cfg.layer_types[idx], w

        def norm(name):
            return RMSNorm(be, w.get(name), cfg.rms_norm_eps, cfg.norm_offset)

        self.input_norm = norm("input_layernorm.weight")
        if cfg.use_pre_post_ffn_norms:  # Gemma: sandwich norms
            self.post_mix_norm = norm("post_attention_layernorm.weight")
            self.pre_mlp_norm = norm("pre_feedforward_layernorm.weight")
            self.post_mlp_norm = norm("post_feedforward_layernorm.weight")
        else:  # Qwen: "post_attention_layernorm" is the norm before the MLP
            self.post_mix_norm = RMSNorm(be, None, 0.0, 0.0)
            self.pre_mlp_norm = norm("post_attention_layernorm.weight")
            self.post_mlp_norm = RMSNorm(be, None, 0.0, 0.0)
        self.mixer = (GDNMixer(cfg, be, idx, w) if self.kind == "linear_attention"
                      else Attention(cfg, be, idx, w))
        self.feed_forward = FeedForward(cfg, be, idx, w, norm)
        self.per_layer_input = (PerLayerInput(be, w, norm)
                                if "per_layer_input_gate.weight" in w else None)
        self.layer_scalar = w.get("layer_scalar")  # Gemma 4: [1]

    def __call__(self, x, batch, ple_i=None, u=None, next_norm=None):
        """x [T, H] -> (h [T, H], next_norm(h) or None); ``ple_i`` [T, P]: this layer's
        per-layer embeddings (Gemma 4).

        Each residual add that a norm of the sum follows is one fused ``add_rms_norm``
        (``RMSNorm.add``); unfused, the layer is the module docstring's::

            u = input_norm(x)                    # or the u the previous layer handed over
            x = x + post_mix_norm(mixer(u))
            u = pre_mlp_norm(x)
            x = x + post_mlp_norm(feed_forward(x, u))
            return x, next_norm(x)               # next_norm: the next layer's input norm, or
                                                 # the final norm after the last layer
        Gemma 4's per-layer input and layer scalar come between the last add and the next norm;
        such a layer returns (x, None) and the caller norms x itself. ``batch.tap`` sees each
        intermediate (names in the comments).
        """
        tap = batch.tap
        if u is None:
            u = self.input_norm(x)
        tap(self.idx, "attn_norm", u)  # input of the mixer (attention or GDN)
        m = self.post_mix_norm(self.mixer(u, batch))
        tap(self.idx, "attn_out", m)  # what the mixer adds to the residual stream
        x, u = self.pre_mlp_norm.add(x, m)  # x = x + m; u = pre_mlp_norm(x)
        tap(self.idx, "mlp_norm", u)  # input of the MLP (or MoE)
        m = self.post_mlp_norm(self.feed_forward(x, u, tap))
        tap(self.idx, "mlp_out", m)  # what the MLP adds to the residual stream
        if self.per_layer_input is None and self.layer_scalar is None and next_norm is not None:
            x, u = next_norm.add(x, m)  # x = x + m; u = next_norm(x)
            tap(self.idx, "h", x)
            return x, u
        x = x + m
        if self.per_layer_input is not None:
            x = x + self.per_layer_input(x, ple_i)
        if self.layer_scalar is not None:
            x = x * self.layer_scalar
        tap(self.idx, "h", x)  # the layer's output (the captured feature when i is a capture id)
        return x, None
