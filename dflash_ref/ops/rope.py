"""NEOX (rotate-half) RoPE, absolute positions, partial rotary; :func:`qk_norm_rope`.

``inv_freq_i = theta^(-2i/rd)`` (float32, rd = rotary dim), ``angle = float32(pos) * inv_freq``
(one float32 product, as HF); x1 = x[:rd/2], x2 = x[rd/2:rd]::

    y1 = x1 cos - x2 sin
    y2 = x2 cos + x1 sin

Channels rd..d pass through unchanged.
"""

from __future__ import annotations

import functools

import numpy as np

from dflash_ref.ops._dtypes import in_compute_dtype
from dflash_ref.ops.norm import rms_norm


@functools.lru_cache(maxsize=64)
def rope_inv_freq(theta: float, rotary_dim: int, factor: float = 1.0) -> np.ndarray:
    """[rotary_dim // 2] float32 ``theta^(-2i/rotary_dim) / factor`` (HF "linear" scaling),
    cached and read-only."""
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
    """NEOX RoPE of x [T, H, d] at positions [T] (any order); the first ``rotary_dim`` channels
    (None: all d) rotate, inv_freq divided by ``factor``. [T, H, d] in the compute dtype.
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
    """The per-head q/k RMSNorms then RoPE, one op (docs/backend.md, "Fused ops")::

        q' = rope(rms_norm(q, q_weight, eps, offset), positions, theta, rotary_dim, factor)
        k' = rope(rms_norm(k, k_weight, eps, offset), positions, theta, rotary_dim, factor)

    q: [T, nq, d] or None (then q' is None); k: [T, nk, d]; positions: [T]; q_weight, k_weight:
    [d] or None (no norm). Returns (q', k').
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
