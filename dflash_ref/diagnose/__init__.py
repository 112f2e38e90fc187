"""``dflash-ref explain`` / :func:`explain`: why acceptance is what it is (docs/acceptance.md).

For a target, a drafter and prompts, greedy chain decoding is run and watched
(:class:`~dflash_ref.diagnose.steps.StepLog`), then run again under each ablation
(:mod:`~dflash_ref.diagnose.ablations`); the configuration is checked
(:mod:`~dflash_ref.diagnose.checks`). :class:`ExplainReport` holds the numbers; its
:meth:`~ExplainReport.findings` are the named findings of :mod:`~dflash_ref.diagnose.rules`
(each with a status and a sentence; other modules add theirs to ``report.extra``),
:meth:`~ExplainReport.signatures` the names of the faults among them, and
:meth:`~ExplainReport.summary` the terminal text, ending in the one-paragraph verdict.

:func:`first_divergence` names the first diverging tensor and step of two golden-vector dumps
(:func:`dflash_ref.oracle.compare.compare_cases`).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dflash_ref.diagnose.ablations import ABLATIONS
from dflash_ref.diagnose.checks import config_checks
from dflash_ref.diagnose.progress import Phases
from dflash_ref.diagnose.rules import (
    Finding,
    features_finding,
    mask_finding,
    miss_words,
    rate,
    rise_finding,
    verdict,
)
from dflash_ref.diagnose.steps import AcceptanceNumbers, StepLog, acceptance_stats
from dflash_ref.oracle.compare import compare_cases
from dflash_ref.spec_decode.loop import generate
from dflash_ref.spec_decode.observe import Observers

RISES = (("layers off by one (-1)", "layers -1", "capturing every feature layer one lower",
          "the drafter was trained on the layers one lower: set target_layer_ids so",
          "a layer one lower would leave the target"),
         ("layers off by one (+1)", "layers +1", "capturing every feature layer one higher",
          "the drafter was trained on the layers one higher: set target_layer_ids so",
          "a layer one higher would leave the target"),
         ("RoPE base", "RoPE base = target's", "the target's RoPE base in the drafter",
          "the drafter was trained with another RoPE base than it runs with",
          "the drafter's RoPE base is the target's already"))
"""(finding, ablation, what it changes, what a rise means, why it may not apply) of each "rises
when fixed" rule."""


@dataclass
class ExplainReport:
    """What :func:`explain` found (module docstring).

    Attributes:
        ablations: each ablation's numbers; None where it does not apply.
        extra: findings other modules add (shown after the rules' own, judged the same way).
        walls: seconds per phase (the CLI's "time" line; not part of :meth:`summary`).
    """

    stats: AcceptanceNumbers
    block_size: int
    ablations: dict[str, AcceptanceNumbers | None] = field(default_factory=dict)
    checks: list[tuple[str, str, str]] = field(default_factory=list)
    extra: list[Finding] = field(default_factory=list)  # e.g. the field's checks (field_checks)
    walls: dict[str, float] = field(default_factory=dict)

    def findings(self) -> list[Finding]:
        """The rules' findings (dflash_ref/diagnose/rules.py), then :attr:`extra`."""
        out = []
        if "features zeroed" in self.ablations:
            out.append(features_finding(self.stats, self.ablations["features zeroed"]))
        for name, ablation, what, fix, moot in RISES:
            if ablation in self.ablations:
                out.append(rise_finding(name, what, self.stats, self.ablations[ablation], fix,
                                        moot))
        out.append(mask_finding(self.checks))
        out.append(miss_words(self.stats))
        return out + list(self.extra)

    def signatures(self) -> list[str]:
        """The names of the faults found, in the findings' order."""
        return [f.name for f in self.findings() if f.status == "fault"]

    def verdict(self) -> str:
        """What this means, in one paragraph (:func:`~dflash_ref.diagnose.rules.verdict`)."""
        return verdict(self.stats, self.block_size, self.findings())

    def summary(self) -> str:
        s, B = self.stats, self.block_size
        lines = [f"tau {s.tau:.2f} over {s.n_steps} spec steps (block {B}), acceptance rate "
                 f"{100 * s.acceptance_rate:.0f}%, {s.accepted} of "
                 f"{s.accepted + s.rejected} drafts judged accepted",
                 "P(a >= j):        " + " ".join(f"{p:.2f}" for p in s.p_at_least),
                 "P(a >= j | j-1):  " + " ".join(f"{p:.2f}" for p in s.p_conditional),
                 "a + 1 histogram:  " + " ".join(str(n) for n in s.histogram),
                 "tau by context:   " + ", ".join(f"{lo}+: {t:.2f} ({n})"
                                                  for lo, t, n in s.tau_by_context),
                 "misses:           " + ", ".join(f"{k} {v}" for k, v in s.misses.items()),
                 "parting position: " + " ".join(str(n) for n in s.parting)]
        for name, a in self.ablations.items():
            lines.append(f"ablation {name:22s} " + (
                "n/a" if a is None else f"tau {a.tau:.2f} ({a.tau - s.tau:+.2f}), "
                                        f"{a.accepted} of {a.accepted + a.rejected} accepted "
                                        f"({100 * rate(a):.0f}%)"))
        for name, status, msg in self.checks:
            lines.append(f"check {name:16s} {status:4s} {msg}")
        lines.append("findings:")
        lines.extend(textwrap.fill(f.line(), 100, initial_indent="  ", subsequent_indent=" " * 10)
                     for f in self.findings())
        sig = self.signatures()
        lines.append("signatures: " + (", ".join(sig) if sig else "none"))
        lines.extend(textwrap.wrap("verdict: " + self.verdict(), 100))
        return "\n".join(lines)


