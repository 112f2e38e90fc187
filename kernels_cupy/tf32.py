"""3xTF32 on tensor cores, emulated in NumPy, and the error bound it is held to (pure: no CuPy).

The tensor-core projection (cuda/linear_mma.cu) multiplies float32 operands on TF32 tensor cores
with the split CUTLASS calls 3xTF32: every operand a is written as a = a_hi + a_lo with

    a_hi = tf32(a)            cvt.rna.tf32.f32: 10 stored mantissa bits, round to nearest,
                              ties away from zero (PTX ISA, "cvt", the .rna modifier)
    a_lo = tf32(a - a_hi)     a - a_hi is exact in float32 (it is a's low 13 mantissa bits)

and a product is taken as a_hi b_hi + a_hi b_lo + a_lo b_hi (a_lo b_lo is dropped). Each MMA
(mma.sync m16n8k8, TF32 in, float32 out) forms its eight products exactly (11 x 11 significant
bits fit float32's 24) and adds them to the accumulator in an order the PTX ISA leaves open; we
emulate it as float32 additions in any order (:func:`mma_m16n8k8`: sequential, reversed,
pairwise, or a random permutation).

The bound (per output element of a K-term dot product y = sum_k a_k b_k), derived
-------------------------------------------------------------------------------------
1. **Representation.** With u_t = 2^-11 (TF32's unit roundoff), |a_lo| <= u_t |a| and
   tf32(a_lo) = a_lo + e_a with |e_a| <= u_t |a_lo| <= u_t^2 |a|; |a_hi| <= (1 + u_t) |a|. So
   a b - (a_hi b_hi + a_hi tf32(b_lo) + tf32(a_lo) b_hi)
       = a_hi (b_lo - tf32(b_lo)) + (a_lo - tf32(a_lo)) b_hi + a_lo b_lo
   is at most ``R = (3 + 2 u_t) u_t^2`` times |a b| (:data:`REPRESENTATION`).
2. **Accumulation.** The 3K kept products are exact float32 numbers; summing them with
   additions each rounded to float32 (relative error <= u_a) along a tree in which no term passes
   through more than d additions is within ``gamma_d * sum |terms|``, gamma_d = d u_a / (1 - d u_a)
   (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 4.2, any order). One
   MMA adds 9 numbers (8 products and the accumulator), so a term passes through at most 8 of its
   additions, and through 8 more in each later MMA on the same accumulator. We take
   u_a = 2^-23 (one float32 ulp rather than half): the bound then also covers an accumulator
   that truncates instead of rounding to nearest, which studies of tensor cores report (Fasi,
   Higham, Mikaitis and Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021).
3. **Two classes of terms.** The kernel keeps the hi x hi products and the two cross products in
   separate accumulators (:mod:`kernels_cupy.linear_mma_plan`), with depths d_hi and d_lo; the
   cross products are at most ``2 u_t (1 + u_t)^2 |a b|``. Altogether:

       |y_computed - y| <= c sum_k |a_k b_k|,
       c = R + gamma(d_hi) (1 + u_t)^2 + gamma(d_lo) 2 u_t (1 + u_t)^2

   (:func:`bound_coefficient`). Inputs are finite with nonzero magnitudes in [2^-32, 2^32], so no
   lo part or product is subnormal (the kernels run with -ftz=true) and nothing overflows.

For comparison, one TF32 pass (a_hi b_hi only) has a representation error up to
``(2 u_t + u_t^2) |a b|``, about 9.8e-4 of sum |a b|, over 100x this bound (7.3e-6) at
K = 2560; the float32 CUDA-core kernel's bound is gamma_d with u = 2^-24 and d = 24 there
(:func:`kernels_cupy.linear_plan.summation_depth`), 1.43e-6: 5.1x smaller (tests/kernels/
test_tf32_bound.py checks both comparisons and that the emulation stays inside the bound).

bf16 weights (:func:`round_bf16`, round to nearest even, 8 significant bits) are exact TF32
numbers: their lo part is zero and the split needs only a_hi b + tf32(a_lo) b.
"""

from __future__ import annotations

import numpy as np

U_TF32 = 2.0**-11  # unit roundoff of TF32 (11 significant bits)
U_ACC = 2.0**-23  # one float32 ulp: covers round-to-nearest and truncating accumulation
U_BF16 = 2.0**-8  # unit roundoff of bf16 (8 significant bits, RNE): |round_bf16(w) - w| <= U |w|
REPRESENTATION = (3 + 2 * U_TF32) * U_TF32**2  # step 1 of the derivation: R
MMA_TERMS = 9  # eight products and the accumulator
MMA_DEPTH = MMA_TERMS - 1  # additions a term can pass through inside one MMA
ORDERS = ("sequential", "reversed", "pairwise", "random")


