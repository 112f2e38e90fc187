"""CuPy twins of :mod:`dflash_ref.ops.gdn` (kernels in cuda/gdn.cu).

- :func:`gdn_recurrent`: one fused kernel over all T tokens; the state stays in registers, lanes
  along the contiguous value axis (decode and verify batches; the state after every token is
  written only with ``return_trace``).
- :func:`gdn_chunked`: prefill, in blocks of whole chunks (memory O(block), not O(T)), three
  launches per block (cuda/gdn_chunk.cu): the preparation (per (head, chunk): running gate sum,
  masked scores, (I + A)^-1 by a blocked inverse, W, U and the state pass's operands, from the
  raw inputs: :func:`plan_chunk_prep`), the sequential inter-chunk state pass (one block per
  (value head, 16 value columns), the state in registers, the next chunk's operands loaded by
  cp.async while the current one computes: on sm_80+ its two products on tensor cores in
  3xTF32 (cuda/gdn_chunk_tc.cu, :mod:`kernels_cupy.gdn_state_tc`), else on float32 CUDA cores
  (:func:`plan_state_pass`); :func:`plan_state` chooses), and the output, written into ``o``
  in place.
- :func:`causal_conv1d`: two grid-stride kernels (outputs, rolled state).
"""

from __future__ import annotations

import cupy as cp

from dflash_ref.ops.gdn import (
    CHUNKS_PER_BLOCK,
    _check_gdn_inputs,
    check_conv_args,
)
from kernels_cupy._build import get_kernel
from kernels_cupy._launch import f32, fp32, i32, launch_elementwise
from kernels_cupy.gdn_state_tc import plan_state_tc
from kernels_cupy.linear import has_tensor_cores

