"""Normalisation ops: RMSNorm, fused residual add + RMSNorm, L2 norm, gated RMSNorm.

All reduce over the last axis of [..., n], broadcast ``weight`` [n], and compute and return the
compute dtype (float32; float64 for float64 inputs), as HF does after its upcast (docs/gdn.md).
"""

from __future__ import annotations

import numpy as np

from dflash_ref.ops._dtypes import in_compute_dtype

L2_NORM_MODES = ("sqrt_eps", "floor")


def rms_norm(x, weight, eps: float, offset: float = 0.0) -> np.ndarray:
    """RMSNorm of x [..., n]: ``y = (offset + w) * x / sqrt(mean(x^2) + eps)``, w [n].

    ``offset=0.0``: Llama/Qwen3; ``offset=1.0``: the (1 + w) form of Gemma and Qwen3-Next.
    """
    x, w = in_compute_dtype(x, weight)
    ms = np.mean(x * x, axis=-1, keepdims=True)  # [..., 1]
    return x / np.sqrt(ms + x.dtype.type(eps)) * (x.dtype.type(offset) + w)


def add_rms_norm(x, residual, weight, eps: float, offset: float = 0.0):
    """``h = x + residual``, then ``normed = rms_norm(h, weight, eps, offset)``, in one op
    (docs/backend.md, "Fused ops"); bit-identical to the two written out.

    x, residual: [..., n]; weight: [n]. Returns (h, normed), [..., n] each.
    """
    if np.shape(x) != np.shape(residual):
        raise ValueError(f"add_rms_norm: x has shape {np.shape(x)} but residual has shape "
                         f"{np.shape(residual)}; they are added element by element and must match")
    x, residual, weight = in_compute_dtype(x, residual, weight)
    h = x + residual  # [..., n]
    return h, rms_norm(h, weight, eps, offset)


def norm_add_rms_norm(x, residual, weight, next_weight, eps: float, offset: float = 0.0):
    """Gemma's sandwich norm then the next norm, in one op (docs/backend.md, "Fused ops")::

        m = rms_norm(x, weight, eps, offset)
        h, normed = add_rms_norm(m, residual, next_weight, eps, offset)

    x, residual: [..., n]; weight, next_weight: [n]. Returns (m, h, normed), [..., n] each.
    """
    m = rms_norm(x, weight, eps, offset)  # [..., n]
    h, normed = add_rms_norm(m, residual, next_weight, eps, offset)
    return m, h, normed


def l2_norm(x, eps: float, mode: str = "sqrt_eps") -> np.ndarray:
    """L2-normalise the last axis of x [..., n], in either eps convention (docs/gdn.md):
    ``"sqrt_eps"`` (FLA, HF): ``x / sqrt(sum(x^2) + eps)``; ``"floor"`` (ggml):
    ``x / max(sqrt(sum(x^2)), eps)``.
    """
    if mode not in L2_NORM_MODES:
        raise ValueError(f"l2_norm mode {mode!r} is unknown; expected one of {L2_NORM_MODES}")
    x = in_compute_dtype(x)
    ss = np.sum(x * x, axis=-1, keepdims=True)  # [..., 1]
    if mode == "sqrt_eps":
        return x / np.sqrt(ss + x.dtype.type(eps))
    return x / np.maximum(np.sqrt(ss), x.dtype.type(eps))


def silu(x) -> np.ndarray:
    """SiLU / swish: ``x * sigmoid(x) = x / (1 + exp(-x))`` (helper; not a table op)."""
    # Written as x * sigmoid(x) with a sign-stable sigmoid so exp never overflows.
    e = np.exp(-np.abs(x))
    sig = np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return x * sig.astype(x.dtype)


def gated_rms_norm(x, z, weight, eps: float) -> np.ndarray:
    """GDN's gated RMSNorm: ``y = w * x / sqrt(mean(x^2) + eps) * silu(z)``, norm then gate,
    plain w (docs/gdn.md). x, z: [..., n] (n = head_v_dim); weight: [n].
    """
    x, z, w = in_compute_dtype(x, z, weight)
    return rms_norm(x, w, eps) * silu(z)
