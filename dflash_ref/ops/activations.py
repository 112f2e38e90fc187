"""Activations: SwiGLU, GeGLU, the sigmoid output gate, the GDN gates, (log-)softmax.

All return the compute dtype; softmax-type ops subtract the max along ``axis`` first.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.ops._dtypes import in_compute_dtype
from dflash_ref.ops.norm import silu

SOFTPLUS_THRESHOLD = 20.0  # softplus(x) = x above this (FLA ``fla/ops/utils/softplus.py``)


def swiglu(gate, up) -> np.ndarray:
    """``silu(gate) * up``; gate, up: [..., F] (gate_proj, up_proj outputs)."""
    gate, up = in_compute_dtype(gate, up)
    return silu(gate) * up


def geglu(gate, up) -> np.ndarray:
    """Gemma's ``gelu_tanh(gate) * up``, gelu_tanh(g) = ``g / (1 + exp(-2 z))``,
    ``z = sqrt(2/pi) (g + 0.044715 g^3)`` (as :func:`dflash_ref.models.gemma.gelu_tanh`, bit for
    bit); gives -0 below g ~ -10.3, where exp overflows. gate, up: [..., F].
    """
    g, up = in_compute_dtype(gate, up)
    c = np.float32(2.0 * np.sqrt(2.0 / np.pi))  # 2 sqrt(2/pi)
    two_z = c * (g + np.float32(0.044715) * g * g * g)  # 2 z, shape of g
    with np.errstate(over="ignore"):  # exp(-2 z) = inf for g < -10.3: g / inf = -0
        return g / (1.0 + np.exp(-two_z)) * up


def sigmoid_gate(x, gate) -> np.ndarray:
    """``x * (1 / (1 + exp(-gate)))``, x and gate [..., n] (Qwen3-Next's attention gate)."""
    x, gate = in_compute_dtype(x, gate)
    if x.shape != gate.shape:
        raise ValueError(f"sigmoid_gate: x {x.shape} and gate {gate.shape} must have the same "
                         f"shape")
    return x * (1.0 / (1.0 + np.exp(-gate)))


def gdn_gates(b, a, A, dt_bias):
    """GDN's write strength and log decay (docs/gdn.md, "The layer")::

        beta = sigmoid(b)                  # as exp(-logaddexp(0, -b))
        g    = A * softplus(a + dt_bias)   # softplus(u) = u above SOFTPLUS_THRESHOLD

    b, a: [T, HV]; A = -exp(A_log), dt_bias: [HV]. Returns (beta, g), [T, HV] each.
    """
    b, a, A, dt_bias = in_compute_dtype(b, a, A, dt_bias)
    if b.ndim != 2 or a.shape != b.shape or A.shape != (b.shape[1],) or A.shape != dt_bias.shape:
        raise ValueError(f"gdn_gates: expected b, a [T, HV] and A, dt_bias [HV]; got b "
                         f"{b.shape}, a {a.shape}, A {A.shape}, dt_bias {dt_bias.shape}")
    beta = np.exp(-np.logaddexp(0.0, -b))  # sigmoid(b) [T, HV]
    u = a + dt_bias  # [T, HV]
    softplus = np.where(u > SOFTPLUS_THRESHOLD, u,
                        np.log1p(np.exp(np.minimum(u, SOFTPLUS_THRESHOLD))))
    return beta, A * softplus


def softmax(x, axis: int = -1) -> np.ndarray:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``. Shape preserved."""
    x = in_compute_dtype(x)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(x, axis: int = -1) -> np.ndarray:
    """``x - max - log(sum(exp(x - max)))`` along ``axis``. Shape preserved."""
    x = in_compute_dtype(x)
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
