"""Intra-chunk algebra of :func:`dflash_ref.ops.gdn.gdn_chunked`: what does not depend on the state.

Private to ``ops/gdn.py`` (not an op family; the op table takes ``gdn_chunked`` from ops/gdn.py,
which keeps the sequential state pass). Here, for all chunks of a block at once: the chunked
views, the masked decays ``exp(G_i - G_j)``, the UT transform ``T = (I + A)^-1`` and the
``W``, ``U``, scores and end-of-chunk factors. The equations, why they are exact and the
fp32-range rule are in :func:`~dflash_ref.ops.gdn.gdn_chunked` and docs/gdn.md ("The chunked
form, and why it is exact", "The fp32-range rule"). Public sources: fla-org/flash-linear-attention
``fla/ops/common/chunk_delta_h.py``; huggingface/transformers
``src/transformers/models/qwen3_next/modeling_qwen3_next.py`` (``torch_chunk_gated_delta_rule``).
"""

from __future__ import annotations

import numpy as np


def chunk_view(x: np.ndarray, N: int, C: int) -> np.ndarray:
    """[T, HV, X] -> [N, HV, C, X] view, zero-padding the time axis to N * C (a copy) if needed."""
    T, HV, X = x.shape
    if T < N * C:
        x = np.concatenate([x, np.zeros((N * C - T, HV, X), x.dtype)])  # g = beta = 0: exact
    return x.reshape(N, C, HV, X).transpose(0, 2, 1, 3)


