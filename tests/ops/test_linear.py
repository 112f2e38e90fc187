"""linear (y = x @ w.T, w in the HF nn.Linear layout [out, in]): hand values, errors, NumPy vs CuPy.

Reading order: dflash_ref/ops/linear.py (the spec) -> kernels_cupy/linear.py, linear_plan.py and
cuda/linear.cu (the twin) -> tests/kernels/test_linear_plan.py (the kernel's order, emulated) ->
this file. Expected values are written by hand or computed in float64 (an independent
evaluation); the twin's tolerance is the bound of docs/performance.md, "The projection kernel".
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.ops.linear import FEW_ROWS, LARGE_WEIGHT, linear, linear_few_rows
from dflash_ref.testing import assert_close
from kernels_cupy.linear_plan import MAX_ROWS, summation_depth
from tests.kernels.test_linear_plan import assert_within, linear_bound
from tests.strategies import AWKWARD, f32_arrays

# ---------------------------------------------------------------- unit: hand-checked values


def test_hand_values_use_the_out_in_layout():
    # w rows are outputs: y[t, n] = sum_k x[t, k] w[n, k].
    x = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 0.5]])  # [2, 3]
    w = np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 2.0, -2.0], [4.0, 0.0, 1.0]])  # [4, 3]
    expected = [[1.0, 6.0, -2.0, 7.0], [0.0, -0.5, -3.0, 0.5]]
    assert_close(linear(x, w), expected, "float64", op="linear", case="2 x 3 by 4 x 3")


def test_empty_rows_and_columns():
    assert linear(np.zeros((0, 5), np.float32), np.ones((3, 5), np.float32)).shape == (0, 3)
    assert linear(np.ones((2, 5), np.float32), np.ones((0, 5), np.float32)).shape == (2, 0)
    # K = 0: an empty sum is 0.
    np.testing.assert_array_equal(linear(np.ones((2, 0)), np.ones((3, 0))), np.zeros((2, 3)))


def test_dtypes_follow_the_compute_rule():
    x, w = np.ones((2, 4), np.float16), np.ones((3, 4), np.float16)
    assert linear(x, w).dtype == np.float32
    assert linear(x.astype(np.float64), w).dtype == np.float64


@pytest.mark.parametrize(("x_shape", "w_shape", "match"), [
    ((4,), (3, 4), "must be \\[T, K\\]"),  # a bare vector: reshape to [1, K]
    ((2, 1, 4), (3, 4), "must be \\[T, K\\]"),
    ((2, 4), (4, 3), "expects 3"),  # the transposed weight
    ((2, 4), (3, 5), "4 features per row"),
])
def test_bad_shapes_say_what_was_expected(x_shape, w_shape, match):
    with pytest.raises(ValueError, match=match):
        linear(np.ones(x_shape, np.float32), np.ones(w_shape, np.float32))


# ---------------------------------------------------------------- property tests


@given(st.data())
def test_matches_float64_sums_within_the_bound(data):
    T, N, K = data.draw(st.integers(1, 5)), data.draw(AWKWARD), data.draw(AWKWARD)
    x = data.draw(f32_arrays((T, K), -2.0, 2.0))
    w = data.draw(f32_arrays((N, K), -2.0, 2.0))
    y = linear(x, w)
    exact = np.array([[math.fsum(float(a) * float(b) for a, b in zip(xr, wr)) for wr in w]
                      for xr in x])  # [T, N], exactly rounded sums of exact products
    assert y.dtype == np.float32 and y.shape == (T, N)
    assert_within(y, exact, linear_bound(x, w, K) + 1e-30, "linear vs fsum")


@given(st.data())
def test_rows_are_independent(data):
    # Each output row depends on its own input row only: linear of a stack == stack of linears.
    T, K, N = data.draw(st.integers(2, 6)), data.draw(AWKWARD), data.draw(AWKWARD)
    x = data.draw(f32_arrays((T, K))).astype(np.float64)
    w = data.draw(f32_arrays((N, K))).astype(np.float64)
    rows = np.stack([linear(x[t:t + 1], w)[0] for t in range(T)])
    assert_close(linear(x, w), rows, "float64", op="linear", case="row by row")


# ---------------------------------------------------------------- NumPy vs CuPy (gpu)

# T: the kernel's templates (1, 2, 16), a padded one (7 -> 8), cuBLAS above 16 (17, 40).
# (N, K): N not a multiple of 4 columns; K odd (scalar kernel), 4 k (float4), long.
GPU_ROWS = [1, 2, 7, 16, 17, 40]
GPU_NK = [(13, 1030), (37, 1028), (1024, 2560), (5, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("T", GPU_ROWS)
@pytest.mark.parametrize(("N", "K"), GPU_NK, ids=str)
def test_linear_twin(T, N, K):
    import cupy as cp

    from kernels_cupy.linear import linear as linear_cupy

    rng = np.random.default_rng(T * 1000 + N + K)
    x = rng.standard_normal((T, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / math.sqrt(K)).astype(np.float32)
    y = cp.asnumpy(linear_cupy(cp.asarray(x), cp.asarray(w)))
    assert y.dtype == np.float32 and y.shape == (T, N)
    # Against float64: the kernel's bound gamma_d (d = its longest rounding path); cuBLAS (T >
    # 16, no TF32 unless CUPY_TF32 is set) within gamma_K, the bound of any summation order.
    d = summation_depth(K, K % 4 == 0) if T <= MAX_ROWS else K
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert_within(y, exact, linear_bound(x, w, d), f"twin vs float64 T={T} N={N} K={K}")
    # Against the NumPy reference (BLAS order, within gamma_K of float64): the sum of the bounds.
    assert_within(y, linear(x, w), linear_bound(x, w, d + K), f"twin vs reference T={T}")


@pytest.mark.gpu
def test_linear_twin_empty_and_bad_input():
    import cupy as cp

    from kernels_cupy.linear import linear as linear_cupy

    assert linear_cupy(cp.zeros((0, 8), cp.float32), cp.ones((3, 8), cp.float32)).shape == (0, 3)
    assert linear_cupy(cp.ones((2, 8), cp.float32), cp.ones((0, 8), cp.float32)).shape == (2, 0)
    assert not linear_cupy(cp.ones((2, 0), cp.float32), cp.ones((3, 0), cp.float32)).any()
    with pytest.raises(ValueError, match="expects 3"):
        linear_cupy(cp.ones((2, 4), cp.float32), cp.ones((4, 3), cp.float32))
    with pytest.raises(TypeError, match="float32"):
        linear_cupy(cp.ones((2, 4)), cp.ones((3, 4), cp.float32))


# ---------------------------------------------------------------- the NumPy backend's few-row form


@pytest.mark.parametrize("T", [1, 2, 3, 7, 8])
@pytest.mark.parametrize("N", [999, 1000, 1001])  # block_rows - 1, == block_rows, + 1
def test_few_rows_form_matches_float64_sums(T, N):
    # y[t, n] against the float64 sum over k (independent of BLAS), within the float32 bound for
    # K terms: catches a block's tail rows left unwritten, a row of x used for another, a
    # block written at the wrong offset.
    K = 300  # N * K >= LARGE_WEIGHT: the few-row form takes T in FEW_ROWS
    assert N * K >= LARGE_WEIGHT
    rng = np.random.default_rng(T * 10_000 + N)
    x = rng.standard_normal((T, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    y = linear_few_rows(x, w, block_rows=1000)
    assert y.shape == (T, N) and y.dtype == np.float32
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert_within(y, exact, linear_bound(x, w, K) + 1e-30, f"few rows T={T} N={N}")


def test_few_rows_form_keeps_linear_outside_its_range():
    # 1 row, 8 rows, and a w below LARGE_WEIGHT are linear's own products, bit for bit.
    rng = np.random.default_rng(3)
    big = rng.standard_normal((LARGE_WEIGHT // 256, 256)).astype(np.float32)  # == LARGE_WEIGHT
    small = big[:-1]  # one row of 256 below it
    for T, w in [(1, big), (8, big), (2, small), (7, small)]:
        x = rng.standard_normal((T, 256)).astype(np.float32)
        np.testing.assert_array_equal(linear_few_rows(x, w), linear(x, w))
    assert FEW_ROWS == range(2, 8)


def test_few_rows_form_checks_shapes_and_empty_inputs():
    with pytest.raises(ValueError, match="expects 3"):
        linear_few_rows(np.ones((2, 4), np.float32), np.ones((4, 3), np.float32))
    assert linear_few_rows(np.zeros((0, 5), np.float32), np.ones((3, 5), np.float32)).shape == \
        (0, 3)


def test_numpy_backend_linear_is_the_few_rows_form():
    from dflash_ref.backend import get_backend

    assert get_backend("numpy").ops.linear is linear_few_rows
