"""Spec-decode gates (docs/spec_decode.md, gates): golden traces, rules, and the bound against AR.

Expected values are worked out by hand from the update rules in the spec, written next to each
assertion; the worked trace of docs/spec_decode.md (t_ar 8 ms, step 54 ms, commit 3) is the
golden vector.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dflash_ref.backend import get_backend
from dflash_ref.errors import ConfigError
from dflash_ref.spec_decode.cost import CostModel, probe_steps_bound, simulate_gated_decode
from dflash_ref.spec_decode.gate import CommitEmaGate, EntropyGate
from dflash_ref.spec_decode.gating import GateObservation, StepObservation, p1_from_logits

NP = get_backend("numpy")
T_AR, STEP, COMMIT = 0.008, 0.054, 3  # the worked trace: 3 * 8 / 54 = 4/9
TOP = GateObservation(NP, None, 0)  # a decision point without logits (the commit-EMA gate's)


def step(commit_n, t_ar=None, step_wall=0.0) -> StepObservation:
    """A committed spec step as the loop reports it to ``gate.observe``."""
    return StepObservation(commit_n=commit_n, step_wall=step_wall, t_ar=t_ar)


def at_p1(p1: float) -> GateObservation:
    """A decision point whose logits row has top-1 probability ``p1``: p1, then the rest spread
    evenly over k tokens each below it (p1 / (p1 + k (1 - p1) / k) = p1)."""
    k = int(np.ceil((1 - p1) / p1)) + 1
    return GateObservation(NP, np.log([p1] + [(1 - p1) / k] * k), 0)


def _run_trace(gate, step_args, n_steps):
    """check() then observe(COMMIT, T_AR, STEP) until a floor; returns decisions, emas."""
    decisions, emas, streaks = [], [], []
    for _ in range(n_steps):
        d = gate.check(TOP)
        decisions.append(d)
        if d.floor:
            break
        gate.observe(step(*step_args))
        emas.append(gate.ema)
        streaks.append(gate.streak)
    return decisions, emas, streaks


# -- commit-EMA gate: the worked trace ---------------------------------------------------------


def test_v1_worked_trace():
    # ema_0 = 2; ema <- ema/2 + (4/9)/2:  11/9 = 1.222, 5/6 = 0.833, 23/36 = 0.639, 39/72 = 0.542.
    # streak (ema < 1): 0, 1, 2, 3. Decisions before steps 1, 2: probe (n_draft_steps < warmup 2);
    # 3, 4: spec (streak 1, 2 < sustain 3); before step 5 streak 3 >= 3: floor.
    gate = CommitEmaGate("v1")
    decisions, emas, streaks = _run_trace(gate, (COMMIT, T_AR, STEP), 10)
    assert emas == pytest.approx([11 / 9, 5 / 6, 23 / 36, 39 / 72], rel=1e-12)
    assert streaks == [0, 1, 2, 3]
    assert [d.reason for d in decisions] == ["probe", "probe", "spec", "spec", "streak"]
    assert decisions[-1].floor and decisions[-1].n_draft_steps == 4


def test_v2_worked_trace():
    # ema_0 = 0: 2/9 = 0.222 (streak 1), 1/3 = 0.333 (streak 2). Before step 3: n_draft_steps 2
    # >= warmup, streak 2 < 3, but n_ema_updates 2 >= 2 and 1/3 < 0.5 * margin: hard floor.
    gate = CommitEmaGate("v2")
    decisions, emas, streaks = _run_trace(gate, (COMMIT, T_AR, STEP), 10)
    assert emas == pytest.approx([2 / 9, 1 / 3], rel=1e-12)
    assert streaks == [1, 2]
    assert [d.reason for d in decisions] == ["probe", "probe", "hard"]
    assert decisions[-1].floor and decisions[-1].n_draft_steps == 2


def test_v3_floors_like_v1_on_the_worked_trace():
    # v3 starts at 2.0 like v1. Its hard path needs ema < 0.5, but the lowest EMA before the
    # streak rule fires is 39/72 = 0.542 >= 0.5: it floors before step 5, exactly as v1.
    decisions, emas, _ = _run_trace(CommitEmaGate("v3"), (COMMIT, T_AR, STEP), 10)
    assert emas == pytest.approx([11 / 9, 5 / 6, 23 / 36, 39 / 72], rel=1e-12)
    assert [d.reason for d in decisions][-1] == "streak" and len(decisions) == 5


@pytest.mark.parametrize("version", ["v1", "v2", "v3"])
def test_a_winning_profile_never_floors(version):
    # 14 tokens in 12 ms with t_ar 8 ms: ratio 112/12 = 9.33 > 1 every step.
    gate = CommitEmaGate(version)
    decisions, _, _ = _run_trace(gate, (14, T_AR, 0.012), 50)
    assert not any(d.floor for d in decisions)
    assert gate.ema > 9.0


def test_v3_test_c_two_slow_warmup_steps_then_winners():
    # Two slow steps (4/9) then winners (28/3). v3: 11/9, 5/6 -> before step 3 streak 1 and
    # 5/6 >= 0.5: keep going; then 5/12 + 14/3 > 1 resets the streak: never floors.
    # v2 on the same profile: 2/9, 1/3 -> hard floor before step 3 (the regression v3 fixed).
    for version, floors in (("v3", False), ("v2", True)):
        gate = CommitEmaGate(version)
        floored = False
        for i in range(30):
            if gate.check(TOP).floor:
                floored = True
                assert i == 2
                break
            gate.observe(step(*((COMMIT, T_AR, STEP) if i < 2 else (14, T_AR, 0.012))))
        assert floored is floors, version


def test_timing_fallback_ratio_per_version():
    # t_ar <= 0 or step_wall <= 0: v1 uses ratio 2.0, v2/v3 1.0.
    assert CommitEmaGate("v1").observe(step(3, 0.0, STEP)) == 2.0
    assert CommitEmaGate("v2").observe(step(3, T_AR, 0.0)) == 1.0
    assert CommitEmaGate("v3").observe(step(3, -1.0, STEP)) == 1.0


def test_state_lifetime_per_version():
    # v1 keeps its EMA in the turn's locals: start_turn resets to 2.0. v2/v3 keep it as a backend
    # member across turns; n_draft_steps always restarts (warmup counts this turn's spec steps).
    v1, v2 = CommitEmaGate("v1"), CommitEmaGate("v2")
    for g in (v1, v2):
        g.observe(step(COMMIT, T_AR, STEP))
        g.observe(step(COMMIT, T_AR, STEP))
        g.start_turn(64, sampled=False)
        assert g.n_draft_steps == 0 and not g.floored
    assert (v1.ema, v1.streak, v1.n_ema_updates) == (2.0, 0, 0)
    assert v2.ema == pytest.approx(1 / 3) and v2.streak == 2 and v2.n_ema_updates == 2
    assert v2.check(TOP).reason == "probe"  # warmup applies per turn even with a persistent EMA


def test_disabled_sampled_and_floored():
    for gate in (CommitEmaGate("v2", enabled=False), CommitEmaGate("v2", sampled=True)):
        decisions, _, _ = _run_trace(gate, (COMMIT, T_AR, STEP), 10)
        assert not any(d.floor for d in decisions)
        assert decisions[0].reason in ("disabled", "sampled")
    gate = CommitEmaGate("v2")
    _run_trace(gate, (COMMIT, T_AR, STEP), 10)
    assert gate.check(TOP).reason == "floored" and gate.floored  # no way back within the turn


def test_t_ar_measurement_protocols():
    # v1: once per process, t_ar = (wall of AR token 2 + wall of token 3) / 2.
    v1 = CommitEmaGate("v1")
    assert v1.needs_t_ar_warmup
    assert v1.set_t_ar([0.010, 0.012]) == pytest.approx(0.011)
    assert not v1.needs_t_ar_warmup and not v1.pure_ar_turn(2)
    # v2: every turn, t_ar = wall of token 3; below 0.5 ms -> 5 ms; log EMA 0.7 old + 0.3 new.
    v2 = CommitEmaGate("v2")
    assert v2.set_t_ar([0.009]) == 0.009
    assert v2.set_t_ar([0.0003]) == 0.005
    assert v2.t_ar_log == pytest.approx(0.7 * 0.009 + 0.3 * 0.005)
    assert v2.needs_t_ar_warmup and v2.pure_ar_turn(3) and not v2.pure_ar_turn(4)
    # observe falls back to the cached t_ar: 3 * 5 ms / 54 ms.
    assert v2.observe(step(3, step_wall=STEP)) == pytest.approx(15 / 54)
    with pytest.raises(ValueError, match="2 wall times"):
        v1.set_t_ar([0.01])


def test_bad_config_is_explained():
    with pytest.raises(ConfigError, match="unknown version"):
        CommitEmaGate("v9")
    with pytest.raises(ConfigError, match="sustain"):
        CommitEmaGate(sustain=0)
    with pytest.raises(ConfigError, match="ar_p1"):
        EntropyGate(ar_p1=1.5)


# -- entropy gate ------------------------------------------------------------------------------


def _entropy_trace(gate, p1s):
    out = []
    for p1 in p1s:
        d = gate.check(at_p1(p1))
        out.append(d)
        if d.floor:
            break
        gate.observe(step(COMMIT, T_AR, STEP))
    return out


def test_entropy_gate_streak_trace():
    # ema_p1 starts at 1: 0.95 -> 0.975 (>= 0.9, streak 0; n 0: probe); 0.7 -> 0.8375 (streak 1,
    # n 1: spec); 0.8 -> 0.81875 (streak 2 >= sustain 2: floor).
    d = _entropy_trace(EntropyGate(), [0.95, 0.7, 0.8])
    assert [x.ema for x in d] == pytest.approx([0.975, 0.8375, 0.81875], rel=1e-12)
    assert [x.streak for x in d] == [0, 1, 2]
    assert [x.reason for x in d] == ["probe", "spec", "streak"]


def test_entropy_gate_tie_after_the_one_step_probe():
    # A tie at step 0 does not floor (the one-step probe: n_draft_steps >= 1 is required).
    # 0.99 -> 0.995, then p1 0.44 < 0.45 is a tie: floor at once.
    assert _entropy_trace(EntropyGate(), [0.4])[0].reason == "probe"
    d = _entropy_trace(EntropyGate(), [0.99, 0.44])
    assert [x.reason for x in d] == ["probe", "tie"] and d[-1].floor
    assert d[-1].ema == pytest.approx(0.7175)


def test_entropy_gate_streak_resets():
    # 0.95 -> 0.975; 0.85 -> 0.9125 (>= 0.9: streak 0); 0.85 -> 0.88125 (streak 1);
    # 0.99 -> 0.935625 (streak 0): never floors.
    d = _entropy_trace(EntropyGate(), [0.95, 0.85, 0.85, 0.99])
    assert [x.streak for x in d] == [0, 0, 1, 0]
    assert d[-1].ema == pytest.approx(0.935625) and not any(x.floor for x in d)


def test_entropy_gate_without_logits_and_disabled():
    g = EntropyGate()
    d = g.check(TOP)
    assert d.reason == "no-logits" and not d.floor and g.ema_p1 == 1.0
    for gate in (EntropyGate(enabled=False), EntropyGate(sampled=True)):
        assert not any(x.floor for x in _entropy_trace(gate, [0.1] * 5))


def test_p1_from_logits():
    # [0, ln 3]: p1 = 3 / (1 + 3) = 0.75, computed in float64.
    assert p1_from_logits(NP, np.array([0.0, math.log(3.0)], np.float32)) == pytest.approx(0.75)


# -- cost model and the modelled run -----------------------------------------------------------


def test_cost_model_hand_values():
    c = CostModel(target_fixed=0.020, target_per_row=0.001, drafter_fixed=0.005,
                  drafter_per_row=0.0005, step_overhead=0.001)
    assert c.t_ar == pytest.approx(0.021)
    assert c.target(16) == pytest.approx(0.036)
    assert c.drafter(16) == pytest.approx(0.013)
    assert c.spec_step(16) == pytest.approx(0.013 + 0.036 + 0.001)
    assert c.spec_step(16, verify_width=23) == pytest.approx(0.013 + 0.043 + 0.001)


def test_simulated_worked_trace():
    # t_ar 8 ms, spec step 54 ms (drafter 46 + target 8), commits of 3: 30 tokens in all.
    # v1 floors after 4 spec steps: 4 * 54 + (30 - 12) * 8 = 360 ms vs AR 240: excess 120 ms.
    # v2 floors after 2: 2 * 54 + 24 * 8 = 300 ms: excess 60 ms.
    cost = CostModel(target_fixed=T_AR, drafter_fixed=STEP - T_AR)
    for version, steps, time in (("v1", 4, 0.360), ("v2", 2, 0.300)):
        run = simulate_gated_decode(CommitEmaGate(version), [3] * 10, cost, block_size=16)
        assert run.floored_after == steps and run.spec_steps == steps
        assert run.time == pytest.approx(time) and run.ar_time == pytest.approx(0.240)


def test_probe_bound_matches_the_worked_trace():
    # v1: e0 = 2, r = 4/9: (e0 - r) / (1 - r) = 2.8, smallest k with 2^k > 2.8 is 2 (ema_2 = 0.833
    # is the first below 1); the streak reaches 3 after 2 + 3 - 1 = 4 steps: the 4 of the trace.
    assert probe_steps_bound(CommitEmaGate("v1"), 4 / 9, 2.0) == 4
    # From e0 = 0.5 < margin the streak starts at once: max(warmup 2, 1 + 3 - 1) = 3.
    assert probe_steps_bound(CommitEmaGate("v2"), 4 / 9, 0.5) == 3
    # A landing on the margin is not below it: e0 = 2, r = 0.5: ema 1.25, 0.875 -> k_drop 2;
    # e0 = 1.5, r = 0.5: ema_1 = 1.0 exactly (not < 1), ema_2 = 0.75 -> k_drop 2 -> 4 steps.
    assert probe_steps_bound(CommitEmaGate("v1"), 0.5, 1.5) == 4


def _bad_steps_allowed(warmup, sustain, margin, r_bad, e0):
    """Bad spec steps before a floor, from the spec's rules (computed here, not by the gate).

    After k bad steps ema_k = r + (e0 - r) / 2^k. The streak counts updates with ema < margin;
    it starts at the first k with ema_k < margin (k_drop) and reaches `sustain` at update
    k_drop + sustain - 1; the floor also needs n_draft_steps >= warmup. The v2/v3 hard floor can
    only come earlier. So at most max(warmup, k_drop + sustain - 1) bad steps run.
    """
    k = 1
    while not r_bad + (e0 - r_bad) / 2**k < margin - 1e-9:  # conservative at exact landings
        k += 1
    return max(warmup, k + sustain - 1)


@given(
    version=st.sampled_from(["v1", "v2", "v3"]),
    target_fixed=st.integers(2, 30), target_per_row=st.integers(0, 4),
    drafter=st.integers(1, 40), commit_good=st.integers(1, 16), commit_bad=st.integers(1, 16),
    kind=st.sampled_from(["bad", "good", "good-then-bad", "bad-then-good"]),
    n1=st.integers(1, 40), n2=st.integers(1, 40),
)
def test_gated_run_is_never_worse_than_ar_by_more_than_the_probe(
        version, target_fixed, target_per_row, drafter, commit_good, commit_bad, kind, n1, n2):
    # Times in units of 2^-12 s (~0.24 ms; integers -> exact sums). A spec step costs
    # c_s = drafter(16) + target(16); AR costs t_ar = target(1) per token. A step committing
    # c tokens loses c_s - c t_ar against AR (negative: a win). Bad steps: c_bad t_ar < c_s
    # (ratio < 1 = margin); good steps: c_good t_ar >= c_s.
    # Claim: excess = T_gated - T_AR <= P * (c_s - c_bad t_ar), P = the most bad steps the gate
    # can take before it floors (from the rules, with the EMA at the start of the bad run at most
    # max(ema_init, r_good): the EMA is a running mean of ema_init and the ratios seen).
    cost = CostModel(target_fixed=target_fixed / 4096, target_per_row=target_per_row / 4096,
                     drafter_fixed=drafter / 4096)
    t_ar, c_s = cost.t_ar, cost.spec_step(16)
    assume(commit_bad * t_ar < c_s)
    good_exists = commit_good * t_ar >= c_s
    assume(good_exists or kind == "bad")
    commits = {"bad": [commit_bad] * n1, "good": [commit_good] * n1,
               "good-then-bad": [commit_good] * n1 + [commit_bad] * n2,
               "bad-then-good": [commit_bad] * n1 + [commit_good] * n2}[kind]
    gate = CommitEmaGate(version)
    run = simulate_gated_decode(gate, commits, cost, block_size=16)
    r_bad, r_good = commit_bad * t_ar / c_s, commit_good * t_ar / c_s
    init = {"v1": 2.0, "v2": 0.0, "v3": 2.0}[version]
    e0 = init if kind in ("bad", "bad-then-good") else max(init, r_good)
    P = _bad_steps_allowed(gate.warmup, gate.sustain, gate.margin, r_bad, e0)
    loss = c_s - commit_bad * t_ar
    tol = 1e-12
    if kind == "good":
        assert run.excess <= tol
    else:
        assert run.excess <= P * loss + tol, (run.excess, P, loss)
    exact = probe_steps_bound(gate, r_bad, e0)  # the same rule run with the gate's float update
    assert P - 1 <= exact <= P  # they differ only when ema_k lands on the margin exactly
    if kind == "bad" and version == "v1" and n1 > exact:  # no hard path: exactly that many steps
        assert run.floored_after == exact


def test_commit_ema_gate_alternation_defeats_the_bound():
    # The bound needs runs of bad steps. An alternation of 1-token and 10-token steps after a good
    # phase is slower than AR (11 tokens in 2 * 54 = 108 ms vs 88 ms) yet never floors: with
    # lo = 8/54, hi = 80/54 the EMA cycles between (lo + 2 hi)/3 = 1.037 (streak reset) and
    # 0.593 (streak 1; >= 0.5, no hard floor). Loss: 20 ms per cycle, unbounded in the cycles.
    cost = CostModel(target_fixed=T_AR, drafter_fixed=STEP - T_AR)
    commits = [14] * 5 + [1, 10] * 100
    for version in ("v1", "v2", "v3"):
        run = simulate_gated_decode(CommitEmaGate(version), commits, cost, block_size=16)
        assert run.floored_after is None
        # 5 good steps: 5 * (54 - 112) = -290 ms; 100 cycles: 100 * (108 - 88) = 2000 ms.
        assert run.excess == pytest.approx(1.710, rel=1e-9)