def masked_exp(diff: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """exp(diff) where ``mask`` else exactly 0, sanitised *before* exp.

    ``diff`` holds G_i - G_j: <= 0 inside the mask (i >= j; G is a running sum of g <= 0, and
    adding a non-positive float never increases a float), positive outside it. Clamping the
    exponents to <= 0 first changes only the masked-out entries, so exp never overflows and no
    inf appears (hence no inf * 0 = NaN); the mask then zeroes them. Overwrites ``diff``.
    """
    np.minimum(diff, 0, out=diff)
    np.exp(diff, out=diff)
    diff *= mask
    return diff


def intra_chunk_scalar(Qc, Kc, Vc, bc, G, scale):
    """Per-chunk quantities that do not depend on the chunk-start state, scalar gate.

    Shapes (leading dims [N, HV]): Qc, Kc [.., C, K]; Vc [.., C, V]; bc [.., C, 1]; G [.., C].
    Returns
        WQ  = [W; scale * Q * exp(G)]            [.., 2C, K]
        U                                         [.., C, V]
        P   = scale * (Q K^T * Gamma)             [.., C, C]  (diagonal included)
        KdT = (K * exp(G_C - G))^T                [.., K, C]
        dC  = exp(G_C)                            [.., 1, 1]
    """
    C = G.shape[-1]
    eG = np.exp(G)[..., None]  # [.., C, 1]; G <= 0 so every factor is <= 1
    incl = np.tril(np.ones((C, C), dtype=bool))  # i >= j
    G = np.ascontiguousarray(G)
    Gamma = masked_exp(G[..., :, None] - G[..., None, :], incl)  # exp(G_i - G_j), [.., C, C]
    KT = Kc.swapaxes(-1, -2)  # [.., K, C]
    P = Qc @ KT  # [.., C, C]
    P *= Gamma
    P *= scale
    A = Kc @ KT  # [.., C, C]
    A *= Gamma
    A *= bc  # beta_i scales row i
    A[..., np.arange(C), np.arange(C)] = 0  # strictly lower (Gamma is already 0 above)
    # W = T (beta e^G K) = (T * beta_j) (e^G K) and U = (T * beta_j) V: beta moves to T's columns.
    Tb = invert_unit_lower(A) * bc.swapaxes(-1, -2)  # [.., C, C]
    WQ = np.empty(Qc.shape[:-2] + (2 * C, Qc.shape[-1]), Qc.dtype)  # [W; scale Q e^G]
    np.matmul(Tb, Kc * eG, out=WQ[..., :C, :])  # W [.., C, K]
    np.multiply(Qc, scale * eG, out=WQ[..., C:, :])
    U = Tb @ Vc  # [.., C, V]
    GC = G[..., -1:]  # [.., 1]
    KdT = (Kc * np.exp(GC - G)[..., None]).swapaxes(-1, -2)  # G_C - G_j <= 0; [.., K, C]
    dC = np.exp(GC)[..., None]  # [.., 1, 1]
    return WQ, U, P, KdT, dC


def intra_chunk_kda(Qc, Kc, Vc, bc, G, scale):
    """As :func:`intra_chunk_scalar` for a per-key-channel gate G [HV, C, K] (one chunk).

    A_ij = beta_i sum_c k_ic k_jc exp(G_ic - G_jc) and P_ij = sum_c q_ic k_jc exp(G_ic - G_jc),
    with the [C, C, K] decay tensor masked before exp (only non-positive exponents). Returns
    dC = exp(G_C) as [HV, K, 1] (it scales the state's rows).
    """
    C = G.shape[-2]
    incl = np.tril(np.ones((C, C), dtype=bool))[:, :, None]  # [C, C, 1]
    E = masked_exp(G[..., :, None, :] - G[..., None, :, :], incl)  # [HV, C(i), C(j), K]
    KE = Kc[..., None, :, :] * E  # k_jc exp(G_ic - G_jc): [HV, C(i), C(j), K]
    A = bc * np.einsum("...ic,...ijc->...ij", Kc, KE)  # [HV, C, C]
    A[..., np.arange(C), np.arange(C)] = 0  # strictly lower (E is already 0 above)
    P = scale * np.einsum("...ic,...ijc->...ij", Qc, KE)  # [HV, C, C], diagonal included
    eG = np.exp(G)  # [HV, C, K]
    Tinv = invert_unit_lower(A)
    WQ = np.concatenate([Tinv @ (bc * eG * Kc), scale * Qc * eG], axis=-2)  # [HV, 2C, K]
    U = Tinv @ (bc * Vc)
    GC = G[..., -1:, :]  # [HV, 1, K]
    KdT = (Kc * np.exp(GC - G)).swapaxes(-1, -2)  # [HV, K, C]
    dC = np.exp(GC).swapaxes(-1, -2)  # [HV, K, 1]
    return WQ, U, P, KdT, dC


def invert_unit_lower(A, base: int = 8):
    """``(I + A)^-1`` for a batch of strictly lower-triangular ``A`` [.., C, C]. No pivoting.

    Blocked, as FLA's fused C=64 kernel does (docs/gdn.md, "The chunked form, and why it is exact"):

    1. the C / base diagonal blocks (base x base) are inverted together by forward substitution
       (row i of X is e_i - sum_{j<i} A_ij X_j);
    2. neighbouring blocks are merged pairwise, doubling the size each round, with
       ``[[X11, 0], [A21, X22]]^-1 = [[X11, 0], [-X22 A21 X11, X22]]`` (two batched matmuls).

    When C / base is not a power of two (odd chunk sizes) the whole matrix is forward-substituted.
    The result is unit lower triangular. (LAPACK's batched solve would also do, but it loops over
    tiny matrices with a large per-call cost.)
    """
    C = A.shape[-1]
    m = C // base  # number of diagonal blocks
    if C <= base or C % base or m & (m - 1):
        return forward_substitution_inverse(A)
    blocks = [slice(i * base, (i + 1) * base) for i in range(m)]
    X = forward_substitution_inverse(np.stack([A[..., b, b] for b in blocks], axis=-3))
    s = base  # X [.., m, s, s]: inverses of the diagonal blocks of size s
    while m > 1:
        m //= 2
        A21 = np.stack([A[..., (2 * p + 1) * s:(2 * p + 2) * s, 2 * p * s:(2 * p + 1) * s]
                        for p in range(m)], axis=-3)  # [.., m, s, s]
        X11, X22 = X[..., 0::2, :, :], X[..., 1::2, :, :]
        Y = np.zeros(A.shape[:-2] + (m, 2 * s, 2 * s), A.dtype)
        Y[..., :s, :s] = X11
        Y[..., s:, s:] = X22
        Y[..., s:, :s] = -(X22 @ (A21 @ X11))
        X, s = Y, 2 * s
    return X[..., 0, :, :]


def forward_substitution_inverse(A):
    """(I + A)^-1 for strictly lower A [.., c, c], row by row, vectorised over the batch."""
    c = A.shape[-1]
    X = np.zeros_like(A)
    X[..., np.arange(c), np.arange(c)] = 1
    for i in range(1, c):
        X[..., i, :i] -= np.einsum("...j,...jk->...k", A[..., i, :i], X[..., :i, :i])
    return X
