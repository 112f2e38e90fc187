"""Elementwise and row-wise activations: SwiGLU, GeGLU, the sigmoid output gate, the GDN gates,
softmax, log-softmax.

Softmax-type ops are max-subtracted (``exp(x - max)``) so that any finite input is safe; they
work along ``axis`` (last by default).
"""

from __future__ import annotations

import numpy as np

from dflash_ref.ops._dtypes import in_compute_dtype
from dflash_ref.ops.norm import silu

SOFTPLUS_THRESHOLD = 20.0  # softplus(x) = x above this (FLA ``fla/ops/utils/softplus.py``)


def swiglu(gate, up) -> np.ndarray:
    """SwiGLU activation of the gated MLP: ``silu(gate) * up``.

    The full MLP is ``down_proj(swiglu(x @ gate_proj^T, x @ up_proj^T))``.

    Args:
        gate: [..., F] output of gate_proj.
        up: [..., F] output of up_proj.
    Returns:
        [..., F] in the compute dtype.
    """
    gate, up = in_compute_dtype(gate, up)
    return silu(gate) * up


def geglu(gate, up) -> np.ndarray:
    """GeGLU activation of Gemma's gated MLP: ``gelu_tanh(gate) * up``.

    GELU with the tanh approximation (HF ``gelu_pytorch_tanh``: ``0.5 g (1 + tanh(z))``,
    ``z = sqrt(2/pi) (g + 0.044715 g^3)``), evaluated as ``g / (1 + exp(-2 z))``, the same
    function without the cancellation of ``1 + tanh(z)`` in float32; the written-out form and
    why are :func:`dflash_ref.models.gemma.gelu_tanh`'s, and this op equals
    ``gelu_tanh(np, gate) * up`` bit for bit (tests/ops/test_activations.py). ``exp`` overflows
    to ``inf`` below ``g ~ -10.3``, where the quotient is ``-0`` (the true value is under 1e-37).
    The CuPy twin is one launch (the NumPy expression is nine array operations).

    Args:
        gate: [..., F] output of gate_proj.
        up: [..., F] output of up_proj.
    Returns:
        [..., F] in the compute dtype.
    """
    g, up = in_compute_dtype(gate, up)
    c = np.float32(2.0 * np.sqrt(2.0 / np.pi))  # 2 sqrt(2/pi)
    two_z = c * (g + np.float32(0.044715) * g * g * g)  # 2 z, shape of g
    with np.errstate(over="ignore"):  # exp(-2 z) = inf for g < -10.3: g / inf = -0
        return g / (1.0 + np.exp(-two_z)) * up


def sigmoid_gate(x, gate) -> np.ndarray:
    """An output gate: ``x * sigmoid(gate) = x * (1 / (1 + exp(-gate)))``, elementwise.

    Qwen3.5 / Qwen3-Next full-attention layers gate the attention output per head with the
    second half of each q_proj head (dflash_ref/models/qwen3_5.py; HF ``Qwen3NextAttention``).
    The CuPy twin is one launch (five array operations in NumPy terms) and reads x and gate in
    place when they are 2-D or 3-D with contiguous channels (the gate: a strided view of the
    [q | gate] heads).

    Args:
        x: [..., n]; gate: the same shape.
    Returns:
        [..., n] in the compute dtype.
    """
    x, gate = in_compute_dtype(x, gate)
    if x.shape != gate.shape:
        raise ValueError(f"sigmoid_gate: x {x.shape} and gate {gate.shape} must have the same "
                         f"shape")
    return x * (1.0 / (1.0 + np.exp(-gate)))


def gdn_gates(b, a, A, dt_bias):
    """The layer's per-token write strength and log decay from its b and a projections
    (docs/gdn.md, "The layer"; HF ``Qwen3NextGatedDeltaNet``; dflash_ref/models/gdn_layer.py)::

        beta = sigmoid(b)                          # written exp(-logaddexp(0, -b)): no overflow
        g    = A * softplus(a + dt_bias)           # A = -exp(A_log) < 0, so g <= 0

    softplus is ``log1p(exp(u))``, and ``u`` itself above ``SOFTPLUS_THRESHOLD`` (FLA's rule).
    The CuPy twin is one launch (the NumPy expression is eleven array operations) and reads b
    and a in place as the column slices of the layer's stacked input projection.

    Args:
        b, a: [T, HV] per token and value head.
        A: [HV] ``-exp(A_log)``; dt_bias: [HV].
    Returns:
        (beta, g): [T, HV] each, in the compute dtype.
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
