"""Gated DeltaNet (GDN) token mixer: recurrent form, chunk-parallel form, and the short conv.

Notation and layout follow FLA (fla-org/flash-linear-attention
``fla/ops/gated_delta_rule/naive.py``; docs/gdn.md, "Shapes and the recurrence"), for one
sequence (no batch axis):

    q, k   [T, H, K]     H query/key heads, K = head_k_dim (L2-normalised by the caller)
    v      [T, HV, V]    HV value heads, V = head_v_dim; HV = r * H
    g      [T, HV]       log decay per token and value head (<= 0); or [T, HV, K] for KDA
    beta   [T, HV]       write strength in (0, 1)
    state  [HV, K, V]    one K x V matrix per value head: rows = key channel, cols = value channel
    o      [T, HV, V]

The per-token recurrence, in this exact order for every value head h:

    1. decay   S <- exp(g_t) * S                  (KDA: S <- Diag(exp(g_t)) S, rows scaled)
    2. read    r_t = S^T k_t                      (with the *decayed* state)
    3. delta   d_t = beta_t * (v_t - r_t)
    4. write   S <- S + k_t d_t^T                 (rank-1 update)
    5. output  o_t = scale * S^T q_t              (from the *updated* state; scale = K^-1/2)

GQA head mapping (docs/gdn.md, "GQA: the grouped vs tiled pitfall"): value head ``h`` reads
q/k head ``h // r`` ("grouped", as FLA, HF, vLLM and SGLang do). ggml uses ``h % H`` ("tiled"),
and llama.cpp's converter permutes every value-head-indexed tensor accordingly;
:func:`value_heads_tiled_to_grouped` undoes that permutation so that a tiled model can run
through these grouped ops.

Compute dtype: float64 inputs stay float64 (closed-form tests), everything else runs in float32;
the state is always kept in the compute dtype (float32 in the reference, as FLA and Qwen do).
"""

from __future__ import annotations

import numpy as np

from dflash_ref.ops._dtypes import in_compute_dtype
from dflash_ref.ops._gdn_chunk import chunk_view, intra_chunk_kda, intra_chunk_scalar
from dflash_ref.ops.norm import silu

GQA_MAPPINGS = ("grouped", "tiled")


# ------------------------------------------------------------------ shapes and head mapping


def _check_gdn_inputs(q, k, v, g, beta, state) -> tuple[int, int, int, int, int, bool]:
    """Validate the FLA shapes; return (T, H, HV, K, V, kda)."""
    if q.ndim != 3 or k.shape != q.shape:
        raise ValueError(f"gdn: q and k must both be [T, H, K]; got q {q.shape}, k {k.shape}")
    T, H, K = q.shape
    if v.ndim != 3 or v.shape[0] != T:
        raise ValueError(f"gdn: v must be [T={T}, HV, V]; got {v.shape}")
    HV, V = v.shape[1], v.shape[2]
    if H == 0 or HV % H != 0:
        raise ValueError(
            f"gdn: the number of value heads HV={HV} must be a multiple of the number of "
            f"q/k heads H={H} (GQA ratio r = HV / H)"
        )
    if g.shape == (T, HV):
        kda = False
    elif g.shape == (T, HV, K):
        kda = True
    else:
        raise ValueError(
            f"gdn: g must be [T, HV]=({T}, {HV}) (scalar gate) or [T, HV, K]=({T}, {HV}, {K}) "
            f"(per-key-channel KDA gate); got {g.shape}"
        )
    if beta.shape != (T, HV):
        raise ValueError(f"gdn: beta must be [T, HV]=({T}, {HV}); got {beta.shape}")
    if state is not None and state.shape != (HV, K, V):
        raise ValueError(f"gdn: state must be [HV, K, V]=({HV}, {K}, {V}); got {state.shape}")
    return T, H, HV, K, V, kda


def _check_log_decay(g, op: str) -> None:
    """g is a log decay: every entry must be <= 0 (the chunked form relies on it for range)."""
    if g.size and bool((g > 0).any()):
        raise ValueError(
            f"{op}: g must be <= 0 (a log decay, e.g. -exp(A_log) * softplus(a + dt_bias)); got "
            f"max {float(g.max())}. Positive gates grow the state and have no overflow-safe "
            f"chunked form"
        )


