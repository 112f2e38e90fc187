"""Rotary position embedding, NEOX (rotate-half) style, absolute positions, partial rotary; and
:func:`qk_norm_rope`, the q/k norms and RoPE of an attention layer as one op.

As HF and z-lab/dflash ``dflash/model.py`` (docs/backend.md):
``inv_freq_i = theta^(-2i/rd)`` for i = 0..rd/2-1 where rd is the rotary dimension
(``head_dim * partial_rotary_factor``); ``angle = pos * inv_freq``; the first rd channels of each
head are split into halves x1 = x[:rd/2], x2 = x[rd/2:rd] and rotated::

    y1 = x1 cos - x2 sin
    y2 = x2 cos + x1 sin

Channels rd..d pass through unchanged. Rotation preserves each head's norm, and q·k after RoPE
depends only on the relative position (tests/ops/test_rope.py).

Numerics follow HF: inv_freq is computed in float32 and the angle is one float32 product
``float32(pos) * inv_freq``, so NumPy and the CuPy twin (which receives the same inv_freq table)
agree on the angle bit for bit; only cos/sin and the final FMA differ by an ulp or two.
"""

from __future__ import annotations

import functools

import numpy as np

from dflash_ref.ops._dtypes import in_compute_dtype
from dflash_ref.ops.norm import rms_norm


@functools.lru_cache(maxsize=64)
def rope_inv_freq(theta: float, rotary_dim: int, factor: float = 1.0) -> np.ndarray:
    """The [rotary_dim // 2] float32 inverse frequencies ``theta^(-2i/rotary_dim) / factor``.

    ``factor`` is HF's "linear" RoPE scaling (Gemma 3 global layers: 8.0); 1.0 is plain RoPE.
    The table is a constant of its arguments: made once per configuration (a model has one or
    two, and calls :func:`rope` twice per layer and step) and returned read-only, as the CuPy
    twin keeps it on the device.
    """
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    if not theta > 0:
        raise ValueError(f"rope theta must be positive, got {theta}")
    if not factor > 0:
        raise ValueError(f"rope linear scaling factor must be positive, got {factor}")
    exponent = np.arange(0, rotary_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(
        rotary_dim
    )  # [rd/2]
    inv_freq = (np.float32(1.0) / (np.float32(theta) ** exponent)).astype(np.float32)
    if factor != 1.0:
        inv_freq = (inv_freq / np.float32(factor)).astype(np.float32)
    inv_freq.setflags(write=False)  # shared by every call with these arguments
    return inv_freq


def rope(x, positions, theta: float, rotary_dim: int | None = None,
         factor: float = 1.0) -> np.ndarray:
    """Apply NEOX RoPE to every head of ``x`` at absolute ``positions``.

    Args:
        x: [T, H, d] queries or keys (one row per token, H heads of size d).
        positions: [T] integer absolute positions (any order; need not be contiguous).
        theta: RoPE base (``rope_theta``; never defaulted, see docs/conventions.md).
        rotary_dim: number of leading channels rotated (even, <= d); None means all d.
        factor: linear RoPE scaling; the inverse frequencies are divided by it (1.0 = none).
    Returns:
        [T, H, d] in the compute dtype.
    """
    x = in_compute_dtype(x)
    if x.ndim != 3:
        raise ValueError(f"rope expects x of shape [T, H, d], got {x.shape}")
    T, _, d = x.shape
    rd = d if rotary_dim is None else int(rotary_dim)
    if rd > d:
        raise ValueError(f"rotary_dim {rd} exceeds head_dim {d}")
    pos = np.asarray(positions)
    if pos.shape != (T,):
        raise ValueError(f"positions must have shape [{T}], got {pos.shape}")
    inv_freq = rope_inv_freq(theta, rd, factor)  # [rd/2] f32
    angle = pos.astype(np.float32)[:, None] * inv_freq[None, :]  # [T, rd/2] f32
    angle = angle.astype(x.dtype)  # float64 inputs get exact cos/sin of the float32 angle
    cos = np.cos(angle)[:, None, :]  # [T, 1, rd/2]
    sin = np.sin(angle)[:, None, :]
    x1, x2 = x[..., : rd // 2], x[..., rd // 2 : rd]  # [T, H, rd/2] each
    out = x.copy()
    out[..., : rd // 2] = x1 * cos - x2 * sin
    out[..., rd // 2 : rd] = x2 * cos + x1 * sin
    return out


def qk_norm_rope(q, k, positions, q_weight, k_weight, eps: float, offset: float, theta: float,
                 rotary_dim: int | None = None, factor: float = 1.0):
    """The per-head q and k RMSNorms, then RoPE of both: four steps of an attention layer as one
    op (docs/backend.md, "Fused ops")::

        q' = rope(rms_norm(q, q_weight, eps, offset), positions, theta, rotary_dim, factor)
        k' = rope(rms_norm(k, k_weight, eps, offset), positions, theta, rotary_dim, factor)

    This reference is that composition of :func:`~dflash_ref.ops.norm.rms_norm` and
    :func:`rope`, so it equals the four calls bit for bit. A weight of None skips that norm (a
    layer without q/k norms; Qwen3 and Gemma norm both, Llama-style layers neither). The norm is
    over each head's d channels; RoPE as :func:`rope` (partial ``rotary_dim``, linear
    ``factor``). The CuPy twin is one launch reading q and k in place: rows and heads may be
    strided (the column slices of a stacked q/k/v product, a [q | gate] head), the channels
    contiguous.

    Args:
        q: [T, nq, d] queries (projected, before their norm), or None: keys only, and q' is
            None (the drafter's context keys).
        k: [T, nk, d] keys.
        positions: [T] integer absolute positions.
        q_weight, k_weight: [d] per-channel scales as stored, or None (no norm).
        eps, offset: as in :func:`~dflash_ref.ops.norm.rms_norm` (offset 1.0: the (1 + w) form).
        theta, rotary_dim, factor: as in :func:`rope`.
    Returns:
        (q', k'): [T, nq, d] and [T, nk, d] in the compute dtype.
    """
    if np.ndim(k) != 3 or (q is not None and np.ndim(q) != 3):
        raise ValueError(f"qk_norm_rope expects q [T, nq, d] (or None) and k [T, nk, d], got "
                         f"shapes {np.shape(q) if q is not None else None} and {np.shape(k)}")
    if q is not None and (np.shape(q)[0] != np.shape(k)[0] or np.shape(q)[2] != np.shape(k)[2]):
        raise ValueError(f"qk_norm_rope: q {np.shape(q)} and k {np.shape(k)} must have the same "
                         f"number of tokens T and head dim d (axes 0 and 2)")
    k = k if k_weight is None else rms_norm(k, k_weight, eps, offset)  # [T, nk, d]
    k = rope(k, positions, theta, rotary_dim, factor)
    if q is None:
        return None, k
    q = q if q_weight is None else rms_norm(q, q_weight, eps, offset)  # [T, nq, d]
    return rope(q, positions, theta, rotary_dim, factor), k
