"""What Gemma 4 adds to the reference decoder layer (with Gemma's sandwich norms,
:mod:`dflash_ref.models.gemma`): per-layer embeddings, the layer scalar, KV sharing, k = v and
proportional RoPE.

Rules from huggingface/transformers ``src/transformers/models/gemma4/modeling_gemma4.py``
(``Gemma4TextModel.get_per_layer_inputs`` / ``project_per_layer_inputs``,
``Gemma4TextDecoderLayer``, ``Gemma4TextAttention``) and
``src/transformers/modeling_rope_utils.py`` (``_compute_proportional_rope_parameters``);
docs/target.md, "Families".

**The layer** is the reference block and one more line, which its MLP residual add
(:class:`LayerOutputAdd`) makes::

    x = x + post_attention_layernorm(attn(input_layernorm(x)))
    x = x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))
    x = (x + per_layer_input(x, ple_i)) * layer_scalar            # LayerOutputAdd

**Attention** (``Gemma4TextAttention``): q and k get their RMS norms (weight w) before RoPE, v a
weightless RMS norm (:class:`VNormAttention`), the scale is 1 (the common
:class:`~dflash_ref.models.layers.Attention`, configured so). Full layers with
``attention_k_eq_v`` keep no v_proj: v is the raw k projection (:class:`KEqVAttention`). The
last ``num_kv_shared_layers`` keep no K/V at all: they attend over the K/V the last earlier
layer of their type stored in this batch (:class:`SharedKVAttention`,
``batch.kv[source].read()``).

**Per-layer embeddings (PLE)**, the small variants (E2B / E4B), P = hidden_size_per_layer_input,
L = num_hidden_layers, e = the scaled token embeddings [T, H]::

    tok  = embed_tokens_per_layer[ids] * sqrt(P)                    # [T, L*P] -> [T, L, P]
    ctx  = rms_P(e @ per_layer_model_projection.T * H^-0.5)         # [T, L, P]
    ple  = (ctx + tok) * 2^-0.5                                      # layer i reads ple[:, i]

and at the end of decoder layer i, after the MLP residual::

    x = x + post_per_layer_input_norm(per_layer_projection(act(per_layer_input_gate(x)) * ple_i))

**Proportional RoPE** (full-attention layers): with ``a = rotary_dim / 2`` rotated frequencies
over a head of d channels, ``inv_freq_i = theta^(-2i/d) / factor`` for i < a and 0 for the other
``d/2 - a``; channel i pairs with channel i + d/2 across the whole head (HF's rotate_half), so
the zero frequencies pass their channels through unchanged.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.config.fields import embedding_scale_for
from dflash_ref.models.gemma import gelu_tanh
from dflash_ref.models.layers import Attention, RMSNorm


def proportional_inv_freq(spec) -> np.ndarray:
    """[d/2] float32 inverse frequencies of a proportional RopeSpec (zeros past rotary_dim/2)."""
    d, a = spec.head_dim, spec.rotary_dim // 2
    exponent = np.arange(0, 2 * a, 2, dtype=np.int64).astype(np.float32) / np.float32(d)
    rotated = (np.float32(1.0) / (np.float32(spec.theta) ** exponent)).astype(np.float32)
    inv = np.concatenate([rotated, np.zeros(d // 2 - a, np.float32)])
    return (inv / np.float32(spec.factor)).astype(np.float32)  # [d/2]


def proportional_cos_sin(xp, positions, inv_freq):
    """cos, sin [T, 1, d] float32 of proportional RoPE at ``positions`` [T] (backend ints).

    ``inv_freq`` [d/2] is :func:`proportional_inv_freq` on the backend. The angle is one float32
    product, as in HF; computed on the backend, once per batch and layer type (the target caches
    it on the batch: dflash_ref/models/batch_arrays.py).
    """
    angle = positions.astype(xp.float32)[:, None] * inv_freq[None, :]  # [T, d/2]
    angle = xp.concatenate([angle, angle], axis=1)  # [T, d], both halves of a pair
    return xp.cos(angle)[:, None, :], xp.sin(angle)[:, None, :]  # [T, 1, d] each


def proportional_rope(xp, x, cos, sin):
    """x [T, h, d] rotated by :func:`proportional_cos_sin`'s tables -> [T, h, d] float32."""
    half = x.shape[-1] // 2
    rotated = xp.concatenate([-x[..., half:], x[..., :half]], axis=-1)  # rotate_half(x)
    return x * cos + rotated * sin


