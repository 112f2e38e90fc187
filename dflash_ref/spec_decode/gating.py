"""What the loop knows of a gate: one protocol, its observations and decision, the null gate.

Every gate implements the same four calls, and the loop never asks which class it holds::

    n_warmup = gate.start_turn(max_new_tokens, sampled)  # AR tokens to run before speculating
    gate.end_warmup(walls)                        # their wall times (or modelled ones)
    while generating:
        decision = gate.check(GateObservation(...))   # loop top, before any draft work
        if decision.floor: AR-decode the rest of the turn
        ... draft, verify, commit ...
        gate.observe(StepObservation(...))        # after the commit

A run without a gate holds :data:`ALWAYS_SPECULATE`, as an unwatched run holds
``observe.UNWATCHED``. The gates themselves are in :mod:`~dflash_ref.spec_decode.gate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dflash_ref.backend import Backend, as_backend
from dflash_ref.ops.reductions import top1_prob_rows


@dataclass(frozen=True)
class GateDecision:
    """One gate evaluation at the top of the loop."""

    floor: bool  # True: stop speculating, AR-decode the rest of the turn
    # why: "disabled", "sampled", "floored" (already this turn), "no-logits" (no p1), "probe" (too
    # few spec steps to judge), "tie" / "streak" / "hard" (the floor rule that fired), "spec"
    # (keep speculating), "always" (ALWAYS_SPECULATE, which judges nothing)
    reason: str
    n_draft_steps: int  # spec steps taken this turn before this decision
    ema: float  # the gate's EMA after this decision's update (ema_p1 or the commit-ratio EMA)
    streak: int  # the low streak after this decision's update
    p1: float | None = None  # the entropy gate's input (None for the commit-EMA gate)


@dataclass(frozen=True)
class GateObservation:
    """What the loop knows at a decision point (the top of a step)."""

    be: object  # the Backend of logits_row
    # [V] the target's row that produced the newest token (the prefill's last row, a plain
    # step's, or the bonus token's verify row); None in a modelled turn (simulate_gated_decode)
    logits_row: object
    n_generated: int  # tokens emitted so far this turn

    @property
    def p1(self) -> float | None:
        """The target's top-1 probability here (host float64; syncs), None without a row."""
        if self.logits_row is None:
            return None
        return p1_from_logits(self.be, self.logits_row)


@dataclass(frozen=True)
class StepObservation:
    """What one committed speculative step reports to the gate."""

    commit_n: int  # tokens the step committed, bonus included (chain: a + 1)
    step_wall: float  # seconds from just after the gate check to the end of the commit
    t_ar: float | None = None  # a plain step's modelled time; None: the gate measures its own


def p1_from_logits(be: Backend | str, logits_row) -> float:
    """``p1 = 1 / sum_i exp(l_i - l_max)`` in float64 of a [V] logits row."""
    host = as_backend(be).to_numpy(logits_row).astype(np.float64)
    return float(top1_prob_rows(host.reshape(-1)))


class AlwaysSpeculate:
    """The gate of a run given none: no warm-up, never a floor, nothing learnt. A run given no
    gate records none of its answers; passed explicitly as ``gate=``, it is recorded like any."""

    SPECULATE = GateDecision(False, "always", 0, 0.0, 0)

    def start_turn(self, max_new_tokens: int, sampled: bool) -> int:
        return 0

    def end_warmup(self, walls: Sequence[float]) -> None:
        pass

    def check(self, obs: GateObservation) -> GateDecision:
        return self.SPECULATE

    def observe(self, step: StepObservation) -> None:
        pass


ALWAYS_SPECULATE = AlwaysSpeculate()
