"""The chunked GDN's inter-chunk state pass on tensor cores in 3xTF32 (``gdn_chunk_state_tc_f32``
in cuda/gdn_chunk_tc.cu): layout, plan and the per-chunk error bound (pure: no CuPy).

The twin of ``gdn_chunk_state_f32`` (cuda/gdn_chunk.cu, float32 CUDA cores): same arguments,
same outputs, same order of chunks (fla's chunk_delta_h), per chunk n of a value head

    Delta_n = U_n - W_n S_n                      [C, V] = [C, V] - [C, K] [K, V]
    S_(n+1) = dC_n * S_n + KdT_n (fold_n * Delta_n)   dC per state row, fold per chunk row

with S_0 the state in and every S_n saved (S0s) for the output kernel. Both products are
``mma.sync.m16n8k8`` with TF32 operands split hi / lo (:mod:`kernels_cupy.tf32`; the split's
non-finite convention of tf32_mma.cuh, so a NaN from a rising gate still poisons its head).
Emulated lane by lane on CPU by tests/kernels/test_gdn_state_tc.py.

Layout. A block of :data:`WARPS` = 8 warps owns a value head and a slice of :data:`VS` = 16
value columns (two n-tiles of 8), grid (HV, ceil(V / 16)) as the twin's. Product 1 (Delta):
warp w takes chunk rows 16 (w >> 1) .. + 15 and n-tile w & 1, A = W (FRAGMENT_A of
:mod:`kernels_cupy.linear_mma_plan`), B = the state tile in shared memory (FRAGMENT_B: B[k][n] =
S[state row k][column n]). Product 2 (the state): warp w owns state rows 16 w .. and
16 (w + 8) .., both n-tiles, in registers in the C layout (FRAGMENT_C) across all chunks;
A = KdT, B = fold * Delta in shared memory. Padding (W rows past C and columns past K, KdT rows
past K and columns past C, round8 / round16) is zero in shared memory.

The bound, per chunk (u = 2^-24)
--------------------------------
Given the chunk-start state S^ the kernel carried (its S0s) and its Delta^:

    |Delta^_ic - (U_ic - sum_r W_ir S^_rc)| <= c_W sum_r |W_ir S^_rc| + u' |Delta^_ic|
    |S'^_rc - (dC_r S^_rc + sum_i KdT_ri FD_ic)| <= c_K sum_i |KdT_ri FD_ic| + u' |S'^_rc|

with FD = fl(fold_i Delta^_ic) (one float32 product, as the kernel forms it),
``c_W = bound_coefficient(*delta_depths(K))``, ``c_K = bound_coefficient(*state_depths(C))``
(kernels_cupy/tf32.py: the representation error of the split, then float32 accumulation in any
order; the depths count ceil(x / 8) MMAs of 8 products on each accumulator, two on lo per
k-step, and hi + lo), and u' = u (1 + u) for the final subtraction or ``fmaf`` (one rounding
each). :func:`chunk_bounds` evaluates both. The state is carried, so errors of earlier chunks
enter later ones through S^; the per-chunk bound is what the hardware's unspecified MMA order
allows at each step, and the chain is held against the float64 recurrence at the twins'
``float32_gdn`` tolerance. At K = 128 and C = 64: c_W = 1.61e-5, c_K = 8.5e-6 (tests check the
hand numbers); one TF32 pass has 9.8e-4 per product.

Selection: ``kernels_cupy.gdn.plan_state_pass(..., tensor_cores=True)`` on sm_80+ returns
:func:`plan_state_tc` (the projection's model: ``plan_linear(tensor_cores=...)``), the twin's
plan otherwise; :data:`STATE_TC` turns it off.
"""

from __future__ import annotations

import numpy as np

from kernels_cupy.tf32 import bound_coefficient

# Must match gdn_chunk_tc.cu (tests/kernels/test_gdn_state_tc.py checks the source).
VS = 16  # GTC_VS: value columns per block, two n-tiles of 8
WARPS = 8  # GTC_WARPS
THREADS = 32 * WARPS  # GTC_THREADS
MAX_C = 64  # GTC_MAX_C: four m-tiles of chunk rows (warps 2 dm, 2 dm + 1)
MAX_K = 256  # GTC_MAX_K: sixteen m-tiles of state rows (warps w, w + 8)
LDS = 24  # GTC_LDS: row stride of the state and fold * Delta tiles
KERNEL = "gdn_chunk_state_tc_f32"
FAMILY = "gdn_chunk_tc"
STATE_TC = True  # plan parameter, read at call time: the state pass on tensor cores on sm_80+
U_F32 = 2.0**-24


