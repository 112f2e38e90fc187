"""The target's decoder layer, the one that runs on every backend, and its common parts.

A decoder layer is picoGPT's block (jaymody/picoGPT ``gpt2.py``, ``transformer_block``)::

    x = x + mixer(input_norm(x))                     # mixer: attention, or a GDN mixer
    x = x + feed_forward(x, pre_mlp_norm(x))         # a gated MLP, or an MoE block

Every residual add is read by a norm (the pre-MLP norm, then the next layer's input norm, the
final norm last), so :class:`DecoderLayer` is handed its normed input and hands the next layer
its own, each add and the norm after it one component::

    m, x, u = mixer_add(x, mixer(u))                 # x += m; u = pre_mlp_norm(x)
    m, x, u = mlp_add(x, feed_forward(x, u))         # x += m; u = next_norm(x)

Components are chosen once per layer (:func:`dflash_ref.models.assemble.decoder_layers`); nothing
here branches on a family. All [T, H] -> [T, H]: ``add(x, b, batch)`` -> ``(m, x + m,
norm(x + m))``, ``mixer(u, batch)``, ``feed_forward(x, u, batch)``.
"""

from __future__ import annotations

import numpy as np


class RMSNorm:
    """``rms_norm(x, w, eps, offset)`` over the last axis (``offset=1.0``: the (1 + w) form)."""

    def __init__(self, be, weight, eps: float, offset: float):
        self.be, self.weight, self.eps, self.offset = be, weight, eps, offset

    def __call__(self, x):
        return self.be.ops.rms_norm(x, self.weight, self.eps, self.offset)


class Identity:
    """The norm a layer does not have (no q/k norm, no post norm): ``x -> x``."""

    weight = None  # no weight to hand a fused op

    def __call__(self, x):
        return x


class Rope:
    """RoPE of one layer type (a :class:`~dflash_ref.config.rope.RopeSpec`), the ``rope`` op."""

    def __init__(self, be, spec):
        self.be, self.spec = be, spec

    def __call__(self, x, arrays):
        """x [T, h, d] rotated at ``arrays.positions`` [T] -> [T, h, d]."""
        r, xp = self.spec, self.be.xp
        return self.be.ops.rope(xp.ascontiguousarray(x), arrays.positions, r.theta,
                                r.rotary_dim, r.factor)


class NormRope:
    """q and k normed per head over d (RMSNorm, or Identity), then rotated: four calls, or one
    ``qk_norm_rope`` in the fused form (:class:`~dflash_ref.models.fused.FusedNormRope`)."""

    def __init__(self, idx: int, q_norm, k_norm, rope):
        self.idx, self.q_norm, self.k_norm, self.rope = idx, q_norm, k_norm, rope

    def __call__(self, q, k, batch):
        """q [T, nh, d], k [T, nkv, d] -> (q, k) normed and rotated, same shapes."""
        tap, arrays = batch.tap, batch.arrays
        q, k = self.q_norm(q), self.k_norm(k)
        tap(self.idx, "q", q)
        tap(self.idx, "k", k)
        q, k = self.rope(q, arrays), self.rope(k, arrays)
        tap(self.idx, "q_rope", q)
        tap(self.idx, "k_rope", k)
        return q, k


class Projections:
    """Projections of one input as one product: ``u @ [W_1; ...; W_n]^T``, split by columns.

    ``Projections.stacked(be, w, ["q", "k", "v"])(u)`` -> ``(u @ w["q"]^T, ...)``, [T, n_i] each.
    """

    def __init__(self, be, weight, sizes):  # weight [sum(sizes), H]: the stacked rows
        self.be, self.weight, self.sizes = be, weight, list(sizes)
        edges = np.cumsum([0, *self.sizes])
        self.slices = [slice(int(a), int(b)) for a, b in zip(edges, edges[1:])]

    @classmethod
    def stacked(cls, be, w: dict, names):
        """Stack ``w[name]`` for ``names`` once; ``w``'s entries become views of the stack."""
        p = cls(be, be.xp.concatenate([w[n] for n in names]), [w[n].shape[0] for n in names])
        for n, rows in zip(names, p.slices):
            w[n] = p.weight[rows]
        return p

    def rows(self, first: int, stop: int):
        """The projections ``first .. stop-1`` alone, over the same stacked memory."""
        lo, hi = self.slices[first].start, self.slices[stop - 1].stop
        return Projections(self.be, self.weight[lo:hi], self.sizes[first:stop])

    def __call__(self, u):
        """u [T, H] -> one [T, n_i] array per weight."""
        y = self.be.ops.linear(u, self.weight)  # [T, sum n_i]
        return tuple(y[:, s] for s in self.slices)


