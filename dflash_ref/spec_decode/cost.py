"""Modelled time: a cost model for target and drafter forwards, and a gate run on it alone.

A :class:`CostModel` replaces wall times with modelled ones so that ``generate`` (through
``GateOptions(gate, cost_model)``) and :func:`simulate_gated_decode` are deterministic under
test, and so that the break-even of speculation can be reasoned about: a spec step costs a draft
plus one wide verify, plain decoding one narrow forward per token. (Wall times per phase are the
loop's :class:`~dflash_ref.spec_decode.observe.Clock`.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dflash_ref.spec_decode.gate import (
    CommitEmaGate,
    GateDecision,
    GateObservation,
    StepObservation,
)


@dataclass(frozen=True)
class CostModel:
    """Modelled costs (seconds) so a loop can be timed deterministically instead of by wall clock.

    ``target(w) = target_fixed + target_per_row * w`` for a target forward over w rows (decode:
    w = 1; chain verify: w = B; tree verify: w = N). ``drafter(B) = drafter_fixed +
    drafter_per_row * B``. A spec step costs ``drafter(B) + target(width) + step_overhead``.
    Memory-bound decoding makes ``target_per_row`` small next to ``target_fixed``: that is why a
    wide verify is nearly as cheap as one decode step.
    """

    target_fixed: float
    target_per_row: float = 0.0
    drafter_fixed: float = 0.0
    drafter_per_row: float = 0.0
    step_overhead: float = 0.0

    def target(self, width: int) -> float:
        return self.target_fixed + self.target_per_row * width

    def drafter(self, block_size: int) -> float:
        return self.drafter_fixed + self.drafter_per_row * block_size

    @property
    def t_ar(self) -> float:
        """One plain decode step: ``target(1)``."""
        return self.target(1)

    def spec_step(self, block_size: int, verify_width: int | None = None) -> float:
        """A spec step: draft ``block_size`` rows, verify ``verify_width`` rows (default: B)."""
        w = block_size if verify_width is None else verify_width
        return self.drafter(block_size) + self.target(w) + self.step_overhead


@dataclass
class GatedRun:
    """The modelled timeline of :func:`simulate_gated_decode`."""

    time: float
    ar_time: float
    n_tokens: int
    spec_steps: int
    floored_after: int | None  # spec steps taken when the gate floored (None: never)
    decisions: list[GateDecision] = field(default_factory=list)

    @property
    def excess(self) -> float:
        """Modelled time over plain AR decoding of the same tokens (negative: spec won)."""
        return self.time - self.ar_time


def simulate_gated_decode(gate: CommitEmaGate, commits: Sequence[int], cost: CostModel,
                          block_size: int, verify_width: int | None = None) -> GatedRun:
    """A modelled turn: spec steps committing ``commits[i]`` tokens until the gate floors.

    The gate is driven by the loop's protocol: ``start_turn``, then per step ``check`` at the
    top (a decision point without a logits row) and ``observe`` after the commit. The turn
    produces ``sum(commits)`` tokens. Each spec step costs ``cost.spec_step`` and feeds the gate
    ``StepObservation(commit_n, step_wall = cost.spec_step, t_ar = cost.t_ar)``; once the gate
    floors, the tokens of the remaining steps are decoded by AR at ``t_ar`` each. Plain AR
    decoding of the same tokens takes ``sum(commits) * t_ar``. (The v2 t_ar warmup tokens are AR
    in both runs and left out: the warm-up ``start_turn`` asks for is not run.) Not the loop: no
    model runs, only the gate and the cost model.
    """
    t_ar = cost.t_ar
    step = cost.spec_step(block_size, verify_width)
    n_tokens = int(sum(commits))
    gate.start_turn(n_tokens, sampled=False)
    time, done, floored_after = 0.0, 0, None
    for i, c in enumerate(commits):
        if gate.check(GateObservation(None, None, done)).floor:
            floored_after = i
            time += (n_tokens - done) * t_ar
            break
        time += step
        done += int(c)
        gate.observe(StepObservation(commit_n=int(c), step_wall=step, t_ar=t_ar))
    spec_steps = floored_after if floored_after is not None else len(commits)
    return GatedRun(time=time, ar_time=n_tokens * t_ar, n_tokens=n_tokens, spec_steps=spec_steps,
                    floored_after=floored_after, decisions=list(gate.decisions))


def probe_steps_bound(gate: CommitEmaGate, bad_ratio: float, ema_start: float) -> int:
    """Most spec steps the gate can take in a run of steps whose ratio is ``bad_ratio < margin``.

    From the update rule, after k bad steps ``ema_k = r + (e0 - r) 2^-k`` (r = bad_ratio,
    e0 = ``ema_start``). The streak starts at the first k with ``ema_k < margin`` (k_drop; 1 if
    e0 < margin) and reaches ``sustain`` after ``k_drop + sustain - 1`` steps; the floor also waits
    for ``n_draft_steps >= warmup``. So at most ``max(warmup, k_drop + sustain - 1)`` bad steps
    run (the v2/v3 hard floor can only stop it earlier, and a streak already running at e0 too).
    k_drop is found by running the gate's own float update, so it is exact for the gate even
    when ``ema_k`` lands on the margin.
    """
    r, m = float(bad_ratio), gate.margin
    if not r < m:
        raise ValueError(f"bad_ratio {r} must be below the margin {m}")
    ema, k_drop = float(ema_start), 0
    while True:  # ends: ema - r halves every step and r < m
        k_drop += 1
        ema = 0.5 * ema + 0.5 * r
        if ema < m:
            break
    return max(gate.warmup, k_drop + gate.sustain - 1)