def _round(n: int, m: int) -> int:
    return -(-n // m) * m


def layout(C: int, K: int) -> dict:
    """gdn_chunk_tc.cu's GtcLayout (floats): padded sizes, row strides, one stage's size."""
    Kp8, C8, C16, K16 = _round(K, 8), _round(C, 8), _round(C, 16), _round(K, 16)
    ldw, ldk = _round(Kp8, 32) + 4, _round(C8, 32) + 4
    stage = C16 * ldw + K16 * ldk + C * VS + C8 + K16
    return {"Kp8": Kp8, "C8": C8, "C16": C16, "K16": K16, "ldw": ldw, "ldk": ldk,
            "stage": stage, "fixed": (K16 + C8) * LDS}


def plan_state_tc(HV: int, K: int, V: int, C: int, shared_limit: int) -> dict:
    """Launch of ``gdn_chunk_state_tc_f32``: family, kernel, grid (HV, ceil(V / 16)), block
    (THREADS, 1, 1), nbuf (two stages when they fit ``shared_limit`` bytes) and shared_mem.

    Raises:
        ValueError: K or C beyond the kernel, or one stage over ``shared_limit``.
    """
    if not (1 <= K <= MAX_K and 1 <= C <= MAX_C):
        raise ValueError(f"gdn_chunked (cupy): K={K} > {MAX_K} or chunk_size C={C} > {MAX_C} "
                         f"is beyond the tensor-core state kernel")
    lay = layout(C, K)
    nbuf = 2 if 4 * (2 * lay["stage"] + lay["fixed"]) <= shared_limit else 1
    shared = 4 * (nbuf * lay["stage"] + lay["fixed"])
    if shared > shared_limit:
        raise ValueError(f"gdn_chunked (cupy): the tensor-core state pass needs {shared} bytes "
                         f"of shared memory at K={K}, C={C}; this device allows {shared_limit}: "
                         f"use a smaller chunk_size")
    return {"family": FAMILY, "kernel": KERNEL, "grid": (HV, -(-V // VS)),
            "block": (THREADS, 1, 1), "Kp": _round(K, 4), "Cp": _round(C, 4), "nbuf": nbuf,
            "shared_mem": shared}


def delta_depths(K: int) -> tuple[int, int]:
    """(d_hi, d_lo) of a Delta product W_ir S_rc: ceil(K / 8) MMAs, then hi + lo."""
    ks = -(-K // 8)
    return 8 * ks + 1, 16 * ks + 1


def state_depths(C: int) -> tuple[int, int]:
    """(d_hi, d_lo) of a state product KdT_ri FD_ic: ceil(C / 8) MMAs, then hi + lo."""
    ks = -(-C // 8)
    return 8 * ks + 1, 16 * ks + 1


def chunk_bounds(W, KdT, U, fold, dC, S0, Delta, S1):
    """The module docstring's bounds for one chunk of one value head, float64.

    W [C, >= K], KdT [K, >= C], U [C, V], fold [C], dC [K]: the chunk's operands (padding
    ignored); S0 [K, V] the chunk-start state and Delta [C, V] the kernel's output; S1 [K, V]
    the kernel's next state. Returns (Delta error, Delta bound, S1 error, S1 bound), each
    [C, V] or [K, V], the errors against the float64 evaluation of the same inputs."""
    K, V = S0.shape
    C = U.shape[0]
    W, KdT = np.asarray(W, np.float64)[:, :K], np.asarray(KdT, np.float64)[:, :C]
    S0, Delta, S1 = (np.asarray(a, np.float64) for a in (S0, Delta, S1))
    u1 = U_F32 * (1 + U_F32)
    d_err = np.abs(Delta - (np.asarray(U, np.float64) - W @ S0))
    d_bound = bound_coefficient(*delta_depths(K)) * (np.abs(W) @ np.abs(S0)) + u1 * np.abs(Delta)
    FD = (np.asarray(fold, np.float32)[:, None] * Delta.astype(np.float32)).astype(np.float64)
    s_err = np.abs(S1 - (np.asarray(dC, np.float64)[:, None] * S0 + KdT @ FD))
    s_bound = bound_coefficient(*state_depths(C)) * (np.abs(KdT) @ np.abs(FD)) + u1 * np.abs(S1)
    return d_err, d_bound, s_err, s_bound
