"""The projection ``y = x W^T`` of every linear layer (no bias), W [N, K] as HF ``nn.Linear``."""

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
    """``y[t, n] = sum_k x[t, k] * w[n, k]``: x [T, K] (T may be 0), w [N, K] -> [T, N]."""
    x, w = in_compute_dtype(x, w)
    check_linear_shapes(x.shape, w.shape)
    return x @ w.T  # [T, K] @ [K, N] -> [T, N]