def round_tf32(a: np.ndarray) -> np.ndarray:
    """``cvt.rna.tf32.f32``: float32 -> the nearest TF32 (ties away from zero), as float32.

    On the bit pattern: add half of the 13 dropped bits' weight to the magnitude, then clear
    them (the carry may step the exponent, or reach infinity). NaN stays NaN."""
    a = np.asarray(a, np.float32)
    bits = a.view(np.uint32)
    rounded = ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isnan(a), a, rounded).astype(np.float32)


def split_tf32(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a_hi, a_lo): a_hi = tf32(a), a_lo = tf32(a - a_hi) (the subtraction is exact)."""
    a = np.asarray(a, np.float32)
    hi = round_tf32(a)
    return hi, round_tf32(a - hi)


def round_bf16(w: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bf16 (ties to even), as float32: what bf16 weight storage keeps.

    On the bit pattern: add 0x7FFF plus the lowest kept bit, then clear the low 16 bits. NaN
    stays NaN."""
    w = np.asarray(w, np.float32)
    bits = w.view(np.uint32)
    odd = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = ((bits + np.uint32(0x7FFF) + odd) & np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(w), w, rounded).astype(np.float32)


def sum_in_order(terms: np.ndarray, order: str, rng: np.random.Generator | None) -> np.ndarray:
    """Sum ``terms`` [n, ...] over axis 0 in float32, one rounding per addition, in ``order``."""
    n = terms.shape[0]
    if order == "pairwise":
        while terms.shape[0] > 1:
            m = terms.shape[0] // 2
            head = terms[:m] + terms[m:2 * m]  # [m, ...] float32
            terms = np.concatenate([head, terms[2 * m:]])
        return terms[0]
    idx = {"sequential": np.arange(n), "reversed": np.arange(n)[::-1]}.get(order)
    if idx is None:
        idx = (rng or np.random.default_rng(0)).permutation(n)
    s = terms[idx[0]]
    for i in idx[1:]:
        s = s + terms[i]  # float32 + float32: rounded once
    return s


def mma_m16n8k8(A: np.ndarray, B: np.ndarray, C: np.ndarray, order: str = "sequential",
                rng: np.random.Generator | None = None) -> np.ndarray:
    """D = A B + C as one TF32 MMA: A [..., 16, 8], B [..., 8, 8] TF32 values, C [..., 16, 8]
    float32 (leading axes broadcast: many tiles at once).

    The products A_rk B_kc are exact in float32 (checked; inf and NaN operands give IEEE
    products, 0 * inf = NaN); D_rc adds the nine numbers C_rc,
    A_r0 B_0c, ..., A_r7 B_7c in ``order`` ("sequential": C first, then k = 0..7; "reversed";
    "pairwise"; "random": a permutation drawn from ``rng``), each addition rounded to float32.
    """
    A, B, C = (np.asarray(m, np.float32) for m in (A, B, C))
    if not (np.array_equal(round_tf32(A), A, equal_nan=True)
            and np.array_equal(round_tf32(B), B, equal_nan=True)):
        raise ValueError("mma_m16n8k8: A and B must hold TF32 values (round_tf32 first)")
    prods = np.moveaxis(A[..., :, :, None] * B[..., None, :, :], -2, 0)  # [8, ..., 16, 8]: exact
    terms = np.concatenate([np.broadcast_to(C, prods.shape[1:])[None], prods])  # [9, ..., 16, 8]
    return sum_in_order(terms, order, rng)


def gamma(d: int, u: float = U_ACC) -> float:
    """gamma_d = d u / (1 - d u): the relative bound of d roundings (Higham, Lemma 3.1)."""
    if d * u >= 1:
        raise ValueError(f"gamma: d u = {d * u} >= 1, the bound is void")
    return d * u / (1 - d * u)


def bound_coefficient(depth_hi: int, depth_lo: int) -> float:
    """c such that |y_computed - y| <= c * sum_k |a_k b_k| (the module docstring's bound)."""
    grow = (1 + U_TF32) ** 2
    return REPRESENTATION + gamma(depth_hi) * grow + gamma(depth_lo) * 2 * U_TF32 * grow


def bf16_coefficient(depth_hi: int, depth_lo: int) -> float:
    """c for bf16 weights against the float32-weight product: rounding to bf16 (<= U_BF16 |w|)
    plus the 3xTF32 bound of the product with the rounded weights (which grow by 1 + U_BF16)."""
    return U_BF16 + bound_coefficient(depth_hi, depth_lo) * (1 + U_BF16)
