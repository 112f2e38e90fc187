"""The sampling law at its exact edges (dflash_ref/ops/sampling.py): a zero-probability token
is never drawn, at u = 0, at u -> 1 (the largest float32 and float64 uniforms below 1) and with
a subnormal total; the temperature below which decoding is greedy, at the boundary value and
its two neighbours.

Expected tokens are read off by hand from the rows (which entries are positive). A subnormal
total is what a residual ``max(p - q, 0)`` of two nearly equal laws can leave; there ``u * total``
rounds up to the total itself for u close to 1 (a subnormal has few significant bits), so the
inverse CDF runs past every positive entry.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.backend import get_backend
from dflash_ref.ops.sampling import (
    GREEDY_BELOW_TEMPERATURE,
    SamplingParams,
    sample_from_probs,
    sample_tokens,
)

TINY = np.nextafter(0.0, 1.0)  # 2^-1074, the smallest subnormal
U_NEAR_ONE = [1 - 2.0**-24, np.nextafter(1.0, 0.0)]  # float32's and float64's largest u < 1


def test_a_leading_zero_probability_token_is_never_drawn_at_u_zero():
    # Catches ``c < u * total`` (strict): at u = 0 it counts no entry and draws token 0.
    assert sample_from_probs(np.array([0.0, 0.5, 0.5]), 0.0) == 1
    assert sample_from_probs(np.array([0.0, 0.0, 2.0, 0.0]), 0.0) == 2


@pytest.mark.parametrize("u", U_NEAR_ONE)
def test_a_trailing_zero_probability_token_is_never_drawn_as_u_nears_one(u):
    assert sample_from_probs(np.array([0.5, 0.5, 0.0, 0.0]), u) == 1
    assert sample_from_probs(np.array([0.1, 0.0, 0.9, 0.0]), u) == 2


@pytest.mark.parametrize("u", [0.0, 0.5, *U_NEAR_ONE])
def test_subnormal_totals_draw_only_positive_tokens(u):
    # Catches the fall-back to the last positive token dropped (u * 3 TINY rounds to 3 TINY:
    # the count runs to V = 4) or found with ``>= 0`` (token 3, of probability 0).
    assert sample_from_probs(np.array([0.0, 3 * TINY, 0.0, 0.0]), u) == 1
    two = np.array([TINY, 0.0, TINY, 0.0])  # cumsum [t, t, 2t, 2t]
    assert sample_from_probs(two, u) == (0 if u < 0.5 else 2)


def test_subnormal_rows_are_sampled_row_by_row():
    probs = np.array([[0.0, 3 * TINY, 0.0], [TINY, 0.0, 0.0], [0.0, 0.0, 5 * TINY]])
    u = np.array(U_NEAR_ONE + [0.0])
    assert sample_from_probs(probs, u).tolist() == [1, 0, 2]


def _seed_with_first_draw_above_half() -> int:
    return next(s for s in range(100) if np.random.default_rng(s).random() > 0.5)


def test_the_greedy_threshold_is_strict_at_its_boundary_value():
    # "Below T = 1e-5 decoding is greedy": 1e-5 itself samples. Catches ``T <= 1e-5``.
    t = GREEDY_BELOW_TEMPERATURE
    assert t == 1e-5
    assert SamplingParams(np.nextafter(t, 0.0)).greedy
    assert not SamplingParams(t).greedy
    assert not SamplingParams(np.nextafter(t, 1.0)).greedy
    assert SamplingParams(0.0).greedy
    # Two tied logits: the argmax is token 0; a draw u > 1/2 picks token 1.
    be, seed = get_backend("numpy"), _seed_with_first_draw_above_half()
    logits = np.zeros((1, 2), np.float32)
    assert sample_tokens(be, logits, SamplingParams(t, seed=seed), seed).tolist() == [1]
    below = SamplingParams(np.nextafter(t, 0.0), seed=seed)
    assert sample_tokens(be, logits, below, seed).tolist() == [0]
