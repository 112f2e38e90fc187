"""Certify a running server, black box: ``dflash-ref conform`` (docs/conformance.md).

The server is asked for completions of token-id prompts (dflash_ref/oracle/conform_http.py);
the reference is dflash-ref's own target (and drafter) on the same weights, handed in as any
object with

- ``rows(prompt, tokens)`` -> [len(tokens), V]: row i is the target's logits for the token after
  ``prompt + tokens[:i]`` (teacher forcing);
- ``next_logits(prompt, prefix)`` -> [V]: the logits after ``prompt + prefix``;
- ``acceptance(prompt, n_predict, policy, seeds)`` -> [(drafted, accepted)] per run of its own
  loop driven as the server drives its drafter, or None without a drafter

(dflash_ref/oracle/conform_reference.py builds one from a checkpoint or GGUF). Three checks:

**Greedy.** Each greedy completion is run through the reference with the server's own tokens
as the prefix; a position where the server's token is not the reference's argmax is a
divergence, with its *margin* ``logit[argmax] - logit[server token]`` of the reference's row.
A divergence is excused only at a near-tie, margin <= ``tie_margin`` (default 0.1: float
rounding of another stack moves logits by ~1e-3 on the same weights, a quantized one by ~1e-2);
every divergence is reported with its position and margin.

**Sampled.** Per policy, ``n`` completions with seeds ``seed, seed+1, ..`` whose first
``length`` tokens (default 3: the first comes from the prompt's last row, the next two from the
first speculative step, so a bug past the first draft row shows) are counted as sequences and
compared with the exact law of plain sampling, ``P(x_1..x_L) = prod_j law(row(x_<j))[x_j]``
(``law``: :func:`dflash_ref.testing.lossless.sampling_law`). The law is expanded prefix by
prefix only where a prefix's expected count reaches ``EXPAND_MIN`` (one target row each); a
prefix below it is one cell (:mod:`~dflash_ref.testing.conform_law`). Two tests at
significance ``alpha`` each:

- Pearson's chi-square over the cells (expected count < 5 pooled; a sequence of probability 0,
  one the policy removes, fails at once);
- the max-deviation statistic (a ds4-style test): ``z = max |O_c - n p_c| / sqrt(n p_c (1 - p_c))``
  over cells of expected count >= 5, p-value by Bonferroni over those m cells,
  ``min(1, 2 m (1 - Phi(z)))``; the report gives ``max |O_c / n - p_c|``.

The report states the smallest bias the run could detect: a cell whose probability is off by
``delta = z_crit * max_c sqrt(p_c (1 - p_c) / n)``, ``z_crit = Phi^-1(1 - alpha / (2 m))``, is
flagged with probability >= 1/2. The false-alarm rate of a correct server is at most
``alpha`` x the number of statistical tests (two per sampled policy, one per sampled
acceptance check).

**Acceptance.** Where the server reports ``draft_n`` / ``draft_n_accepted``, its acceptance
rate (accepted / drafted) is compared with the reference loop's on the same prompts, policies and
lengths: greedy, within ``acceptance_tolerance`` (a deterministic run: only near-ties move it);
sampled, a two-sample z-test of the per-request rates at ``alpha``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from statistics import NormalDist

import numpy as np

from dflash_ref.testing.conform_law import judge_law, law_cells
from dflash_ref.testing.lossless import Law


@dataclass(frozen=True)
class Policy:
    """One sampling policy: temperature (0: greedy), top-k (0: off), top-p (1: off)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def name(self) -> str:
        if self.greedy:
            return "greedy"
        parts = [f"T={self.temperature:g}"]
        if self.top_k:
            parts.append(f"top_k={self.top_k}")
        if self.top_p < 1.0:
            parts.append(f"top_p={self.top_p:g}")
        return " ".join(parts)


@dataclass(frozen=True)
class Completion:
    """What one request returned: the generated ``tokens`` and, where the server reports them,
    the drafts it proposed (``draft_n``) and accepted (``draft_n_accepted``); None otherwise."""

    tokens: tuple[int, ...]
    draft_n: int | None = None
    draft_n_accepted: int | None = None


ALPHA = 1e-3
"""Significance of each statistical test."""
TIE_MARGIN = 0.1
"""Greedy: a divergence is excused when the reference's logit gap there is at most this."""
ACCEPTANCE_TOLERANCE = 0.05
"""Greedy: the largest |server - reference| difference of acceptance rates that holds."""


@dataclass
class Check:
    """One row of the verdict table."""

    check: str
    policy: str
    n: int
    holds: bool
    result: str
    detail: dict = field(default_factory=dict)


