"""The sampled check of ``dflash-ref conform``: the exact law of a completion's first tokens,
cell by cell, and its two tests (dflash_ref/testing/conform.py's docstring, "Sampled").

A cell is a sequence of ``length`` tokens, or a prefix too unlikely to expand (its expected count
below ``EXPAND_MIN``): every target row the law needs is one forward of the reference, so only the
prefixes that the counts can resolve are expanded.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from dflash_ref.testing.chisquare import chi_square_gof
from dflash_ref.testing.lossless import Law, sampling_law

EXPAND_MIN = 20.0
"""A prefix whose expected count reaches this is expanded into its next tokens."""
MAX_ROWS = 256
"""At most this many target rows are computed for one policy's law."""
MIN_EXPECTED = 5.0
"""Cells with a smaller expected count are pooled for the chi-square."""


def law_cells(next_logits: Callable[[tuple[int, ...]], np.ndarray], law: Law, n: int,
              length: int, expand_min: float = EXPAND_MIN,
              max_rows: int = MAX_ROWS) -> dict[tuple[int, ...], float]:
    """The cells of the first ``length`` tokens' law and their probabilities (summing to 1).

    The root is expanded into its next tokens; then, most probable first, every prefix shorter
    than ``length`` whose expected count ``n * P(prefix)`` reaches ``expand_min`` (at most
    ``max_rows`` rows in all). A cell is a sequence of ``length`` tokens or a prefix not
    expanded; tokens ``law`` gives probability 0 have no cell."""
    cells: dict[tuple[int, ...], float] = {}
    frontier = [((), 1.0)]
    rows = 0
    while frontier:
        frontier.sort(key=lambda c: -c[1])
        prefix, mass = frontier.pop(0)
        if len(prefix) == length or (prefix and (n * mass < expand_min or rows >= max_rows)):
            cells[prefix] = mass
            continue
        p = sampling_law(next_logits(prefix), law)  # [V]
        rows += 1
        frontier += [((*prefix, int(t)), mass * float(p[t])) for t in np.flatnonzero(p > 0)]
    return cells


def cell_of(seq: tuple[int, ...], cells: dict) -> tuple[int, ...] | None:
    """The cell ``seq`` falls in: its shortest prefix that is a cell (None: probability 0)."""
    for k in range(1, len(seq) + 1):
        if seq[:k] in cells:
            return seq[:k]
    return None


@dataclass(frozen=True)
class LawTest:
    """The two tests of one policy's counts against its law (module docstring)."""

    chi2_p: float
    maxdev_p: float
    max_deviation: float
    detectable_bias: float
    worst: tuple[tuple[int, ...], int, float]
    impossible: tuple[tuple[int, ...], ...]
    n_cells: int

    def holds(self, alpha: float) -> bool:
        return not self.impossible and self.chi2_p > alpha and self.maxdev_p > alpha


def judge_law(sequences: Sequence[tuple[int, ...]], cells: dict, alpha: float) -> LawTest:
    """Chi-square and max-deviation of the observed ``sequences`` against ``cells``."""
    n = len(sequences)
    counts: Counter = Counter()
    impossible = []
    for s in sequences:
        c = cell_of(tuple(s), cells)
        if c is None:
            impossible.append(tuple(s))
        else:
            counts[c] += 1
    big = [c for c, p in cells.items() if n * p >= MIN_EXPECTED]
    small = [c for c, p in cells.items() if n * p < MIN_EXPECTED]
    obs = [counts[c] for c in big] + ([sum(counts[c] for c in small)] if small else [])
    exp = [cells[c] for c in big] + ([sum(cells[c] for c in small)] if small else [])
    chi2_p = chi_square_gof(obs, exp)[2] if len(obs) >= 2 else 1.0
    z = {c: abs(counts[c] - n * cells[c]) / math.sqrt(n * cells[c] * (1 - cells[c]))
         for c in big if cells[c] < 1.0}
    m = max(len(z), 1)
    worst = max(z, key=z.get) if z else next(iter(cells))
    maxdev_p = min(1.0, 2 * m * (1 - NormalDist().cdf(max(z.values(), default=0.0))))
    z_crit = NormalDist().inv_cdf(1 - alpha / (2 * m))
    sd = max((math.sqrt(p * (1 - p) / n) for p in cells.values()), default=0.0)
    max_dev = max(abs(counts[c] / n - p) for c, p in cells.items())
    return LawTest(chi2_p, maxdev_p, max_dev, z_crit * sd,
                   (worst, counts[worst], n * cells[worst]), tuple(impossible[:5]), len(cells))


__all__ = ["EXPAND_MIN", "LawTest", "MAX_ROWS", "MIN_EXPECTED", "cell_of", "judge_law",
           "law_cells"]