REC_COLS, REC_WARPS = 32, 8  # GDN_REC_COLS, GDN_REC_WARPS: block of gdn_recurrent_f32
MAX_K_RECURRENT = 256  # GDN_REC_WARPS x GDN_REC_MAX_ROWS (gdn.cu)
# gdn_chunk.cu's constants (tests/kernels/test_gdn_plan.py reads them back from the source):
MAX_C = 64  # GDN_MAX_C
MAX_K_CHUNK = 256  # GDN_MAX_K
PREP_THREADS = 128  # GDN_PREP_THREADS: block of gdn_chunk_prep_f32, one solve slot each
ST_VS, ST_TY = 16, 16  # GDN_ST_VS, GDN_ST_TY: block of gdn_chunk_state_f32
ST_MAX_RPT, ST_MAX_IPT = 16, 4  # GDN_ST_MAX_RPT, GDN_ST_MAX_IPT: K <= 256, C <= 64
OUT_VT, OUT_TX = 64, 16  # GDN_OUT_VT, GDN_OUT_TX: gdn_chunk_output_f32's tile and block
SHARED_DEFAULT = 48 * 1024  # dynamic shared memory a kernel gets without opting in
# Device bytes one block of gdn_chunked may use for its temporaries (chunks_per_block_for). At
# HV = 32, K = V = 128, C = 64 a chunk costs about 6.8 MB over all heads, so 512 MiB gives 64
# chunks (4096 tokens: 2048 (head, chunk) pairs per launch), HV = 16 gives 128; independent of
# T. The whole prompt at once was about 7 GB per layer at 32k tokens.
BLOCK_BYTES = 512 * 2**20


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
    grid = (HV, -(-V // REC_COLS))  # lanes along the contiguous V axis: coalesced state I/O
    get_kernel("gdn", "gdn_recurrent_f32")(
        grid, (REC_COLS, REC_WARPS),
        (q, k, v, g, beta, state, out_state, o, trace, i32(T), i32(H), i32(HV), i32(K), i32(V),
         i32(kda), i32(return_trace), fp32(scale)),
    )
    return (o, out_state, trace) if return_trace else (o, out_state)


def _round4(n: int) -> int:
    return -(-n // 4) * 4


def chunk_bytes_per_chunk(HV: int, K: int, V: int, C: int, kda: bool) -> int:
    """Device bytes of :func:`gdn_chunked`'s temporaries per chunk of C tokens (all heads).

    Counted from the block body below (float32): the preparation's outputs W [C, Kp],
    KdT [K, Cp], U [C, V], fold [C], dC [K], P [C, C], G [C, gk]; the state pass's S0s [K, V]
    and Delta [C, V]. The output is written into ``o`` (no temporary).
    """
    gk = K if kda else 1
    Kp, Cp = _round4(K), _round4(C)
    per_head = (C * Kp + K * Cp + C * V + C + K  # W, KdT, U, fold, dC
                + C * C + C * gk  # P, G
                + K * V + C * V)  # S0s, Delta
    return 4 * HV * per_head


def plan_chunk_prep(C: int, K: int, kda: bool, shared_limit: int) -> dict:
    """Launch of gdn_chunk_prep_f32: block and dynamic shared bytes (the grid is HV * N).

    Shared memory (floats), as the kernel lays it out: keys [C, K + 1], the gate's running sum
    [C, 1] (KDA [C, K + 1]), beta [C], A [C, C + 1], then max(queries [C, K + 1], one solve slot
    per thread [C, PREP_THREADS]). Pure: tested on CPU.
    """
    ldk, ldg = K + 1, (K + 1 if kda else 1)
    shared = 4 * (C * ldk + C * ldg + C + C * (C + 1) + max(C * ldk, C * PREP_THREADS))
    if shared > shared_limit:
        raise ValueError(f"gdn_chunked (cupy): the preparation kernel needs {shared} bytes of "
                         f"shared memory at K={K}, C={C}{', KDA' if kda else ''}; this device "
                         f"allows {shared_limit}: use a smaller chunk_size")
    return {"block": (PREP_THREADS,), "shared_mem": shared}


def plan_state_pass(HV: int, K: int, V: int, C: int, shared_limit: int) -> dict:
    """Launch of gdn_chunk_state_f32: grid, block, padded widths Kp / Cp, stages and shared bytes.

    Shared memory (floats), as the kernel lays it out: per stage W [C, Kp + 4], KdT [K, Cp + 4],
    U [C, ST_VS], fold [Cp], dC [round4(K)]; once, the transposed state tile [ST_VS, Kp + 4] and
    fold * Delta [ST_VS, Cp + 4]. Two stages (loads of chunk n + 1 overlap chunk n) when they fit
    in ``shared_limit`` bytes, else one. Pure: tested on CPU.
    """
    if K > ST_TY * ST_MAX_RPT or C > ST_TY * ST_MAX_IPT:
        raise ValueError(f"gdn_chunked (cupy): K={K} > {ST_TY * ST_MAX_RPT} or chunk_size C={C} "
                         f"> {ST_TY * ST_MAX_IPT} is beyond the state kernel")
    Kp, Cp = _round4(K), _round4(C)
    stage = C * (Kp + 4) + K * (Cp + 4) + C * ST_VS + Cp + _round4(K)
    fixed = ST_VS * ((Kp + 4) + (Cp + 4))
    nbuf = 2 if 4 * (2 * stage + fixed) <= shared_limit else 1
    shared = 4 * (nbuf * stage + fixed)
    if shared > shared_limit:
        raise ValueError(f"gdn_chunked (cupy): the state pass needs {shared} bytes of shared "
                         f"memory at K={K}, C={C}; this device allows {shared_limit}: use a "
                         f"smaller chunk_size")
    return {"grid": (HV, -(-V // ST_VS)), "block": (ST_VS, ST_TY), "Kp": Kp, "Cp": Cp,
            "nbuf": nbuf, "shared_mem": shared}


def plan_state(HV: int, K: int, V: int, C: int, shared_limit: int,
               tensor_cores: bool = False) -> dict:
    """The state pass's launch, family and kernel named: on sm_80+ (``tensor_cores``, while
    ``gdn_state_tc.STATE_TC`` is on, read at call time) the tensor-core kernel's plan
    (:func:`kernels_cupy.gdn_state_tc.plan_state_tc`) where it fits ``shared_limit``, else the
    float32 twin's (:func:`plan_state_pass`). Pure: tested on CPU."""
    from kernels_cupy import gdn_state_tc

    if tensor_cores and gdn_state_tc.STATE_TC:
        try:
            return plan_state_tc(HV, K, V, C, shared_limit)
        except ValueError:  # its tiles do not fit this device (K = 256, C = 64 on an sm_80)
            pass
    return {"family": "gdn_chunk", "kernel": "gdn_chunk_state_f32",
            **plan_state_pass(HV, K, V, C, shared_limit)}


def _shared_limit() -> int:
    """The device's opt-in maximum of dynamic shared memory per block (bytes)."""
    return int(cp.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"])


def plan_chunk_blocks(T: int, C: int, chunks_per_block: int) -> list[tuple[int, int]]:
    """Token ranges ``[(t0, t1), ...]`` of the blocks :func:`gdn_chunked` processes in order.

    Every block but the last holds exactly ``chunks_per_block`` whole chunks, so chunk
    boundaries fall where they would in one pass over T (only the last chunk is padded), and the
    blocks tile [0, T) without gaps or overlap. Pure: tested on CPU.
    """
    if C < 1 or chunks_per_block < 1:
        raise ValueError(f"plan_chunk_blocks: C={C} and chunks_per_block={chunks_per_block} "
                         f"must be >= 1")
    step = C * chunks_per_block
    return [(t0, min(T, t0 + step)) for t0 in range(0, T, step)]


def chunks_per_block_for(HV: int, K: int, V: int, C: int, kda: bool,
                         budget: int | None = None) -> int:
    """Chunks per block so that one block's temporaries fit in ``budget`` bytes
    (:data:`BLOCK_BYTES` when None).

    At least :data:`dflash_ref.ops.gdn.CHUNKS_PER_BLOCK` (the reference's block, 1024 tokens at
    C = 64) so the prep and output kernels keep enough (head, chunk) blocks to fill the GPU;
    beyond that as many as the budget allows, rounded down to a power of two.
    """
    budget = BLOCK_BYTES if budget is None else budget  # read at call time (tests lower it)
    fit = max(1, budget // chunk_bytes_per_chunk(HV, K, V, C, kda))
    n = CHUNKS_PER_BLOCK
    while 2 * n <= fit:
        n *= 2
    return n


def gdn_chunked(q, k, v, g, beta, state=None, scale=None, chunk_size: int = 64):
    """Twin of :func:`dflash_ref.ops.gdn.gdn_chunked` (chunk_size <= 64, K <= 256).

    Works in blocks of whole chunks (:func:`plan_chunk_blocks`), the state carried from block to
    block exactly as from chunk to chunk, so device memory beyond the inputs and the output is
    O(block), not O(T): at most max(:data:`BLOCK_BYTES`, one block of the reference's 16 chunks)
    (:func:`chunk_bytes_per_chunk`).

    The log-decay rule (g <= 0) is checked on the device, not the host (a check here read a flag
    back: a synchronisation per call, and no CUDA graph could hold it): a chunk with g > 0 makes
    its head's outputs from that chunk on, and its state, NaN, where the NumPy reference raises
    ValueError. The model's gates (``gdn_gates``: -exp(A_log) softplus(...)) are <= 0 by
    construction.
    """
    q, k, v, g, beta, state, (T, H, HV, K, V, kda) = _inputs(
        "gdn_chunked", q, k, v, g, beta, state)
    if not 1 <= chunk_size <= MAX_C:
        raise ValueError(
            f"gdn_chunked (cupy): chunk_size must be in [1, {MAX_C}], got {chunk_size}")
    if K > MAX_K_CHUNK:
        raise ValueError(f"gdn_chunked (cupy): head_k_dim K={K} > {MAX_K_CHUNK} unsupported")
    scale = float(K ** -0.5 if scale is None else scale)
    if T == 0:
        return cp.zeros((0, HV, V), cp.float32), state.copy()
    o = cp.empty((T, HV, V), cp.float32)
    S = state
    for t0, t1 in plan_chunk_blocks(T, chunk_size, chunks_per_block_for(HV, K, V, chunk_size,
                                                                         kda)):
        blk = slice(t0, t1)  # rows of C-contiguous arrays: contiguous views, written in place
        S = _chunked_block(q[blk], k[blk], v[blk], g[blk], beta[blk], S, o[blk], scale,
                           chunk_size, kda)
    return o, S


def _opt_in(kernel, shared: int) -> None:
    """Let ``kernel`` take ``shared`` bytes of dynamic shared memory (once per size)."""
    if shared > SHARED_DEFAULT and kernel.max_dynamic_shared_size_bytes < shared:
        kernel.max_dynamic_shared_size_bytes = shared


def _chunked_block(q, k, v, g, beta, state, o, scale: float, C: int, kda: bool):
    """:func:`gdn_chunked` on one block of tokens from ``state``: writes ``o`` [T, HV, V] in
    place (a contiguous row range of the caller's output) and returns the state after it.

    Three launches (cuda/gdn_chunk.cu; the state pass from cuda/gdn_chunk_tc.cu on sm_80+):
    prep -> state pass -> output. The temporaries are
    [HV, N, ...] with N chunks, the last zero-padded by the kernels' index maps.
    """
    T, H, K = q.shape
    HV, V = v.shape[1:]
    N = -(-T // C)
    gk = K if kda else 1
    limit = _shared_limit()
    prep = plan_chunk_prep(C, K, kda, limit)
    plan = plan_state(HV, K, V, C, limit, has_tensor_cores(cp.cuda.Device().id))
    Kp, Cp = plan["Kp"], plan["Cp"]

    W = cp.empty((HV, N, C, Kp), cp.float32)  # zero past K
    KdT = cp.empty((HV, N, K, Cp), cp.float32)  # zero past C
    U = cp.empty((HV, N, C, V), cp.float32)
    fold = cp.empty((HV, N, C), cp.float32)
    dC = cp.empty((HV, N, K), cp.float32)
    P = cp.empty((HV, N, C, C), cp.float32)
    G = cp.empty((HV, N, C, gk), cp.float32)
    kernel = get_kernel("gdn_chunk", "gdn_chunk_prep_f32")
    _opt_in(kernel, prep["shared_mem"])
    kernel((HV * N,), prep["block"],
           (q, k, v, g, beta, W, KdT, U, fold, dC, P, G, i32(T), i32(H), i32(HV), i32(N),
            i32(C), i32(K), i32(V), i32(gk), i32(Kp), i32(Cp), fp32(scale)),
           shared_mem=prep["shared_mem"])

    S0s = cp.empty((HV, N, K, V), cp.float32)
    Delta = cp.empty((HV, N, C, V), cp.float32)
    out_state = cp.empty((HV, K, V), cp.float32)
    kernel = get_kernel(plan["family"], plan["kernel"])  # 3xTF32 on sm_80+, else float32
    _opt_in(kernel, plan["shared_mem"])
    kernel(plan["grid"], plan["block"],
           (W, KdT, U, fold, dC, state, out_state, S0s, Delta, i32(N), i32(C), i32(K), i32(V),
            i32(Kp), i32(Cp), i32(plan["nbuf"])), shared_mem=plan["shared_mem"])

    get_kernel("gdn_chunk", "gdn_chunk_output_f32")(
        (HV * N, -(-V // OUT_VT)), (OUT_TX, OUT_TX),
        (q, G, P, S0s, Delta, o, i32(T), i32(H), i32(HV), i32(N), i32(C), i32(K), i32(V),
         i32(gk), fp32(scale)))
    return out_state


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

