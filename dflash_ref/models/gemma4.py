"""Gemma 4 pieces outside the common decoder layer: per-layer embeddings and proportional RoPE.

Rules from huggingface/transformers ``src/transformers/models/gemma4/modeling_gemma4.py``
(``Gemma4TextModel.get_per_layer_inputs`` / ``project_per_layer_inputs``,
``Gemma4TextDecoderLayer``) and ``src/transformers/modeling_rope_utils.py``
(``_compute_proportional_rope_parameters``); docs/target.md, "Families".

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
from dflash_ref.models.moe import gelu_tanh


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


class PerLayerEmbeddings:
    """The model-level half of PLE: ``ple`` [T, L, P] from the ids and the scaled embeddings."""

    def __init__(self, cfg, be, w: dict):
        g, p = cfg.gemma4, cfg.weight_prefix
        self.be, self.L, self.P = be, cfg.num_hidden_layers, g.hidden_size_per_layer_input
        self.eps, self.H = cfg.rms_norm_eps, cfg.hidden_size
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


class PerLayerInput:
    """The layer-level half of PLE: the gated residual add at the end of a decoder layer."""

    def __init__(self, be, w: dict, norm):
        self.be = be
        self.gate = w["per_layer_input_gate.weight"]  # [P, H]
        self.projection = w["per_layer_projection.weight"]  # [H, P]
        self.norm = norm("post_per_layer_input_norm.weight")

    def __call__(self, x, ple_i):
        """x [T, H], ple_i [T, P] -> the term added to the residual stream [T, H]."""
        a = gelu_tanh(self.be.xp, x @ self.gate.T) * ple_i  # [T, P]
        return self.norm(a @ self.projection.T)
