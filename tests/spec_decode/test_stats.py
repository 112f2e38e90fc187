"""tau, acceptance rate, per-position acceptance (docs/spec_decode.md): hand values, identities."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.spec_decode.stats import (
    AcceptanceStats,
    acceptance_histogram,
    acceptance_rate,
    per_position_accepted,
    tau_per_response,
    tau_pooled,
)


def test_tau_per_response_vs_pooled_hand_values():
    # Response 1: acceptance lengths 1, 3 (mean 2); response 2: 5 (mean 5).
    # Authors (per response, then mean): (2 + 5) / 2 = 3.5. Pooled: (1 + 3 + 5) / 3 = 3.
    assert tau_per_response([[1, 3], [5]]) == 3.5
    assert tau_pooled([1, 3, 5]) == 3.0
    assert tau_per_response([[1, 3], [], [5]]) == 3.5  # a response without steps has no tau
    with pytest.raises(ValueError):
        tau_pooled([])


def test_acceptance_rate_and_per_position_hand_values():
    # a = 0, 2, 4 of k = 15 each: rate 6 / 45. Position j accepted when a >= j:
    # j = 1: 2 steps (a=2, a=4), j = 2: 2, j = 3: 1, j = 4: 1, j >= 5: 0.
    assert acceptance_rate([0, 2, 4], [15, 15, 15]) == pytest.approx(6 / 45)
    assert per_position_accepted([0, 2, 4], 6).tolist() == [2, 2, 1, 1, 0, 0]
    assert per_position_accepted([], 3).tolist() == [0, 0, 0]


def test_histogram_bins_0_to_B():
    # acceptance lengths 1, 1, 3, 16 with B = 16: 17 bins, bin 0 always empty for a verify step.
    h = acceptance_histogram([1, 1, 3, 16], 16)
    assert h.shape == (17,) and h[1] == 2 and h[3] == 1 and h[16] == 1 and h.sum() == 4
    with pytest.raises(ValueError, match=r"\[0, 16\]"):
        acceptance_histogram([17], 16)


def test_published_rate_to_tau():
    # vllm-project/vllm pull 41703 (docs/spec_decode.md, "tau versus acceptance rate"): a 44.69%
    # draft acceptance rate with k = 15 is tau = 1 + 0.4469 * 15 = 7.7035 tokens per step (not
    # 44.69% of 16). 10000 steps with sum(a) = 0.4469 * 15 * 10000 = 67035:
    # 7035 steps of a = 7 and 2965 of a = 6 (49245 + 17790).
    st_ = AcceptanceStats(block_size=16)
    for a in [7] * 7035 + [6] * 2965:
        st_.record(a, 15)
    assert st_.acceptance_rate == pytest.approx(0.4469, rel=1e-12)
    assert st_.tau_pooled == pytest.approx(7.7035, rel=1e-12)


def test_accumulator_hand_values():
    s = AcceptanceStats(block_size=4)
    s.start_response()
    s.record(0, 3)
    s.record(3, 3)
    s.start_response()
    s.record(1, 3)
    # per response: (1 + 4) / 2 = 2.5 and 2 -> tau 2.25; pooled (1 + 4 + 2) / 3 = 7/3.
    assert s.tau == 2.25 and s.tau_pooled == pytest.approx(7 / 3)
    assert s.acceptance_rate == pytest.approx(4 / 9)
    acc, drafted = s.per_position()
    assert acc.tolist() == [2, 1, 1] and drafted.tolist() == [3, 3, 3]
    np.testing.assert_allclose(s.per_position_rate(), [2 / 3, 1 / 3, 1 / 3])
    assert s.histogram().tolist() == [0, 1, 1, 0, 1]
    with pytest.raises(ValueError):
        s.record(4, 3)


@given(st.integers(1, 15), st.lists(st.lists(st.integers(0, 15), min_size=1, max_size=20),
                                   min_size=1, max_size=5))
def test_tau_equals_one_plus_rate_times_k(k, responses):
    # For a fixed k: pooled tau = 1 + rate * k, and per response tau_r = 1 + rate_r * k, so the
    # authors' tau = 1 + k * mean_r(rate_r).
    responses = [[min(a, k) for a in r] for r in responses]
    s = AcceptanceStats(block_size=k + 1)
    for r in responses:
        s.start_response()
        for a in r:
            s.record(a, k)
    assert s.tau_pooled == pytest.approx(1 + s.acceptance_rate * k, rel=1e-12)
    rates = [acceptance_rate(r, [k] * len(r)) for r in responses]
    assert s.tau == pytest.approx(1 + k * float(np.mean(rates)), rel=1e-12)
    assert 1 <= s.tau <= k + 1 and 1 <= s.tau_pooled <= k + 1
    acc, drafted = s.per_position()
    assert acc.sum() == sum(a for r in responses for a in r)  # sum over positions = sum of a
    assert np.all(np.diff(acc) <= 0)  # position j accepted implies all before it were
    assert np.all(drafted == s.n_steps)
