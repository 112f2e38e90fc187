"""gdn_gates: the GDN layer's write strength beta and log decay g from its b and a projections
(dflash_ref/ops/activations.py): hand values, the float64 closed form, the softplus threshold,
NumPy vs CuPy (also on the stacked input projection's column slices, read in place)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.backend import get_backend
from dflash_ref.ops.activations import SOFTPLUS_THRESHOLD, gdn_gates
from dflash_ref.testing import assert_close
from tests.gpu import check_twin
from tests.strategies import f32_arrays, rows_and_width


def test_hand_values():
    # sigmoid(0) = 1/2, sigmoid(ln 3) = 3/4; softplus(0) = ln 2, softplus(ln(e - 1)) = 1.
    b = np.array([[0.0, np.log(3.0)]])
    a = np.array([[0.0, np.log(np.e - 1) - 0.5]])
    A, dt_bias = np.array([-2.0, -0.25]), np.array([0.0, 0.5])
    beta, g = gdn_gates(b, a, A, dt_bias)
    assert_close(beta, [[0.5, 0.75]], "float64", op="gdn_gates", tensor="beta")
    assert_close(g, [[-2 * np.log(2.0), -0.25]], "float64", op="gdn_gates", tensor="g")


def test_matches_the_float64_closed_form(rng):
    b = 6 * rng.standard_normal((7, 12))
    a = 6 * rng.standard_normal((7, 12))
    A, dt_bias = -np.exp(rng.standard_normal(12)), rng.standard_normal(12)
    beta, g = gdn_gates(b.astype(np.float32), a.astype(np.float32), A.astype(np.float32),
                        dt_bias.astype(np.float32))
    b, a, A, dt_bias = (x.astype(np.float32).astype(np.float64) for x in (b, a, A, dt_bias))
    assert_close(beta, 1 / (1 + np.exp(-b)), "float32_vs_float64", op="gdn_gates", tensor="beta")
    assert_close(g, A * np.log1p(np.exp(a + dt_bias)), "float32_vs_float64", op="gdn_gates",
                 tensor="g")


@given(st.data())
def test_properties_and_the_float64_closed_form(data):
    # beta in [0, 1]; g <= 0 (A < 0, softplus >= 0); g never increases as a grows (A < 0); both
    # the float64 closed forms (softplus(u) = u past the threshold, where log1p(exp(u)) = u).
    T, HV = data.draw(rows_and_width())
    b = data.draw(f32_arrays((T, HV), -60, 60))
    a = data.draw(f32_arrays((T, HV), -60, 60))
    A = -np.exp(data.draw(f32_arrays((HV,), -3, 3)))
    dt_bias = data.draw(f32_arrays((HV,), -3, 3))
    beta, g = gdn_gates(b, a, A, dt_bias)
    assert np.all((beta >= 0) & (beta <= 1)) and np.all(g <= 0)
    _, g_up = gdn_gates(b, a + np.float32(1.0), A, dt_bias)
    assert np.all(g_up <= g)
    b64, u64, A64 = b.astype(np.float64), (a + dt_bias).astype(np.float64), A.astype(np.float64)
    softplus = np.where(u64 > SOFTPLUS_THRESHOLD, u64, np.log1p(np.exp(np.minimum(u64, 30.0))))
    assert_close(beta, 1 / (1 + np.exp(-b64)), "float32_vs_float64", op="gdn_gates",
                 tensor="beta")
    assert_close(g, A64 * softplus, "float32_vs_float64", op="gdn_gates", tensor="g")


def test_extremes_stay_finite_and_the_threshold_is_linear():
    # b = +-200: no overflow (beta 0 or 1); softplus(u) = u above the threshold, exactly.
    beta, g = gdn_gates(np.array([[-200.0, 200.0, 0.0]], np.float32),
                        np.array([[SOFTPLUS_THRESHOLD + 5, 500.0, -200.0]], np.float32),
                        np.full(3, -1.0, np.float32), np.zeros(3, np.float32))
    assert np.all(np.isfinite(beta)) and np.all(np.isfinite(g))
    np.testing.assert_array_equal(beta[0, :2], [0.0, 1.0])
    np.testing.assert_array_equal(g[0, :2], [-(SOFTPLUS_THRESHOLD + 5), -500.0])
    assert g[0, 2] == 0.0  # softplus(-200) = exp(-200) underflows in float32: g = -0


def test_bad_shapes_are_explained():
    with pytest.raises(ValueError, match=r"b, a \[T, HV\] and A, dt_bias \[HV\]"):
        gdn_gates(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros(4), np.zeros(4))


@pytest.mark.gpu
@pytest.mark.parametrize("T,HV", [(1, 32), (16, 32), (5, 7), (3, 1)])
def test_twin(rng, T, HV):
    b = (6 * rng.standard_normal((T, HV))).astype(np.float32)
    a = (6 * rng.standard_normal((T, HV))).astype(np.float32)
    a[0, 0] = SOFTPLUS_THRESHOLD + 1  # the linear branch
    A = -np.exp(rng.standard_normal(HV)).astype(np.float32)
    dt_bias = rng.standard_normal(HV).astype(np.float32)
    check_twin("gdn_gates", (b, a, A, dt_bias), tol="float32_elementwise", case=f"T={T} HV={HV}")


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 16])
def test_twin_reads_the_stacked_projections_columns_in_place(rng, T):
    # b and a as the layer passes them: the last two column blocks of [qkv | z | b | a].
    import cupy as cp

    HV, other = 32, 100
    y = (4 * rng.standard_normal((T, other + 2 * HV))).astype(np.float32)
    A = -np.exp(rng.standard_normal(HV)).astype(np.float32)
    dt_bias = rng.standard_normal(HV).astype(np.float32)
    want = gdn_gates(y[:, other:other + HV], y[:, other + HV:], A, dt_bias)
    dy = cp.asarray(y)
    got = get_backend("cupy").ops.gdn_gates(dy[:, other:other + HV], dy[:, other + HV:],
                                            cp.asarray(A), cp.asarray(dt_bias))
    for name, g, w in zip(("beta", "g"), got, want):
        assert_close(cp.asnumpy(g), w, "float32_elementwise", op="gdn_gates", tensor=name,
                     case=f"column slices T={T}")
