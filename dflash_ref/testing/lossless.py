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

**How.** ``n_trials`` steps with a fixed seed; each completed sequence is one count. Pearson's
chi-square of the counts against the exact law above (:mod:`~dflash_ref.testing.chisquare`), with
the sequences of expected count < 5 pooled into one cell, and any count on a sequence of
probability 0 (a token top-k or top-p removed) an immediate failure. The report also gives the
chi-square of each position's marginal, to say where a failing sampler goes wrong. The test has
power: the one-line mutants of tests/testing/test_lossless.py (residual not renormalised, the
bonus drawn from q, top-p after the ratio, ...) fail it by p-values below 1e-10.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dflash_ref.testing.chisquare import chi_square_gof

Target = Callable[[tuple[int, ...]], np.ndarray]
Step = Callable[[Target, np.ndarray, np.random.Generator], Sequence[int]]

P_VALUE_THRESHOLD = 1e-4
"""A sampler passes when every chi-square p-value is above this (fixed seeds: a correct sampler
fails by chance with probability ~1e-4 per test, once, and then always or never)."""
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
    out: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for prefix, mass in out.items():
            p = sampling_law(target(prefix), law)
            for t in np.flatnonzero(p > 0):
                nxt[(*prefix, int(t))] = mass * float(p[t])
        out = nxt
    return out


@dataclass(frozen=True)
class LosslessReport:
    """What :func:`check_lossless` found.

    Attributes:
        joint_p: chi-square p-value of the completed sequences against their exact law.
        marginal_p: [length] p-value of each position's marginal.
        worst: the sequence whose count is furthest from its expectation (in standard
            deviations), with (observed, expected).
        impossible: completed sequences seen that have probability 0 under the target's law.
        acceptance: mean tokens a step emitted (tau of the toy pair).
        n_trials: steps run.
    """

    joint_p: float
    marginal_p: tuple[float, ...]
    worst: tuple[tuple[int, ...], int, float]
    impossible: tuple[tuple[int, ...], ...]
    acceptance: float
    n_trials: int

    @property
    def p_value(self) -> float:
        """The smallest of the p-values: what the verdict is made on."""
        return min(self.joint_p, *self.marginal_p)

    def ok(self, threshold: float = P_VALUE_THRESHOLD) -> bool:
        return self.p_value > threshold and not self.impossible

    def explain(self) -> str:
        seq, o, e = self.worst
        return (f"joint p = {self.joint_p:.3g}, per-position p = "
                f"{[float(f'{p:.3g}') for p in self.marginal_p]} over {self.n_trials} steps; "
                f"worst sequence {seq}: seen {o}, expected {e:.1f}"
                + (f"; {len(self.impossible)} impossible sequences seen, e.g. "
                   f"{self.impossible[0]}" if self.impossible else ""))


def completed_counts(step: Step, target: Target, draft_logits, law: Law, *, n_trials: int,
                     seed: int = 0) -> tuple[Counter, float]:
    """Run ``step`` ``n_trials`` times and complete each output to ``L + 1`` tokens by plain
    sampling from ``law`` (a generator of its own). Returns (counts of the completed
    sequences, mean emitted tokens per step)."""
    draft_logits = np.asarray(draft_logits, dtype=np.float64)
    length = draft_logits.shape[0] + 1
    rng, fill = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])
    counts: Counter = Counter()
    emitted = 0
    for _ in range(n_trials):
        out = tuple(int(t) for t in step(target, draft_logits, rng))
        if not 1 <= len(out) <= length:
            raise AssertionError(f"a step emitted {len(out)} tokens {out}; a step over L = "
                                 f"{length - 1} draft rows emits 1 to {length}")
        emitted += len(out)
        while len(out) < length:
            p = sampling_law(target(out), law)
            out = (*out, int(fill.choice(p.shape[0], p=p)))
        counts[out] += 1
    return counts, emitted / n_trials


def _pooled_chi_square(counts: Counter, law: dict) -> tuple[float, tuple, tuple]:
    """(p-value, worst cell, impossible cells) of ``counts`` against ``law``."""
    n = sum(counts.values())
    impossible = tuple(sorted(s for s in counts if law.get(s, 0.0) == 0.0))
    big = [s for s, p in law.items() if n * p >= MIN_EXPECTED]
    small = [s for s, p in law.items() if n * p < MIN_EXPECTED]
    obs = [counts.get(s, 0) for s in big]
    exp = [law[s] for s in big]
    if small:
        obs.append(sum(counts.get(s, 0) for s in small))
        exp.append(sum(law[s] for s in small))
    if len(obs) < 2:
        pv = 1.0
    else:
        pv = chi_square_gof(obs, exp)[2]
    z = [(abs(counts.get(s, 0) - n * law[s]) / math.sqrt(n * law[s]), s) for s in big] or \
        [(0.0, next(iter(law)))]
    worst = max(z)[1]
    return pv, (worst, counts.get(worst, 0), n * law[worst]), impossible


def check_lossless(step: Step, target: Target, draft_logits, law: Law, *,
                   n_trials: int = 20_000, seed: int = 0) -> LosslessReport:
    """Chi-square that ``step`` followed by plain sampling is plain sampling (module docstring).

    Args:
        step: the sampler under test.
        target: ``prefix -> [V]`` logits (e.g. :func:`toy_target`).
        draft_logits: [L, V] handed to ``step``.
        law: the sampling law of the run (the one ``step`` must reproduce).
        n_trials: steps to run (20000: the mutants of the tests fail with p < 1e-10).
        seed: the fixed seed of the step's generator and of the completion.
    """
    length = np.asarray(draft_logits).shape[0] + 1
    exact = sequence_law(target, law, length)
    counts, tau = completed_counts(step, target, draft_logits, law, n_trials=n_trials, seed=seed)
    joint_p, worst, impossible = _pooled_chi_square(counts, exact)
    marginal_p = []
    for j in range(length):
        m_exact: dict = {}
        m_counts: Counter = Counter()
        for s, p in exact.items():
            m_exact[s[j]] = m_exact.get(s[j], 0.0) + p
        for s, c in counts.items():
            m_counts[s[j]] += c
        marginal_p.append(_pooled_chi_square(m_counts, m_exact)[0] if not impossible else 0.0)
    return LosslessReport(joint_p, tuple(marginal_p), worst, impossible, tau, n_trials)


def assert_lossless(step: Step, target: Target, draft_logits, law: Law, *,
                    n_trials: int = 20_000, seed: int = 0,
                    threshold: float = P_VALUE_THRESHOLD) -> LosslessReport:
    """:func:`check_lossless`, raising ``AssertionError`` (with the report) when it fails."""
    report = check_lossless(step, target, draft_logits, law, n_trials=n_trials, seed=seed)
    if not report.ok(threshold):
        raise AssertionError(f"the sampler is not lossless: {report.explain()}")
    return report


__all__ = ["Law", "LosslessReport", "P_VALUE_THRESHOLD", "assert_lossless", "check_lossless",
           "completed_counts", "sampling_law", "sequence_law", "toy_target"]
