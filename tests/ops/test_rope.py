"""rope: hand-checked values, properties (norm, relative position, composition), NumPy vs CuPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.ops.rope import rope, rope_inv_freq
from dflash_ref.testing import Tolerance, assert_close
from tests.gpu import check_twin
from tests.strategies import f32_arrays

# ---------------------------------------------------------------- unit: hand-checked values


def test_rope_inv_freq_hand_values():
    # theta^(-2i/d) for d = 4, theta = 10000: [1, 10000^-0.5] = [1, 0.01].
    assert_close(rope_inv_freq(10000.0, 4), [1.0, 0.01], "float32_elementwise", op="rope_inv_freq")


def test_linear_scaling_divides_the_frequencies():
    # factor 8 (Gemma 3 global layers): position 8 with factor 8 == position 1 without scaling.
    assert_close(rope_inv_freq(10000.0, 4, factor=8.0), [1 / 8, 0.01 / 8], "float32_elementwise",
                 op="rope_inv_freq", case="linear factor 8")
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]])
    assert_close(rope(x, np.array([8]), 1e4, factor=8.0), rope(x, np.array([1]), 1e4),
                 "float32_rope", op="rope", case="linear factor 8")


def test_rope_single_pair_rotates_by_position():
    # d = 2, inv_freq = [1]: [1, 0] at position p -> [cos p, sin p].
    x = np.array([[[1.0, 0.0]], [[1.0, 0.0]]])  # [T=2, H=1, d=2]
    y = rope(x, np.array([0, 1]), theta=10000.0)
    assert_close(y[:, 0], [[1.0, 0.0], [np.cos(1.0), np.sin(1.0)]], "float32_vs_float64",
                 op="rope")


def test_rope_neox_halves_hand_values():
    # d = 4, theta = 1e4 -> inv_freq [1, 0.01]; position 2 -> angles [2, 0.02].
    # NEOX pairs channel j with j + d/2: (x0, x2) rotate by 2, (x1, x3) by 0.02.
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]])
    c0, s0, c1, s1 = np.cos(2.0), np.sin(2.0), np.cos(0.02), np.sin(0.02)
    expected = [1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 3 * c0 + 1 * s0, 4 * c1 + 2 * s1]
    assert_close(rope(x, np.array([2]), 1e4)[0, 0], expected, "float32_vs_float64", op="rope")


def test_partial_rotary_leaves_tail_channels():
    # rotary_dim = 2 of d = 4: channels (0, 1) rotate with inv_freq [1]; channels 2, 3 pass.
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]])
    c, s = np.cos(3.0), np.sin(3.0)
    expected = [1 * c - 2 * s, 2 * c + 1 * s, 3.0, 4.0]
    assert_close(rope(x, np.array([3]), 1e4, rotary_dim=2)[0, 0], expected, "float32_vs_float64",
                 op="rope", case="partial rotary")


def test_rope_rejects_bad_arguments():
    x = np.zeros((2, 1, 4), np.float32)
    with pytest.raises(ValueError, match="positions"):
        rope(x, np.array([0, 1, 2]), 1e4)
    with pytest.raises(ValueError, match="rotary_dim"):
        rope(x, np.array([0, 1]), 1e4, rotary_dim=6)
    with pytest.raises(ValueError, match="theta"):
        rope(x, np.array([0, 1]), 0.0)


# ---------------------------------------------------------------- property tests

HEAD_DIMS = st.sampled_from([2, 4, 6, 64, 128])


@given(st.data())
def test_rope_preserves_head_norms(data):
    d = data.draw(HEAD_DIMS)
    T, H = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 3))
    x = data.draw(f32_arrays((T, H, d))).astype(np.float64)
    pos = np.array(data.draw(st.lists(st.integers(0, 40000), min_size=T, max_size=T)))
    y = rope(x, pos, 1e6)
    assert_close(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), "float64", op="rope")


@given(st.data())
def test_rope_scores_depend_only_on_relative_position(data):
    # q(m) . k(n) == q(m + s) . k(n + s): the defining property of RoPE.
    d = data.draw(HEAD_DIMS)
    q = data.draw(f32_arrays((1, 1, d), -1, 1)).astype(np.float64)
    k = data.draw(f32_arrays((1, 1, d), -1, 1)).astype(np.float64)
    m, n, s = (data.draw(st.integers(0, 2000)) for _ in range(3))
    theta = data.draw(st.sampled_from([1e4, 1e6, 1e7]))

    def score(a, b):
        return float(np.sum(rope(q, np.array([a]), theta) * rope(k, np.array([b]), theta)))

    # Angles are float32 products (HF numerics), so shifted angles round differently, by up to
    # 2 ulp(6000) ~ 1e-3 rad; each rotated pair then moves by <= |q_pair| |k_pair| 1e-3, and
    # by Cauchy-Schwarz the score by <= 1e-3 |q| |k|. A position-dependent bug moves it by ~|q||k|.
    bound = 1e-3 * np.linalg.norm(q) * np.linalg.norm(k) + 1e-12
    assert abs(score(m, n) - score(m + s, n + s)) <= bound


@given(st.data())
def test_rope_at_zero_is_identity_and_composes(data):
    d = data.draw(HEAD_DIMS)
    x = data.draw(f32_arrays((2, 2, d))).astype(np.float64)
    assert_close(rope(x, np.zeros(2, int), 1e4), x, "float64", op="rope", case="position 0")
    x = x / max(1.0, float(np.abs(x).max()))  # |x| <= 1
    a, b = data.draw(st.integers(0, 100)), data.draw(st.integers(0, 100))
    twice = rope(rope(x, np.full(2, a), 1e4), np.full(2, b), 1e4)
    # Angles are float32 products: a f + b f and (a + b) f round differently, by up to about
    # ulp(200) = 1.5e-5 rad per term; with |x| <= 1 the output moves by at most ~3e-5.
    tol = Tolerance(0.0, 1e-4, "float32 angles a*f + b*f vs (a+b)*f round differently")
    assert_close(twice, rope(x, np.full(2, a + b), 1e4), tol, op="rope", case="composition")


# ---------------------------------------------------------------- NumPy vs CuPy (gpu)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "T,H,d,rotary_dim,theta,factor",
    [(1, 1, 2, None, 1e4, 1.0), (7, 3, 64, None, 1e6, 1.0), (33, 8, 128, None, 1e7, 1.0),
     (5, 2, 256, 64, 1e7, 1.0), (16, 4, 128, 32, 1e4, 1.0), (9, 2, 128, None, 1e6, 8.0)],
)
def test_rope_twin(rng, T, H, d, rotary_dim, theta, factor):
    x = rng.standard_normal((T, H, d)).astype(np.float32)
    pos = rng.integers(0, 40000, size=T)
    check_twin("rope", (x, pos, theta), {"rotary_dim": rotary_dim, "factor": factor},
               "float32_rope",
               case=f"T={T} H={H} d={d} rd={rotary_dim}")