class ProportionalRope:
    """Proportional RoPE of a layer type (module docstring), a RoPE component of
    :class:`~dflash_ref.models.layers.Attention`: its cos / sin table is made on the backend
    once per batch and shared by the layers of the type (``arrays.once``)."""

    def __init__(self, be, spec):
        self.be, self.spec = be, spec
        self.inv_freq = be.to_backend(proportional_inv_freq(spec))  # [d/2]

    def __call__(self, x, arrays):
        """x [T, h, d] rotated at ``arrays.positions`` [T] -> [T, h, d]."""
        xp = self.be.xp
        cos, sin = arrays.once(("rope", self.spec), lambda: proportional_cos_sin(
            xp, arrays.positions, self.inv_freq))  # [T, 1, d] each, once per batch
        return proportional_rope(xp, x, cos, sin)


class VNormAttention(Attention):
    """Gemma 4's attention: v RMS-normed per head over d, without a weight
    (``Gemma4TextAttention``'s ``v_norm``)."""

    def __init__(self, cfg, be, idx: int, w: dict, rope):
        super().__init__(cfg, be, idx, w, rope)
        self.v_norm = RMSNorm(be, be.xp.ones(self.d, dtype=be.xp.float32), cfg.rms_norm_eps, 0.0)

    def values(self, kv, k):
        """v [T, nkv, d]: ``v_norm(u @ Wv^T)``."""
        return self.v_norm(super().values(kv, k))


class KEqVAttention(VNormAttention):
    """A full layer with ``attention_k_eq_v``: no v_proj, v is the raw k projection (normed)."""

    PROJECTIONS = ("q_proj", "k_proj")

    def values(self, kv, k):
        """v [T, nkv, d]: ``v_norm(k)``, k the raw k projection."""
        return self.v_norm(k)


class SharedKVAttention(Attention):
    """A KV-sharing layer: its own queries over the K/V layer ``kv_source`` stored this batch.

    ``batch.tap`` sees "q" and "q_rope" only (the layer computes no k or v)."""

    PROJECTIONS = ("q_proj",)

    def __init__(self, cfg, be, idx: int, w: dict, rope):
        super().__init__(cfg, be, idx, w, rope)
        self.kv_source = cfg.kv_source_for(idx)

    def attend(self, q, kv, batch):
        """q [T, nh, d] (projected, before its norm; ``kv`` empty) -> attention output [T, nh*d]
        over what the source layer stored for this batch."""
        q = self.q_norm(q)
        batch.tap(self.idx, "q", q)
        q = self.rope(q, batch.arrays)
        batch.tap(self.idx, "q_rope", q)
        keys, values, mask = batch.kv[self.kv_source].read()
        o = self.be.ops.attention(q, keys, values, mask, scale=self.scale,
                                  softcap=self.softcap)  # [T, nh, d]
        return o.reshape(o.shape[0], -1)  # [T, nh*d]