def qk_head_of_value_head(hv: int, num_k_heads: int, num_v_heads: int,
                          mapping: str = "grouped") -> int:
    """The q/k head that value head ``hv`` reads (docs/gdn.md, "GQA: the grouped vs tiled pitfall").

    - "grouped" (FLA, HF, vLLM, SGLang; what these ops implement): ``hv // r`` with
      ``r = num_v_heads // num_k_heads``: value heads 0..r-1 share q/k head 0.
    - "tiled" (ggml / llama.cpp GGUF): ``hv % num_k_heads``: value heads 0, H, 2H, ... share
      q/k head 0.
    The two agree only when r == 1.
    """
    if mapping not in GQA_MAPPINGS:
        raise ValueError(f"unknown GQA mapping {mapping!r}; expected one of {GQA_MAPPINGS}")
    if mapping == "grouped":
        return hv // (num_v_heads // num_k_heads)
    return hv % num_k_heads


def value_heads_tiled_to_grouped(x, num_k_heads: int, num_v_heads: int, axis: int = 0):
    """Permute a value-head-indexed axis from tiled order to grouped order (docs/gdn.md, GQA).

    A GGUF converted by llama.cpp stores HF value head ``h * r + j`` (grouped, ``[H, r, n]``) at
    position ``j * H + h`` (tiled, ``[r, H, n]``), because ggml's kernels pair value head ``i``
    with q/k head ``i % H``. This function maps tiled order back to grouped order, so tensors
    read from such a file can be fed to the grouped ops here (or to a HF-layout layer).

    ``axis`` has length ``HV * n`` where ``n`` is the per-head block: n = 1 for A_log, dt_bias,
    the rows of in_proj_a / in_proj_b, and for beta and g; n = head_v_dim for the V rows of
    in_proj_qkv and in_proj_z and the V channels of conv1d (apply it to the V part only);
    apply it along axis 1 (n = head_v_dim) for out_proj's V columns.

    Shapes: ``x`` [..., HV * n, ...] -> the same shape, blocks reordered. NumPy or CuPy.
    Example (H=2, r=2, n=1; a/b = q/k head, 0/1 = sub-head j): tiled [a0, b0, a1, b1] ->
    grouped [a0, a1, b0, b1].
    """
    return _permute_value_heads(x, num_k_heads, num_v_heads, axis, to_grouped=True)


def value_heads_grouped_to_tiled(x, num_k_heads: int, num_v_heads: int, axis: int = 0):
    """Inverse of :func:`value_heads_tiled_to_grouped`: grouped [H, r, n] -> tiled [r, H, n]."""
    return _permute_value_heads(x, num_k_heads, num_v_heads, axis, to_grouped=False)


def _permute_value_heads(x, H: int, HV: int, axis: int, to_grouped: bool):
    if H <= 0 or HV % H != 0:
        raise ValueError(f"num_v_heads={HV} must be a positive multiple of num_k_heads={H}")
    axis = axis % x.ndim
    total = x.shape[axis]
    if total % HV != 0:
        raise ValueError(f"axis {axis} has length {total}, not a multiple of num_v_heads={HV}")
    r, n = HV // H, total // HV
    lead, trail = x.shape[:axis], x.shape[axis + 1:]
    src = (r, H) if to_grouped else (H, r)
    y = x.reshape(*lead, *src, n, *trail)  # [.., src0, src1, n, ..]
    y = y.swapaxes(axis, axis + 1)  # [.., src1, src0, n, ..]
    return y.reshape(x.shape)


def _expand_qk(x: np.ndarray, r: int) -> np.ndarray:
    """[T, H, K] -> [T, HV, K] with the grouped mapping: value head h gets q/k head h // r."""
    return np.repeat(x, r, axis=1) if r > 1 else x


# ------------------------------------------------------------------ recurrent form


