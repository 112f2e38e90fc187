"""Normalisation ops: RMSNorm (plain and (1+w)), the fused residual add + RMSNorm (also after a
sandwich norm of what is added), L2 norm (two eps conventions), gated RMSNorm.

All reduce over the last axis and broadcast ``weight`` [n] over the leading axes. The statistic is
accumulated in the compute dtype (float32, or float64 for float64 inputs), as HF does after its
upcast (docs/drafter.md, docs/gdn.md; huggingface/transformers
``src/transformers/models/qwen3_next/modeling_qwen3_next.py``).
"""

from __future__ import annotations

import numpy as np

from dflash_ref.ops._dtypes import in_compute_dtype

L2_NORM_MODES = ("sqrt_eps", "floor")


def rms_norm(x, weight, eps: float, offset: float = 0.0) -> np.ndarray:
    """RMSNorm over the last axis: ``y = (offset + w) * x / sqrt(mean(x^2) + eps)``.

    ``offset=0.0`` is the Llama/Qwen3 form (multiply by w). ``offset=1.0`` is the zero-centred
    (1 + w) form of Gemma and of Qwen3-Next/Qwen3.5 (except their GDN gated norm, which is plain w).

    Args:
        x: [..., n] activations.
        weight: [n] per-channel scale as stored in the checkpoint.
        eps: added to the mean square inside the sqrt.
        offset: added to ``weight`` before scaling (0.0 or 1.0).
    Returns:
        [..., n] in the compute dtype.
    """
    x, w = in_compute_dtype(x, weight)
    ms = np.mean(x * x, axis=-1, keepdims=True)  # [..., 1]
    return x / np.sqrt(ms + x.dtype.type(eps)) * (x.dtype.type(offset) + w)


def add_rms_norm(x, residual, weight, eps: float, offset: float = 0.0):
    """The residual add and the RMSNorm of the sum, in one op (docs/backend.md, "Fused ops").

    ``h = x + residual``, then ``normed = rms_norm(h, weight, eps, offset)``: the same two
    computations in the same order as written out separately, so the results are bit-identical
    to ``h = x + residual; rms_norm(h, weight, eps, offset)``. The CuPy twin reads x and residual
    once and writes h and normed in one pass, where the unfused pair launches twice and reads h
    back (the pattern of vLLM's ``fused_add_rms_norm``, vllm-project/vllm
    ``csrc/layernorm_kernels.cu``).

    Args:
        x: [..., n] what a sub-block adds (attention / MLP output).
        residual: [..., n] the residual stream, same shape as ``x``.
        weight: [n] as stored in the checkpoint; ``offset`` as in :func:`rms_norm`.
        eps: added to the mean square inside the sqrt.
    Returns:
        (h, normed): both [..., n] in the compute dtype (float32, float64 for float64 inputs).
    """
    if np.shape(x) != np.shape(residual):
        raise ValueError(f"add_rms_norm: x has shape {np.shape(x)} but residual has shape "
                         f"{np.shape(residual)}; they are added element by element and must match")
    x, residual, weight = in_compute_dtype(x, residual, weight)
    h = x + residual  # [..., n]
    return h, rms_norm(h, weight, eps, offset)


def norm_add_rms_norm(x, residual, weight, next_weight, eps: float, offset: float = 0.0):
    """A sub-block's output normed, added to the residual stream, and the sum normed: Gemma's
    sandwich norm then the next norm, in one op (docs/backend.md, "Fused ops")::

        m = rms_norm(x, weight, eps, offset)                  # post_attention / post_feedforward
        h, normed = add_rms_norm(m, residual, next_weight, eps, offset)

    The same calls in the same order, so the results equal the written-out three steps bit for
    bit. The CuPy twin is one launch (one block per row) where the pair of norms and the add took
    two.

    Args:
        x: [..., n] a sub-block's output, before its norm.
        residual: [..., n] the residual stream.
        weight: [n] the sub-block's post norm; next_weight: [n] the norm of the sum.
        eps, offset: as in :func:`rms_norm`, shared by both norms.
    Returns:
        (m, h, normed): [..., n] each, in the compute dtype.
    """
    m = rms_norm(x, weight, eps, offset)  # [..., n]
    h, normed = add_rms_norm(m, residual, next_weight, eps, offset)
    return m, h, normed


def l2_norm(x, eps: float, mode: str = "sqrt_eps") -> np.ndarray:
    """L2-normalise the last axis, in one of the two public eps conventions (docs/gdn.md).

    - ``mode="sqrt_eps"`` (FLA, HF): ``y = x / sqrt(sum(x^2) + eps)`` (eps inside the sqrt).
    - ``mode="floor"`` (ggml): ``y = x / max(sqrt(sum(x^2)), eps)`` (eps floors the norm).

    They agree for ordinary vectors and differ near zero: for a 128-vector of 1e-5 with eps 1e-6,
    "sqrt_eps" gives norm 0.112 while "floor" gives 1.0.

    Args:
        x: [..., n].
        eps: 1e-6 in Qwen3-Next / Qwen3.5.
        mode: "sqrt_eps" or "floor".
    Returns:
        [..., n] in the compute dtype.
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
    """Gated RMSNorm of the GDN output path: ``y = w * x / sqrt(mean(x^2) + eps) * silu(z)``.

    Normalise first, then gate (HF ``Qwen3NextRMSNormGated``, FLA ``FusedRMSNormGated``;
    docs/gdn.md, "The layer"). The weight is plain ``w`` (no +1), unlike the model's other norms.

    Args:
        x: [..., n] core GDN output (per value head: n = head_v_dim).
        z: [..., n] gate, same shape as ``x``.
        weight: [n] shared by all heads.
        eps: rms_norm_eps.
    Returns:
        [..., n] in the compute dtype.
    """
    x, z, w = in_compute_dtype(x, z, weight)
    return rms_norm(x, w, eps) * silu(z)
