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