def gdn_recurrent(q, k, v, g, beta, state=None, scale=None, return_trace: bool = False):
    """Gated delta rule, one token at a time (docs/gdn.md, "Shapes and the recurrence").

    The ground truth.

    For every token t and value head h (q/k head ``h // r``), in this order::

        S <- exp(g_t) * S                    decay first (KDA: row i scaled by exp(g_t[i]))
        r = S^T k_t                          read with the decayed state          [V]
        d = beta_t * (v_t - r)               delta                               [V]
        S <- S + k_t d^T                     rank-1 write                        [K, V]
        o_t = scale * S^T q_t                output from the updated state       [V]

    Args:
        q, k: [T, H, K]; k should be L2-normalised (then every transition has eigenvalues in
            [0, 1] and the state stays bounded).
        v: [T, HV, V] with HV a multiple of H.
        g: [T, HV] scalar log-decay (GDN) or [T, HV, K] per-key-channel log-decay (KDA); <= 0.
        beta: [T, HV].
        state: [HV, K, V] initial state, or None for zeros. Not modified.
        scale: output scale; None means K ** -0.5.
        return_trace: also return the state after every token.
    Returns:
        ``(o, final_state)`` with o [T, HV, V] and final_state [HV, K, V]; with
        ``return_trace=True``, ``(o, final_state, trace)`` where trace [T, HV, K, V] and
        ``trace[t]`` is the state after tokens 0..t, bit-identical to the final state of a run
        on the first t + 1 tokens (the same operations in the same order).
    """
    q, k, v, g, beta, state = in_compute_dtype(q, k, v, g, beta, state)
    dt = q.dtype
    T, H, HV, K, V, kda = _check_gdn_inputs(q, k, v, g, beta, state)
    scale = dt.type(K ** -0.5 if scale is None else scale)
    r = HV // H
    qh, kh = _expand_qk(q, r), _expand_qk(k, r)  # [T, HV, K]
    decay = np.exp(g)  # [T, HV] or [T, HV, K]; every factor <= 1 for g <= 0

    S = np.zeros((HV, K, V), dt) if state is None else state.copy()  # [HV, K, V]
    o = np.empty((T, HV, V), dt)
    trace = np.empty((T, HV, K, V), dt) if return_trace else None
    for t in range(T):
        o[t] = recurrent_step(S, qh[t], kh[t], v[t], decay[t], beta[t], scale)
        if trace is not None:
            trace[t] = S
    return (o, S, trace) if return_trace else (o, S)


def recurrent_step(S, q_t, k_t, v_t, decay_t, beta_t, scale):
    """One token of the gated delta rule, all value heads at once; updates S in place.

    The five steps of :func:`gdn_recurrent`, in its order (decay, read, delta, write, output).
    Shared with :func:`dflash_ref.ops.gdn_tree.gdn_tree_recurrent`, so a tree node and a chain
    token go through the same operations.

    Args:
        S: [HV, K, V] the state before the token; holds the state after it on return.
        q_t, k_t: [HV, K], already mapped to value heads (grouped GQA).
        v_t: [HV, V]; decay_t: exp(g_t), [HV] (scalar gate) or [HV, K] (KDA); beta_t: [HV].
    Returns:
        o_t [HV, V] = scale * S^T q_t from the updated state.
    """
    S *= decay_t.reshape(decay_t.shape[0], -1, 1)  # [HV, 1 or K, 1]: KDA scales row i by g_t[i]
    read = (k_t[:, None, :] @ S)[:, 0, :]  # S^T k: [HV, 1, K] @ [HV, K, V] -> [HV, V]
    delta = beta_t[:, None] * (v_t - read)  # [HV, V]
    S += k_t[:, :, None] * delta[:, None, :]  # k d^T: [HV, K, 1] * [HV, 1, V]
    return scale * (q_t[:, None, :] @ S)[:, 0, :]  # [HV, V]


# ------------------------------------------------------------------ chunk-parallel form


# Tokens per block of the chunked form: the sequence is processed in blocks of this many chunks
# (1024 tokens at C = 64), carrying the state between blocks, so temporaries stay O(block) and
# cache-resident however long T is. Any value gives the same result up to rounding.
CHUNKS_PER_BLOCK = 16


