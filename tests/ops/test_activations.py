"""swiglu, softmax, log_softmax: hand-checked values, properties, NumPy vs CuPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.ops.activations import log_softmax, softmax, swiglu
from dflash_ref.testing import assert_close
from tests.gpu import check_twin
from tests.strategies import f32_arrays, rows_and_width


def test_swiglu_hand_values():
    # silu(0) = 0; silu(1) * 2 = 2 / (1 + e^-1); silu(-1) * 3 = -3 / (1 + e).
    y = swiglu(np.array([0.0, 1.0, -1.0]), np.array([5.0, 2.0, 3.0]))
    assert_close(y, [0.0, 2 / (1 + np.exp(-1.0)), -3 / (1 + np.e)], "float64", op="swiglu")


def test_swiglu_extreme_gates_stay_finite():
    y = swiglu(np.array([-1e4, 1e4], np.float32), np.array([1.0, 1.0], np.float32))
    assert_close(y, [0.0, 1e4], "float32_elementwise", op="swiglu", case="|gate| = 1e4")


def test_softmax_hand_values():
    # [0, ln 3] -> [1/4, 3/4]; a large common offset changes nothing.
    x = np.array([0.0, np.log(3.0)])
    assert_close(softmax(x), [0.25, 0.75], "float64", op="softmax")
    assert_close(softmax(x + 1000.0), [0.25, 0.75], "float64", op="softmax", case="offset 1000")
    assert_close(log_softmax(x), np.log([0.25, 0.75]), "float64", op="log_softmax")


def test_softmax_axis():
    x = np.array([[0.0, 0.0], [np.log(3.0), 0.0]])  # columns are [0, ln 3] and [0, 0]
    assert_close(softmax(x, axis=0), [[0.25, 0.5], [0.75, 0.5]], "float64", op="softmax",
                 case="axis 0")


@given(st.data())
def test_softmax_properties(data):
    rows, n = data.draw(rows_and_width())
    x = data.draw(f32_arrays((rows, n), -30, 30)).astype(np.float64)
    c = data.draw(st.floats(-50, 50))
    p = softmax(x)
    assert_close(p.sum(-1), np.ones(rows), "float64", op="softmax", case="sums to 1")
    assert_close(softmax(x + c), p, "float64", op="softmax", case="shift invariant")
    assert_close(np.exp(log_softmax(x)), p, "float64", op="log_softmax", case="exp == softmax")


@given(st.data())
def test_swiglu_matches_float64_closed_form(data):
    rows, n = data.draw(rows_and_width())
    g = data.draw(f32_arrays((rows, n), -20, 20))
    u = data.draw(f32_arrays((rows, n)))
    g64, u64 = g.astype(np.float64), u.astype(np.float64)
    assert_close(swiglu(g, u), g64 / (1 + np.exp(-g64)) * u64, "float32_vs_float64", op="swiglu")


SHAPES = [(1, 1), (3, 7), (2, 3, 257), (4, 4096), (2, 32000)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
def test_swiglu_twin(rng, shape):
    g = (4 * rng.standard_normal(shape)).astype(np.float32)
    u = rng.standard_normal(shape).astype(np.float32)
    check_twin("swiglu", (g, u), tol="float32_elementwise", case=str(shape))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_twins(rng, shape, op):
    x = (5 * rng.standard_normal(shape)).astype(np.float32)
    check_twin(op, (x,), tol="float32_rowsum", case=str(shape))
    if len(shape) > 1:
        check_twin(op, (x,), {"axis": 0}, tol="float32_rowsum", case=f"{shape} axis 0")
