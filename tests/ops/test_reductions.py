"""argmax_rows, top1_prob_rows, entropy_rows, count_nonfinite_rows: hand values, properties,
the non-finite rule (docs/conventions.md, "Non-finite logits"), NumPy vs CuPy."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.ops.reductions import (
    argmax_rows,
    count_nonfinite_rows,
    entropy_rows,
    top1_prob_rows,
)
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
    check_twin("count_nonfinite_rows", (x,), tol="exact", case=str(shape))


@pytest.mark.gpu
def test_argmax_twin_ties_and_neg_inf():
    # Row 0: ties at 1, 2 and 700 (the lowest wins across the block's strided slices); row 1 all
    # -inf (index 0); row 2 a thousand equal values (index 0).
    x = np.zeros((3, 1000), np.float32)
    x[0, [1, 2, 700]] = 3.0
    x[1] = -np.inf
    x[2] = 2.0
    check_twin("argmax_rows", (x,), tol="exact", case="ties")
    check_twin("entropy_rows", (np.array([[0.0, -np.inf, 1.0]], np.float32),), tol="float32_rowsum",
               case="-inf logit")


# ---------------------------------------------------------------------------------------------
# The non-finite rule (docs/conventions.md, "Non-finite logits"). Expected values are hand-derived
# from the rule: NaN beats every number, first NaN first; +-inf are ordinary extremes for argmax;
# top1/entropy are NaN where max(row) is not finite; -inf beside a finite value has p = 0.
# ---------------------------------------------------------------------------------------------

NAN, INF = np.nan, np.inf
NONFINITE_ROWS = np.array([
    [1.0, NAN, 3.0, NAN],      # NaN beats 3: first NaN, index 1
    [NAN, 9.0, 2.0, 0.0],      # NaN at the front
    [5.0, 2.0, 0.0, NAN],      # NaN at the end beats the max 5
    [INF, NAN, 0.0, 1.0],      # NaN beats +inf
    [1.0, INF, INF, 0.0],      # +inf is an ordinary max; ties to the lowest index
    [-INF, -INF, -INF, -INF],  # all -inf: a tie, index 0
    [-INF, 0.0, -INF, 2.0],    # -inf are masked tokens: softmax over [0, 2]
    [0.0, -INF, np.log(3.0), -INF],  # p = [1/4, 0, 3/4, 0]
], np.float32)
NONFINITE_ARGMAX = [1, 0, 3, 1, 1, 0, 3, 2]
NONFINITE_COUNT = [2, 1, 1, 2, 2, 4, 2, 2]
_P = np.array([1 / (1 + np.e ** 2), np.e ** 2 / (1 + np.e ** 2)])  # softmax([0, 2])
NONFINITE_TOP1 = [NAN] * 6 + [_P[1], 0.75]
NONFINITE_ENTROPY = [NAN] * 6 + [-np.sum(_P * np.log(_P)),
                                 -(0.25 * np.log(0.25) + 0.75 * np.log(0.75))]


def test_argmax_rows_nonfinite_rule():
    assert argmax_rows(NONFINITE_ROWS).tolist() == NONFINITE_ARGMAX
    # Leading dimensions: the rule is per row.
    assert argmax_rows(NONFINITE_ROWS.reshape(2, 4, 4)).tolist() == [NONFINITE_ARGMAX[:4],
                                                                     NONFINITE_ARGMAX[4:]]


def test_softmax_reductions_nonfinite_rule_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value" RuntimeWarning on the way to NaN
        top1, h = top1_prob_rows(NONFINITE_ROWS), entropy_rows(NONFINITE_ROWS)
    assert top1.dtype == np.float32 and h.dtype == np.float32
    assert_close(top1, NONFINITE_TOP1, "float32_vs_float64", op="top1_prob_rows", case="non-finite")
    assert_close(h, NONFINITE_ENTROPY, "float32_vs_float64", op="entropy_rows", case="non-finite")
    # float64 inputs stay float64 and follow the same rule.
    assert_close(top1_prob_rows(NONFINITE_ROWS.astype(np.float64)), NONFINITE_TOP1,
                 "float32_vs_float64", op="top1_prob_rows", case="float64")


def test_count_nonfinite_rows_hand_values():
    assert count_nonfinite_rows(NONFINITE_ROWS).tolist() == NONFINITE_COUNT
    assert count_nonfinite_rows(np.zeros((2, 3), np.float32)).tolist() == [0, 0]
    assert count_nonfinite_rows(NONFINITE_ROWS).dtype == np.int64


def _argmax_oracle(row) -> int:
    """The rule in plain Python: the first NaN, else the first index of the largest value."""
    row = [float(v) for v in row]
    for j, v in enumerate(row):
        if v != v:
            return j
    return row.index(max(row))


@given(st.data())
def test_argmax_rows_matches_the_rule_with_injected_specials(data):
    rows, n = data.draw(rows_and_width())
    x = data.draw(f32_arrays((rows, n), -30, 30))
    specials = st.sampled_from([np.nan, np.inf, -np.inf])
    for _ in range(data.draw(st.integers(0, rows * n))):
        r, j = data.draw(st.integers(0, rows - 1)), data.draw(st.integers(0, n - 1))
        x[r, j] = data.draw(specials)
    assert argmax_rows(x).tolist() == [_argmax_oracle(r) for r in x]
    assert count_nonfinite_rows(x).tolist() == [sum(not np.isfinite(v) for v in r) for r in x]


def _wide_rows() -> np.ndarray:
    """[6, 1000]: the NaN, the +inf and the max in different threads, warps and strides of a
    256-thread block."""
    wide = np.zeros((6, 1000), np.float32)
    wide[:, 123] = 7.0
    wide[0, [600, 5]] = np.nan      # first NaN in the first stride of thread 5
    wide[1, [257, 300]] = np.nan    # both in the second stride, threads 1 and 44
    wide[2, [999, 40]] = np.inf     # +inf ties: lowest index
    wide[3, :] = -np.inf            # all -inf
    wide[4, 512] = np.nan           # a lone NaN beside the max 7
    wide[5, [7, 900]] = -np.inf     # masked tokens only
    return wide


def test_nonfinite_rule_on_wide_rows():
    wide = _wide_rows()
    assert argmax_rows(wide).tolist() == [5, 257, 40, 0, 512, 123]
    assert count_nonfinite_rows(wide).tolist() == [2, 2, 2, 1000, 1, 2]
    top1 = top1_prob_rows(wide)
    assert np.isnan(top1[:5]).all()
    # Row 5: 997 zeros and one 7 count, two -inf do not: p1 = e^7 / (e^7 + 997).
    assert_close(top1[5], np.exp(7.0) / (np.exp(7.0) + 997), "float32_vs_float64",
                 op="top1_prob_rows", case="masked wide row")


@pytest.mark.gpu
def test_nonfinite_rule_twins():
    # The same hand rows and wide rows through the CuPy kernels: outputs equal NumPy's.
    check_twin("argmax_rows", (NONFINITE_ROWS,), tol="exact", case="hand rows")
    check_twin("count_nonfinite_rows", (NONFINITE_ROWS,), tol="exact", case="hand rows")
    check_twin("top1_prob_rows", (NONFINITE_ROWS,), tol="float32_rowsum", case="hand rows")
    check_twin("entropy_rows", (NONFINITE_ROWS,), tol="float32_rowsum", case="hand rows")
    wide = _wide_rows()
    for op, tol in (("argmax_rows", "exact"), ("count_nonfinite_rows", "exact"),
                    ("top1_prob_rows", "float32_rowsum"), ("entropy_rows", "float32_rowsum")):
        check_twin(op, (wide,), tol=tol, case="wide rows")
