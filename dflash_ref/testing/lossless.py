"""A harness that proves a speculative sampler lossless (docs/lossless.md).

Point it at one speculative step of your own, written as a function

    step(target, draft_logits, rng) -> emitted tokens

- ``target(prefix)``: [V] the target's logits for the token after ``prefix``, a tuple of the
  tokens this step has put after the anchor (``()`` is the anchor's own row; the drafts
  ``(d_1, .., d_j)`` give verify row j; a tree node's path gives its row). The toy target of
  :func:`toy_target` makes every prefix's row different, as a real target does.
- ``draft_logits``: [L, V] the drafter's logits for block positions 1..L (a DFlash drafter sees
  the whole block at once: row j does not depend on the drafts before it). A policy may ignore
  them (DFlash 2's selector re-scores its candidates along the path it takes).
- ``rng``: a ``numpy.random.Generator``, the step's only source of randomness: its drafts and
  its uniforms.
- returns the tokens the step emits: the accepted drafts, then the bonus (1 to L+1 tokens).

**The claim it checks.** A step followed by plain sampling up to ``length = L + 1`` tokens has the
law of plain sampling: ``P(x_1 .. x_m) = prod_j law(target(x_<j))[x_j]`` where ``law`` is the
run's sampling distribution (temperature, top-k, top-p), written here once more, independently of
the package (:func:`sampling_law`). The emitted distribution of each position equals the
target's, jointly (so also conditionally on the earlier positions).

**How.** ``n_trials`` steps (:data:`N_TRIALS`, 50,000, by default) with a fixed seed; each
completed sequence is one count. Against the exact law above: any emitted output of probability
0 (a token top-k or top-p removed) fails at once; Pearson's chi-square of the completed
sequences (:mod:`~dflash_ref.testing.chisquare`; cells of expected count < 5 pooled) and of each
position's marginal; the exact binomial tail, two-sided, of every event (each prefix
``x_1..x_j``, each marginal ``x_j = t``), Bonferroni over the events, so that a rare sequence
over-produced cannot hide in the pooled cell; and ds4's max deviation
``max_e |f_e - p_e|`` against the bound its largest binomial standard error sets. A lossless
sampler fails with probability at most ``(L + 4) x`` :data:`P_VALUE_THRESHOLD`
(:meth:`LosslessReport.false_alarm_bound`). tests/testing/test_harness_power.py plants a wrong
sampler of each kind and shows each rejected; the one-line mutants of
tests/testing/test_lossless.py (residual not renormalised, the bonus drawn from q, top-p after
the ratio, ...) fail by p-values below 1e-10.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dflash_ref.testing.chisquare import (
    binom_cdf,
    binom_sf,
    chi_square_gof,
    normal_isf,
    normal_sf,
)

Target = Callable[[tuple[int, ...]], np.ndarray]
Step = Callable[[Target, np.ndarray, np.random.Generator], Sequence[int]]

P_VALUE_THRESHOLD = 1e-4
"""A sampler passes when every p-value is above this (fixed seeds: a correct sampler fails by
chance with probability at most ``(L + 4) x 1e-4`` per run,
:meth:`LosslessReport.false_alarm_bound`, once, and then always or never)."""
N_TRIALS = 50_000
"""Steps per run by default (ds4's count): a first token drawn at T' = 0.88 instead of 1 fails."""
MIN_EXPECTED = 5.0
"""Cells with a smaller expected count are pooled (Pearson's statistic needs ~5 per cell)."""


@dataclass(frozen=True)
class Law:
    """A sampling distribution: ``softmax(logits / T)``, then top-k, then top-p (0 / 1 off)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0


def sampling_law(logits, law: Law) -> np.ndarray:
    """The probabilities one row of ``logits`` gives under ``law`` (float64, sums to 1).

    The release's order (PyPI ``dflash`` 0.1.0 ``dflash/model.py``, ``_sampling_probs``): divide
    by T; keep the k largest logits; softmax over them; keep the smallest prefix of the
    probabilities sorted in decreasing order whose mass *before* each kept entry is < top_p;
    renormalise. Ties keep the lower token id first. Written token by token, apart from the
    package's vectorised form (dflash_ref/ops/sampling.py), so that it can judge it.

    Args:
        logits: [V].
    Returns:
        [V] float64.
    """
    x = [float(v) / law.temperature for v in np.asarray(logits, dtype=np.float64)]
    V = len(x)
    by_logit = sorted(range(V), key=lambda i: (-x[i], i))
    kept = set(by_logit[: law.top_k]) if 0 < law.top_k < V else set(range(V))
    top = max(x[i] for i in kept)
    w = [math.exp(x[i] - top) if i in kept else 0.0 for i in range(V)]
    total = sum(w)
    p = [v / total for v in w]
    if law.top_p < 1.0:
        mass, nucleus = 0.0, set()
        for i in sorted(range(V), key=lambda i: (-p[i], i)):
            if p[i] == 0.0 or mass >= law.top_p:
                break
            nucleus.add(i)
            mass += p[i]
        total = sum(p[i] for i in nucleus)
        p = [p[i] / total if i in nucleus else 0.0 for i in range(V)]
    return np.asarray(p)


def toy_target(vocab: int, seed: int = 0, scale: float = 2.0) -> Target:
    """A target whose next-token logits are a fixed random function of the whole prefix.

    ``target(prefix)`` = ``scale`` x standard normals seeded by (seed, prefix): every prefix has
    its own row, so a sampler that reads the wrong row (or an unconditioned one) is seen.
    """
    rows: dict[tuple[int, ...], np.ndarray] = {}

    def target(prefix: tuple[int, ...]) -> np.ndarray:
        key = tuple(int(t) for t in prefix)
        if key not in rows:
            g = np.random.default_rng([seed, len(key), *key])
            rows[key] = scale * g.standard_normal(vocab)
        return rows[key]

    return target


def sequence_law(target: Target, law: Law, length: int) -> dict[tuple[int, ...], float]:
    """The exact law of plain sampling of ``length`` tokens: every sequence of positive
    probability with ``prod_j sampling_law(target(x_<j))[x_j]``."""
    return {s: p for s, p in prefix_law(target, law, length).items() if len(s) == length}


@dataclass(frozen=True)
class LosslessReport:
    """What :func:`check_lossless` found.

    Attributes:
        joint_p: chi-square p-value of the completed sequences against their exact law (cells of
            expected count < 5 pooled).
        marginal_p: [length] chi-square p-value of each position's marginal.
        tail_p: the exact binomial test of every event one at a time (each prefix ``x_1..x_j``
            of positive probability, each position's marginal ``x_j = t``), two-sided,
            Bonferroni-corrected over the events: a rare sequence over-produced fails here even
            where the chi-square pools it away.
        max_deviation: ds4's statistic, ``max_e |f_e - p_e|`` over the same events (f: the
            empirical frequency, p: the exact probability).
        max_deviation_p: its p-value, ``2 m P(Z >= D / s)`` with ``s`` the largest binomial
            standard error ``sqrt(p (1 - p) / n)`` of the m events (normal approximation,
            Bonferroni).
        max_deviation_bound: the D at which the run fails at :data:`P_VALUE_THRESHOLD`: the
            smallest deviation of any event's probability this run can detect.
        worst: the event with the smallest exact tail p-value, as (label, observed count,
            expected count).
        impossible: emitted outputs with probability 0 under the target's law (a token that top-k
            or top-p removes): any one fails the run.
        acceptance: mean tokens a step emitted (tau of the toy pair).
        n_trials: steps run.
    """

    joint_p: float
    marginal_p: tuple[float, ...]
    tail_p: float
    max_deviation: float
    max_deviation_p: float
    max_deviation_bound: float
    worst: tuple[str, int, float]
    impossible: tuple[tuple[int, ...], ...]
    acceptance: float
    n_trials: int

    @property
    def p_value(self) -> float:
        """The smallest of the p-values: what the verdict is made on."""
        return min(self.joint_p, *self.marginal_p, self.tail_p, self.max_deviation_p)

    @property
    def n_tests(self) -> int:
        """The p-values the verdict reads (joint, each marginal, tail, max deviation)."""
        return len(self.marginal_p) + 3

    def false_alarm_bound(self, threshold: float = P_VALUE_THRESHOLD) -> float:
        """At most this probability that a lossless sampler fails ``ok(threshold)`` (the union
        bound over :attr:`n_tests` tests at level ``threshold`` each; the chi-square p-values
        are the usual large-count approximation)."""
        return self.n_tests * threshold

    def ok(self, threshold: float = P_VALUE_THRESHOLD) -> bool:
        return self.p_value > threshold and not self.impossible

    def explain(self) -> str:
        label, o, e = self.worst
        return (f"joint p = {self.joint_p:.3g}, per-position p = "
                f"{[float(f'{p:.3g}') for p in self.marginal_p]}, exact tail p = "
                f"{self.tail_p:.3g}, max deviation {self.max_deviation:.4f} (p = "
                f"{self.max_deviation_p:.3g}; detectable from {self.max_deviation_bound:.4f}) "
                f"over {self.n_trials} steps; worst event {label}: seen {o}, expected {e:.2f}"
                + (f"; {len(self.impossible)} impossible outputs seen, e.g. "
                   f"{self.impossible[0]}" if self.impossible else ""))


def prefix_law(target: Target, law: Law, length: int) -> dict[tuple[int, ...], float]:
    """``P(x_1 .. x_j = s)`` under plain sampling for every prefix ``s`` of length 0..``length``
    with positive probability (``()`` has probability 1)."""
    out: dict[tuple[int, ...], float] = {(): 1.0}
    level = dict(out)
    for _ in range(length):
        nxt = {}
        for prefix, mass in level.items():
            p = sampling_law(target(prefix), law)
            for t in np.flatnonzero(p > 0):
                nxt[(*prefix, int(t))] = mass * float(p[t])
        out.update(nxt)
        level = nxt
    return out


def completed_counts(step: Step, target: Target, draft_logits, law: Law, *, n_trials: int,
                     seed: int = 0) -> tuple[Counter, float, tuple]:
    """Run ``step`` ``n_trials`` times and complete each output to ``L + 1`` tokens by plain
    sampling from ``law`` (a generator of its own). Returns (counts of the completed
    sequences, mean emitted tokens per step, the emitted outputs of probability 0)."""
    draft_logits = np.asarray(draft_logits, dtype=np.float64)
    length = draft_logits.shape[0] + 1
    exact = prefix_law(target, law, length)
    cdfs: dict[tuple[int, ...], tuple[np.ndarray, int]] = {}
    rng, fill = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])
    counts: Counter = Counter()
    impossible = set()
    emitted = 0
    for _ in range(n_trials):
        out = tuple(int(t) for t in step(target, draft_logits, rng))
        if not 1 <= len(out) <= length:
            raise AssertionError(f"a step emitted {len(out)} tokens {out}; a step over L = "
                                 f"{length - 1} draft rows emits 1 to {length}")
        emitted += len(out)
        if exact.get(out, 0.0) == 0.0:
            impossible.add(out)
        while len(out) < length:
            if out not in cdfs:
                p = sampling_law(target(out), law)
                cdfs[out] = (np.cumsum(p), int(np.flatnonzero(p > 0)[-1]))
            out = (*out, _inverse_cdf(*cdfs[out], fill.random()))
        counts[out] += 1
    return counts, emitted / n_trials, tuple(sorted(impossible))


def _inverse_cdf(cdf, last: int, u: float) -> int:
    """The token whose CDF interval holds ``u``: ``cdf[t-1] <= u < cdf[t]`` (a token of
    probability 0 has an empty interval); ``u`` past the rounded total gives the last token of
    positive probability."""
    return min(int(np.searchsorted(cdf, u, side="right")), last)


def _pooled_chi_square(counts: Counter, law: dict) -> float:
    """Pearson's p-value of ``counts`` against ``law``, cells of expected count < 5 pooled."""
    n = sum(counts.values())
    big = [s for s, p in law.items() if n * p >= MIN_EXPECTED]
    small = [s for s, p in law.items() if n * p < MIN_EXPECTED]
    obs = [counts.get(s, 0) for s in big]
    exp = [law[s] for s in big]
    if small:
        obs.append(sum(counts.get(s, 0) for s in small))
        exp.append(sum(law[s] for s in small))
    return 1.0 if len(obs) < 2 else chi_square_gof(obs, exp)[2]


def events(counts: Counter, exact: dict, length: int) -> list[tuple[str, int, float]]:
    """Every event the tail and max-deviation tests read, as (label, observed count, exact
    probability), from the completed sequences' ``counts`` and exact law: each prefix
    ``x_1..x_j`` (j = 1..length) of positive probability, and each position's marginal
    ``x_j = t`` for j >= 2 (``x_1``'s are the prefixes of length 1)."""
    seen: Counter = Counter()
    for s, c in counts.items():
        for j in range(1, length + 1):
            seen[("prefix", s[:j])] += c
        for j in range(1, length):
            seen[("marginal", j, s[j])] += c
    prob: dict = {}
    for s, p in exact.items():
        for key in [("prefix", s[:j]) for j in range(1, length + 1)] + \
                [("marginal", j, s[j]) for j in range(1, length)]:
            prob[key] = prob.get(key, 0.0) + p
    return [(_label(key), seen.get(key, 0), p) for key, p in prob.items()]


def _label(key) -> str:
    if key[0] == "prefix":
        return f"x_1..x_{len(key[1])} = {key[1]}"
    return f"x_{key[1] + 1} = {key[2]}"


def _two_sided_binomial(o: int, n: int, p: float) -> float:
    return min(1.0, 2.0 * min(binom_sf(o, n, p), binom_cdf(o, n, p)))


def tail_test(evs, n: int) -> tuple[float, tuple[str, int, float]]:
    """(Bonferroni p-value over ``evs``, the worst event as (label, observed, expected))."""
    scored = [(_two_sided_binomial(o, n, p), label, o, n * p) for label, o, p in evs]
    best = min(scored, key=lambda x: x[0])
    return min(1.0, len(evs) * best[0]), (best[1], best[2], best[3])


def max_deviation_test(evs, n: int, threshold: float = P_VALUE_THRESHOLD):
    """ds4's statistic over ``evs``: (D, its p-value, the D that fails at ``threshold``)."""
    m = len(evs)
    d = max(abs(o / n - p) for _, o, p in evs)
    s = max(math.sqrt(p * (1.0 - p) / n) for _, _, p in evs)
    if s == 0.0:  # every event certain: any deviation is a failure
        return d, (0.0 if d > 0 else 1.0), 0.0
    p_value = min(1.0, 2.0 * m * normal_sf(d / s))
    return d, p_value, s * normal_isf(threshold / (2.0 * m))


def check_lossless(step: Step, target: Target, draft_logits, law: Law, *,
                   n_trials: int = N_TRIALS, seed: int = 0) -> LosslessReport:
    """Test that ``step`` followed by plain sampling is plain sampling (module docstring).

    Args:
        step: the sampler under test.
        target: ``prefix -> [V]`` logits (e.g. :func:`toy_target`).
        draft_logits: [L, V] handed to ``step``.
        law: the sampling law of the run (the one ``step`` must reproduce).
        n_trials: steps to run (:data:`N_TRIALS` by default).
        seed: the fixed seed of the step's generator and of the completion.
    """
    length = np.asarray(draft_logits).shape[0] + 1
    exact = sequence_law(target, law, length)
    counts, tau, impossible = completed_counts(step, target, draft_logits, law,
                                               n_trials=n_trials, seed=seed)
    if impossible:
        return LosslessReport(0.0, (0.0,) * length, 0.0, 1.0, 0.0, 0.0,
                              (f"impossible output {impossible[0]}", 0, 0.0), impossible, tau,
                              n_trials)
    joint_p = _pooled_chi_square(counts, exact)
    marginal_p = []
    for j in range(length):
        m_exact: dict = {}
        m_counts: Counter = Counter()
        for s, p in exact.items():
            m_exact[s[j]] = m_exact.get(s[j], 0.0) + p
        for s, c in counts.items():
            m_counts[s[j]] += c
        marginal_p.append(_pooled_chi_square(m_counts, m_exact))
    evs = events(counts, exact, length)
    tail_p, worst = tail_test(evs, n_trials)
    d, d_p, d_bound = max_deviation_test(evs, n_trials)
    return LosslessReport(joint_p, tuple(marginal_p), tail_p, d, d_p, d_bound, worst, (), tau,
                          n_trials)


def assert_lossless(step: Step, target: Target, draft_logits, law: Law, *,
                    n_trials: int = N_TRIALS, seed: int = 0,
                    threshold: float = P_VALUE_THRESHOLD) -> LosslessReport:
    """:func:`check_lossless`, raising ``AssertionError`` (with the report) when it fails."""
    report = check_lossless(step, target, draft_logits, law, n_trials=n_trials, seed=seed)
    if not report.ok(threshold):
        raise AssertionError(f"the sampler is not lossless: {report.explain()}")
    return report


__all__ = ["Law", "LosslessReport", "N_TRIALS", "P_VALUE_THRESHOLD", "assert_lossless",
           "check_lossless", "completed_counts", "events", "max_deviation_test", "prefix_law",
           "sampling_law", "sequence_law", "tail_test", "toy_target"]
