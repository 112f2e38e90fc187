"""The tensor-core projection ``linear_mma_rows16_*`` (cuda/linear_mma.cu): layout, plan, depths.

Pure (no CuPy; emulated on CPU by tests/kernels/test_linear_mma.py). ``y = x @ w.T`` for
x [T, K] with T <= 16 (one MMA tile of M = 16 rows; rows T..15 are zeros, never read), w [N, K]:
a block of THREADS threads (WARPS warps) computes one tile of COLS = 8 output columns (the MMA's
N) at a time, tiles ``blockIdx.x, blockIdx.x + gridDim.x, ...``. The block's warps split K in
k-steps of 8 (the MMA's K): warp ``v`` takes the steps v, v + WARPS, v + 2 WARPS, ...; its m-th
step (m = 0, 1, ...) goes to accumulator pair ``m % NACC`` (independent accumulators: shorter
chains, more MMAs in flight). Per step, the lane loads its A fragment (x) and B fragment (w rows
= B's columns: ``.col`` B is w as stored) by :data:`FRAGMENT_A` / :data:`FRAGMENT_B`, splits
each into TF32 hi and lo parts (kernels_cupy/tf32.py) and issues three MMAs:
lo += x_lo w_hi, lo += x_hi w_lo, hi += x_hi w_hi (bf16 weights: lo += x_lo w, hi += x_hi w).
Then, per fragment element: hi = (hi_0 + hi_1) + ... + hi_7 in order, lo likewise, v = hi + lo; the
block adds the warps' v in warp order from shared memory and writes y[row, n0 + col] for
row < T, n0 + col < N (:data:`FRAGMENT_C`).

The fragment tables are the PTX ISA's for ``mma.m16n8k8`` with ``.tf32`` operands (section
"Matrix Fragments for mma.m16n8k8"; g = lane >> 2 is the groupID, t = lane % 4 the
threadID_in_group): which (row, col) of A [16, 8], B [8, 8] (rows: k) and C/D [16, 8] a lane's
registers hold.
"""

from __future__ import annotations

import math

from kernels_cupy.tf32 import MMA_DEPTH

# Must match linear_mma.cu (tests/kernels/test_linear_mma.py checks the source).
THREADS = 256  # LMM_THREADS: 8 warps
WARPS = THREADS // 32
COLS = 8  # LMM_COLS: the MMA's N, output columns per tile
KSTEP = 8  # LMM_KSTEP: the MMA's K
NACC = 8  # LMM_NACC: accumulator pairs per warp
ROWS = 16  # the MMA's M: at most 16 rows of x
MIN_SM = 80  # mma.sync with TF32 operands: sm_80 and later
KERNELS = {"float32": "linear_mma_rows16_f32", "bf16": "linear_mma_rows16_bf16w"}

# register -> (row, col) as functions of (g, t), per the PTX ISA tables.
FRAGMENT_A = (lambda g, t: (g, t), lambda g, t: (g + 8, t),  # a0, a1
              lambda g, t: (g, t + 4), lambda g, t: (g + 8, t + 4))  # a2, a3
FRAGMENT_B = (lambda g, t: (t, g), lambda g, t: (t + 4, g))  # b0, b1: (k, n)
FRAGMENT_C = (lambda g, t: (g, 2 * t), lambda g, t: (g, 2 * t + 1),  # c0, c1
              lambda g, t: (g + 8, 2 * t), lambda g, t: (g + 8, 2 * t + 1))  # c2, c3


def steps_per_accumulator(K: int) -> int:
    """The most k-steps any one accumulator of any warp takes: ceil(ceil(K / 8) / WARPS / NACC)."""
    per_warp = math.ceil(math.ceil(K / KSTEP) / WARPS)
    return math.ceil(per_warp / NACC)


def mma_depths(K: int, weights: str = "float32") -> tuple[int, int]:
    """(d_hi, d_lo): the most float32 additions a hi x hi product, or a cross product, passes
    through from its MMA to the output (tf32.bound_coefficient's depths).

    An accumulator's L steps: MMA_DEPTH in the product's own MMA and in each later one on the
    same accumulator (the lo accumulator takes two MMAs per step, one with bf16 weights); then
    NACC - 1 additions across accumulators, 1 for hi + lo, WARPS - 1 across warps.
    """
    L = steps_per_accumulator(K)
    tail = (NACC - 1) + 1 + (WARPS - 1)
    lo_mmas = 1 if weights == "bf16" else 2
    return MMA_DEPTH * L + tail, MMA_DEPTH * lo_mmas * L + tail


def plan_mma(T: int, N: int, K: int, max_blocks: int | None = None,
             weights: str = "float32") -> dict:
    """The launch of ``linear_mma_rows16_*`` for 1 <= T <= 16 (linear_plan.plan_linear's
    "kernel" path on sm_80+): kernel, family, tiles (ceil(N / COLS)), grid, block, depths."""
    tiles = math.ceil(N / COLS)
    return {
        "path": "kernel", "family": "linear_mma", "kernel": KERNELS[weights], "TT": ROWS,
        "tiles": tiles, "block": (THREADS, 1, 1),
        "grid": (tiles if max_blocks is None else min(tiles, max_blocks), 1, 1),
        "depths": mma_depths(K, weights),
    }
