"""Intervals for the field checks (dflash_ref/diagnose/field_checks.py): differences of mean
tau with their 99% confidence intervals, paired (one value per prompt on each side) or Welch
(two independent samples), from Student's t quantiles tabulated in :data:`T_995`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

T_995 = {1: 63.657, 2: 9.925, 3: 5.841, 4: 4.604, 5: 4.032, 6: 3.707, 7: 3.499, 8: 3.355,
         9: 3.250, 10: 3.169, 11: 3.106, 12: 3.055, 13: 3.012, 14: 2.977, 15: 2.947, 16: 2.921,
         17: 2.898, 18: 2.878, 19: 2.861, 20: 2.845, 21: 2.831, 22: 2.819, 23: 2.807,
         24: 2.797, 25: 2.787, 26: 2.779, 27: 2.771, 28: 2.763, 29: 2.756, 30: 2.750,
         40: 2.704, 60: 2.660, 120: 2.617}
"""Student's t quantile t_{0.995, df} (two-sided 99%), by degrees of freedom; a df between two
rows takes the lower row (a wider interval), beyond 120 the normal 2.576."""


def t_quantile(df: float) -> float:
    """t_{0.995, df} from :data:`T_995` (the row at or below ``df``; the normal past 120)."""
    if df < 1:
        raise ValueError(f"a t interval needs df >= 1, got {df}")
    if df > 120:
        return 2.576
    return T_995[max(k for k in T_995 if k <= df)]


@dataclass(frozen=True)
class Difference:
    """``mean`` of x - y with its 99% interval [low, high] over ``n`` prompts (or n_x + n_y)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def significant(self) -> bool:
        return self.low > 0 or self.high < 0

    def text(self) -> str:
        return f"{self.mean:+.2f}, 99% CI {self.low:+.2f}..{self.high:+.2f}"


def paired_difference(x, y) -> Difference:
    """x - y paired (one value per prompt each, [n]): mean difference +- t * sd / sqrt(n)."""
    d = np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)  # [n]
    n = d.size
    if n < 2:
        return Difference(float(d.mean()) if n else 0.0, -np.inf, np.inf, n)
    half = t_quantile(n - 1) * d.std(ddof=1) / np.sqrt(n)
    return Difference(float(d.mean()), float(d.mean() - half), float(d.mean() + half), n)


def welch_difference(x, y) -> Difference:
    """mean(x) - mean(y) of two independent samples (Welch; Welch-Satterthwaite df)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.size < 2 or y.size < 2:
        return Difference(float(x.mean() - y.mean()), -np.inf, np.inf, x.size + y.size)
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = np.sqrt(vx + vy)
    m = float(x.mean() - y.mean())
    if se == 0:
        return Difference(m, m, m, x.size + y.size)
    df = (vx + vy) ** 2 / (vx ** 2 / (x.size - 1) + vy ** 2 / (y.size - 1))
    half = t_quantile(df) * se
    return Difference(m, float(m - half), float(m + half), x.size + y.size)


__all__ = ["T_995", "Difference", "paired_difference", "t_quantile", "welch_difference"]