def gdn_chunked(q, k, v, g, beta, state=None, scale=None, chunk_size: int = 64):
    """Gated delta rule, chunk-parallel (WY / UT transform). Same result as :func:`gdn_recurrent`
    up to rounding (docs/gdn.md, "The chunked form, and why it is exact"; FLA
    ``fla/ops/common/chunk_delta_h.py``).

    The sequence is cut into chunks of C = ``chunk_size`` tokens (the tail zero-padded: g = 0 is
    no decay and beta = 0 no write, so padding is exact). Inside a chunk, with the chunk-local
    inclusive cumulative gate ``G_i = g_1 + ... + g_i`` and the state S0 at the chunk start:

        Gamma_ij = exp(G_i - G_j) for i >= j, else 0               decay from token j to i
        A_ij     = beta_i (k_i . k_j) Gamma_ij for i > j, else 0   strictly lower
        T        = (I + A)^-1                                      unit lower triangular
        W = T (beta * exp(G) * K),   U = T (beta * V)              [C, K], [C, V]
        Delta    = U - W S0                                        the deltas d_t of the chunk
        O        = scale [ (Q * exp(G)) S0 + ((Q K^T) * Gamma) Delta ]
        S_C      = exp(G_C) S0 + (K * exp(G_C - G))^T Delta

    Why it is exact: stacking step 3 of the recurrence for the chunk's tokens gives
    ``(I + A) Delta = beta * V - (beta * exp(G) * K) S0``, a triangular system, whose solution is
    ``U - W S0``; outputs and the final state are then plain sums of the rank-1 writes.

    Range (docs/gdn.md, "The fp32-range rule"): G restarts at every chunk and only non-positive
    differences (G_i - G_j with i >= j, G_i, G_C - G_j) are exponentiated; the positive
    upper-triangle differences are sanitised *before* exp (clamped to 0) and zeroed after, so
    nothing overflows for any g <= 0. Never factor exp(G_i - G_j) as exp(G_i) * exp(-G_j): a chunk
    of g = -2 gives exp(128) = inf in float32. g must be <= 0 (a log decay); positive g raises
    ValueError.

    KDA (g [T, HV, K]): the decay no longer factors out of K K^T, so the per-channel decay
    tensor exp(G_ic - G_jc) [C, C, K] is built (masked, non-positive exponents only) one chunk at
    a time; no sub-chunking is needed for range.

    Cost layout, for NumPy speed (few, large BLAS calls; see docs/gdn.md): the sequence is
    processed in blocks of ``CHUNKS_PER_BLOCK`` chunks (the state carried between blocks, as
    between chunks). Within a block, everything that does not depend on S0 (A, T, W, U, the
    masked scores) is computed for all chunks at once with batched matmuls; W is stacked with
    Q e^G as [W; Q e^G] so that the first of the two sequential products per chunk,
    [W; Q e^G] S0, gives both W S0 (for Delta) and the inter-chunk output; the intra-chunk
    output is one batched product at the end.

    Args: as :func:`gdn_recurrent`; ``chunk_size`` >= 1 (64 as FLA; ggml uses 16 for KDA).
    Returns:
        ``(o, final_state)``: o [T, HV, V], final_state [HV, K, V].
    """
    if chunk_size < 1:
        raise ValueError(f"gdn_chunked: chunk_size must be >= 1, got {chunk_size}")
    q, k, v, g, beta, state = in_compute_dtype(q, k, v, g, beta, state)
    dt = q.dtype
    T, H, HV, K, V, kda = _check_gdn_inputs(q, k, v, g, beta, state)
    _check_log_decay(g, "gdn_chunked")
    scale = dt.type(K ** -0.5 if scale is None else scale)
    S = np.zeros((HV, K, V), dt) if state is None else state.copy()  # [HV, K, V]
    o = np.empty((T, HV, V), dt)
    step = chunk_size * CHUNKS_PER_BLOCK
    for t0 in range(0, T, step):
        blk = slice(t0, min(T, t0 + step))
        o[blk], S = _chunked_block(q[blk], k[blk], v[blk], g[blk], beta[blk], S, scale,
                                   chunk_size, kda)
    return o, S


