"""rms_norm, add_rms_norm, norm_add_rms_norm, l2_norm, gated_rms_norm: hand-checked values,
properties, NumPy vs CuPy.

Reading order for a newcomer: dflash_ref/ops/norm.py (the spec) -> kernels_cupy/norm.py and
kernels_cupy/cuda/norm.cu (the twin) -> this file (unit, property, gpu).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.ops.norm import add_rms_norm, gated_rms_norm, l2_norm, norm_add_rms_norm, rms_norm
from dflash_ref.testing import assert_close
from tests.gpu import check_twin
from tests.strategies import f32_arrays, rows_and_width

# ---------------------------------------------------------------- unit: hand-checked values


def test_rms_norm_hand_values():
    # x = [3, 4]: mean(x^2) = (9 + 16) / 2 = 12.5, so x / rms = [3, 4] / sqrt(12.5).
    x = np.array([3.0, 4.0])
    r = np.sqrt(12.5)
    assert_close(rms_norm(x, np.array([1.0, 2.0]), eps=0.0), [3 / r, 8 / r], "float64",
                 op="rms_norm", case="w form")
    # offset=1.0 is the (1 + w) form: scales [2, 3].
    assert_close(rms_norm(x, np.array([1.0, 2.0]), eps=0.0, offset=1.0), [6 / r, 12 / r],
                 "float64", op="rms_norm", case="(1+w) form")
    # eps sits inside the sqrt: x = [1, 1], eps = 3 -> 1 / sqrt(1 + 3) = 0.5.
    assert_close(rms_norm(np.ones(2), np.ones(2), eps=3.0), [0.5, 0.5], "float64",
                 op="rms_norm", case="eps inside sqrt")


def test_add_rms_norm_hand_values():
    # x + residual = [1, 2] + [2, 2] = [3, 4]; mean(h^2) = 12.5 (the rms_norm hand case above).
    x, res = np.array([1.0, 2.0]), np.array([2.0, 2.0])
    r = np.sqrt(12.5)
    h, y = add_rms_norm(x, res, np.array([1.0, 2.0]), eps=0.0)
    assert_close(h, [3.0, 4.0], "float64", op="add_rms_norm", tensor="h")
    assert_close(y, [3 / r, 8 / r], "float64", op="add_rms_norm", tensor="normed", case="w")
    # Gemma's (1 + w): scales [2, 3]; eps inside the sqrt: h = [1, 1], eps = 3 -> 0.5.
    _, y = add_rms_norm(x, res, np.array([1.0, 2.0]), eps=0.0, offset=1.0)
    assert_close(y, [6 / r, 12 / r], "float64", op="add_rms_norm", case="(1+w)")
    _, y = add_rms_norm(np.zeros(2), np.ones(2), np.ones(2), eps=3.0)
    assert_close(y, [0.5, 0.5], "float64", op="add_rms_norm", case="eps inside sqrt")


def test_add_rms_norm_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="residual has shape"):
        add_rms_norm(np.ones((2, 4)), np.ones((1, 4)), np.ones(4), 1e-6)


def test_l2_norm_hand_values_and_conventions():
    assert_close(l2_norm(np.array([3.0, 4.0]), eps=0.0), [0.6, 0.8], "float64", op="l2_norm")
    # The two public conventions (docs/gdn.md) on a 128-vector of 1e-5 with eps 1e-6.
    # sum x^2 = 1.28e-8.
    x = np.full(128, 1e-5)
    y_fla = l2_norm(x, eps=1e-6, mode="sqrt_eps")  # 1e-5 / sqrt(1.28e-8 + 1e-6)
    y_ggml = l2_norm(x, eps=1e-6, mode="floor")  # 1e-5 / max(sqrt(1.28e-8), 1e-6)
    assert_close(np.linalg.norm(y_fla), np.sqrt(1.28e-8 / (1.28e-8 + 1e-6)), "float64",
                 op="l2_norm", case="sqrt_eps near zero (norm 0.112)")
    assert_close(np.linalg.norm(y_ggml), 1.0, "float64", op="l2_norm", case="floor near zero")
    # Below the floor the ggml form divides by eps itself: 1e-9 / 1e-6 = 1e-3.
    assert_close(l2_norm(np.array([1e-9]), eps=1e-6, mode="floor"), [1e-3], "float64",
                 op="l2_norm", case="below floor")


def test_l2_norm_rejects_unknown_mode():
    with pytest.raises(ValueError, match="sqrt_eps"):
        l2_norm(np.ones(3), 1e-6, mode="inside")


def test_gated_rms_norm_hand_values():
    # silu(0) = 0 gates channel 0 off; silu(1) = 1 / (1 + e^-1).
    x = np.array([3.0, 4.0])
    r = np.sqrt(12.5)
    y = gated_rms_norm(x, np.array([0.0, 1.0]), np.array([1.0, 2.0]), eps=0.0)
    assert_close(y, [0.0, 8 / r / (1 + np.exp(-1.0))], "float64", op="gated_rms_norm")


def test_dtypes_follow_the_compute_rule():
    x32 = np.ones((2, 4), np.float32)
    assert rms_norm(x32, np.ones(4, np.float32), 1e-6).dtype == np.float32
    assert rms_norm(x32.astype(np.float16), np.ones(4, np.float16), 1e-6).dtype == np.float32
    assert rms_norm(x32.astype(np.float64), np.ones(4), 1e-6).dtype == np.float64


# ---------------------------------------------------------------- property tests


@given(st.data())
def test_rms_norm_scale_invariant_and_unit_rms(data):
    rows, n = data.draw(rows_and_width())
    x = data.draw(f32_arrays((rows, n), min_abs=0.1)).astype(np.float64)
    c = data.draw(st.floats(0.01, 100.0))
    w = np.ones(n)
    y = rms_norm(x, w, eps=0.0)
    # rms_norm(c x) == rms_norm(x) for c > 0, and each output row has mean square 1.
    assert_close(rms_norm(c * x, w, eps=0.0), y, "float64", op="rms_norm", case="scale")
    assert_close(np.mean(y * y, axis=-1), np.ones(rows), "float64", op="rms_norm", case="unit")


@given(st.data())
def test_rms_norm_offset_equals_shifted_weight(data):
    rows, n = data.draw(rows_and_width())
    x = data.draw(f32_arrays((rows, n)))
    w = data.draw(f32_arrays((n,), -1.0, 1.0))
    assert_close(rms_norm(x, w, 1e-6, offset=1.0), rms_norm(x, w + np.float32(1.0), 1e-6),
                 "float32_elementwise", op="rms_norm", case="(1+w) == offset 1")


@given(st.data(), st.sampled_from([0.0, 1.0]))
def test_add_rms_norm_is_the_add_then_rms_norm_bit_for_bit(data, offset):
    # The unfused pair the decoder layer used to run: the same float32 computation, so equal
    # bit for bit (a fused op that normed x instead of x + residual, or dropped the offset,
    # or returned the pre-add stream as h, fails here).
    rows, n = data.draw(rows_and_width())
    x, res = data.draw(f32_arrays((rows, n))), data.draw(f32_arrays((rows, n)))
    w = data.draw(f32_arrays((n,), -1.0, 1.0))
    h, y = add_rms_norm(x, res, w, 1e-6, offset)
    assert h.dtype == y.dtype == np.float32
    np.testing.assert_array_equal(h, x + res)
    np.testing.assert_array_equal(y, rms_norm(x + res, w, 1e-6, offset))


def test_norm_add_rms_norm_hand_values():
    # x = [3, 4] (rms sqrt(12.5)), post weight [1, 1]: m = [3, 4] / sqrt(12.5); the stream
    # [1 - m0, 2 - m1] makes h = [1, 2] (rms sqrt(2.5)), next weight [2, 1]: [2, 2] / sqrt(2.5).
    r = np.sqrt(12.5)
    m, h, y = norm_add_rms_norm(np.array([3.0, 4.0]), np.array([1 - 3 / r, 2 - 4 / r]),
                                np.ones(2), np.array([2.0, 1.0]), eps=0.0)
    assert_close(m, [3 / r, 4 / r], "float64", op="norm_add_rms_norm", tensor="m")
    assert_close(h, [1.0, 2.0], "float64", op="norm_add_rms_norm", tensor="h")
    assert_close(y, [2 / np.sqrt(2.5), 2 / np.sqrt(2.5)], "float64", op="norm_add_rms_norm",
                 tensor="normed")


@given(st.data(), st.sampled_from([0.0, 1.0]))
def test_norm_add_rms_norm_is_the_three_steps_bit_for_bit(data, offset):
    # Gemma's post norm, the add, the next norm (dflash_ref/models/fused.py,
    # ``FusedPostNormAddNorm``): a fused op that added the raw x, normed with the wrong weight,
    # or handed back the pre-add stream fails here.
    rows, n = data.draw(rows_and_width())
    x, res = data.draw(f32_arrays((rows, n))), data.draw(f32_arrays((rows, n)))
    w, w2 = data.draw(f32_arrays((n,), -1.0, 1.0)), data.draw(f32_arrays((n,), -1.0, 1.0))
    m, h, y = norm_add_rms_norm(x, res, w, w2, 1e-6, offset)
    np.testing.assert_array_equal(m, rms_norm(x, w, 1e-6, offset))
    np.testing.assert_array_equal(h, m + res)
    np.testing.assert_array_equal(y, rms_norm(m + res, w2, 1e-6, offset))


@given(st.data())
def test_l2_norm_unit_and_modes_agree_away_from_zero(data):
    rows, n = data.draw(rows_and_width())
    x = data.draw(f32_arrays((rows, n), min_abs=0.5)).astype(np.float64)
    a, b = l2_norm(x, 1e-12, "sqrt_eps"), l2_norm(x, 1e-12, "floor")
    assert_close(np.linalg.norm(a, axis=-1), np.ones(rows), "float64", op="l2_norm")
    assert_close(a, b, "float64", op="l2_norm", case="modes agree for |x| >> eps")


def test_l2_norm_of_q_and_k_heads_together_is_each_alone_bit_for_bit(rng):
    # The GDN layer norms q's and k's heads in one call over the conv output's [T, 2H, dk] view
    # (dflash_ref/models/gdn_layer.py ``split_qkv``): each row is normed alone, so the halves
    # equal separate calls exactly.
    conv = rng.standard_normal((5, 2 * 3 * 16 + 40)).astype(np.float32)  # [T, q | k | v]
    qk = l2_norm(conv[:, :96].reshape(5, 6, 16), 1e-6)
    np.testing.assert_array_equal(qk[:, :3], l2_norm(conv[:, :48].reshape(5, 3, 16), 1e-6))
    np.testing.assert_array_equal(qk[:, 3:], l2_norm(conv[:, 48:96].reshape(5, 3, 16), 1e-6))


@given(st.data())
def test_gated_rms_norm_open_gate_is_rms_norm_times_z(data):
    # For z >= 30, sigmoid(z) == 1 to double precision, so silu(z) == z.
    rows, n = data.draw(rows_and_width())
    x = data.draw(f32_arrays((rows, n))).astype(np.float64)
    z = np.full((rows, n), 40.0)
    w = data.draw(f32_arrays((n,))).astype(np.float64)
    assert_close(gated_rms_norm(x, z, w, 1e-6), rms_norm(x, w, 1e-6) * 40.0, "float64",
                 op="gated_rms_norm", case="open gate")


# ---------------------------------------------------------------- NumPy vs CuPy (gpu)

SHAPES = [(1, 1), (3, 7), (5, 128), (2, 3, 257), (4, 4096), (1, 5000)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_twin(rng, shape, offset):
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    check_twin("rms_norm", (x, w, 1e-6), {"offset": offset}, "float32_rowsum", case=str(shape))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_norm_add_rms_norm_twin(rng, shape, offset):
    # m and normed: rms_norm's row-sum tolerance; h = m + residual carries m's few-ulp error.
    x = (3 * rng.standard_normal(shape)).astype(np.float32)
    res = rng.standard_normal(shape).astype(np.float32)
    w, w2 = (rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(2))
    check_twin("norm_add_rms_norm", (x, res, w, w2, 1e-6), {"offset": offset},
               "float32_rowsum", case=str(shape))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_add_rms_norm_twin(rng, shape, offset):
    # h is one float32 add on both sides; normed has rms_norm's row-sum tolerance.
    x = rng.standard_normal(shape).astype(np.float32)
    res = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    check_twin("add_rms_norm", (x, res, w, 1e-6), {"offset": offset}, "float32_rowsum",
               case=str(shape))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["sqrt_eps", "floor"])
def test_l2_norm_twin(rng, shape, mode):
    x = rng.standard_normal(shape).astype(np.float32)
    check_twin("l2_norm", (x, 1e-6), {"mode": mode}, "float32_rowsum", case=str(shape))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
def test_gated_rms_norm_twin(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    z = (3 * rng.standard_normal(shape)).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    check_twin("gated_rms_norm", (x, z, w, 1e-6), tol="float32_rowsum", case=str(shape))


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 16])
@pytest.mark.parametrize("mode", ["sqrt_eps", "floor"])
def test_l2_norm_twin_reads_the_conv_outputs_heads_in_place(rng, T, mode):
    # q's and k's heads as the GDN layer passes them: a [T, 2H, dk] view of the conv output's
    # first 2H dk columns (row stride the conv width), normed by one launch.
    import cupy as cp

    from dflash_ref.backend import get_backend

    H, dk, dv = 16, 128, 4096
    conv = rng.standard_normal((T, 2 * H * dk + dv)).astype(np.float32)
    want = l2_norm(conv[:, :2 * H * dk].reshape(T, 2 * H, dk), 1e-6, mode)
    dconv = cp.asarray(conv)
    got = get_backend("cupy").ops.l2_norm(dconv[:, :2 * H * dk].reshape(T, 2 * H, dk), 1e-6, mode)
    assert_close(cp.asnumpy(got), want, "float32_rowsum", op="l2_norm", case=f"view T={T}")
