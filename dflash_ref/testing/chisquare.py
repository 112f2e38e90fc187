"""Chi-square goodness of fit: the statistic behind :mod:`dflash_ref.testing.lossless`.

Pearson's statistic with its own survival function (SciPy is not a dependency): the regularized
upper incomplete gamma by series / Lentz continued fraction (Numerical Recipes 6.2). Checked in
tests/spec_decode/test_sampling.py against closed forms of the chi-square survival function for
1..4 degrees of freedom.
"""

from __future__ import annotations

import math

import numpy as np


def _log_gamma_prefactor(a: float, x: float) -> float:
    return -x + a * math.log(x) - math.lgamma(a)


def gamma_q(a: float, x: float) -> float:
    """Regularized upper incomplete gamma ``Q(a, x) = Gamma(a, x) / Gamma(a)``, a > 0, x >= 0.

    Series for P = 1 - Q when x < a + 1, Lentz's continued fraction for Q otherwise (Numerical
    Recipes 6.2); relative accuracy ~1e-14, ample for p-value thresholds.
    """
    if a <= 0 or x < 0:
        raise ValueError(f"gamma_q needs a > 0 and x >= 0, got a={a}, x={x}")
    if x == 0:
        return 1.0
    if x < a + 1:
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(_log_gamma_prefactor(a, x)))
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-16:
            break
    return math.exp(_log_gamma_prefactor(a, x)) * h


def chi2_sf(x: float, dof: int) -> float:
    """Survival function of the chi-square distribution: ``P(X >= x) = Q(dof / 2, x / 2)``."""
    if dof < 1:
        raise ValueError(f"dof must be >= 1, got {dof}")
    return gamma_q(dof / 2.0, max(float(x), 0.0) / 2.0)


def chi_square_gof(counts, probs) -> tuple[float, int, float]:
    """Pearson chi-square test of observed ``counts`` against expected ``probs``.

    ``stat = sum (O - n p)^2 / (n p)`` over cells with p > 0 (a count in a p = 0 cell gives an
    infinite statistic and p-value 0), dof = cells with p > 0 minus 1.

    Returns:
        (stat, dof, p_value).
    """
    o = np.asarray(counts, dtype=np.float64).ravel()
    p = np.asarray(probs, dtype=np.float64).ravel()
    if o.shape != p.shape:
        raise ValueError(f"counts {o.shape} and probs {p.shape} differ")
    p = p / p.sum()
    n = o.sum()
    live = p > 0
    if np.any(o[~live] > 0):
        return math.inf, int(live.sum()) - 1, 0.0
    e = n * p[live]
    stat = float(np.sum((o[live] - e) ** 2 / e))
    dof = int(live.sum()) - 1
    return stat, dof, chi2_sf(stat, dof)


def beta_inc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)``, a, b > 0, 0 <= x <= 1.

    Lentz's continued fraction (Numerical Recipes 6.4), on ``x`` or by the symmetry
    ``I_x(a, b) = 1 - I_(1-x)(b, a)`` where it converges faster (x > (a + 1) / (a + b + 2)).
    """
    if a <= 0 or b <= 0 or not 0.0 <= x <= 1.0:
        raise ValueError(f"beta_inc needs a, b > 0 and 0 <= x <= 1, got a={a}, b={b}, x={x}")
    if x in (0.0, 1.0):
        return x
    if x > (a + 1) / (a + b + 2):
        return 1.0 - beta_inc(b, a, 1.0 - x)
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    return math.exp(log_front) * _beta_fraction(a, b, x) / a


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (tiny if abs(d) < tiny else d)
    h = d
    for m in range(1, 10_000):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (tiny if abs(d) < tiny else d)
            c = 1.0 + num / c
            c = tiny if abs(c) < tiny else c
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def binom_sf(k: int, n: int, p: float) -> float:
    """``P(X >= k)`` for ``X ~ Binomial(n, p)``: ``I_p(k, n - k + 1)``."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return beta_inc(k, n - k + 1, p)


def binom_cdf(k: int, n: int, p: float) -> float:
    """``P(X <= k)`` for ``X ~ Binomial(n, p)``: ``I_(1-p)(n - k, k + 1)``."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return beta_inc(n - k, k + 1, 1.0 - p)


def normal_sf(z: float) -> float:
    """``P(Z >= z)`` for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def normal_isf(alpha: float) -> float:
    """The z with ``P(Z >= z) = alpha`` (0 < alpha < 1), by bisection on :func:`normal_sf`."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"normal_isf needs 0 < alpha < 1, got {alpha}")
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if normal_sf(mid) > alpha else (lo, mid)
    return 0.5 * (lo + hi)
