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


FEW_ROWS = range(2, 8)
"""The row counts T for which :func:`linear_few_rows` takes one product per row: OpenBLAS's
matrix product of 2 to 7 rows costs 2 to 4 one-row products (it repacks all of w for every
call); 8 or more rows keep the matrix product (docs/spec_decode.md, "Verify that costs what it
must")."""

BLOCK_ROWS = 1024
"""Rows of w per block in :func:`linear_few_rows`: 2.5 MiB for 640 inputs, within the last-level
cache while the T products read it."""

LARGE_WEIGHT = 1 << 18
"""Elements of w (1 MiB in float32) from which :func:`linear_few_rows` pays; a smaller w stays
in cache and keeps :func:`linear`, bit for bit."""


def linear_few_rows(x, w, block_rows: int = BLOCK_ROWS) -> np.ndarray:
    """:func:`linear` for a few rows of x and a large w: x [T, K], w [N, K] -> [T, N].

    For T in :data:`FEW_ROWS` and w of at least :data:`LARGE_WEIGHT` elements, w is read
    ``block_rows`` rows at a time and each row of x is multiplied by the block while it is in
    cache, one matrix-vector product per row (each y[t, n] one dot product of K terms, as in a
    one-row ``linear``). Other shapes are :func:`linear`'s. The NumPy backend's ``linear``.
    """
    if np.ndim(x) != 2 or np.shape(x)[0] not in FEW_ROWS or np.size(w) < LARGE_WEIGHT:
        return linear(x, w)  # its own conversion, checks and product
    x, w = in_compute_dtype(x, w)
    check_linear_shapes(x.shape, w.shape)
    T, N = x.shape[0], w.shape[0]
    y = np.empty((T, N), np.result_type(x, w))  # [T, N]
    for lo in range(0, N, block_rows):
        block = w[lo: lo + block_rows]  # [b, K], read from memory once
        for t in range(T):
            np.matmul(block, x[t], out=y[t, lo: lo + block_rows])  # [b, K] @ [K] -> [b]
    return y
