"""qk_norm_rope: the q/k norms and RoPE of an attention layer as one op (dflash_ref/ops/rope.py).

Expected values are an independent float64 form: the norm from ``np.linalg.norm`` and RoPE as
complex multiplication (channel pair (j, j + rd/2) is the complex number x_j + i x_{j+rd/2},
turned by ``exp(i pos inv_freq_j)``), never the op's own composition. The composition is what
the op must equal bit for bit (the reference layer's four calls, dflash_ref/models/layers.py
``NormRope``), checked separately. The twin reads q and k in place from the stacked q/k/v product
(the column slices ``Projections`` returns) and from a [q | gate] head (Qwen3.5): the ``gpu``
tests pass exactly those views; tests/kernels/test_qk_norm_rope_plan.py emulates the kernel.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.backend import get_backend
from dflash_ref.ops.norm import rms_norm
from dflash_ref.ops.rope import qk_norm_rope, rope
from dflash_ref.testing import assert_close
from tests.gpu import check_twin
from tests.strategies import f32_arrays


def closed_form(x, pos, weight, eps, offset, theta, rd=None, factor=1.0):
    """x [T, h, d] float64: per-head RMSNorm (weight None: none), then RoPE as complex turns."""
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    rd = d if rd is None else rd
    if weight is not None:
        rms = np.linalg.norm(x, axis=-1, keepdims=True) / np.sqrt(d)  # sqrt(mean x^2)
        x = x / np.sqrt(rms ** 2 + eps) * (offset + np.asarray(weight, np.float64))
    # The angle is HF's float32 product (docs/backend.md, "RoPE angle precision"), by hand:
    # inv_freq = 1 / theta^(2i/rd) / factor and pos * inv_freq, each rounded to float32.
    f32 = np.float32
    inv = f32(1) / f32(theta) ** (np.arange(0, rd, 2).astype(f32) / f32(rd)) / f32(factor)
    angle = np.asarray(pos).astype(f32)[:, None, None] * inv.astype(f32)  # [T, 1, rd/2] f32
    turn = np.exp(1j * angle.astype(np.float64))  # [T, 1, rd/2]
    z = (x[..., : rd // 2] + 1j * x[..., rd // 2: rd]) * turn
    return np.concatenate([z.real, z.imag, x[..., rd:]], axis=-1)


def test_hand_values_one_head():
    # q = [3, 4] (rms sqrt(12.5)), weight [1, 1], eps 0, position 0: only the norm acts.
    q = np.array([[[3.0, 4.0]]])
    k = np.array([[[1.0, 0.0]]])
    yq, yk = qk_norm_rope(q, k, np.array([0]), np.ones(2), None, 0.0, 0.0, 1e4)
    assert_close(yq[0, 0], np.array([3.0, 4.0]) / np.sqrt(12.5), "float64", op="qk_norm_rope")
    assert_close(yk[0, 0], [1.0, 0.0], "float64", op="qk_norm_rope", case="no k norm")
    # Position 2 (d = 2, inv_freq [1]): k = [1, 0] turns to [cos 2, sin 2].
    _, yk = qk_norm_rope(q, k, np.array([2]), None, None, 0.0, 0.0, 1e4)
    assert_close(yk[0, 0], [np.cos(2.0), np.sin(2.0)], "float64", op="qk_norm_rope",
                 case="position 2")


@pytest.mark.parametrize("rd,factor,offset,norms", [
    (None, 1.0, 0.0, (True, True)),    # Qwen3
    (None, 8.0, 1.0, (True, True)),    # Gemma 3 global layers: (1 + w), linear factor 8
    (16, 1.0, 1.0, (True, True)),      # Qwen3.5 full attention: partial rotary
    (None, 1.0, 0.0, (False, False)),  # no q/k norms (Identity)
    (32, 1.0, 0.0, (True, False)),     # one side normed
])
def test_matches_the_float64_closed_form(rng, rd, factor, offset, norms):
    T, nq, nk, d = 5, 4, 2, 64
    q = rng.standard_normal((T, nq, d))
    k = 3 * rng.standard_normal((T, nk, d))
    w = [0.5 + rng.random(d) if n else None for n in norms]
    pos = rng.integers(0, 5000, T)
    yq, yk = qk_norm_rope(q, k, pos, w[0], w[1], 1e-6, offset, 1e6, rd, factor)
    assert_close(yq, closed_form(q, pos, w[0], 1e-6, offset, 1e6, rd, factor), "float64",
                 op="qk_norm_rope", tensor="q")
    assert_close(yk, closed_form(k, pos, w[1], 1e-6, offset, 1e6, rd, factor), "float64",
                 op="qk_norm_rope", tensor="k")


@given(st.data())
def test_equals_the_four_reference_calls_bit_for_bit(data):
    # What NormRope runs: rms_norm on the (strided) q and k views, then rope of each.
    T, nq, nk = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 4)), data.draw(
        st.integers(1, 3))
    d = data.draw(st.sampled_from([2, 6, 64, 130]))
    stacked = data.draw(f32_arrays((T, (nq + 2 * nk) * d)))  # [T, (nq + 2 nk) d]: q | k | v
    q = stacked[:, : nq * d].reshape(T, nq, d)
    k = stacked[:, nq * d: (nq + nk) * d].reshape(T, nk, d)
    wq, wk = data.draw(f32_arrays((d,))), data.draw(f32_arrays((d,)))
    pos = np.arange(T) + data.draw(st.integers(0, 70000))
    rd = data.draw(st.sampled_from([None, 2]))
    offset = data.draw(st.sampled_from([0.0, 1.0]))
    yq, yk = qk_norm_rope(q, k, pos, wq, wk, 1e-6, offset, 1e6, rd, 8.0)
    np.testing.assert_array_equal(yq, rope(rms_norm(q, wq, 1e-6, offset), pos, 1e6, rd, 8.0))
    np.testing.assert_array_equal(yk, rope(rms_norm(k, wk, 1e-6, offset), pos, 1e6, rd, 8.0))


def test_keys_only(rng):
    # q None (the drafter's context keys): k alone, q' None; the same k' as with queries.
    q, k = rng.standard_normal((3, 2, 8)), rng.standard_normal((3, 1, 8))
    w, pos = 0.5 + rng.random(8), np.array([4, 9, 70000])
    none, yk = qk_norm_rope(None, k, pos, None, w, 1e-6, 1.0, 1e4, 4)
    assert none is None
    np.testing.assert_array_equal(yk, qk_norm_rope(q, k, pos, w, w, 1e-6, 1.0, 1e4, 4)[1])
    assert_close(yk, closed_form(k, pos, w, 1e-6, 1.0, 1e4, 4), "float64", op="qk_norm_rope",
                 case="keys only")


def test_rejects_bad_arguments():
    q, k, pos = np.zeros((2, 4, 8)), np.zeros((2, 2, 8)), np.arange(2)
    with pytest.raises(ValueError, match=r"q \[T, nq, d\]"):
        qk_norm_rope(q[0], k, pos, None, None, 1e-6, 0.0, 1e4)
    with pytest.raises(ValueError, match="same number of tokens"):
        qk_norm_rope(q, k[:1], pos, None, None, 1e-6, 0.0, 1e4)
    with pytest.raises(ValueError, match="same number of tokens"):
        qk_norm_rope(q, np.zeros((2, 2, 4)), pos, None, None, 1e-6, 0.0, 1e4)
    with pytest.raises(ValueError, match="rotary_dim"):
        qk_norm_rope(q, k, pos, None, None, 1e-6, 0.0, 1e4, rotary_dim=10)
    with pytest.raises(ValueError, match="positions"):
        qk_norm_rope(q, k, np.arange(3), None, None, 1e-6, 0.0, 1e4)


# ---------------------------------------------------------------- NumPy vs CuPy (gpu)

CASES = [  # T, nq, nk, d, rotary_dim, factor, offset, which sides are normed
    (1, 32, 8, 128, None, 1.0, 0.0, (True, True)),    # a Qwen3-4B decode
    (16, 32, 8, 128, None, 1.0, 0.0, (True, True)),   # its 16-row verify
    (7, 8, 4, 256, None, 8.0, 1.0, (True, True)),     # Gemma 3 global: d 256, (1 + w), factor
    (5, 16, 2, 256, 64, 1.0, 1.0, (True, True)),      # Qwen3.5 full attention: partial rotary
    (3, 6, 3, 66, None, 1.0, 0.0, (False, False)),    # no q/k norms, d % 4 != 0
    (9, 3, 1, 130, 2, 1.0, 0.0, (True, False)),       # one side normed, d > QK_THREADS
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=str)
def test_twin_on_contiguous_inputs(rng, case):
    T, nq, nk, d, rd, factor, offset, norms = case
    q = rng.standard_normal((T, nq, d)).astype(np.float32)
    k = (3 * rng.standard_normal((T, nk, d))).astype(np.float32)
    wq, wk = ((0.5 + rng.random(d)).astype(np.float32) if n else None for n in norms)
    pos = rng.integers(0, 40000, T)
    check_twin("qk_norm_rope", (q, k, pos, wq, wk, 1e-6, offset, 1e6),
               {"rotary_dim": rd, "factor": factor}, "float32_rope", case=str(case))


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("layout", ["qkv", "gated"])
def test_twin_reads_the_stacked_product_in_place(rng, case, layout):
    # q and k as the layer passes them: column slices of the stacked q/k/v product ("qkv"), or
    # with each q head packed as [q | gate] (Qwen3.5, "gated": head stride 2d). Positions as the
    # target passes them: a device int32 array.
    import cupy as cp

    T, nq, nk, d, rd, factor, offset, norms = case
    qw = 2 * d if layout == "gated" else d
    y = rng.standard_normal((T, nq * qw + 2 * nk * d)).astype(np.float32)
    wq, wk = ((0.5 + rng.random(d)).astype(np.float32) if n else None for n in norms)
    pos = rng.integers(0, 40000, T).astype(np.int32)

    def views(y):
        q = y[:, : nq * qw].reshape(T, nq, qw)[..., :d]  # [T, nq, d], rows and heads strided
        k = y[:, nq * qw: nq * qw + nk * d].reshape(T, nk, d)
        return q, k

    expected = qk_norm_rope(*views(y), pos, wq, wk, 1e-6, offset, 1e6, rd, factor)
    cp_ops = get_backend("cupy").ops
    dev = [None if w is None else cp.asarray(w) for w in (wq, wk)]
    got = cp_ops.qk_norm_rope(*views(cp.asarray(y)), cp.asarray(pos), *dev, 1e-6, offset, 1e6,
                              rd, factor)
    for name, g, e in zip("qk", got, expected):
        assert g.flags.c_contiguous
        assert_close(cp.asnumpy(g), e, "float32_rope", op="qk_norm_rope", tensor=name,
                     case=f"{layout} {case}")
    # keys only (q None), k read in place: the drafter's context keys
    none, yk = cp_ops.qk_norm_rope(None, views(cp.asarray(y))[1], cp.asarray(pos), None, dev[1],
                                   1e-6, offset, 1e6, rd, factor)
    assert none is None
    assert_close(cp.asnumpy(yk), expected[1], "float32_rope", op="qk_norm_rope", tensor="k",
                 case=f"keys only {layout} {case}")
