"""Spec-decode gates: when to stop speculating and hand the rest of the turn to plain AR decoding.

Speculative decoding wins only when the drafter is accepted often enough to pay for the draft and
the wide verify; on novel, high-entropy text it can be 2-4x slower than AR (lucebox, seed 000).
A gate is evaluated at the top of every loop iteration, before any draft or verify work, and
either lets the step run or **floors**: the rest of the turn is decoded by plain AR, with no way
back to speculation within the turn (spec/kvflash_gate.md §4).

Two gates, both pure objects fed with numbers so they are deterministic under test:

- :class:`EntropyGate` (§4.1, lucebox 8e47b477): an EMA of the target's top-1 probability p1.
- :class:`CommitEmaGate` (§4.2, lucebox ``common/spec_gate.h``): an EMA of the measured speed
  ratio ``commit_n * t_ar / step_wall`` (tokens this step would have cost under AR over what the
  step cost), self-calibrating. Versions v1, v2 (default) and v3 differ in their initial EMA,
  timing fallback, hard floor and state lifetime (:data:`COMMIT_EMA_VERSIONS`).

Both are disabled when verification samples (temperature > 0): the gates are a greedy-path
feature in the source. A :class:`CostModel` replaces wall times with modelled ones so that a loop
(or :func:`simulate_gated_decode`) can be run deterministically.

Protocol for the loop::

    gate.begin_turn()
    while generating:
        decision = gate.decide(...)          # loop top; p1 for the entropy gate
        if decision.floor: AR-decode the rest of the turn; break
        ... draft, verify, commit ...
        gate.record_step(...)                # after the commit; (commit_n, t_ar, step_wall)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dflash_ref.backend import Backend, as_backend
from dflash_ref.errors import ConfigError
from dflash_ref.ops.reductions import top1_prob_rows


@dataclass(frozen=True)
class GateDecision:
    """One gate evaluation at the top of the loop.

    Attributes:
        floor: True: stop speculating, AR-decode the rest of the turn.
        reason: why: "disabled", "sampled", "floored" (already floored this turn), "no-logits"
            (entropy gate without p1), "probe" (too few spec steps to judge), "tie" / "streak" /
            "hard" (the floor rule that fired), "spec" (keep speculating).
        n_draft_steps: spec steps taken this turn before this decision.
        ema: the gate's EMA after this decision's update (ema_p1 or the commit-ratio EMA).
        streak: the low streak after this decision's update.
        p1: the entropy gate's input (None for the commit-EMA gate).
    """

    floor: bool
    reason: str
    n_draft_steps: int
    ema: float
    streak: int
    p1: float | None = None


def p1_from_logits(be: Backend | str, logits_row) -> float:
    """The target's top-1 probability ``p1 = 1 / sum_i exp(l_i - l_max)`` in float64 (§4.1).

    Args:
        logits_row: [V] (backend array): the prefill's last row at step 0, afterwards the last
            row of the verify logits for the committed tokens.
    """
    host = as_backend(be).to_numpy(logits_row).astype(np.float64)
    return float(top1_prob_rows(host.reshape(-1)))


# ---------------------------------------------------------------------------------------------
# Entropy gate.
# ---------------------------------------------------------------------------------------------


class EntropyGate:
    """The p1-entropy gate (spec/kvflash_gate.md §4.1; lucebox 8e47b477, replaced a day later).

    State per turn: ``ema_p1 = 1.0`` (optimistic), ``low_streak = 0``. At each loop top with a
    valid p1:

        ema_p1     <- 0.5 * ema_p1 + 0.5 * p1
        low_streak <- low_streak + 1 if ema_p1 < ar_p1 else 0
        tie         = p1 < tie_p1
        floor      iff n_draft_steps >= 1 and (tie or low_streak >= sustain)

    (n_draft_steps >= 1 is the one-step probe; the streak is the hysteresis.) Defaults are the
    source's: DFLASH_ENTROPY_AR_P1 = 0.90, DFLASH_ENTROPY_TIE_P1 = 0.45, DFLASH_ENTROPY_SUSTAIN = 2.
    A decision without p1 (the source only evaluates when logits are valid) updates nothing and
    does not floor.

    p1 is a proxy for acceptance, not a measurement of speed: this gate has no guarantee against
    AR (a confident target with a poor drafter never floors).
    """

    def __init__(self, ar_p1: float = 0.90, tie_p1: float = 0.45, sustain: int = 2,
                 enabled: bool = True, sampled: bool = False):
        if not (0.0 <= tie_p1 <= 1.0 and 0.0 <= ar_p1 <= 1.0) or sustain < 1:
            raise ConfigError(
                f"EntropyGate: need 0 <= ar_p1, tie_p1 <= 1 and sustain >= 1; got ar_p1={ar_p1}, "
                f"tie_p1={tie_p1}, sustain={sustain}"
            )
        self.ar_p1, self.tie_p1, self.sustain = float(ar_p1), float(tie_p1), int(sustain)
        self.enabled, self.sampled = enabled, sampled
        self.decisions: list[GateDecision] = []
        self.begin_turn()

    def begin_turn(self) -> None:
        """Reset the per-turn state (the source keeps it in do_spec_decode's locals)."""
        self.ema_p1 = 1.0
        self.low_streak = 0
        self.n_draft_steps = 0
        self.floored = False

    def decide(self, p1: float | None) -> GateDecision:
        """Evaluate at the loop top with the current decision point's p1 (or None)."""
        reason = self._blocked()
        tie = False
        if reason is None and p1 is None:
            reason = "no-logits"
        elif reason is None:
            self.ema_p1 = 0.5 * self.ema_p1 + 0.5 * float(p1)
            self.low_streak = self.low_streak + 1 if self.ema_p1 < self.ar_p1 else 0
            tie = float(p1) < self.tie_p1
            if self.n_draft_steps < 1:
                reason = "probe"
            elif tie:
                reason = "tie"
            elif self.low_streak >= self.sustain:
                reason = "streak"
            else:
                reason = "spec"
        floor = reason in ("floored", "tie", "streak")
        self.floored = self.floored or floor
        d = GateDecision(floor, reason, self.n_draft_steps, self.ema_p1, self.low_streak,
                         None if p1 is None else float(p1))
        self.decisions.append(d)
        return d

    def record_step(self, *_args, **_kwargs) -> None:
        """Count a finished spec step (arguments accepted and ignored, for a uniform protocol)."""
        self.n_draft_steps += 1

    def _blocked(self) -> str | None:
        if self.floored:
            return "floored"
        if not self.enabled:
            return "disabled"
        if self.sampled:
            return "sampled"
        return None


# ---------------------------------------------------------------------------------------------
# Commit-EMA gate.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommitEmaVersion:
    """What distinguishes the revisions of ``common/spec_gate.h`` (spec/kvflash_gate.md §4.2)."""

    name: str
    ema_init: float
    fallback_ratio: float  # the ratio used when t_ar <= 0 or step_wall <= 0
    hard_floor: bool  # also floor when n_ema_updates >= warmup and ema < 0.5 * margin
    persistent: bool  # EMA, streak and update count survive across turns (backend member)
    t_ar_per_turn: bool  # measure t_ar every turn (v2) instead of once per process (v1)
    source: str


COMMIT_EMA_VERSIONS: dict[str, CommitEmaVersion] = {
    "v1": CommitEmaVersion("v1", 2.0, 2.0, False, False, False,
                           "lucebox 42278139 / a787e3d1, dusterbloom/lucebox-hub@2597cbc3"),
    "v2": CommitEmaVersion("v2", 0.0, 1.0, True, True, True,
                           "lucebox 05bebe70 (PR#487 tip, with test_spec_gate.cpp)"),
    "v3": CommitEmaVersion("v3", 2.0, 1.0, True, True, True,
                           "a later revision seen but not traced to a commit; t_ar protocol "
                           "assumed as v2"),
}
DEFAULT_COMMIT_EMA_VERSION = "v2"
"""The gates exist only on PR#487 (never merged); its tip, 05bebe70, is v2."""

T_AR_WARMUP_TOKENS = 3
"""AR tokens emitted to measure t_ar; token 1 is untimed (v1 times tokens 2-3, v2 token 3)."""
T_AR_MIN = 0.5e-3
"""v2 clamp: a measured t_ar below 0.5 ms is replaced by ``T_AR_FALLBACK`` (times in seconds)."""
T_AR_FALLBACK = 5e-3
"""The 5 ms that replaces an implausibly small t_ar (v2)."""


class CommitEmaGate:
    """The self-calibrating commit-EMA gate (spec/kvflash_gate.md §4.2).

    After each committed spec step::

        ratio  = commit_n * t_ar / step_wall    (the fallback ratio if t_ar <= 0 or step_wall <= 0)
        ema    <- 0.5 * ema + 0.5 * ratio;  n_ema_updates += 1
        streak <- streak + 1 if ema < margin else 0

    At the loop top::

        floor iff enabled and not sampled and n_draft_steps >= warmup
                  and (streak >= sustain or [v2, v3] (n_ema_updates >= warmup and ema < 0.5 margin))

    ratio > 1 means the step produced its tokens faster than AR would have. Defaults:
    margin 1.0, sustain 3, warmup 2 (DFLASH_SPEC_GATE_MARGIN / _SUSTAIN / _WARMUP).
    ``commit_n`` is the step's output count as the source counts it: chain a + 1; DDTree fast
    rollback len(path) (bonus deferred); DDTree replay len(path) + 1 (bonus included).
    ``step_wall`` runs from just after the gate check to the end of the commit.

    Worked trace (spec §4.2; t_ar 8 ms, step 54 ms, commit 3, ratio 4/9): v1 ema 1.222, 0.833,
    0.639, 0.542 with streaks 0, 1, 2, 3, floors before spec step 5; v2 ema 0.222, 0.333, hard
    floor before spec step 3.
    """

    def __init__(self, version: str = DEFAULT_COMMIT_EMA_VERSION, margin: float = 1.0,
                 sustain: int = 3, warmup: int = 2, enabled: bool = True, sampled: bool = False):
        if version not in COMMIT_EMA_VERSIONS:
            raise ConfigError(
                f"CommitEmaGate: unknown version {version!r}; expected one of "
                f"{sorted(COMMIT_EMA_VERSIONS)}"
            )
        if not margin > 0 or sustain < 1 or warmup < 0:
            raise ConfigError(
                f"CommitEmaGate: need margin > 0, sustain >= 1, warmup >= 0; got margin={margin}, "
                f"sustain={sustain}, warmup={warmup}"
            )
        self.version = COMMIT_EMA_VERSIONS[version]
        self.margin, self.sustain, self.warmup = float(margin), int(sustain), int(warmup)
        self.enabled, self.sampled = enabled, sampled
        self.t_ar: float | None = None  # cached measurement (v1: per process; v2: per turn)
        self.t_ar_log: float | None = None  # v2's 0.7 old + 0.3 new, for logging only
        self.decisions: list[GateDecision] = []
        self._reset_ema()
        self.begin_turn()

    def _reset_ema(self) -> None:
        self.ema = self.version.ema_init
        self.streak = 0
        self.n_ema_updates = 0

    def begin_turn(self) -> None:
        """Start a turn: n_draft_steps = 0; v1 also resets the EMA state (v2/v3 keep it)."""
        if not self.version.persistent:
            self._reset_ema()
        self.n_draft_steps = 0
        self.floored = False

    # -- t_ar -------------------------------------------------------------------------------------

    @property
    def needs_t_ar_warmup(self) -> bool:
        """Whether this turn must start with the AR warmup that measures t_ar.

        v1: once per process (until :meth:`set_t_ar` was called). v2/v3: every turn.
        """
        return self.version.t_ar_per_turn or self.t_ar is None

    def pure_ar_turn(self, n_gen: int) -> bool:
        """v2/v3: a turn of at most 3 tokens is decoded by pure AR (no spec, no gate)."""
        return self.version.t_ar_per_turn and n_gen <= T_AR_WARMUP_TOKENS

    def set_t_ar(self, walls: Sequence[float]) -> float:
        """Compute t_ar from the warmup AR tokens' wall times (seconds) and cache it.

        v1: ``walls`` = [w2, w3] (tokens 2 and 3), t_ar = (w2 + w3) / 2.
        v2/v3: ``walls`` = [w3] (token 3; 1 and 2 untimed), t_ar = w3, or 5 ms if w3 < 0.5 ms;
        ``t_ar_log <- 0.7 t_ar_log + 0.3 t_ar`` is kept for logging only.
        """
        walls = [float(w) for w in walls]
        if not self.version.t_ar_per_turn:
            if len(walls) != 2:
                raise ValueError(f"v1 times AR tokens 2 and 3: pass 2 wall times, got {len(walls)}")
            t = sum(walls) / 2
        else:
            if len(walls) != 1:
                raise ValueError(f"v2/v3 time AR token 3 only: pass 1 wall time, got {len(walls)}")
            t = walls[0] if walls[0] >= T_AR_MIN else T_AR_FALLBACK
            self.t_ar_log = t if self.t_ar_log is None else 0.7 * self.t_ar_log + 0.3 * t
        self.t_ar = t
        return t

    # -- the gate ---------------------------------------------------------------------------------

    def decide(self) -> GateDecision:
        """Evaluate at the loop top (before the draft)."""
        if self.floored:
            reason = "floored"
        elif not self.enabled:
            reason = "disabled"
        elif self.sampled:
            reason = "sampled"
        elif self.n_draft_steps < self.warmup:
            reason = "probe"
        elif self.streak >= self.sustain:
            reason = "streak"
        elif (self.version.hard_floor and self.n_ema_updates >= self.warmup
              and self.ema < 0.5 * self.margin):
            reason = "hard"
        else:
            reason = "spec"
        floor = reason in ("floored", "streak", "hard")
        self.floored = self.floored or floor
        d = GateDecision(floor, reason, self.n_draft_steps, self.ema, self.streak)
        self.decisions.append(d)
        return d

    def ratio(self, commit_n: int, t_ar: float, step_wall: float) -> float:
        """``commit_n * t_ar / step_wall``, or the version's fallback when a time is <= 0."""
        if t_ar <= 0 or step_wall <= 0:
            return self.version.fallback_ratio
        return commit_n * t_ar / step_wall

    def record_step(self, commit_n: int, t_ar: float | None = None,
                    step_wall: float = 0.0) -> float:
        """Update after a committed spec step; returns the ratio. ``t_ar`` None: the cached one."""
        t = (self.t_ar if self.t_ar is not None else 0.0) if t_ar is None else float(t_ar)
        r = self.ratio(commit_n, t, float(step_wall))
        self.ema = 0.5 * self.ema + 0.5 * r
        self.n_ema_updates += 1
        self.streak = self.streak + 1 if self.ema < self.margin else 0
        self.n_draft_steps += 1
        return r


# ---------------------------------------------------------------------------------------------
# Cost model and a modelled run.
# ---------------------------------------------------------------------------------------------


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

    The turn produces ``sum(commits)`` tokens. Each spec step costs ``cost.spec_step`` and feeds
    the gate ``(commit_n, t_ar = cost.t_ar, step_wall = cost.spec_step)``; once the gate floors,
    the tokens of the remaining steps are decoded by AR at ``t_ar`` each. Plain AR decoding of
    the same tokens takes ``sum(commits) * t_ar``. (The v2 t_ar warmup tokens are AR in both runs
    and left out.) Not the loop: no model runs, only the gate and the cost model.
    """
    gate.begin_turn()
    t_ar = cost.t_ar
    step = cost.spec_step(block_size, verify_width)
    n_tokens = int(sum(commits))
    time, done, floored_after = 0.0, 0, None
    for i, c in enumerate(commits):
        if gate.decide().floor:
            floored_after = i
            time += (n_tokens - done) * t_ar
            break
        time += step
        done += int(c)
        gate.record_step(int(c), t_ar, step)
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
