"""argmax_rows, top1_prob_rows, entropy_rows: hand values, properties, NumPy vs CuPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.ops.reductions import argmax_rows, entropy_rows, top1_prob_rows
from dflash_ref.testing import assert_close
from tests.gpu import check_twin
from tests.strategies import f32_arrays, rows_and_width


def test_argmax_rows_ties_go_to_lowest_index():
    logits = np.array([[1.0, 3.0, 3.0], [-np.inf, -np.inf, -np.inf], [0.0, -1.0, 5.0]])
    assert argmax_rows(logits).tolist() == [1, 0, 2]
    assert argmax_rows(logits).dtype == np.int64


def test_top1_prob_hand_values():
    # [0, ln 3]: p1 = 3/4. Uniform over 4: p1 = 1/4.
    assert_close(top1_prob_rows(np.array([[0.0, np.log(3.0)], [0.0, 0.0]])), [0.75, 0.5],
                 "float64", op="top1_prob_rows")
    assert_close(top1_prob_rows(np.zeros((1, 4))), [0.25], "float64", op="top1_prob_rows")


def test_entropy_hand_values():
    # Uniform over V: ln V. One-hot (others -inf): 0. [0, ln 3]: -(1/4 ln 1/4 + 3/4 ln 3/4).
    assert_close(entropy_rows(np.zeros((2, 4))), [np.log(4.0)] * 2, "float64", op="entropy_rows")
    assert_close(entropy_rows(np.array([[0.0, -np.inf, -np.inf]])), [0.0], "float64",
                 op="entropy_rows", case="-inf logits")
    h = -(0.25 * np.log(0.25) + 0.75 * np.log(0.75))
    assert_close(entropy_rows(np.array([0.0, np.log(3.0)])), h, "float64", op="entropy_rows")


@given(st.data())
def test_reductions_agree_with_float64_softmax(data):
    rows, n = data.draw(rows_and_width())
    x = data.draw(f32_arrays((rows, n), -30, 30)).astype(np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    assert_close(top1_prob_rows(x), p.max(-1), "float64", op="top1_prob_rows")
    plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    assert_close(entropy_rows(x), -plogp.sum(-1), "float64", op="entropy_rows")
    ids = argmax_rows(x)
    assert np.all(x[np.arange(rows), ids] == x.max(-1))
    assert np.all(entropy_rows(x) <= np.log(n) + 1e-12) and np.all(entropy_rows(x) >= -1e-12)


SHAPES = [(1, 1), (3, 7), (2, 3, 257), (4, 4096), (16, 151936)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
def test_reduction_twins(rng, shape):
    x = (4 * rng.standard_normal(shape)).astype(np.float32)
    check_twin("argmax_rows", (x,), tol="exact", case=str(shape))
    check_twin("top1_prob_rows", (x,), tol="float32_rowsum", case=str(shape))
    check_twin("entropy_rows", (x,), tol="float32_rowsum", case=str(shape))


@pytest.mark.gpu
def test_argmax_twin_ties_and_neg_inf():
    x = np.array([[1.0, 3.0, 3.0], [-np.inf, -np.inf, -np.inf], [2.0] * 1000], np.float32)
    check_twin("argmax_rows", (x,), tol="exact", case="ties")
    check_twin("entropy_rows", (np.array([[0.0, -np.inf, 1.0]], np.float32),), tol="float32_rowsum",
               case="-inf logit")
