"""Elementwise and row-wise activations: SwiGLU, softmax, log-softmax.

Softmax-type ops are max-subtracted (``exp(x - max)``) so that any finite input is safe; they
work along ``axis`` (last by default).
"""

from __future__ import annotations

import numpy as np

from dflash_ref.ops._dtypes import as_compute, compute_dtype
from dflash_ref.ops.norm import silu


def swiglu(gate, up) -> np.ndarray:
    """SwiGLU activation of the gated MLP: ``silu(gate) * up``.

    The full MLP is ``down_proj(swiglu(x @ gate_proj^T, x @ up_proj^T))``.

    Args:
        gate: [..., F] output of gate_proj.
        up: [..., F] output of up_proj.
    Returns:
        [..., F] in the compute dtype.
    """
    dt = compute_dtype(gate, up)
    return silu(as_compute(gate, dt)) * as_compute(up, dt)


def softmax(x, axis: int = -1) -> np.ndarray:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``. Shape preserved."""
    x = as_compute(x, compute_dtype(x))
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(x, axis: int = -1) -> np.ndarray:
    """``x - max - log(sum(exp(x - max)))`` along ``axis``. Shape preserved."""
    x = as_compute(x, compute_dtype(x))
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
