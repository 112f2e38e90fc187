"""The launch plan of the projection kernels ``linear_rows*`` (pure: no CuPy; tested on CPU).

``y = x @ w.T`` for x [T, K], w [N, K] (cuda/linear.cu; docs/performance.md, "The projection
kernel"). For 1 <= T <= MAX_ROWS a block of THREADS threads owns COLS consecutive output columns
(weight rows) and all T rows of x; its threads split K: thread ``i`` takes the element groups
``j = i, i + THREADS, i + 2 THREADS, ...`` (a group is one float4 of 4 consecutive k, or one
float in the scalar kernel), so each weight element is read exactly once, by one thread, and a
warp's loads of one weight row are 512 contiguous bytes. Each thread keeps T x COLS partial sums
in registers and reuses every x load for its COLS columns. The block then reduces over its
threads: a butterfly inside each warp (lanes paired by bit 4, then 3, 2, 1, 0 of the lane id),
then the WARPS warps' results added in warp order from shared memory.

The row count is rounded up to the kernel's template row count TT (1, 2, 4, 8, 16); the padded
rows read no x, add nothing and are not written. T > MAX_ROWS goes to cuBLAS (``cupy.matmul``)
and T == 0 or N == 0 launches nothing.
"""

from __future__ import annotations

import math

# Must match linear.cu (tests/kernels/test_linear_plan.py checks the source).
THREADS = 256  # LIN_THREADS: 8 warps
WARPS = THREADS // 32
COLS = 4  # LIN_COLS: output columns (weight rows) per block
UNROLL = 2  # LIN_UNROLL: element groups per thread loaded before the first FMA
ROW_TEMPLATES = (1, 2, 4, 8, 16)  # TT: x rows a kernel instantiation accumulates
MAX_ROWS = ROW_TEMPLATES[-1]
ALIGN = 16  # bytes: a float4 load's alignment


def kernel_name(TT: int, vec4: bool) -> str:
    """``linear_rows{TT}_vec4_f32`` (float4 loads) or ``linear_rows{TT}_f32`` (scalar loads)."""
    return f"linear_rows{TT}_{'vec4_' if vec4 else ''}f32"


def can_use_vec4(K: int, *pointers: int) -> bool:
    """float4 loads need K % 4 == 0 (every row starts on 16 bytes) and 16-byte-aligned bases."""
    return K % 4 == 0 and all(p % ALIGN == 0 for p in pointers)


def plan_linear(T: int, N: int, K: int, vec4: bool = True) -> dict:
    """How ``kernels_cupy.linear.linear`` computes a [T, K] x [N, K]^T product.

    Returns a dict with ``path``: "empty" (T == 0 or N == 0: nothing to launch), "cublas"
    (T > MAX_ROWS) or "kernel"; for "kernel" also kernel (name), TT (template rows >= T),
    vec4, group (elements per load: 4 or 1), grid (ceil(N / COLS), 1, 1), block (THREADS, 1, 1),
    per_thread (element groups the busiest thread loads per column) and depth (the roundings on
    the longest path from a product to an output: the tolerance's d, docs/performance.md).

    Raises:
        ValueError: a negative size, or vec4 with K % 4 != 0.
    """
    if min(T, N, K) < 0:
        raise ValueError(f"plan_linear: sizes must be >= 0, got T={T}, N={N}, K={K}")
    if vec4 and K % 4:
        raise ValueError(f"plan_linear: float4 loads need K % 4 == 0, got K={K}; "
                         f"use the scalar kernel (vec4=False)")
    if T == 0 or N == 0:
        return {"path": "empty"}
    if T > MAX_ROWS:
        return {"path": "cublas"}
    TT = next(r for r in ROW_TEMPLATES if r >= T)
    group = 4 if vec4 else 1
    per_thread = math.ceil(K // group / THREADS)
    return {
        "path": "kernel", "kernel": kernel_name(TT, vec4), "TT": TT, "vec4": vec4,
        "group": group, "grid": (math.ceil(N / COLS), 1, 1), "block": (THREADS, 1, 1),
        "per_thread": per_thread, "depth": summation_depth(K, vec4),
    }


def summation_depth(K: int, vec4: bool = True) -> int:
    """Roundings on the longest path from one product to its output in ``linear_rows*``.

    A thread's chain of FMAs (one rounding each), then 5 butterfly
    additions across the warp's lanes and WARPS - 1 additions across warps. The classic bound
    (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.5) then gives
    ``|y - y_exact| <= gamma_d * sum_k |x_k w_k|`` with ``gamma_d = d u / (1 - d u)``,
    ``u = 2^-24``.
    """
    group = 4 if vec4 else 1
    chain = math.ceil(K // group / THREADS) * group
    return chain + 5 + (WARPS - 1)