@dataclass
class ConformReport:
    """Every check of one run, and the settings that decide them."""

    server: str
    checks: list[Check]
    settings: dict

    @property
    def holds(self) -> bool:
        return bool(self.checks) and all(c.holds for c in self.checks)

    @property
    def n_statistical_tests(self) -> int:
        return sum(int(c.detail.get("tests", 0)) for c in self.checks)

    @property
    def false_alarm_bound(self) -> float:
        """At most alpha x the statistical tests run (Bonferroni)."""
        return self.n_statistical_tests * self.settings["alpha"]

    def table(self) -> str:
        """The verdict table (plain text, one row per check)."""
        rows = [("check", "policy", "N", "result", "verdict")]
        rows += [(c.check, c.policy, str(c.n), c.result, "holds" if c.holds else "FAILS")
                 for c in self.checks]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = ["  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows]
        lines.insert(1, "-" * len(lines[0]))
        lines.append(f"{'all checks hold' if self.holds else 'NOT CONFORMANT'}: "
                     f"{sum(c.holds for c in self.checks)}/{len(self.checks)} hold; "
                     f"{self.n_statistical_tests} statistical tests at alpha "
                     f"{self.settings['alpha']:g}: false-alarm rate <= "
                     f"{self.false_alarm_bound:.2g}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"server": self.server, "holds": self.holds,
                "false_alarm_bound": self.false_alarm_bound, "settings": self.settings,
                "checks": [asdict(c) for c in self.checks]}


# -- greedy -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GreedyDivergence:
    """A greedy position where the server's token is not the reference's argmax."""

    position: int
    server_token: int
    reference_token: int
    margin: float
    excused: bool


def greedy_divergences(tokens: Sequence[int], rows, tie_margin: float) -> list[GreedyDivergence]:
    """Every position i where ``tokens[i]`` is not the argmax of ``rows[i]`` [V], with the margin
    ``rows[i][argmax] - rows[i][tokens[i]]`` and whether it is excused (margin <= tie_margin)."""
    rows = np.asarray(rows, dtype=np.float64)  # [len(tokens), V]
    out = []
    for i, t in enumerate(tokens):
        best = int(np.argmax(rows[i]))
        margin = float(rows[i, best] - rows[i, int(t)])
        if margin > 0.0:
            out.append(GreedyDivergence(i, int(t), best, margin, margin <= tie_margin))
    return out


def greedy_check(prompt_name: str, completion: Completion, rows, tie_margin: float) -> Check:
    """The greedy verdict of one prompt's completion (module docstring)."""
    div = greedy_divergences(completion.tokens, rows, tie_margin)
    bad = [d for d in div if not d.excused]
    if not div:
        result = f"{len(completion.tokens)} tokens = reference argmax"
    else:
        shown = "; ".join(f"pos {d.position}: {d.server_token} vs {d.reference_token}, margin "
                          f"{d.margin:.3g}{' (near-tie)' if d.excused else ''}" for d in div[:3])
        result = (f"{len(div)} divergence(s), {len(bad)} beyond the tie margin "
                  f"{tie_margin:g}: {shown}" + (" ..." if len(div) > 3 else ""))
    return Check(f"greedy {prompt_name}", "greedy", len(completion.tokens), not bad, result,
                 {"tokens": list(completion.tokens), "divergences": [asdict(d) for d in div]})


# -- sampled: the law of the first tokens ------------------------------------------------------


def sampled_check(policy: Policy, sequences, cells: dict, alpha: float) -> Check:
    """The sampled verdict of one policy (module docstring)."""
    t = judge_law(sequences, cells, alpha)
    seq, o, e = t.worst
    result = (f"chi2 p={t.chi2_p:.2g}, max-dev {t.max_deviation:.4f} (p={t.maxdev_p:.2g}), "
              f"detectable bias {t.detectable_bias:.3f}; worst {list(seq)}: {o} vs {e:.1f}")
    if t.impossible:
        result = f"{len(t.impossible)}+ sequences of probability 0, e.g. {list(t.impossible[0])}"
    detail = {"tests": 2, "chi2_p": t.chi2_p, "maxdev_p": t.maxdev_p,
              "max_deviation": t.max_deviation, "detectable_bias": t.detectable_bias,
              "cells": t.n_cells, "worst": {"sequence": list(seq), "observed": o, "expected": e},
              "impossible": [list(s) for s in t.impossible]}
    return Check("sampled", policy.name, len(sequences), t.holds(alpha), result, detail)


# -- acceptance --------------------------------------------------------------------------------


def _rate(pairs) -> float:
    drafted = sum(d for d, _ in pairs)
    return sum(a for _, a in pairs) / drafted if drafted else 0.0


def acceptance_check(policy: Policy, server: list[tuple[int, int]],
                     reference: list[tuple[int, int]], alpha: float,
                     tolerance: float) -> Check:
    """Server vs reference acceptance rates (module docstring); pairs are (drafted, accepted)."""
    rs, rr = _rate(server), _rate(reference)
    detail = {"server_rate": rs, "reference_rate": rr,
              "server": [sum(d for d, _ in server), sum(a for _, a in server)],
              "reference": [sum(d for d, _ in reference), sum(a for _, a in reference)]}
    if policy.greedy:
        holds = abs(rs - rr) <= tolerance
        result = (f"accepted {detail['server'][1]}/{detail['server'][0]} = {rs:.3f} vs reference "
                  f"{detail['reference'][1]}/{detail['reference'][0]} = {rr:.3f} (tolerance "
                  f"{tolerance:g})")
    else:
        p = _two_sample_p([a / d for d, a in server if d], [a / d for d, a in reference if d])
        holds = p > alpha
        detail.update(tests=1, p_value=p)
        result = f"rate {rs:.3f} vs reference {rr:.3f} (z-test p={p:.2g})"
    return Check("acceptance", policy.name, len(server), holds, result, detail)


def _two_sample_p(x, y) -> float:
    """Two-sided p-value of Welch's z for equal means (1.0 when either side is constant)."""
    if len(x) < 2 or len(y) < 2:
        return 1.0
    se = math.sqrt(np.var(x, ddof=1) / len(x) + np.var(y, ddof=1) / len(y))
    if se == 0.0:
        return 1.0 if np.mean(x) == np.mean(y) else 0.0
    return 2 * (1 - NormalDist().cdf(abs(np.mean(x) - np.mean(y)) / se))


# -- the run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConformSettings:
    """What one run asks: prompts, policies and the statistics' parameters."""

    prompts: tuple[tuple[int, ...], ...]
    policies: tuple[Policy, ...] = (Policy(), Policy(1.0), Policy(0.7, top_k=20, top_p=0.9))
    n: int = 2000
    length: int = 3
    n_predict: int = 8
    seed: int = 0
    alpha: float = ALPHA
    tie_margin: float = TIE_MARGIN
    acceptance_tolerance: float = ACCEPTANCE_TOLERANCE
    acceptance_runs: int = 200


def run_conform(client, reference, settings: ConformSettings, progress=None) -> ConformReport:
    """Every check of ``settings`` against the server behind ``client`` (a
    :class:`~dflash_ref.oracle.conform_http.ServerClient`, or anything with its ``complete``).

    ``progress(n)``: called after each request (a progress bar's update)."""
    tick = progress or (lambda n: None)
    checks: list[Check] = []
    for policy in settings.policies:
        if policy.greedy:
            completions = []
            for k, prompt in enumerate(settings.prompts):
                c = client.complete(prompt, settings.n_predict, policy, settings.seed)
                tick(1)
                completions.append(c)
                checks.append(greedy_check(f"prompt {k}", c, reference.rows(prompt, c.tokens),
                                           settings.tie_margin))
            checks += _acceptance(reference, settings, policy, completions,
                                  [[settings.seed]] * len(settings.prompts))
        else:
            checks += _sampled(client, reference, settings, policy, tick)
    return ConformReport(getattr(client, "url", str(client)), checks,
                         {**asdict(settings), "prompts": [list(p) for p in settings.prompts]})


def _sampled(client, reference, settings: ConformSettings, policy: Policy, tick) -> list[Check]:
    prompt = settings.prompts[0]
    completions = []
    for i in range(settings.n):
        completions.append(client.complete(prompt, settings.n_predict, policy, settings.seed + i))
        tick(1)
    short = [c for c in completions if len(c.tokens) < settings.length]
    if short:
        raise ValueError(f"the server returned {len(short[0].tokens)} tokens where "
                          f"{settings.length} were asked (n_predict {settings.n_predict}, "
                          f"ignore_eos); it must not stop before --length tokens")
    seqs = [tuple(c.tokens[: settings.length]) for c in completions]
    law = Law(policy.temperature, policy.top_k, policy.top_p)
    cells = law_cells(lambda prefix: reference.next_logits(prompt, prefix), law, settings.n,
                      settings.length)
    checks = [sampled_check(policy, seqs, cells, settings.alpha)]
    runs = min(settings.n, settings.acceptance_runs)
    seeds = [[settings.seed + 10**6 + i for i in range(runs)]]
    return checks + _acceptance(reference, settings, policy, completions[:runs], seeds, [prompt])


def _acceptance(reference, settings: ConformSettings, policy: Policy, completions, seeds,
                prompts=None) -> list[Check]:
    """The acceptance row, when the server reported draft counts and the reference drafts."""
    server = [(c.draft_n or 0, c.draft_n_accepted or 0) for c in completions]
    if all(c.draft_n is None for c in completions):
        return [Check("acceptance", policy.name, 0, True, "not reported by the server "
                      "(no draft_n in its timings): not checked", {})]
    ref: list[tuple[int, int]] = []
    for prompt, s in zip(prompts or settings.prompts, seeds):
        got = reference.acceptance(prompt, settings.n_predict, policy, s)
        if got is None:
            return [Check("acceptance", policy.name, 0, True, "no --drafter given: the "
                          "server's draft counts are not compared", {})]
        ref += got
    return [acceptance_check(policy, server, ref, settings.alpha, settings.acceptance_tolerance)]


def total_requests(settings: ConformSettings) -> int:
    """How many requests :func:`run_conform` sends (the progress bar's total)."""
    return sum(len(settings.prompts) if p.greedy else settings.n for p in settings.policies)


__all__ = ["ACCEPTANCE_TOLERANCE", "ALPHA", "Check", "Completion", "ConformReport",
           "ConformSettings", "GreedyDivergence", "Policy", "TIE_MARGIN", "acceptance_check",
           "greedy_check", "greedy_divergences", "run_conform", "sampled_check",
           "total_requests"]
