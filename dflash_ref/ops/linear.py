"""The projection ``y = x W^T`` of every linear layer (no bias: Qwen3 / Llama / Gemma projections).

Weights keep the layout of the checkpoints and of HF ``nn.Linear``: ``W [N, K]`` (out features,
in features), row ``n`` holding output ``n``'s coefficients. The reference is the plain NumPy
product; the CuPy twin (kernels_cupy/linear.py) reads each weight once with its own kernel for
1 to 16 rows and hands larger row counts to cuBLAS (docs/performance.md, "The projection
kernel").
"""

from __future__ import annotations

import numpy as np

from dflash_ref.ops._dtypes import in_compute_dtype


def check_linear_shapes(x_shape: tuple, w_shape: tuple, op: str = "linear") -> None:
    """Raise ValueError unless x is [T, K] and w is [N, K] with the same K."""
    if len(x_shape) != 2 or len(w_shape) != 2:
        raise ValueError(f"{op}: x must be [T, K] and w [N, K] (HF nn.Linear layout: out "
                         f"features, in features), got x {tuple(x_shape)} and w "
                         f"{tuple(w_shape)}; reshape x to 2-D first")
    if x_shape[1] != w_shape[1]:
        raise ValueError(f"{op}: x has {x_shape[1]} features per row but w {tuple(w_shape)} "
                         f"expects {w_shape[1]} (w is [out, in]); pass the weight as stored, "
                         f"not transposed")


def linear(x, w) -> np.ndarray:
    """``y = x @ w.T``: every row of x projected by the weight matrix.

    ``y[t, n] = sum_k x[t, k] * w[n, k]`` (the NumPy product; its summation order is BLAS's).

    Args:
        x: [T, K] rows (T may be 0).
        w: [N, K] weight in the HF ``nn.Linear`` layout (out features, in features).
    Returns:
        [T, N] in the compute dtype (float32; float64 if an input is float64).
    Raises:
        ValueError: x or w not 2-D, or their K differ.
    """
    x, w = in_compute_dtype(x, w)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        check_linear_shapes(x.shape, w.shape)  # raises, saying which rule is broken
    return x @ w.T  # [T, K] @ [K, N] -> [T, N]