class Attention:
    """Self-attention of one layer: projections, q/k norms, RoPE, the KV store, o_proj::

        q, k, v = u @ Wq^T, u @ Wk^T, u @ Wv^T             # one product: Projections
        q, k = rope(q_norm(q)), rope(k_norm(k))             # NormRope
        keys, values, mask = batch.kv[i].update(k, v)       # everything the batch may read
        o = attention(q, keys, values, mask, scale, softcap) @ Wo^T

    A family's attention overrides :meth:`attend` (KV sharing; an output gate) or
    :meth:`values` (a v norm, k = v), and ``PROJECTIONS``, the weights it projects u by.
    """

    PROJECTIONS = ("q_proj", "k_proj", "v_proj")

    def __init__(self, cfg, be, idx: int, w: dict, rope):
        self.be, self.idx, self.w, self.rope = be, idx, w, rope
        self.n_heads = cfg.num_attention_heads
        self.n_kv, self.d = cfg.num_key_value_heads_for(idx), cfg.head_dim_for(idx)
        self.scale, self.softcap = cfg.attention_scale, cfg.attn_logit_softcapping
        qk = cfg.qk_norm  # per head over d, (1 + w) where the family's norms are
        self.q_norm = self.head_norm(w.get("self_attn.q_norm.weight") if qk else None, cfg)
        self.k_norm = self.head_norm(w.get("self_attn.k_norm.weight") if qk else None, cfg)
        names = [f"self_attn.{p}.weight" for p in self.PROJECTIONS]
        self.project = Projections.stacked(be, w, names)  # q (and k, v) in one product
        self.norm_rope = NormRope(idx, self.q_norm, self.k_norm, rope)

    def head_norm(self, weight, cfg):
        """A per-head RMSNorm over d with ``weight`` [d], or :class:`Identity` for None."""
        if weight is None:
            return Identity()
        return RMSNorm(self.be, weight, cfg.rms_norm_eps, cfg.norm_offset)

    def __call__(self, u, batch):
        """u [T, H] -> [T, H] over the layer's KV store in ``batch``."""
        q, *kv = self.project(u)  # q [T, nh*d]; the k (and v) projections [T, nkv*d]
        q = q.reshape(u.shape[0], self.n_heads, self.d)
        return self.be.ops.linear(self.attend(q, kv, batch), self.w["self_attn.o_proj.weight"])

    def attend(self, q, kv, batch):
        """q [T, nh, d] (before its norm), kv the k (and v) projections [T, nkv*d] -> [T, nh*d]:
        the queries attend over everything the layer's KV store returns."""
        k = kv[0].reshape(q.shape[0], self.n_kv, self.d)
        v = self.values(kv, k)
        q, k = self.norm_rope(q, k, batch)  # rope(q_norm(q)), rope(k_norm(k))
        batch.tap(self.idx, "v", v)
        keys, values, mask = batch.kv[self.idx].update(k, v)
        o = self.be.ops.attention(q, keys, values, mask, scale=self.scale,
                                  softcap=self.softcap)  # [T, nh, d]
        return o.reshape(o.shape[0], -1)  # [T, nh*d]

    def values(self, kv, k):
        """v [T, nkv, d]: the v projection (``k``, the raw k, unused here)."""
        return kv[1].reshape(k.shape)


class GatedMLP:
    """``down(act(gate(u), up(u)))``, ``act`` the ``swiglu`` op (``silu(g) * up``) or the
    ``geglu`` op (``gelu_tanh(g) * up``, Gemma); gate and up one product."""

    def __init__(self, be, w: dict, act):
        self.be, self.w, self.act = be, w, act
        self.gate_up = Projections.stacked(be, w, ["mlp.gate_proj.weight", "mlp.up_proj.weight"])

    def __call__(self, x, u, batch):
        """u [T, H] -> [T, H] (x, the residual stream, and batch unused)."""
        g, up = self.gate_up(u)  # u @ Wg^T, u @ Wu^T: [T, F] each
        return self.be.ops.linear(self.act(g, up), self.w["mlp.down_proj.weight"])  # [T, H]


class AddNorm:
    """A residual add, then the norm that reads the sum: ``(x, m) -> (m, x + m, norm(x + m))``."""

    def __init__(self, norm):
        self.norm = norm

    def __call__(self, x, m, batch):
        """x, m [T, H] (``batch`` unused) -> (m, x + m, norm(x + m)), each [T, H]."""
        x = x + m
        return m, x, self.norm(x)


class DecoderLayer:
    """One decoder layer (module docstring); ``w``: its tensors by HF name."""

    def __init__(self, idx: int, w: dict, input_norm, mixer, mixer_add, feed_forward, mlp_add):
        self.idx, self.w = idx, w
        self.input_norm, self.mixer, self.mixer_add = input_norm, mixer, mixer_add
        self.feed_forward, self.mlp_add = feed_forward, mlp_add

    def __call__(self, x, u, batch):
        """x [T, H], u = input_norm(x) -> (x after the layer, next_norm(x)), both [T, H]."""
        i, tap = self.idx, batch.tap
        tap(i, "attn_norm", u)  # input of the mixer (attention or GDN)
        m, x, u = self.mixer_add(x, self.mixer(u, batch), batch)  # x += m; u = pre_mlp_norm(x)
        tap(i, "attn_out", m)
        tap(i, "mlp_norm", u)  # input of the MLP (or MoE)
        m, x, u = self.mlp_add(x, self.feed_forward(x, u, batch), batch)  # x += m; u = next_norm(x)
        tap(i, "mlp_out", m)
        tap(i, "h", x)  # the layer's output (captured when i is a capture id)
        return x, u

    @property
    def pre_mlp_norm(self):
        """The norm before the feed-forward (the one ``mixer_add`` applies)."""
        return self.mixer_add.norm


def run_stack(layers, x, batch, capture=()):
    """Every layer in turn: x [T, H] (the embeddings) -> (final_norm(x_L) [T, H], {i: x_i} for
    i in ``capture``), x_i [T, H] the residual stream after layer i, un-normed."""
    u = layers[0].input_norm(x)  # [T, H]
    captured = {}
    for layer in layers:
        x, u = layer(x, u, batch)
        if layer.idx in capture:
            captured[layer.idx] = x
    return u, captured
