"""The launch plan of the projection kernels ``linear_rows*`` (pure: no CuPy; tested on CPU).

``y = x @ w.T`` for x [T, K], w [N, K] (cuda/linear.cu; docs/performance.md, "The projection
kernel"). For 1 <= T <= MAX_ROWS a block of THREADS threads computes one tile of COLS
consecutive output columns (weight rows) for all T rows of x at a time, and walks the tiles
``blockIdx.x, blockIdx.x + gridDim.x, ...``; the grid is at most one wave of resident blocks
(:func:`resident_blocks` per SM times the SMs), so all blocks start together and read the same
stretch of x at the same time (it stays in L1). Within a tile the block's threads split K:
thread ``i`` takes the element groups ``j = i, i + THREADS, i + 2 THREADS, ...`` (a group is one
float4 of 4 consecutive k, or one float in the scalar kernel), so each weight element is read
exactly once, by one thread, and a warp's loads of one weight row are 512 contiguous bytes. Each
thread keeps T x COLS partial sums in registers and reuses every x load for its COLS columns.
The block then reduces over its threads: a butterfly inside each warp (lanes paired by bit 4,
then 3, 2, 1, 0 of the lane id), then the WARPS warps' results added in warp order from shared
memory.

The row count is rounded up to the kernel's template row count TT (1, 2, 4, 8, 16); the padded
rows read no x, add nothing and are not written. T > MAX_ROWS goes to cuBLAS (``cupy.matmul``)
and T == 0 or N == 0 launches nothing. On sm_80+ (``tensor_cores``) the 1-16-row products run
on tensor cores in 3xTF32 instead (kernels_cupy/linear_mma_plan.py): these kernels stay the
float32 reference twin they are checked against.
"""

from __future__ import annotations

import math

from kernels_cupy.linear_mma_plan import plan_mma

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


def resident_blocks(num_regs: int, regs_per_sm: int = 65536, threads_per_sm: int = 2048,
                    max_blocks_per_sm: int = 32) -> int:
    """Blocks of THREADS threads one SM holds at once, limited by registers and threads.

    Registers are allocated per warp in units of 256 (``num_regs`` per thread, as ptxas
    reports it: ``RawKernel.num_regs``); the static shared memory (<= 2 KiB) never limits.
    """
    per_warp = math.ceil(num_regs * 32 / 256) * 256
    by_regs = (regs_per_sm // per_warp) // WARPS
    return max(1, min(by_regs, threads_per_sm // THREADS, max_blocks_per_sm))


def plan_linear(T: int, N: int, K: int, vec4: bool = True, max_blocks: int | None = None,
                tensor_cores: bool = False) -> dict:
    """How ``kernels_cupy.linear.linear`` computes a [T, K] x [N, K]^T product.

    Returns a dict with ``path``: "empty" (T == 0 or N == 0: nothing to launch), "cublas"
    (T > MAX_ROWS) or "kernel"; for "kernel" with ``tensor_cores`` (sm_80+) the tensor-core
    kernel's plan (:func:`kernels_cupy.linear_mma_plan.plan_mma`), else family ("linear"),
    kernel (name), TT (template rows >= T),
    vec4, group (elements per load: 4 or 1), tiles (ceil(N / COLS)), grid (min(tiles,
    max_blocks), 1, 1) (``max_blocks``: one wave, SMs x :func:`resident_blocks`; None: a block
    per tile), block (THREADS, 1, 1),
    per_thread (element groups the busiest thread loads per column) and depth (the roundings on
    the longest path from a product to an output: the tolerance's d, docs/performance.md).

    Raises:
        ValueError: a negative size or max_blocks < 1, or vec4 with K % 4 != 0.
    """
    if min(T, N, K) < 0 or (max_blocks is not None and max_blocks < 1):
        raise ValueError(f"plan_linear: sizes must be >= 0 and max_blocks >= 1, got T={T}, "
                         f"N={N}, K={K}, max_blocks={max_blocks}")
    if vec4 and K % 4:
        raise ValueError(f"plan_linear: float4 loads need K % 4 == 0, got K={K}; "
                         f"use the scalar kernel (vec4=False)")
    if T == 0 or N == 0:
        return {"path": "empty"}
    if T > MAX_ROWS:
        return {"path": "cublas"}
    if tensor_cores:
        return plan_mma(T, N, K, max_blocks)
    TT = next(r for r in ROW_TEMPLATES if r >= T)
    group = 4 if vec4 else 1
    per_thread = math.ceil(K // group / THREADS)
    tiles = math.ceil(N / COLS)
    return {
        "path": "kernel", "family": "linear", "kernel": kernel_name(TT, vec4), "TT": TT,
        "vec4": vec4,
        "group": group, "tiles": tiles, "block": (THREADS, 1, 1),
        "grid": (tiles if max_blocks is None else min(tiles, max_blocks), 1, 1),
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
