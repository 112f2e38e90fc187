"""``dflash-ref explain`` / :func:`explain`: why acceptance is what it is (docs/acceptance.md).

For a target, a drafter and prompts, greedy chain decoding is run and watched
(:class:`~dflash_ref.diagnose.steps.StepLog`), then run again under each ablation
(:mod:`~dflash_ref.diagnose.ablations`); the configuration is checked
(:mod:`~dflash_ref.diagnose.checks`). :class:`ExplainReport` holds the numbers; its
:meth:`~ExplainReport.summary` is the terminal text and :meth:`~ExplainReport.signatures` names
the faults the numbers point at:

- "features unused": tau drops by less than 10% (and less than 0.2) with the features zeroed;
- "layers off by one (-1 / +1)": tau rises by more than 10% (and 0.2) with every feature layer
  one lower / higher;
- "RoPE base": tau rises by that much with the drafter's RoPE base set to the target's;
- "mask token": the mask-id check warns.

:func:`first_divergence` names the first diverging tensor and step of two golden-vector dumps
(:func:`dflash_ref.oracle.compare.compare_cases`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dflash_ref.diagnose.ablations import ABLATIONS
from dflash_ref.diagnose.checks import config_checks
from dflash_ref.diagnose.steps import AcceptanceNumbers, StepLog, acceptance_stats
from dflash_ref.oracle.compare import compare_cases
from dflash_ref.spec_decode.loop import generate

RISE = (0.10, 0.2)
"""An ablation "moves" tau when it changes by more than 10% of tau and more than 0.2."""


@dataclass
class ExplainReport:
    """What :func:`explain` found (module docstring)."""

    stats: AcceptanceNumbers
    block_size: int
    ablations: dict[str, float | None] = field(default_factory=dict)
    checks: list[tuple[str, str, str]] = field(default_factory=list)
    findings: list = field(default_factory=list)  # the field's named checks (field_checks.py)

    def _moved(self, name: str) -> float:
        """tau under ablation ``name`` minus tau (0 when it did not run)."""
        t = self.ablations.get(name)
        return 0.0 if t is None else t - self.stats.tau

    def _beyond(self, delta: float) -> bool:
        return abs(delta) > max(RISE[0] * self.stats.tau, RISE[1])

    def signatures(self) -> list[str]:
        """The faults the numbers point at (module docstring), in a fixed order."""
        out = []
        zeroed = self._moved("features zeroed")
        if "features zeroed" in self.ablations and not (zeroed < 0 and self._beyond(zeroed)):
            out.append("features unused")
        for d in ("-1", "+1"):
            m = self._moved(f"layers {d}")
            if m > 0 and self._beyond(m):
                out.append(f"layers off by one ({d})")
        m = self._moved("RoPE base = target's")
        if m > 0 and self._beyond(m):
            out.append("RoPE base")
        if any(n == "mask token id" and s == "warn" for n, s, _ in self.checks):
            out.append("mask token")
        return out

    def summary(self) -> str:
        s, B = self.stats, self.block_size
        lines = [f"tau {s.tau:.2f} over {s.n_steps} spec steps (block {B}), acceptance rate "
                 f"{100 * s.acceptance_rate:.0f}%",
                 "P(a >= j):        " + " ".join(f"{p:.2f}" for p in s.p_at_least),
                 "P(a >= j | j-1):  " + " ".join(f"{p:.2f}" for p in s.p_conditional),
                 "a + 1 histogram:  " + " ".join(str(n) for n in s.histogram),
                 "tau by context:   " + ", ".join(f"{lo}+: {t:.2f} ({n})"
                                                  for lo, t, n in s.tau_by_context),
                 "misses:           " + ", ".join(f"{k} {v}" for k, v in s.misses.items()),
                 "parting position: " + " ".join(str(n) for n in s.parting)]
        for name, tau in self.ablations.items():
            lines.append(f"ablation {name:22s} " + ("n/a" if tau is None else
                                                    f"tau {tau:.2f} ({tau - s.tau:+.2f})"))
        for name, status, msg in self.checks:
            lines.append(f"check {name:16s} {status:4s} {msg}")
        lines.extend(f.line() for f in self.findings)
        sig = self.signatures()
        lines.append("signatures: " + (", ".join(sig) if sig else "none"))
        return "\n".join(lines)


def _run(target, drafter, prompts, max_new_tokens, block_size, bucket):
    log = StepLog()
    for p in prompts:
        generate(target, drafter, np.asarray(p), max_new_tokens, block_size=block_size,
                 observer=log)
    return acceptance_stats(log.steps, block_size, bucket)


def explain(target, drafter, prompts: Sequence[Sequence[int]], max_new_tokens: int = 64, *,
            block_size: int | None = None, ablations: Sequence[str] | None = None,
            tokenizer=None, templated: bool | None = None, thinking: bool | None = None,
            bucket: int = 32, field: Sequence | None = None) -> ExplainReport:
    """The acceptance report of ``drafter`` on ``target`` over ``prompts`` (ids), greedy.

    Args:
        prompts: token-id sequences (text: encode it first, through the chat template if the
            checkpoint has one, and say so with ``templated``).
        ablations: names of :data:`~dflash_ref.diagnose.ablations.ABLATIONS` to run (default:
            all; ``()`` for none).
        tokenizer, templated, thinking: for the configuration checks.
        bucket: context positions per bucket of the tau-by-context table.
        field: checks ``(target, drafter, prompts) -> Finding`` to run too (e.g.
            :func:`~dflash_ref.diagnose.field_checks.standard_checks`); their findings are
            ``report.findings``, one summary line each.
    """
    B = int(drafter.block_size if block_size is None else block_size)
    stats = _run(target, drafter, prompts, max_new_tokens, B, bucket)
    report = ExplainReport(stats, B)
    for name in (ABLATIONS if ablations is None else ablations):
        made = ABLATIONS[name](target, drafter)
        if made is None:
            report.ablations[name] = None
            continue
        t, d, restore = made
        try:
            report.ablations[name] = _run(t, d, prompts, max_new_tokens, B, bucket).tau
        finally:
            if restore is not None:
                restore()
    longest = max(len(p) for p in prompts) + max_new_tokens
    report.checks = config_checks(target, drafter, B, tokenizer, templated, thinking, longest)
    report.findings = [check(target, drafter, prompts) for check in field or ()]
    return report


def first_divergence(ours, theirs, tolerance_scale: float = 1.0) -> str:
    """The first tensor (and step) where the dump ``theirs`` leaves the reference case ``ours``:
    :func:`~dflash_ref.oracle.compare.compare_cases`' verdict, one line."""
    report = compare_cases(ours, theirs, tolerance_scale, stop_at_first=True)
    d = report.first
    if d is None:
        return report.verdict()
    return f"first divergence: {d.key} (step {d.step}, layer {d.layer}, {d.name})"


__all__ = ["ExplainReport", "explain", "first_divergence"]
