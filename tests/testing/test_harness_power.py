"""The lossless harness (dflash_ref/testing/lossless.py) against wrong samplers of every kind it
claims to catch, each planted here, and against correct ones at its stated false-alarm rate.

The planted samplers are cheap (plain sampling with one fault), so the harness runs at its
default N_TRIALS where the fault needs it. Expected values: binomial tails from sums of
``math.comb`` terms, normal quantiles from tables, hand cases for the events.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from dflash_ref.testing.chisquare import binom_cdf, binom_sf, normal_isf, normal_sf
from dflash_ref.testing.lossless import (
    N_TRIALS,
    P_VALUE_THRESHOLD,
    Law,
    check_lossless,
    events,
    max_deviation_test,
    sampling_law,
    sequence_law,
    tail_test,
    toy_target,
)

V, L = 4, 2
LENGTH = L + 1
DRAFT = np.zeros((L, V))  # the planted samplers read no drafts


CDFS: dict = {}


def draw(target, prefix: tuple, law: Law, u: float) -> int:
    """One token of ``sampling_law(target(prefix), law)`` by inverse CDF (tables cached)."""
    key = (id(target), prefix, law)
    if key not in CDFS:
        p = sampling_law(target(prefix), law)
        CDFS[key] = (np.cumsum(p), int(np.flatnonzero(p > 0)[-1]), target)
    cdf, last, _ = CDFS[key]
    return min(int(np.searchsorted(cdf, u, side="right")), last)


def plain_tokens(target, rng, law: Law, n: int, prefix=(), first_law: Law | None = None):
    """``n`` tokens of plain sampling after ``prefix``; the first from ``first_law`` if given."""
    out = tuple(prefix)
    for j in range(n):
        out = (*out, draw(target, out, first_law if (j == 0 and first_law) else law,
                          rng.random()))
    return out


def plain_step(law: Law):
    """Lossless by definition: L + 1 tokens of plain sampling."""
    return lambda target, dl, rng: plain_tokens(target, rng, law, LENGTH)


# -- the statistics' pieces, against independent values ----------------------------------------


@pytest.mark.parametrize(("n", "p"), [(10, 0.3), (60, 0.01), (400, 0.5), (2000, 0.002)])
def test_binomial_tails_equal_the_sums_of_their_terms(n, p):
    # Catches a shifted tail (I_p(k + 1, n - k) for P(X >= k)) or swapped arguments.
    terms = [math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                      + i * math.log(p) + (n - i) * math.log1p(-p)) for i in range(n + 1)]
    for k in sorted({0, 1, 2, n // 7, n // 3, n // 2, n - 1, n}):
        sf, cdf = math.fsum(terms[k:]), math.fsum(terms[:k + 1])
        assert binom_sf(k, n, p) == pytest.approx(sf, rel=1e-9, abs=1e-300), k
        assert binom_cdf(k, n, p) == pytest.approx(cdf, rel=1e-9, abs=1e-300), k


def test_normal_quantiles_match_the_tables():
    assert normal_isf(0.025) == pytest.approx(1.959963985, abs=1e-8)
    assert normal_isf(1e-4) == pytest.approx(3.719016485, abs=1e-8)
    assert normal_sf(0.0) == 0.5


def test_events_hand_case():
    # Two tokens, length 2; exact law (0,0) .5, (0,1) .25, (1,0) .25; seen 2, 1, 1.
    exact = {(0, 0): 0.5, (0, 1): 0.25, (1, 0): 0.25}
    got = {label: (o, p) for label, o, p in events(Counter({(0, 0): 2, (0, 1): 1, (1, 0): 1}),
                                                  exact, 2)}
    assert got["x_1..x_1 = (0,)"] == (3, 0.75)
    assert got["x_1..x_1 = (1,)"] == (1, 0.25)
    assert got["x_1..x_2 = (0, 1)"] == (1, 0.25)
    assert got["x_2 = 0"] == (3, 0.75)  # the second position's marginal: (0,0) + (1,0)
    assert got["x_2 = 1"] == (1, 0.25)
    assert len(got) == 2 + 3 + 2


def test_tail_and_max_deviation_hand_case():
    # One event seen 3 times in 100 draws with p = 1e-4: P(X >= 3) = 1.6e-7 (sum of terms), two
    # events: Bonferroni doubles the two-sided 2 x 1.6e-7.
    evs = [("a", 3, 1e-4), ("b", 97, 1 - 1e-4)]
    sf3 = math.fsum(math.comb(100, i) * 1e-4 ** i * (1 - 1e-4) ** (100 - i) for i in range(3, 101))
    p, worst = tail_test(evs, 100)
    assert p == pytest.approx(2 * 2 * sf3, rel=1e-9)
    assert worst[0] in ("a", "b") and worst[1] in (3, 97)
    # D = max |f - p| = 0.03 - 1e-4; s = sqrt(1e-4 (1 - 1e-4) / 100) for both events.
    d, d_p, bound = max_deviation_test(evs, 100)
    s = math.sqrt(1e-4 * (1 - 1e-4) / 100)
    assert d == pytest.approx(0.03 - 1e-4, rel=1e-12)
    assert d_p == pytest.approx(min(1.0, 4 * normal_sf(d / s)), abs=1e-300)
    assert bound == pytest.approx(s * normal_isf(P_VALUE_THRESHOLD / 4), rel=1e-9)


# -- wrong samplers, each rejected --------------------------------------------------------------


@pytest.mark.parametrize(("t_first", "seed", "n_trials"), [(0.88, 16, None), (0.85, 11, 20_000)])
def test_a_first_token_drawn_at_a_nearby_temperature_fails(t_first, seed, n_trials):
    # Every position right but x_1, drawn at T' instead of T = 1: at 4000 draws this passes
    # (seed 16: the chi-square needs ~13000 draws at T' = 0.88); at N_TRIALS (ds4's 50,000) it
    # fails, and the report names position 1 (a harness that dropped the marginals would not).
    law = Law(1.0)

    def step(target, dl, rng):
        return plain_tokens(target, rng, law, LENGTH, first_law=Law(t_first))

    kw = {"n_trials": n_trials} if n_trials else {}
    report = check_lossless(step, toy_target(V, seed=seed), DRAFT, law, **kw)
    assert report.n_trials == (n_trials or N_TRIALS)
    assert not report.ok(), report.explain()
    assert report.marginal_p[0] < P_VALUE_THRESHOLD, report.explain()


def test_a_second_token_drawn_at_a_nearby_temperature_fails():
    # The fault only in x_2's conditional law (T' = 0.85): position 2's marginal moves.
    law = Law(1.0)

    def step(target, dl, rng):
        x1 = plain_tokens(target, rng, law, 1)
        return plain_tokens(target, rng, law, 2, prefix=x1, first_law=Law(0.85))

    report = check_lossless(step, toy_target(V, seed=11), DRAFT, law, n_trials=20_000)
    assert not report.ok() and report.marginal_p[1] < P_VALUE_THRESHOLD, report.explain()


def rarest(target, law):
    exact = sequence_law(target, law, LENGTH)
    return min(exact, key=exact.get), exact


def test_a_rare_sequence_over_produced_fails_though_the_chi_square_pools_it_away():
    # One step in 500 emits the least likely sequence (p ~ 3e-7): a few sightings where 0.001
    # are expected. Pearson's statistic pools that cell with the other rare ones and passes; the
    # exact tail test of each event does not.
    law, target = Law(1.0), toy_target(V, seed=11)
    rare, exact = rarest(target, law)
    assert exact[rare] < 1e-6

    def step(t, dl, rng):
        return rare if rng.random() < 0.002 else plain_tokens(t, rng, law, LENGTH)

    report = check_lossless(step, target, DRAFT, law, n_trials=4000)
    assert report.joint_p > P_VALUE_THRESHOLD and min(report.marginal_p) > P_VALUE_THRESHOLD
    assert report.tail_p < 1e-6, report.explain()
    assert report.worst[0] == f"x_1..x_3 = {rare}" and not report.ok()


def test_a_common_sequence_under_produced_fails_the_two_sided_tail():
    # The likeliest sequence redrawn once in four: under-production, caught below as well as
    # above (a one-sided tail would miss it).
    law, target = Law(1.0), toy_target(V, seed=11)
    exact = sequence_law(target, law, LENGTH)
    top = max(exact, key=exact.get)

    def step(t, dl, rng):
        out = plain_tokens(t, rng, law, LENGTH)
        return plain_tokens(t, rng, law, LENGTH) if out == top and rng.random() < 0.25 else out

    report = check_lossless(step, target, DRAFT, law, n_trials=4000)
    assert report.tail_p < P_VALUE_THRESHOLD, report.explain()
    assert report.worst[1] < report.worst[2]  # seen fewer than expected


@pytest.mark.parametrize("where", [1, 2])
def test_a_token_top_k_removes_fails_at_once(where):
    # Under top-k 2, one step in 1000 puts a removed token at position ``where``: probability 0,
    # so the report lists it as impossible and every p-value is 0.
    law, target = Law(1.0, top_k=2), toy_target(V, seed=11)

    def step(t, dl, rng):
        out = plain_tokens(t, rng, law, where - 1)
        if rng.random() < 0.001:
            removed = int(np.flatnonzero(sampling_law(t(out), law) == 0)[0])
            return (*out, removed)
        return plain_tokens(t, rng, law, LENGTH - len(out), prefix=out)

    report = check_lossless(step, target, DRAFT, law, n_trials=4000)
    assert report.impossible and len(report.impossible[0]) == where, report.explain()
    assert not report.ok() and report.p_value == 0.0


def test_the_max_deviation_sees_a_biased_first_token():
    # ds4's statistic: a first token whose law is p tilted toward its likeliest token by 0.05
    # (half the time the argmax, else p renormalised) deviates by ~0.05 > the run's bound.
    law, target = Law(1.0), toy_target(V, seed=11)
    p = sampling_law(target(()), law)
    tilted = 0.9 * p + 0.1 * np.eye(V)[np.argmax(p)]

    def step(t, dl, rng):
        x1 = (int(rng.choice(V, p=tilted)),)
        return plain_tokens(t, rng, law, L, prefix=x1)

    report = check_lossless(step, target, DRAFT, law, n_trials=20_000)
    assert report.max_deviation == pytest.approx(0.1 * (1 - p.max()), abs=0.012)
    assert report.max_deviation > report.max_deviation_bound
    assert report.max_deviation_p < P_VALUE_THRESHOLD, report.explain()


# -- correct samplers pass, at the stated false-alarm rate --------------------------------------


def test_plain_sampling_passes_at_the_default_count_with_a_small_deviation():
    # ds4's figure for a correct sampler at 50,000 draws: max deviation ~0.002.
    law = Law(0.9, top_k=3, top_p=0.9)
    report = check_lossless(plain_step(law), toy_target(V, seed=11), DRAFT, law)
    assert report.ok(), report.explain()
    assert report.max_deviation < 0.006 < report.max_deviation_bound
    assert report.false_alarm_bound() == pytest.approx((LENGTH + 3) * P_VALUE_THRESHOLD)


def test_the_false_alarm_rate_of_a_correct_sampler_is_within_its_bound():
    # 30 runs of a lossless sampler (different seeds and targets) at a loose threshold 0.01:
    # the union bound allows (L + 4) x 0.01 = 0.06 of them to fail, ~1.8; more than 6 (P < 0.5%
    # for Binomial(30, 0.06)) means a p-value is too small (a Bonferroni factor dropped, the
    # deviation scaled by the smallest standard error).
    law = Law(1.0)
    fails = sum(not check_lossless(plain_step(law), toy_target(V, seed=s), DRAFT, law,
                                   n_trials=1000, seed=s).ok(0.01) for s in range(30))
    assert fails <= 6
