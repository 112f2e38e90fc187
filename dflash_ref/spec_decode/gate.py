"""Spec-decode gates: when to stop speculating and hand the rest of the turn to plain AR decoding.

Speculative decoding wins only when the drafter is accepted often enough to pay for the draft and
the wide verify; on novel, high-entropy text it can be 2-4x slower than AR (lucebox, seed 000).
A gate is evaluated at the top of every loop iteration, before any draft or verify work, and
either lets the step run or **floors**: the rest of the turn is decoded by plain AR, with no way
back to speculation within the turn (docs/spec_decode.md, gates).

Two gates, both pure objects fed with numbers so they are deterministic under test:

- :class:`EntropyGate` (lucebox's first gate, docs/conventions.md): an EMA of the target's
  top-1 probability p1.
- :class:`CommitEmaGate` (lucebox's ``server/src/common/spec_gate.h``): an EMA
  of the measured speed ratio ``commit_n * t_ar / step_wall`` (tokens this step would have
  cost under AR over what the step cost), self-calibrating. Versions v1, v2 (default) and v3
  differ in their initial EMA, timing fallback, hard floor and state lifetime
  (:data:`COMMIT_EMA_VERSIONS`).

A gate built with ``sampled=True`` never floors (the gates are a greedy-path feature in the
source); a gate built without it judges a sampled run like a greedy one. A
:class:`~dflash_ref.spec_decode.cost.CostModel` replaces wall times with modelled ones so that a
loop (or :func:`~dflash_ref.spec_decode.cost.simulate_gated_decode`) runs deterministically.

The protocol and the null gate :data:`ALWAYS_SPECULATE` are in
:mod:`~dflash_ref.spec_decode.gating`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dflash_ref.errors import ConfigError
from dflash_ref.spec_decode.gating import GateDecision, GateObservation, StepObservation

# ---------------------------------------------------------------------------------------------
# Entropy gate.
# ---------------------------------------------------------------------------------------------


class EntropyGate:
    """The p1-entropy gate (lucebox's first gate, replaced a day later by the commit-EMA gate).

    State per turn: ``ema_p1 = 1.0`` (optimistic), ``low_streak = 0``. At each loop top with a
    valid p1:

        ema_p1     <- 0.5 * ema_p1 + 0.5 * p1
        low_streak <- low_streak + 1 if ema_p1 < ar_p1 else 0
        tie         = p1 < tie_p1
        floor      iff n_draft_steps >= 1 and (tie or low_streak >= sustain)

    (n_draft_steps >= 1 is the one-step probe; the streak is the hysteresis.) Defaults are the
    source's: DFLASH_ENTROPY_AR_P1 = 0.90, DFLASH_ENTROPY_TIE_P1 = 0.45, DFLASH_ENTROPY_SUSTAIN = 2.
    A decision without p1 (no logits row; the source only evaluates when logits are valid)
    updates nothing and does not floor.

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
        self._reset_turn()

    def _reset_turn(self) -> None:
        """The per-turn state (the source keeps it in do_spec_decode's locals)."""
        self.ema_p1 = 1.0
        self.low_streak = 0
        self.n_draft_steps = 0
        self.floored = False

    def start_turn(self, max_new_tokens: int, sampled: bool) -> int:
        """Begin a turn (the per-turn state reset); the entropy gate needs no AR warm-up
        (returns 0)."""
        self._reset_turn()
        return 0

    def end_warmup(self, walls: Sequence[float]) -> None:
        """Nothing to calibrate."""

    def check(self, obs: GateObservation) -> GateDecision:
        """Evaluate at the loop top with the decision point's p1 (None: no logits row)."""
        p1 = obs.p1
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

    def observe(self, step: StepObservation) -> None:
        """Count a finished spec step (the entropy gate reads nothing else of it)."""
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
    """What distinguishes the revisions of ``server/src/common/spec_gate.h``."""

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
"""The version of the gates' last revision (``source``; docs/conventions.md, "Where things came
from")."""

T_AR_WARMUP_TOKENS = 3
"""AR tokens emitted to measure t_ar; token 1 is untimed (v1 times tokens 2-3, v2 token 3)."""
T_AR_MIN = 0.5e-3
"""v2 clamp: a measured t_ar below 0.5 ms is replaced by ``T_AR_FALLBACK`` (times in seconds)."""
T_AR_FALLBACK = 5e-3
"""The 5 ms that replaces an implausibly small t_ar (v2)."""


class CommitEmaGate:
    """The self-calibrating commit-EMA gate (Luce-Org/lucebox ``server/src/common/spec_gate.h``).

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

    Worked trace (docs/spec_decode.md; t_ar 8 ms, step 54 ms, commit 3, ratio 4/9): v1 ema
    1.222, 0.833, 0.639, 0.542 with streaks 0, 1, 2, 3, floors before spec step 5; v2 ema
    0.222, 0.333, hard floor before spec step 3.
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
        self._reset_turn()

    def _reset_ema(self) -> None:
        self.ema = self.version.ema_init
        self.streak = 0
        self.n_ema_updates = 0

    def _reset_turn(self) -> None:
        """n_draft_steps = 0; v1 also resets the EMA state (v2/v3 keep it)."""
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

    # -- the loop's protocol (module docstring) ----------------------------------------------

    def start_turn(self, max_new_tokens: int, sampled: bool) -> int:
        """Begin a turn; return how many AR tokens the loop must decode before speculating.

        The turn's state restarts (n_draft_steps = 0; v1 also resets the EMA, v2/v3 keep it).
        Sampled runs skip the warm-up (the source's gate lives on the greedy path). v2/v3 decode
        a turn of at most 3 tokens by pure AR: the warm-up then covers the whole turn.
        Otherwise the t_ar warm-up (:data:`T_AR_WARMUP_TOKENS` tokens) runs when
        :attr:`needs_t_ar_warmup`.
        """
        self._reset_turn()
        if sampled:
            return 0
        if self.pure_ar_turn(max_new_tokens):
            return max_new_tokens
        return T_AR_WARMUP_TOKENS if self.needs_t_ar_warmup else 0

    def end_warmup(self, walls: Sequence[float]) -> None:
        """Calibrate t_ar from the warm-up tokens' times when all three ran (:meth:`set_t_ar`)."""
        if len(walls) >= T_AR_WARMUP_TOKENS:
            need = 1 if self.version.t_ar_per_turn else 2
            self.set_t_ar(walls[-need:])

    def check(self, obs: GateObservation) -> GateDecision:
        """Evaluate at the loop top, before the draft (this gate reads nothing from ``obs``)."""
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

    def observe(self, step: StepObservation) -> float:
        """Update after a committed spec step; returns its ratio. ``step.t_ar`` None: the
        cached (measured) t_ar."""
        t = (self.t_ar if self.t_ar is not None else 0.0) if step.t_ar is None else float(step.t_ar)
        r = self.ratio(step.commit_n, t, float(step.step_wall))
        self.ema = 0.5 * self.ema + 0.5 * r
        self.n_ema_updates += 1
        self.streak = self.streak + 1 if self.ema < self.margin else 0
        self.n_draft_steps += 1
        return r

    def ratio(self, commit_n: int, t_ar: float, step_wall: float) -> float:
        """``commit_n * t_ar / step_wall``, or the version's fallback when a time is <= 0."""
        if t_ar <= 0 or step_wall <= 0:
            return self.version.fallback_ratio
        return commit_n * t_ar / step_wall
