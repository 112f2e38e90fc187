"""CuPy twins of :mod:`dflash_ref.ops.gdn` (kernels in cuda/gdn.cu).

- :func:`gdn_recurrent`: one fused kernel over all T tokens; the state stays in registers
  (decode and verify batches; ``return_trace`` writes the state after every token).
- :func:`gdn_chunked`: prefill. cuBLAS batched GEMMs for the dense in-chunk products
  (Q K^T, K K^T and the outputs), and kernels for the masked decay scores, the triangular solve
  and the sequential inter-chunk state pass.
- :func:`causal_conv1d`: two grid-stride kernels (outputs, rolled state).
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from dflash_ref.ops.gdn import _check_gdn_inputs, _check_log_decay, check_conv_args
from kernels_cupy._build import get_kernel
from kernels_cupy._launch import f32, fp32, i32, i64, launch_elementwise

RECURRENT_WARPS = 4  # value columns per block of gdn_recurrent_f32 (one warp each)
MAX_K_RECURRENT = 256  # 32 lanes x GDN_MAX_ROWS_PER_LANE (gdn.cu)
MAX_C = 64  # GDN_MAX_C
MAX_K_CHUNK = 256  # GDN_MAX_K
STATE_COLS, STATE_ROWS = 32, 8  # GDN_STATE_COLS, GDN_STATE_ROWS
SOLVE_THREADS = 256


def _inputs(op, q, k, v, g, beta, state):
    q, k, v = f32(q, op, "q"), f32(k, op, "k"), f32(v, op, "v")
    g, beta = f32(g, op, "g"), f32(beta, op, "beta")
    state = None if state is None else f32(state, op, "state")
    T, H, HV, K, V, kda = _check_gdn_inputs(q, k, v, g, beta, state)
    if state is None:
        state = cp.zeros((HV, K, V), cp.float32)
    return q, k, v, g, beta, state, (T, H, HV, K, V, kda)


def gdn_recurrent(q, k, v, g, beta, state=None, scale=None, return_trace: bool = False):
    """Twin of :func:`dflash_ref.ops.gdn.gdn_recurrent` (same arguments and returns)."""
    q, k, v, g, beta, state, (T, H, HV, K, V, kda) = _inputs(
        "gdn_recurrent", q, k, v, g, beta, state)
    if K > MAX_K_RECURRENT:
        raise ValueError(f"gdn_recurrent (cupy): head_k_dim K={K} > {MAX_K_RECURRENT} unsupported")
    scale = K ** -0.5 if scale is None else scale
    o = cp.empty((T, HV, V), cp.float32)
    out_state = cp.empty((HV, K, V), cp.float32)
    trace = cp.empty((T, HV, K, V), cp.float32) if return_trace else cp.empty((1,), cp.float32)
    grid = (HV, -(-V // RECURRENT_WARPS))
    get_kernel("gdn", "gdn_recurrent_f32")(
        grid, (32, RECURRENT_WARPS),
        (q, k, v, g, beta, state, out_state, o, trace, i32(T), i32(H), i32(HV), i32(K), i32(V),
         i32(kda), i32(return_trace), fp32(scale)),
    )
    return (o, out_state, trace) if return_trace else (o, out_state)


def gdn_chunked(q, k, v, g, beta, state=None, scale=None, chunk_size: int = 64):
    """Twin of :func:`dflash_ref.ops.gdn.gdn_chunked` (chunk_size <= 64, K <= 256)."""
    q, k, v, g, beta, state, (T, H, HV, K, V, kda) = _inputs(
        "gdn_chunked", q, k, v, g, beta, state)
    if not 1 <= chunk_size <= MAX_C:
        raise ValueError(
            f"gdn_chunked (cupy): chunk_size must be in [1, {MAX_C}], got {chunk_size}")
    if K > MAX_K_CHUNK:
        raise ValueError(f"gdn_chunked (cupy): head_k_dim K={K} > {MAX_K_CHUNK} unsupported")
    _check_log_decay(g, "gdn_chunked (cupy)")
    scale = float(K ** -0.5 if scale is None else scale)
    if T == 0:
        return cp.zeros((0, HV, V), cp.float32), state.copy()
    C = chunk_size
    N = -(-T // C)
    B = HV * N  # number of (head, chunk) pairs
    r = HV // H

    # [T, HV, X] -> [HV, N, C, X], zero-padded (exact: g = beta = 0 on the padding).
    Qc = _chunks(cp.repeat(q, r, axis=1) if r > 1 else q, N, C)
    Kc = _chunks(cp.repeat(k, r, axis=1) if r > 1 else k, N, C)
    Vc = _chunks(v, N, C)
    bc = cp.ascontiguousarray(_chunks(beta[:, :, None], N, C)[..., 0])  # [HV, N, C]
    gk = K if kda else 1
    G = cp.cumsum(_chunks(g if kda else g[:, :, None], N, C), axis=2)  # [HV, N, C, gk]
    G = cp.ascontiguousarray(G)

    # Masked decay scores P (scaled, i >= j) and A (beta-scaled rows, i > j): [HV, N, C, C].
    P = cp.empty((HV, N, C, C), cp.float32)
    A = cp.empty((HV, N, C, C), cp.float32)
    total = B * C * C
    if kda:
        launch_elementwise("gdn", "gdn_chunk_scores_kda_f32", total,
                           (Qc, Kc, G, bc, P, A, i64(total), i32(C), i32(K), fp32(scale)))
    else:
        KT = Kc.swapaxes(-1, -2)
        QKt = cp.ascontiguousarray(cp.matmul(Qc, KT))  # cuBLAS batched, [HV, N, C, C]
        KKt = cp.ascontiguousarray(cp.matmul(Kc, KT))
        launch_elementwise("gdn", "gdn_chunk_scores_f32", total,
                           (QKt, KKt, G, bc, P, A, i64(total), i32(C), fp32(scale)))

    # [W | U] = (I + A)^-1 [beta e^G K | beta V]: one block per (head, chunk).
    W = cp.empty((HV, N, C, K), cp.float32)
    U = cp.empty((HV, N, C, V), cp.float32)
    get_kernel("gdn", "gdn_chunk_solve_f32")(
        (B,), (SOLVE_THREADS,), (A, Kc, Vc, G, bc, W, U, i32(C), i32(K), i32(V), i32(gk)))

    # Decays for the state pass: Kd = K e^(G_C - G) (non-positive exponents), dC = e^(G_C).
    GC = G[:, :, -1:, :]  # [HV, N, 1, gk]
    Kdec = cp.ascontiguousarray(Kc * cp.exp(GC - G))  # [HV, N, C, K]
    dC = cp.ascontiguousarray(cp.broadcast_to(cp.exp(GC[:, :, 0, :]), (HV, N, K)))

    S0s = cp.empty((HV, N, K, V), cp.float32)
    Delta = cp.empty((HV, N, C, V), cp.float32)
    out_state = cp.empty((HV, K, V), cp.float32)
    get_kernel("gdn", "gdn_chunk_state_f32")(
        (HV, -(-V // STATE_COLS)), (STATE_COLS, STATE_ROWS),
        (W, U, Kdec, dC, state, out_state, S0s, Delta, i32(N), i32(C), i32(K), i32(V)))

    # Outputs: scale (Q e^G) S0 + P Delta (cuBLAS batched).
    Qg = Qc * (np.float32(scale) * cp.exp(G))  # [HV, N, C, K]
    O = cp.matmul(Qg, S0s) + cp.matmul(P, Delta)  # [HV, N, C, V]
    o = O.reshape(HV, N * C, V)[:, :T].transpose(1, 0, 2)  # [T, HV, V]
    return cp.ascontiguousarray(o), out_state


def _chunks(x, N: int, C: int):
    """[T, HV, X] -> contiguous [HV, N, C, X], zero-padding time to N * C."""
    T, HV, X = x.shape
    out = cp.zeros((HV, N * C, X), cp.float32)
    out[:, :T] = x.transpose(1, 0, 2)
    return out.reshape(HV, N, C, X)


def causal_conv1d(x, weight, state=None):
    """Twin of :func:`dflash_ref.ops.gdn.causal_conv1d`: x [T, D], weight [D, W], state [D, W-1]."""
    x, w = f32(x, "causal_conv1d", "x"), f32(weight, "causal_conv1d", "weight")
    state = None if state is None else f32(state, "causal_conv1d", "state")
    T, D, W = check_conv_args(x, w, state)
    if state is None:
        state = cp.zeros((D, W - 1), cp.float32)
    y = cp.empty((T, D), cp.float32)
    new_state = cp.empty((D, W - 1), cp.float32)
    launch_elementwise("gdn", "causal_conv1d_f32", T * D, (x, w, state, y, i32(T), i32(D), i32(W)))
    launch_elementwise("gdn", "conv_state_update_f32", D * (W - 1),
                       (x, state, new_state, i32(T), i32(D), i32(W)))
    return y, new_state