class PerLayerEmbeddings:
    """The model-level half of PLE: ``ple`` [T, L, P] from the ids and the scaled embeddings.

    ``embed`` is the target's token embedding (ids [T] -> [T, H], times its scale); the layers
    read the table through :meth:`of_batch`, made once per batch from the batch's ids."""

    def __init__(self, cfg, be, w: dict, embed):
        g, p = cfg.gemma4, cfg.weight_prefix
        self.be, self.L, self.P = be, cfg.num_hidden_layers, g.hidden_size_per_layer_input
        self.eps, self.H, self.embed = cfg.rms_norm_eps, cfg.hidden_size, embed
        self.table = w[f"{p}embed_tokens_per_layer.weight"]  # [V_ple, L*P]
        self.projection = w[f"{p}per_layer_model_projection.weight"]  # [L*P, H]
        self.norm = w[f"{p}per_layer_projection_norm.weight"]  # [P]
        # HF multiplies by sqrt(P) cast to the table's dtype (like the main embedding scale).
        self.tok_scale = embedding_scale_for(self.P, cfg.embedding_dtype or "float32")

    def __call__(self, ids, embeds):
        """ids [T], embeds [T, H] (already times the embedding scale) -> [T, L, P]."""
        xp, T = self.be.xp, embeds.shape[0]
        tok = (self.table[xp.asarray(ids)] * xp.float32(self.tok_scale)).reshape(T, self.L, self.P)
        ctx = (embeds @ self.projection.T) * xp.float32(self.H ** -0.5)  # [T, L*P]
        ctx = self.be.ops.rms_norm(ctx.reshape(T * self.L, self.P), self.norm, self.eps, 0.0)
        return (ctx.reshape(T, self.L, self.P) + tok) * xp.float32(2.0 ** -0.5)

    def of_batch(self, arrays):
        """[T, L, P] for the batch's ids (``arrays.ids``), made on the first call per batch."""
        return arrays.once("per_layer_embeddings",
                           lambda: self(arrays.ids, self.embed(arrays.ids)))


def per_layer_embeddings(cfg, be, w: dict, embed) -> PerLayerEmbeddings | None:
    """The model's per-layer embeddings, made once and shared by its layers (None without)."""
    if cfg.gemma4 is None or not cfg.gemma4.hidden_size_per_layer_input:
        return None
    return PerLayerEmbeddings(cfg, be, w, embed)


class PerLayerInput:
    """The layer-level half of PLE: the gated residual add at the end of a decoder layer::

        x + post_per_layer_input_norm(per_layer_projection(gelu(per_layer_input_gate(x)) * ple_i))
    """

    def __init__(self, be, idx: int, w: dict, norm, embeddings: PerLayerEmbeddings):
        self.be, self.idx, self.embeddings = be, idx, embeddings
        self.gate = w["per_layer_input_gate.weight"]  # [P, H]
        self.projection = w["per_layer_projection.weight"]  # [H, P]
        self.norm = norm("post_per_layer_input_norm.weight")

    def __call__(self, x, batch):
        """x [T, H] -> x plus this layer's per-layer input [T, H]."""
        ple_i = self.embeddings.of_batch(batch.arrays)[:, self.idx]  # [T, P]
        a = gelu_tanh(self.be.xp, x @ self.gate.T) * ple_i  # [T, P]
        return x + self.norm(a @ self.projection.T)


class LayerOutputAdd:
    """A Gemma 4 layer's MLP residual add, then its output, then the next norm::

        m = post_norm(b)                                  # b: what the feed-forward returned
        x = per_layer_input(x + m) * layer_scalar         # per_layer_input: PerLayerInput, or x
        u = norm(x)                                       # the next layer's input norm (alone)

    HF records a layer's return value, so the captured stream ("h") is the x after the output.
    A residual add of :class:`~dflash_ref.models.layers.DecoderLayer`.
    """

    def __init__(self, post_norm, per_layer_input, layer_scalar, norm):
        self.post_norm, self.norm = post_norm, norm
        self.per_layer_input, self.layer_scalar = per_layer_input, layer_scalar  # _, [1]

    @classmethod
    def of(cls, be, idx: int, w: dict, norm, ple, post_norm, next_norm) -> LayerOutputAdd:
        """Layer ``idx``'s, with its :class:`PerLayerInput` where the model has embeddings
        ``ple`` (a :class:`PerLayerEmbeddings`, or None)."""
        per_layer_input = no_per_layer_input if ple is None else PerLayerInput(be, idx, w, norm,
                                                                                ple)
        return cls(post_norm, per_layer_input, w["layer_scalar"], next_norm)

    def __call__(self, x, b, batch):
        """x, b [T, H] -> (m, the layer's output, its norm), each [T, H]."""
        m = self.post_norm(b)
        x = self.per_layer_input(x + m, batch) * self.layer_scalar
        return m, x, self.norm(x)


def no_per_layer_input(x, batch):
    """A Gemma 4 layer without per-layer embeddings: x unchanged."""
    return x
