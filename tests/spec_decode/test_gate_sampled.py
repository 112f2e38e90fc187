"""The gates under sampling (docs/lossless.md, "Gates under sampling").

- a gate built with ``sampled=True`` never floors: every decision says "sampled";
- a default-built gate judges a sampled run as a greedy one; the entropy gate reads p1 of the
  row that chose the anchor, for the sampled chain and the sampled tree (bonus node) alike;
- after a floor the turn is plain sampling: no spec step follows;
- lossless: a gate decides from the past only (the anchor's row, committed counts, times), so a
  step that may be replaced by plain sampling keeps the law; a "gate" that looks at the verify
  result and redoes a poor step with plain sampling is not lossless. Both checked by
  dflash_ref.testing.lossless on a toy target.

Expected p1 values come from a plain full forward of the committed sequence
(tests/spec_decode/test_gate_wiring.py ``expected_p1s``).
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.ops.sampling import SamplingParams
from dflash_ref.spec_decode.cost import CostModel
from dflash_ref.spec_decode.gate import CommitEmaGate, EntropyGate
from dflash_ref.spec_decode.loop import GateOptions, generate
from dflash_ref.spec_decode.verifiers import RejectionChainVerifier
from dflash_ref.testing.lossless import Law, check_lossless, sampling_law, toy_target
from tests.spec_decode.test_gate_wiring import (
    PROMPT,
    _p1,
    _scripted,
    expected_p1s,
    target,  # noqa: F401  (the fixture)
)
from tests.testing.policies import verifier_step

SAMPLED = SamplingParams(1.0, seed=3)
COST = CostModel(target_fixed=1.0, target_per_row=0.1, drafter_fixed=0.5)


def _gates(sampled: bool):
    return {"entropy": EntropyGate(sampled=sampled),
            "commit-ema": GateOptions(CommitEmaGate(sampled=sampled), COST)}


@pytest.mark.parametrize("verify", ["chain", "tree"])
@pytest.mark.parametrize("kind", ["entropy", "commit-ema"])
def test_a_gate_built_sampled_never_floors(target, kind, verify):  # noqa: F811
    res = generate(target, _scripted(target, 24, seed=5), PROMPT, 24, sampling=SAMPLED,
                   verify=verify, gate=_gates(True)[kind])
    assert res.floored_at is None
    assert res.gate_decisions and {d.reason for d in res.gate_decisions} == {"sampled"}


@pytest.mark.parametrize("verify", ["chain", "tree"])
def test_a_default_entropy_gate_reads_the_anchor_row_under_sampling(target, verify):  # noqa: F811
    res = generate(target, _scripted(target, 24, seed=5), PROMPT, 24, sampling=SAMPLED,
                   verify=verify, gate=EntropyGate())
    seen = [d.p1 for d in res.gate_decisions]
    # Decision k is taken after k spec steps, with the anchor at position N - 1 + 1 + sum of
    # their lengths; p1 is that of the row before it (test_gate_wiring.expected_p1s, which
    # stops at the last step: a floor adds one decision after it).
    seq = np.concatenate([PROMPT, res.tokens])
    logits = target.be.to_numpy(target.forward(seq, target.new_state()).logits)
    emitted = [1 + sum(res.acceptance_lengths[:k]) for k in range(len(seen))]
    expected = [_p1(logits[PROMPT.size - 2 + e]) for e in emitted]
    assert len(seen) >= 2 and np.allclose(seen, expected, atol=1e-5)
    assert np.allclose(seen[:-1], expected_p1s(target, res)[: len(seen) - 1], atol=1e-5)


@pytest.mark.parametrize("kind", ["entropy", "commit-ema"])
def test_after_a_floor_the_turn_is_plain_sampling(target, kind):  # noqa: F811
    res = generate(target, _scripted(target, 40, seed=6), PROMPT, 40,
                   sampling=SamplingParams(1.0, seed=1), gate=_gates(False)[kind])
    assert res.floored_at is not None
    # Every spec step came before the floor: their tokens (plus the prefill's first one, and the
    # commit-EMA gate's AR warm-up) are the tokens emitted up to it.
    assert sum(res.acceptance_lengths) < res.floored_at + 1
    assert res.gate_decisions[-1].floor


# -- a default-built gate on a sampled run: the warm-up count and every decision by hand --


def _warmup_count(res) -> int:
    """Plain tokens before the first spec step: every token but the prefill's, the spec steps'
    and (after a floor) the plain ones."""
    spec_end = 1 + sum(res.acceptance_lengths)
    return (res.floored_at if res.floored_at is not None else len(res.tokens)) - spec_end


@pytest.mark.parametrize("verify", ["chain", "tree"])
def test_a_default_commit_ema_gate_under_sampling_by_hand(target, verify):  # noqa: F811
    # The documented rule (CommitEmaGate, docs/lossless.md "Gates under sampling"): a sampled run
    # skips the AR warm-up, so no t_ar is measured and every ratio is the timing fallback,
    # whatever the wall times. v2 (the default): ema starts at 0.0, fallback 1.0, margin 1.0,
    # sustain 3, warmup 2. By hand, decision k sees the ema after k updates 1 - 2^-k and a
    # streak of k (each ema < margin):
    #   k=0 probe (0 steps < warmup 2); k=1 probe; k=2 spec (streak 2 < 3; ema 0.75 >= 0.5 margin,
    #   no hard floor); k=3 streak 3 >= 3: floor, after 3 spec steps.
    # Catches the warm-up run for a sampled run (a gate reading its own ``sampled`` flag, or the
    # loop passing the run as greedy: 3 plain tokens, a measured t_ar, wall-time ratios).
    res = generate(target, _scripted(target, 40, seed=6), PROMPT, 40, sampling=SAMPLED,
                   verify=verify, gate=CommitEmaGate())
    assert _warmup_count(res) == 0
    got = [(d.reason, d.floor, d.n_draft_steps, d.ema, d.streak) for d in res.gate_decisions]
    assert got == [("probe", False, 0, 0.0, 0), ("probe", False, 1, 0.5, 1),
                   ("spec", False, 2, 0.75, 2), ("streak", True, 3, 0.875, 3)]
    assert len(res.acceptance_lengths) == 3 and res.floored_at == 1 + sum(res.acceptance_lengths)


def test_a_default_commit_ema_gate_v1_under_sampling_never_floors(target):  # noqa: F811
    # v1: ema starts at 2.0 and the fallback ratio is 2.0, so the ema stays 2.0 >= margin: the
    # streak never grows and v1 has no hard floor; decisions 0 and 1 probe, the rest speculate.
    res = generate(target, _scripted(target, 40, seed=6), PROMPT, 40, sampling=SAMPLED,
                   gate=CommitEmaGate("v1"))
    assert _warmup_count(res) == 0 and res.floored_at is None
    got = [(d.reason, d.ema, d.streak) for d in res.gate_decisions]
    assert got == [("probe" if k < 2 else "spec", 2.0, 0) for k in range(len(got))]
    assert len(got) == len(res.acceptance_lengths) >= 3


@pytest.mark.parametrize(("ar_p1", "tie_p1", "sustain", "ends"),
                         [(0.90, 0.45, 2, "tie"), (0.2, 0.02, 3, "streak")],
                         ids=["defaults", "streak"])  # the tiny target's p1 is 0.02-0.1
def test_a_greedy_entropy_gate_under_sampling_decides_by_its_rule(target, ar_p1, tie_p1,  # noqa: F811
                                                                  sustain, ends):
    # EntropyGate's documented rule on p1s from a plain full forward (decision k reads the row
    # that chose the anchor after k spec steps, as in the test above): ema <- ema / 2 + p1 / 2
    # from 1.0; streak + 1 while ema < ar_p1, else 0; probe before the first spec step, then tie
    # (p1 < tie_p1), streak (>= sustain) or spec; a floor ends the decisions. No warm-up.
    res = generate(target, _scripted(target, 40, seed=6), PROMPT, 40, sampling=SAMPLED,
                   gate=EntropyGate(ar_p1, tie_p1, sustain))
    assert _warmup_count(res) == 0
    seq = np.concatenate([PROMPT, res.tokens])
    logits = target.be.to_numpy(target.forward(seq, target.new_state()).logits)
    ema, streak, expected = 1.0, 0, []
    for k in range(len(res.acceptance_lengths) + 1):
        p1 = _p1(logits[PROMPT.size - 2 + 1 + sum(res.acceptance_lengths[:k])])
        ema = 0.5 * ema + 0.5 * p1
        streak = streak + 1 if ema < ar_p1 else 0
        reason = ("probe" if k < 1 else "tie" if p1 < tie_p1 else "streak" if streak >= sustain
                  else "spec")
        expected.append((reason, streak, ema))
        if reason in ("tie", "streak") or k == len(res.gate_decisions) - 1:
            break
    got = [(d.reason, d.streak, d.ema) for d in res.gate_decisions]
    assert [g[:2] for g in got] == [e[:2] for e in expected]
    assert [g[2] for g in got] == pytest.approx([e[2] for e in expected], abs=1e-5)
    assert got[-1][0] == ends and res.floored_at is not None  # the case reaches its floor


# -- losslessness: a decision from the past keeps the law; one from the verify result does not --

LAW, V, L = Law(1.0), 4, 2


def _draft_logits():
    return 1.5 * np.random.default_rng(7).standard_normal((L, V))


def _plain(toy, rng):
    p = sampling_law(toy(()), LAW)
    return (int(rng.choice(V, p=p)),)


def test_a_gate_that_reads_the_past_keeps_the_law():
    spec = verifier_step(RejectionChainVerifier(), LAW)

    def gated(toy, dl, rng):  # the entropy gate's input: p1 of the anchor's row
        if sampling_law(toy(()), LAW).max() < 0.5:
            return _plain(toy, rng)
        return spec(toy, dl, rng)

    for seed in (3, 11):
        report = check_lossless(gated, toy_target(V, seed=seed), _draft_logits(), LAW,
                                n_trials=3000)
        assert report.ok(), report.explain()


def test_a_gate_that_reads_the_verify_result_is_not_lossless():
    spec = verifier_step(RejectionChainVerifier(), LAW)

    def peeking(toy, dl, rng):  # "the drafts were all rejected: decode this one plainly"
        out = spec(toy, dl, rng)
        return _plain(toy, rng) if len(out) == 1 else out

    report = check_lossless(peeking, toy_target(V, seed=11), _draft_logits(), LAW, n_trials=3000)
    assert report.p_value < 1e-10, report.explain()
