"""The chunked GDN prep kernel's blocked inverse (cuda/gdn_chunk.cu, ``gdn_prep_invert``), on CPU.

The prep kernel forms [W | U] = (I + A)^-1 R for each chunk (A [C, C] strictly lower, R the
[beta e^G K | beta V] columns). It used to solve by forward substitution down each column (C - 1
dependent steps of up to C - 1 fmaf each, about 2000 per column at C = 64); it now inverts
L = I + A by blocks (:func:`blocked_inverse`, the kernel's order: the 16 x 16 diagonal blocks by
forward substitution, then block rows in order) and multiplies, four rows at a time
(:func:`apply_inverse`). Both are emulated here with exact fmaf (``fma32``) and compared with the
float64 closed form ``numpy.linalg.solve(I + A, R)`` (an independent evaluation).

The stated tolerance, per element, first order in u = 2^-24, with T = L^-1 (float64):

    |x_computed - x| <= 3 C u (|T| |L| |T| + |T|) |R|

Derivation: forward substitution is componentwise backward stable, (L + dL) x = r with
|dL| <= gamma_C |L| (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., Thm 8.5),
so its forward error is at most C u |T| |L| |T| |r|; the blocked inverse's error is of the same
form, |T_computed - T| <= 2 C u |T| |L| |T| (each entry passes through one diagonal block's
substitution, one block-row sum of at most C terms and one product with a diagonal block: the
block methods of Higham, chapter 14), and the product T r adds gamma_C |T| |r|. The serial
solve meets the same bound, so the two agree within twice it. Checked on GDN-like matrices and
on L = I + (strictly lower ones), whose inverse grows like 2^(i - j).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.test_linear_plan import fma32

B = 16  # GDN_INV_B
U = 2.0**-24
f = np.float32


def blocked_inverse(A: np.ndarray, bsize: int = B, skip_diagonal_term: bool = False) -> np.ndarray:
    """gdn_prep_invert on one strictly lower A [C, C] float32: (I + A)^-1, in the kernel's order.

    ``skip_diagonal_term``: a test's bug (the block-row sum starting one block late)."""
    C = A.shape[0]
    X = A.astype(f).copy()  # sA, overwritten in place
    nb = -(-C // bsize)
    for b in range(nb):  # 1. diagonal blocks, all columns at once
        o = b * bsize
        bs = min(bsize, C - o)
        D = np.eye(bs, dtype=f)
        for i in range(bs):
            x = (np.arange(bs) == i).astype(f)  # [col]
            for j in range(i):  # j >= col where it matters: D[j, col] = 0 for j < col
                x = np.where(np.arange(bs) <= j, fma32(-A[o + i, o + j], D[j], x), x)
            D[i] = x
        X[o:o + bs, o:o + bs] = D
    for bi in range(1, nb):  # 2. block rows in order
        oi, bsi = bi * bsize, min(bsize, C - bi * bsize)
        Y = []
        for bj in range(bi):
            oj = bj * bsize
            y = np.zeros((bsi, bsize), f)
            for m in range(oj + (bsize if skip_diagonal_term else 0), oi):
                y = fma32(X[oi:oi + bsi, m][:, None], X[m, oj:oj + bsize][None, :], y)
            Y.append(y)
        for bj in range(bi):
            x = np.zeros((bsi, bsize), f)
            for m in range(bsi):
                x = np.where(np.arange(bsi)[:, None] >= m,
                             fma32(-X[oi:oi + bsi, oi + m][:, None], Y[bj][m][None, :], x), x)
            X[oi:oi + bsi, bj * bsize:(bj + 1) * bsize] = x
    return X


def apply_inverse(Tinv: np.ndarray, R: np.ndarray) -> np.ndarray:
    """x_i = sum_(j <= i) Tinv_ij r_j, one fmaf chain per row in j order (rows in fours)."""
    C = Tinv.shape[0]
    X = np.zeros(R.shape, f)
    for i in range(C):
        acc = np.zeros(R.shape[1:], f)
        for j in range(i + 1):
            acc = fma32(Tinv[i, j], R[j], acc)
        X[i] = acc
    return X


def serial_solve(A: np.ndarray, R: np.ndarray) -> np.ndarray:
    """The previous kernel: row i = r_i - sum_(j < i) A_ij row_j, fmaf in j order."""
    X = R.astype(f).copy()
    for i in range(A.shape[0]):
        for j in range(i):
            X[i] = fma32(-A[i, j], X[j], X[i])
    return X


def tolerance(A: np.ndarray, R: np.ndarray) -> np.ndarray:
    """3 C u (|T| |L| |T| + |T|) |R| (the module docstring's bound), in float64."""
    C = A.shape[0]
    L = np.eye(C) + A.astype(np.float64)
    T = np.abs(np.linalg.inv(L))
    return 3 * C * U * ((T @ np.abs(L) @ T + T) @ np.abs(R.astype(np.float64)))


def gdn_like(C: int, rng, ill: bool = False):
    """A = beta_i (k_i . k_j) exp(G_i - G_j) (i > j) from unit keys, and R [C, 24]; ``ill``:
    A = strictly lower ones (T_ij = (-1)^(i-j) 2^(i-j-1): |T| |L| |T| grows like 4^C)."""
    if ill:
        A = np.tril(np.ones((C, C)), -1).astype(f)
    else:
        k = rng.standard_normal((C, 32))
        k /= np.linalg.norm(k, axis=1, keepdims=True)
        G = np.cumsum(-rng.uniform(0, 0.3, C))
        beta = rng.uniform(0.2, 1.0, C)
        A = np.tril(beta[:, None] * (k @ k.T) * np.exp(G[:, None] - G[None, :]), -1).astype(f)
    return A, rng.standard_normal((C, 24)).astype(f)


SIZES = [64, 63, 48, 33, 17, 16, 10, 1]  # whole blocks, a partial last block, one partial block


@pytest.mark.parametrize("ill", [False, True], ids=["gdn", "ill"])
@pytest.mark.parametrize("C", SIZES)
def test_blocked_and_serial_solves_within_the_stated_tolerance(C, ill):
    A, R = gdn_like(C, np.random.default_rng(C), ill)
    exact = np.linalg.solve(np.eye(C) + A.astype(np.float64), R.astype(np.float64))
    tol = tolerance(A, R)
    blocked = apply_inverse(blocked_inverse(A), R)
    serial = serial_solve(A, R)
    for name, x in (("blocked", blocked), ("serial", serial)):
        err = np.abs(x - exact)
        assert (err <= tol).all(), f"{name} C={C}: worst {np.max(err / tol):.3g} of the tolerance"
    assert (np.abs(blocked.astype(np.float64) - serial) <= 2 * tol).all()


@pytest.mark.parametrize("C", [64, 33, 10])
def test_the_blocked_inverse_is_unit_lower_and_inverts(C):
    A, _ = gdn_like(C, np.random.default_rng(1))
    T = blocked_inverse(A)
    assert (np.triu(T, 1) == 0).all() and (np.diag(T) == 1).all()
    exact = np.linalg.inv(np.eye(C) + A.astype(np.float64))
    L = np.eye(C) + A.astype(np.float64)
    assert (np.abs(T - exact) <= 2 * C * U * (np.abs(exact) @ np.abs(L) @ np.abs(exact))).all()


def test_a_block_row_sum_missing_its_first_block_is_caught():
    # The Y sum starting at oj + B instead of oj (the diagonal block's Tinv_(bj, bj) left out).
    A, R = gdn_like(64, np.random.default_rng(2))
    exact = np.linalg.solve(np.eye(64) + A.astype(np.float64), R.astype(np.float64))
    x = apply_inverse(blocked_inverse(A, skip_diagonal_term=True), R)
    assert (np.abs(x - exact) > tolerance(A, R)).any()
