"""How generate() feeds the gates: which logits row the entropy gate reads, what commit count the
commit-EMA gate is given, and where the hard floor sits.

Expected values come from outside the loop: p1 is recomputed from a plain full forward of the
committed sequence (no cache, no verify batches), and the EMA trajectory is predicted by hand
from the update rule ``ema <- ema / 2 + ratio / 2`` with ``ratio = commit_n * t_ar / step``.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.cost import CostModel
from dflash_ref.spec_decode.gate import (
    CommitEmaGate,
    EntropyGate,
    GateObservation,
    StepObservation,
)
from dflash_ref.spec_decode.loop import GateOptions, generate
from dflash_ref.tiny import write_tiny_target
from tests.spec_decode.drafters import ScriptedDrafter

PROMPT = np.array([3, 17, 42, 99, 5, 61])
B = 8


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = write_tiny_target(tmp_path_factory.mktemp("gate_wiring") / "t", "qwen3", seed=41)
    return TargetModel.from_pretrained(path, target_layer_ids=[0, 2])


def _scripted(target, n, seed):
    """A drafter that knows the greedy continuation and errs on 30% of rows: every acceptance
    length 0..B-1 occurs, so the bonus row is rarely the last verify row."""
    truth = np.concatenate([PROMPT, generate(target, None, PROMPT, n + B + 2).tokens])
    return ScriptedDrafter(target, truth, B, error_rate=0.3, seed=seed)


def _p1(logits_row) -> float:
    """Top-1 probability in float64, written out: 1 / sum_i exp(l_i - max l)."""
    z = np.asarray(logits_row, np.float64)
    return float(1.0 / np.exp(z - z.max()).sum())


def expected_p1s(target, res) -> list[float]:
    """The p1 each gate decision of ``res`` must have seen, computed independently.

    One plain forward over prompt + every generated token; the row at position q holds the
    target's distribution for the token at q + 1. Decision k is taken with the anchor (the newest
    emitted token) at position N - 1 + emitted_k, emitted_k = 1 + the sum of the earlier steps'
    a + 1; the row that produced the anchor is the one before it.
    """
    seq = np.concatenate([PROMPT, res.tokens])
    logits = target.be.to_numpy(target.forward(seq, target.new_state()).logits)
    emitted = 1 + np.concatenate([[0], np.cumsum(res.acceptance_lengths)[:-1]])
    return [_p1(logits[PROMPT.size - 1 + int(e) - 1]) for e in emitted[: len(res.gate_decisions)]]


def test_entropy_gate_sees_the_bonus_row(target):
    n = 40
    # Thresholds 0: the gate never floors, so every spec step is preceded by a decision.
    gate = EntropyGate(ar_p1=0.0, tie_p1=0.0)
    res = generate(target, _scripted(target, n, seed=5), PROMPT, n, gate=gate)
    assert res.floored_at is None
    assert len(res.gate_decisions) == len(res.acceptance_lengths)
    assert any(a < B for a in res.acceptance_lengths[:-1]), "need rejections (bonus row != last)"
    for k, (d, expected) in enumerate(zip(res.gate_decisions, expected_p1s(target, res))):
        assert d.p1 == pytest.approx(expected, rel=1e-4, abs=1e-6), f"decision {k}"


def test_commit_ema_counts_the_bonus_token(target):
    n = 48
    cost = CostModel(target_fixed=0.010, target_per_row=0.001, drafter_fixed=0.004)
    # A tiny margin: the gate never floors (no streak, no hard floor), so each step is recorded.
    gate = CommitEmaGate("v2", margin=1e-9)
    res = generate(target, _scripted(target, n, seed=9), PROMPT, n, gate=GateOptions(gate, cost))
    assert res.floored_at is None and len(res.acceptance_lengths) >= 4
    assert len(set(res.acceptance_lengths)) >= 3  # varied commits, so the EMA path is specific
    # By hand: t_ar = target(1) = 0.011 s; a spec step = drafter 0.004 + target(8) 0.018 =
    # 0.022 s; a step committing a + 1 tokens (accepted drafts + the bonus) has ratio
    # (a + 1) * 0.011 / 0.022 = (a + 1) / 2. v2 starts the EMA at 0.
    ema, expected = 0.0, []
    for commit_n in res.acceptance_lengths:
        expected.append(ema)  # the decision before a step sees the EMA of the earlier steps
        ema = 0.5 * ema + 0.5 * (commit_n / 2.0)
    got = [d.ema for d in res.gate_decisions]
    np.testing.assert_allclose(got, expected[: len(got)], rtol=1e-12, atol=1e-12)
    assert len(got) == len(res.acceptance_lengths)
    assert gate.ema == pytest.approx(ema, rel=1e-12)


@pytest.mark.parametrize("margin", [1.0, 2.0])
def test_hard_floor_threshold_is_half_margin(margin):
    # v2 (EMA starts at 0, hard floor on), warmup 2, sustain 3: after two steps the streak is 2,
    # so only the hard floor "ema < 0.5 * margin" can fire at the third decision.
    # ratio = commit_n * t_ar / step_wall. By hand, with t_ar = margin / 10 and step_wall 1:
    #   commits (6, 6):  ema 0 -> 0.3 m -> 0.15 m + 0.3 m = 0.45 m  (below 0.5 m: floor)
    #   commits (2, 10): ema 0 -> 0.1 m -> 0.05 m + 0.5 m = 0.55 m  (above 0.5 m: no floor)
    # A threshold of 0.4 m misses the first, 0.6 m floors the second.
    for commits, ema_after, floors in (((6, 6), 0.45, True), ((2, 10), 0.55, False)):
        gate = CommitEmaGate("v2", margin=margin, sustain=3, warmup=2)
        gate.start_turn(64, sampled=False)
        top = GateObservation(None, None, 0)  # the commit-EMA gate reads nothing from it
        for c in commits:
            assert not gate.check(top).floor  # the probe
            gate.observe(StepObservation(commit_n=c, step_wall=1.0, t_ar=margin / 10))
        assert gate.ema == pytest.approx(ema_after * margin, rel=1e-12)
        assert gate.streak == 2  # both EMAs are below the margin, yet short of sustain 3
        d = gate.check(top)
        assert d.floor == floors, (commits, d)
        assert d.reason == ("hard" if floors else "spec")
