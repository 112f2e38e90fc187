"""The break-even model (dflash_ref/spec_decode/break_even.py) against closed forms worked out by
hand: a step of constant cost C pays from tau = s C / P; a verify of exactly a + 1 rows whose
cost is linear in its rows, ``F + k tau``, from tau = s F / (P - s k); the spans of a lazy
grouping summed by hand; the geometric law's tau ``(1 - alpha^B) / (1 - alpha)``.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.spec_decode.break_even import (
    EAGER,
    ORACLE,
    Form,
    RowCosts,
    break_even_tau,
    geometric_alpha,
    geometric_law,
    law_tau,
    measured_law,
    speedup,
    step_ms,
)

# B = 4; L(r) + H(r) = 8 + 2r; D + R = 2; plain 11 ms a token
LINEAR = RowCosts(layers=(5.0, 6.0, 7.0, 8.0), head=(5.0, 6.0, 7.0, 8.0), draft=1.5, rest=0.5,
                  plain=11.0)


def test_eager_pays_from_tau_s_c_over_p():
    # C = 2 + L(4) + H(4) = 18 whatever is accepted: speedup = tau * 11 / 18.
    # Catches a cost that grows with a in the eager form, or a bisection that keeps the wrong end.
    assert [step_ms(LINEAR, EAGER, a) for a in range(4)] == [18.0] * 4
    assert break_even_tau(LINEAR, EAGER, 1.0) == pytest.approx(18 / 11, abs=1e-6)
    assert break_even_tau(LINEAR, EAGER, 1.3) == pytest.approx(1.3 * 18 / 11, abs=1e-6)


def test_the_oracle_pays_from_tau_s_f_over_p_minus_s_k():
    # cost(a) = 2 + 8 + 2 (a + 1): E[cost] = 10 + 2 tau; tau 11 / (10 + 2 tau) = s.
    # Catches rows(a) for rows(a + 1) (the bonus's row), which moves both answers.
    assert [step_ms(LINEAR, ORACLE, a) for a in range(4)] == [12.0, 14.0, 16.0, 18.0]
    assert break_even_tau(LINEAR, ORACLE, 1.0) == pytest.approx(10 / 9, abs=1e-6)
    assert break_even_tau(LINEAR, ORACLE, 1.3) == pytest.approx(13 / (11 - 2.6), abs=1e-6)


def test_a_form_already_paying_at_alpha_zero_says_tau_one_and_one_never_paying_says_none():
    cheap = RowCosts((1.0,) * 4, (1.0,) * 4, 0.0, 0.0, plain=10.0)
    assert break_even_tau(cheap, ORACLE, 1.0) == 1.0  # 1 token for 2 ms against 10
    # eager at 18 ms a step: 4 tokens at most, 44 / 18 = 2.44x at alpha = 1, never 3x
    assert break_even_tau(LINEAR, EAGER, 44 / 18 - 1e-9) == pytest.approx(4.0, abs=1e-6)
    assert break_even_tau(LINEAR, EAGER, 3.0) is None


def test_lazy_spans_are_paid_from_the_row_that_reaches_them():
    # B = 4, groups (1, 1): spans (0, 1), (1, 2), (2, 4); a span (lo, hi) is paid when a >= lo.
    # Catches a > lo for a >= lo (a step accepting exactly lo drafts must read row lo).
    c = RowCosts(layers=(3.0, 4.0, 5.0, 6.0), head=(10.0, 12.0, 14.0, 16.0), draft=1.0,
                 rest=1.0, plain=20.0)
    later = Form("lazy", (1, 1), layers_later=True)
    assert [step_ms(c, later, a) for a in range(4)] == [
        2 + 13, 2 + 13 + 13, 2 + 13 + 13 + 16, 2 + 13 + 13 + 16]
    at_once = Form("lazy", (1, 1), layers_later=False)  # the layers of all 4 rows, once
    assert [step_ms(c, at_once, a) for a in range(4)] == [
        2 + 6 + 10, 2 + 6 + 20, 2 + 6 + 20 + 12, 2 + 6 + 20 + 12]
    assert step_ms(c, Form("lazy", (), False), 3) == step_ms(c, EAGER, 3) == 2 + 6 + 16
    with pytest.raises(ValueError):
        step_ms(c, EAGER, 4)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.75, 1.0])
def test_the_geometric_law_has_tail_alpha_to_the_j_and_its_tau(alpha):
    # Catches the last entry written as alpha^(B-1) (1 - alpha): the law would lose mass.
    law = geometric_law(alpha, 8)
    assert law.sum() == pytest.approx(1.0)
    tails = np.cumsum(law[::-1])[::-1]  # P(a >= j)
    assert tails == pytest.approx(alpha ** np.arange(8))
    tau = 8.0 if alpha == 1 else (1 - alpha ** 8) / (1 - alpha)
    assert law_tau(law) == pytest.approx(tau)


@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_geometric_alpha_inverts_the_tau_of_the_law(alpha):
    tau = law_tau(geometric_law(alpha, 8))
    assert geometric_alpha(tau, 8) == pytest.approx(alpha, abs=1e-9)
    with pytest.raises(ValueError):
        geometric_alpha(8.5, 8)


def test_speedup_over_a_measured_law_by_hand():
    # accepts 0, 0, 1, 3: law (1/2, 1/4, 0, 1/4), tau (1 + 1 + 2 + 4) / 4 = 2;
    # oracle costs 12, 12, 14, 18: mean 14; speedup 2 * 11 / 14.
    law = measured_law([0, 0, 1, 3], 4)
    assert law == pytest.approx([0.5, 0.25, 0.0, 0.25])
    assert law_tau(law) == pytest.approx(2.0)
    assert speedup(LINEAR, ORACLE, law) == pytest.approx(22 / 14)


def test_row_costs_need_one_cost_per_row_count():
    with pytest.raises(ValueError):
        RowCosts((1.0, 2.0), (1.0,), 0.0, 0.0, 1.0)
