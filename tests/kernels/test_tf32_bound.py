"""The 3xTF32 split and its error bound (kernels_cupy/tf32.py), checked on CPU.

Independent sources: hand cases and an exact rational rounding for TF32 (cvt.rna: nearest, ties
away); gguf-py's BF16 quantizer (ggml's fp32 -> bf16) for bf16 storage; float64 products and
``Fraction`` sums for the MMA. The bound's non-vacuity: one TF32 pass, or a split that drops a
cross product, lands outside it on adversarial inputs, and it stays within a small factor of
the float32 CUDA-core kernel's own bound.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given

from kernels_cupy.linear_mma_plan import mma_depths, steps_per_accumulator
from kernels_cupy.linear_plan import summation_depth
from kernels_cupy.tf32 import (
    ORDERS,
    REPRESENTATION,
    U_TF32,
    bound_coefficient,
    gamma,
    mma_m16n8k8,
    round_bf16,
    round_tf32,
    split_tf32,
    sum_in_order,
)
from tests.strategies import f32_arrays


def _rna_exact(v: float, bits: int = 11) -> float:
    """v rounded to ``bits`` significant bits, ties away from zero, by exact rationals."""
    if v == 0 or not math.isfinite(v):
        return v
    m, e = math.frexp(abs(v))  # abs(v) = m 2^e, m in [0.5, 1)
    scaled = Fraction(m) * 2**bits  # the kept bits are the integer part
    q = math.floor(scaled + Fraction(1, 2))  # half rounds up: away from zero on |v|
    return math.copysign(float(Fraction(q, 2**bits) * Fraction(2) ** e), v)


def test_round_tf32_hand_cases():
    # 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties away gives 1 + 2^-10 (ties to even
    # would give 1); one ulp below halfway rounds down; the largest float32 rounds to infinity.
    a = np.array([1 + 2.0**-11, -(1 + 2.0**-11), 1 + 2.0**-11 - 2.0**-23, 1 + 2.0**-10,
                  np.finfo(np.float32).max, np.inf, -np.inf, 0.0, 2.0 - 2.0**-23], np.float32)
    want = [1 + 2.0**-10, -(1 + 2.0**-10), 1.0, 1 + 2.0**-10, np.inf, np.inf, -np.inf, 0.0, 2.0]
    np.testing.assert_array_equal(round_tf32(a), np.array(want, np.float32))
    assert np.isnan(round_tf32(np.array([np.nan], np.float32)))[0]


@given(f32_arrays((64,), -2.0**100, 2.0**100))
def test_round_tf32_equals_exact_rounding(a):
    # Catches a carry into the wrong bit (0x800 or 0x2000 instead of 0x1000) or ties to even.
    np.testing.assert_array_equal(round_tf32(a), np.array([_rna_exact(float(v)) for v in a],
                                                          np.float32))


@given(f32_arrays((64,), -2.0**32, 2.0**32, min_abs=2.0**-32))
def test_split_is_within_the_representation_steps(a):
    # |a - hi| <= u_t |a| and |a - hi - lo| <= u_t^2 |a| (the derivation's step 1); hi and lo
    # are TF32 values. A split that forgot to round lo breaks the TF32 check.
    hi, lo = split_tf32(a)
    a64 = a.astype(np.float64)
    assert (np.abs(a64 - hi) <= U_TF32 * np.abs(a64)).all()
    assert (np.abs(a64 - hi - lo) <= U_TF32**2 * np.abs(a64)).all()
    np.testing.assert_array_equal(round_tf32(lo), lo)
    np.testing.assert_array_equal(round_tf32(hi), hi)


def test_round_bf16_equals_ggml():
    # gguf-py's BF16 quantizer is ggml's fp32 -> bf16 (round to nearest even): the storage the
    # bf16 weights use. Hand ties: 1 + 2^-8 -> 1 (even), 1 + 3 2^-8 -> 1 + 2^-6 (even).
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    rng = np.random.default_rng(3)
    w = np.concatenate([rng.standard_normal(4096) * 10.0 ** rng.integers(-30, 30, 4096),
                        [1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 65504.0, 0.0]]
                       ).astype(np.float32)
    ggml = (quantize(w, GGMLQuantizationType.BF16).view(np.uint16).astype(np.uint32)
            << np.uint32(16)).view(np.float32)
    np.testing.assert_array_equal(round_bf16(w), ggml)
    assert round_bf16(np.float32(1 + 2.0**-8)) == 1.0
    assert round_bf16(np.float32(1 + 3 * 2.0**-8)) == np.float32(1 + 2.0**-6)
    np.testing.assert_array_equal(round_tf32(ggml), ggml)  # bf16 values are TF32 values


# ---------------------------------------------------------------- one MMA


def _tf32_operands(rng, shape, scale=1.0):
    return round_tf32((rng.standard_normal(shape) * scale).astype(np.float32))


@pytest.mark.parametrize("order", ORDERS)
def test_one_mma_is_exact_products_summed_within_gamma_8(order):
    # Against Fraction sums: every order of the 9 additions stays within gamma_8 (u = 2^-24,
    # round to nearest) of the exact A B + C; the products themselves are exact.
    rng = np.random.default_rng(7)
    A, B = _tf32_operands(rng, (16, 8)), _tf32_operands(rng, (8, 8))
    C = rng.standard_normal((16, 8)).astype(np.float32)
    D = mma_m16n8k8(A, B, C, order, np.random.default_rng(1))
    for r, c in [(0, 0), (15, 7), (9, 3)]:
        exact = Fraction(float(C[r, c])) + sum(Fraction(float(A[r, k])) * Fraction(float(B[k, c]))
                                               for k in range(8))
        absum = abs(float(C[r, c])) + sum(abs(float(A[r, k] * B[k, c])) for k in range(8))
        assert abs(Fraction(float(D[r, c])) - exact) <= Fraction(gamma(8, 2.0**-24) * absum)


def test_mma_refuses_operands_that_are_not_tf32():
    A = np.full((16, 8), 1 + 2.0**-20, np.float32)
    with pytest.raises(ValueError, match="TF32"):
        mma_m16n8k8(A, np.ones((8, 8), np.float32), np.zeros((16, 8), np.float32))


# ---------------------------------------------------------------- the bound is not vacuous


def _dot_3xtf32(a, b, drop_cross=False):
    """sum_k a_k b_k inside the bound's model: 3xTF32 products; chains of
    ``steps_per_accumulator(K)`` MMAs of 8 terms (float32 additions in order, depth <= 8 L);
    the chains added pairwise (depth <= log2 of their count <= NACC - 1 + 1 + WARPS - 1)."""
    ah, al = split_tf32(a)
    bh, bl = split_tf32(b)
    span = 8 * steps_per_accumulator(a.size)
    out = np.float32(0)
    parts = [ah * bh, ah * bl] + ([] if drop_cross else [al * bh])  # exact float32 products
    for part in parts:
        chains = []
        for k in range(0, a.size, span):
            c = np.float32(0)
            for v in part[k:k + span]:
                c = np.float32(c + v)
            chains.append(c)
        out = np.float32(out + sum_in_order(np.array(chains, np.float32), "pairwise", None))
    return out


def _adversarial(K, rng):
    """Products all positive, each operand as far from TF32 as float32 allows (bits 0x0FFF
    below a TF32 value: tf32 rounds every one away by almost half a TF32 ulp, the same way)."""
    base = np.abs(rng.standard_normal(K)).astype(np.float32) + np.float32(0.5)
    bits = (base.view(np.uint32) & np.uint32(0xFFFFE000)) | np.uint32(0x0FFF)
    return bits.view(np.float32)


@pytest.mark.parametrize("K", [256, 2560])
def test_one_tf32_pass_and_a_dropped_cross_product_break_the_bound(K):
    # The bound separates 3xTF32 from what a plausible bug computes: one TF32 pass (a_hi b_hi
    # only), or a split that drops x_lo w_hi (one MMA missing).
    rng = np.random.default_rng(K)
    a, b = _adversarial(K, rng), _adversarial(K, rng)
    exact = float(a.astype(np.float64) @ b.astype(np.float64))
    absum = float(np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    bound = bound_coefficient(*mma_depths(K)) * absum
    assert abs(float(_dot_3xtf32(a, b)) - exact) <= bound
    one_pass = float(round_tf32(a).astype(np.float64) @ round_tf32(b).astype(np.float64))
    assert abs(one_pass - exact) > 10 * bound
    assert abs(float(_dot_3xtf32(a, b, drop_cross=True)) - exact) > bound


@pytest.mark.parametrize("K", [1024, 2560, 4096, 9728])
def test_the_bound_beside_float32_and_one_tf32_pass(K):
    # Hand numbers at K = 2560: 320 k-steps, 40 per warp, 5 per accumulator: d_hi = 8 * 5 +
    # 7 + 1 + 7 = 55, d_lo = 16 * 5 + 15 = 95; c ~ 7.2e-7 + 6.6e-6 + 1.1e-8 ~ 7.3e-6, 5.1x the
    # float32 kernel's gamma_24 (u = 2^-24) = 1.43e-6 and 134x below one TF32 pass (docs).
    c = bound_coefficient(*mma_depths(K))
    one_tf32 = 2 * U_TF32 + U_TF32**2  # one pass: both operands rounded, per product
    float32_kernel = gamma(summation_depth(K), 2.0**-24)
    assert c < one_tf32 / 25  # tensor cores at float32 accuracy, not TF32's
    assert c < 8 * float32_kernel  # within a small factor of the CUDA-core kernel's bound
    if K == 2560:
        assert mma_depths(K) == (55, 95)
        assert c == pytest.approx(REPRESENTATION + gamma(55) * (1 + U_TF32)**2
                                  + gamma(95) * 2 * U_TF32 * (1 + U_TF32)**2)
        assert 7.2e-6 < c < 7.4e-6
        assert round(c / float32_kernel, 1) == 5.1 and one_tf32 / c > 100
