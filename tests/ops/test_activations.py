"""swiglu, geglu, softmax, log_softmax: hand-checked values, properties, NumPy vs CuPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.backend import get_backend
from dflash_ref.models.gemma import gelu_tanh
from dflash_ref.ops.activations import geglu, log_softmax, sigmoid_gate, softmax, swiglu
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


def geglu_closed_form(g, up):
    """HF's ``gelu_pytorch_tanh`` as written, ``0.5 g (1 + tanh(z))``, in float64, times up."""
    g, up = np.asarray(g, np.float64), np.asarray(up, np.float64)
    z = np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)
    return 0.5 * g * (1 + np.tanh(z)) * up


def test_geglu_hand_values():
    # gelu(0) = 0; gelu(1) = 0.5 (1 + tanh(sqrt(2/pi) 1.044715)) = 0.8411920 (PyTorch's
    # gelu(1, approximate="tanh") prints 0.8412); gelu(-1) = gelu(1) - 1 (gelu(x) - gelu(-x) = x).
    # The constants are float32 (as models/gemma.py's), so float64 inputs agree to ~1e-8.
    y = geglu(np.array([0.0, 1.0, -1.0]), np.array([5.0, 2.0, 3.0]))
    assert_close(y, [0.0, 2 * 0.8411919906082768, 3 * (0.8411919906082768 - 1)],
                 "float32_vs_float64", op="geglu")


@given(st.data())
def test_geglu_matches_the_float64_tanh_form(data):
    # Where 1 + tanh(z) does not cancel (g > -5): the sigmoid form is the same function.
    rows, n = data.draw(rows_and_width())
    g = data.draw(f32_arrays((rows, n), -5, 20))
    u = data.draw(f32_arrays((rows, n)))
    assert_close(geglu(g, u), geglu_closed_form(g, u), "float32_vs_float64", op="geglu")


def test_geglu_is_gemmas_written_out_form_bit_for_bit():
    # The op replaces models/gemma.py's elementwise chain in the layer: the same values.
    rng = np.random.default_rng(3)
    g = (6 * rng.standard_normal((7, 129))).astype(np.float32)
    g[0, :3] = [-11.0, -200.0, 40.0]  # exp overflows to inf: -0, as the chain gives
    u = rng.standard_normal((7, 129)).astype(np.float32)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(geglu(g, u), gelu_tanh(np, g) * u)


def test_sigmoid_gate_hand_values_and_shapes():
    # sigmoid(0) = 1/2, sigmoid(ln 3) = 3/4, sigmoid(-ln 3) = 1/4; a far negative gate closes.
    y = sigmoid_gate(np.array([2.0, 4.0, 8.0, 5.0]), np.array([0.0, np.log(3.0), -np.log(3.0),
                                                                -200.0]))
    assert_close(y, [1.0, 3.0, 2.0, 0.0], "float64", op="sigmoid_gate")
    with pytest.raises(ValueError, match="same shape"):
        sigmoid_gate(np.zeros((2, 3)), np.zeros((3, 2)))


@given(st.data())
def test_sigmoid_gate_matches_float64_closed_form_and_bounds(data):
    # |x * sigmoid(gate)| <= |x|, with the sign of x; equal to the float64 closed form.
    rows, n = data.draw(rows_and_width())
    x = data.draw(f32_arrays((rows, n), -50, 50))
    gate = data.draw(f32_arrays((rows, n), -80, 80))
    y = sigmoid_gate(x, gate)
    assert np.all(np.abs(y) <= np.abs(x)) and np.all(y * x >= 0)
    x64, g64 = x.astype(np.float64), gate.astype(np.float64)
    assert_close(y, x64 / (1 + np.exp(-g64)), "float32_elementwise", op="sigmoid_gate")


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


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
def test_geglu_twin(rng, shape):
    g = (4 * rng.standard_normal(shape)).astype(np.float32)
    u = rng.standard_normal(shape).astype(np.float32)
    check_twin("geglu", (g, u), tol="float32_elementwise", case=str(shape))


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["swiglu", "geglu"])
@pytest.mark.parametrize("T,F", [(1, 7), (16, 257), (5, 4096)])
def test_gated_twins_read_the_stacked_products_columns_in_place(rng, op, T, F):
    # gate and up as the layer passes them: column slices of one [T, 2F] product (plus 3 columns
    # past up, so a row stride that is not 2F); the twin reads them strided, with no copy.
    import cupy as cp

    y = (4 * rng.standard_normal((T, 2 * F + 3))).astype(np.float32)
    expected = getattr(get_backend("numpy").ops, op)(y[:, :F], y[:, F:2 * F])
    dy = cp.asarray(y)
    got = getattr(get_backend("cupy").ops, op)(dy[:, :F], dy[:, F:2 * F])
    assert got.flags.c_contiguous and got.shape == (T, F)
    assert_close(cp.asnumpy(got), expected, "float32_elementwise", op=op,
                 case=f"column slices T={T} F={F}")


@pytest.mark.gpu
@pytest.mark.parametrize("T,nh,d", [(1, 32, 128), (16, 32, 128), (3, 5, 66)])
def test_sigmoid_gate_twin_reads_the_gate_half_of_each_q_head_in_place(rng, T, nh, d):
    # Qwen3.5: q_proj's heads are [q | gate]; the gate is a [T, nh, d] view with head stride 2d,
    # x the attention output [T, nh, d]. Also the contiguous 2-D form.
    import cupy as cp

    heads = (4 * rng.standard_normal((T, nh, 2 * d))).astype(np.float32)
    x = rng.standard_normal((T, nh, d)).astype(np.float32)
    want = sigmoid_gate(x, heads[..., d:])
    got = get_backend("cupy").ops.sigmoid_gate(cp.asarray(x), cp.asarray(heads)[..., d:])
    assert_close(cp.asnumpy(got), want, "float32_elementwise", op="sigmoid_gate",
                 case=f"strided gate T={T} nh={nh} d={d}")
    check_twin("sigmoid_gate", (x.reshape(T, -1), np.ascontiguousarray(heads[..., d:]).reshape(
        T, -1)), tol="float32_elementwise", case=f"2-D T={T}")
