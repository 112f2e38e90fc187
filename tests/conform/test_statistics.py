"""conform's judgements on hand cases: greedy margins, the law's cells, the two tests, the
detectable bias, the acceptance comparison (dflash_ref/testing/conform.py).

Expected values are written by hand from the definitions in the module docstring; the normal
quantile of the detectable bias is the tabulated z_{0.99975} = 3.4808.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dflash_ref.testing.conform import Policy, acceptance_check, greedy_divergences
from dflash_ref.testing.conform_law import cell_of, judge_law, law_cells
from dflash_ref.testing.lossless import Law


def test_greedy_divergence_margins_and_the_tie_rule():
    rows = np.array([[0.0, 2.0, 1.0],    # server 1 = argmax: no divergence
                     [0.0, 1.0, 0.9375],  # server 2: margin 0.0625 <= 0.125, a near-tie
                     [3.0, 1.0, 0.0],    # server 1: margin 2.0, a real divergence
                     [1.0, 1.125, 0.0]])  # server 0: margin 0.125, exactly the threshold
    div = greedy_divergences([1, 2, 1, 0], rows, tie_margin=0.125)
    assert [(d.position, d.server_token, d.reference_token) for d in div] == \
        [(1, 2, 1), (2, 1, 0), (3, 0, 1)]
    assert [d.margin for d in div] == [0.0625, 2.0, 0.125]  # binary fractions: exact
    # catches: the margin read from the wrong side, or "<" for "<=" at the threshold
    assert [d.excused for d in div] == [True, False, True]


def _rows(table):
    return lambda prefix: np.log(np.asarray(table[prefix], np.float64))


TABLE = {(): [0.75, 0.25], (0,): [0.5, 0.5], (1,): [0.2, 0.8]}


def test_law_cells_expand_only_prefixes_with_enough_expected_count():
    # n = 100: both first tokens have n p >= 20 and are expanded into pairs.
    cells = law_cells(_rows(TABLE), Law(1.0), n=100, length=2)
    assert cells == pytest.approx({(0, 0): 0.375, (0, 1): 0.375, (1, 0): 0.05, (1, 1): 0.2})
    # n = 40: token 1 has expected count 10 < 20: one cell (1,) of probability 0.25.
    cells = law_cells(_rows(TABLE), Law(1.0), n=40, length=2)
    assert cells == pytest.approx({(0, 0): 0.375, (0, 1): 0.375, (1,): 0.25})
    assert cell_of((1, 0), cells) == (1,) and cell_of((0, 1), cells) == (0, 1)


def test_law_cells_follow_the_policy():
    # top_k = 1 keeps token 0 alone at every row: one cell of probability 1.
    assert law_cells(_rows(TABLE), Law(1.0, top_k=1), n=100, length=2) == {(0, 0): 1.0}


def test_counts_at_their_expectation_pass_and_a_removed_token_fails():
    cells = {(0,): 0.5, (1,): 0.5}
    exact = [(0,)] * 50 + [(1,)] * 50
    t = judge_law(exact, cells, alpha=1e-3)
    assert t.chi2_p == pytest.approx(1.0) and t.max_deviation == 0.0 and t.holds(1e-3)
    # a token of probability 0 (no cell): fails whatever the rest
    t = judge_law(exact[:-1] + [(2,)], cells, alpha=1e-3)
    assert t.impossible == ((2,),) and not t.holds(1e-3)


def test_max_deviation_and_detectable_bias_hand_values():
    cells = {(0,): 0.5, (1,): 0.5}
    seqs = [(0,)] * 70 + [(1,)] * 30  # 70 vs 50 expected: deviation 0.2, z = 20 / 5 = 4
    t = judge_law(seqs, cells, alpha=1e-3)
    assert t.max_deviation == pytest.approx(0.2)
    # Bonferroni over m = 2 cells: p = 2 * 2 * (1 - Phi(4)) = 4 * 3.167e-5
    assert t.maxdev_p == pytest.approx(4 * 3.1671e-5, rel=1e-3)
    # delta = z_{1 - 1e-3 / 4} * sqrt(0.25 / 100) = 3.4808 * 0.05
    assert t.detectable_bias == pytest.approx(3.4808 * 0.05, rel=1e-4)
    # chi-square 1 dof: (20^2 / 50) * 2 = 16, p = erfc(sqrt(8)) = 6.334e-5
    assert t.chi2_p == pytest.approx(math.erfc(math.sqrt(8.0)), rel=1e-6)
    assert not t.holds(1e-3) and t.holds(1e-5)  # catches: a verdict on one test only


def test_acceptance_greedy_tolerance_and_sampled_z_test():
    greedy = Policy()
    assert acceptance_check(greedy, [(10, 8)], [(10, 8)], 1e-3, 0.05).holds
    assert not acceptance_check(greedy, [(10, 9)], [(10, 8)], 1e-3, 0.05).holds  # 0.9 vs 0.8
    # sampled: the same per-request rates hold; all-accepted vs a spread of rates fails
    ref = [(4, a) for a in (0, 1, 2, 3, 4) * 20]
    assert acceptance_check(Policy(1.0), ref, ref, 1e-3, 0.05).holds
    assert not acceptance_check(Policy(1.0), [(4, 4)] * 100, ref, 1e-3, 0.05).holds