def _run(target, drafter, prompts, max_new_tokens, block_size, bucket, progress):
    log = StepLog()
    for p in prompts:
        generate(target, drafter, np.asarray(p), max_new_tokens, block_size=block_size,
                 observer=Observers(log, progress))
    return acceptance_stats(log.steps, block_size, bucket)


def explain(target, drafter, prompts: Sequence[Sequence[int]], max_new_tokens: int = 64, *,
            block_size: int | None = None, ablations: Sequence[str] | None = None,
            tokenizer=None, templated: bool | None = None, thinking: bool | None = None,
            bucket: int = 32, phases: Phases | None = None,
            field: Sequence | None = None) -> ExplainReport:
    """The acceptance report of ``drafter`` on ``target`` over ``prompts`` (ids), greedy.

    Args:
        prompts: token-id sequences (text: encode it first, through the chat template if the
            checkpoint has one, and say so with ``templated``).
        ablations: names of :data:`~dflash_ref.diagnose.ablations.ABLATIONS` to run (default:
            all; ``()`` for none).
        tokenizer, templated, thinking: for the configuration checks.
        bucket: context positions per bucket of the tau-by-context table.
        phases: progress and timing of the runs (default: timed, not shown).
        field: checks ``(target, drafter, prompts) -> Finding`` to run too (e.g.
            :func:`~dflash_ref.diagnose.field_checks.standard_checks`); their findings are
            ``report.findings``, one summary line each.
    """
    B = int(drafter.block_size if block_size is None else block_size)
    phases = Phases(show=False) if phases is None else phases
    run = (target, drafter, prompts, max_new_tokens, B, bucket)
    total = len(prompts) * max_new_tokens
    with phases.phase("baseline", total) as progress:
        stats = _run(*run, progress)
    report = ExplainReport(stats, B)
    for name in (ABLATIONS if ablations is None else ablations):
        report.ablations[name] = _ablate(name, run, phases, total)
    longest = max(len(p) for p in prompts) + max_new_tokens
    report.checks = config_checks(target, drafter, B, tokenizer, templated, thinking, longest)
    if field:
        with phases.phase("field checks"):
            report.extra = [check(target, drafter, prompts) for check in field]
    report.walls = dict(phases.walls)
    return report


def _ablate(name, run, phases, total) -> AcceptanceNumbers | None:
    """The numbers of ``run`` under ablation ``name`` (None when it does not apply)."""
    target, drafter, *rest = run
    made = ABLATIONS[name](target, drafter)
    if made is None:
        return None
    t, d, restore = made
    try:
        with phases.phase(name, total) as progress:
            return _run(t, d, *rest, progress)
    finally:
        if restore is not None:
            restore()


def first_divergence(ours, theirs, tolerance_scale: float = 1.0) -> str:
    """The first tensor (and step) where the dump ``theirs`` leaves the reference case ``ours``:
    :func:`~dflash_ref.oracle.compare.compare_cases`' verdict, one line."""
    report = compare_cases(ours, theirs, tolerance_scale, stop_at_first=True)
    d = report.first
    if d is None:
        return report.verdict()
    return f"first divergence: {d.key} (step {d.step}, layer {d.layer}, {d.name})"


__all__ = ["ExplainReport", "explain", "first_divergence"]