def _chunked_block(q, k, v, g, beta, S, scale, C: int, kda: bool):
    """:func:`gdn_chunked` on one block of tokens, from state S; returns (o [T, HV, V], S)."""
    T, H, K = q.shape
    HV, V = v.shape[1:]
    N = -(-T // C)  # chunks in this block, the last one zero-padded
    r = HV // H

    # [T, HV, X] -> chunked views [N, HV, C, X] (strided: no copy unless padding or GQA expansion
    # is needed; BLAS takes the row stride as its leading dimension).
    Qc = chunk_view(_expand_qk(q, r), N, C)  # [N, HV, C, K]
    Kc = chunk_view(_expand_qk(k, r), N, C)  # [N, HV, C, K]
    Vc = chunk_view(v, N, C)  # [N, HV, C, V]
    bc = chunk_view(beta[:, :, None], N, C)  # [N, HV, C, 1]
    G = np.cumsum(chunk_view(g if kda else g[:, :, None], N, C), axis=2)
    # G: chunk-local inclusive cumulative gate, [N, HV, C, K or 1]

    if kda:
        parts = [intra_chunk_kda(Qc[n], Kc[n], Vc[n], bc[n], G[n], scale) for n in range(N)]
        WQ, U, P, KdT, dC = (np.stack(p) for p in zip(*parts))
    else:
        WQ, U, P, KdT, dC = intra_chunk_scalar(Qc, Kc, Vc, bc, G[..., 0], scale)
    # WQ = [W; scale Q e^G] [N,HV,2C,K]; U [N,HV,C,V]; P = scale Q K^T * Gamma [N,HV,C,C];
    # KdT = (K * exp(G_C - G))^T [N,HV,K,C]; dC = exp(G_C) [N,HV,1 or K,1].

    # Sequential state pass (FLA chunk_delta_h): the only loop over chunks.
    X = np.empty((N, HV, 2 * C, V), S.dtype)  # per chunk: [W S0 -> Delta; scale Q e^G S0]
    KdT_Delta = np.empty((HV, K, V), S.dtype)
    for n in range(N):
        np.matmul(WQ[n], S, out=X[n])  # [HV, 2C, K] @ [HV, K, V] -> [HV, 2C, V]
        Delta = X[n, :, :C]  # [HV, C, V]
        np.subtract(U[n], Delta, out=Delta)  # Delta = U - W S0: the chunk's deltas d_t
        np.matmul(KdT[n], Delta, out=KdT_Delta)  # [HV, K, C] @ [HV, C, V] -> [HV, K, V]
        S *= dC[n]  # S_C = exp(G_C) S0 + (K exp(G_C - G))^T Delta
        S += KdT_Delta

    # Outputs of all chunks (FLA chunk_o): O = scale Q e^G S0 (already in X) + P Delta.
    O = X[..., C:, :]  # [N, HV, C, V]
    O += P @ X[..., :C, :]  # [N, HV, C, C] @ [N, HV, C, V]
    o = O.transpose(0, 2, 1, 3).reshape(N * C, HV, V)[:T]  # [T, HV, V]
    return o, S


# ------------------------------------------------------------------ short convolution


def check_conv_args(x, weight, state, op: str = "causal_conv1d") -> tuple[int, int, int]:
    """Shapes of :func:`causal_conv1d` (both backends; ``op`` names the caller in errors): x
    [T, D], weight [D, W], state [D, W - 1] or None. Returns (T, D, W); a mismatch is a
    ValueError saying the expected shape."""
    if x.ndim != 2 or weight.ndim != 2 or weight.shape[0] != x.shape[1] or weight.shape[1] < 1:
        raise ValueError(
            f"{op}: x must be [T, D] and weight [D, W]; got x {x.shape}, weight "
            f"{weight.shape} (squeeze a [D, 1, W] checkpoint weight to [D, W])"
        )
    T, D = x.shape
    W = weight.shape[1]
    if state is not None and state.shape != (D, W - 1):
        raise ValueError(f"{op}: state must be [D, W-1]=({D}, {W - 1}); got {state.shape}")
    return T, D, W


def causal_conv1d(x, weight, state=None):
    """Causal depthwise conv1d followed by SiLU, with the rolled conv state (docs/gdn.md, "The
    layer"; huggingface/transformers ``src/transformers/models/qwen3_next/modeling_qwen3_next.py``).

    With W = kernel width (4 in Qwen) and the time axis extended by the state,
    ``xx = concat(state^T, x)`` [W - 1 + T, D]::

        y[t, c] = silu( sum_{j=0}^{W-1} weight[c, j] * xx[t + j, c] )
        new_state = xx[T : T + W - 1]^T          the last W - 1 raw (pre-conv) inputs

    so ``weight[c, W - 1]`` multiplies the current token and ``state[:, -1]`` is the most recent
    past input. A zero state is the start of a sequence (PyTorch's ``padding=W-1`` then
    truncation to the first T outputs).

    Args:
        x: [T, D] raw inputs (D = conv_dim = 2 * key_dim + value_dim in the GDN layer).
        weight: [D, W] (the checkpoint's conv1d.weight [D, 1, W] squeezed).
        state: [D, W - 1], oldest column first, or None for zeros.
    Returns:
        ``(y, new_state)``: y [T, D], new_state [D, W - 1].
    """
    x, weight, state = in_compute_dtype(x, weight, state)
    dt = x.dtype
    T, D, W = check_conv_args(x, weight, state)
    state = np.zeros((D, W - 1), dt) if state is None else state
    xx = np.concatenate([state.T, x], axis=0)  # [W - 1 + T, D]
    acc = np.zeros((T, D), dt)
    for j in range(W):
        acc += weight[:, j] * xx[j:j + T]  # tap j sees input t + j - (W - 1)
    new_state = np.ascontiguousarray(xx[T:].T)  # [D, W - 1]
    return silu(acc), new_state
