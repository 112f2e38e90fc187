"""The lossless harness (dflash_ref/testing/lossless.py) proves every sampled verify rule of the
package lossless, and rejects each one-line mutant (tests/testing/policies.py).

Expected laws come from the harness's own token-by-token ``sampling_law`` and products of it,
checked here against hand values and against the package's vectorised ``sampling_probs``. The
rules run through their :class:`Verifier` classes, as the loop runs them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dflash_ref.backend import get_backend
from dflash_ref.ops.sampling import sampling_probs
from dflash_ref.spec_decode.extra_verifiers import GreedyDraftChainVerifier, SampledTreeVerifier
from dflash_ref.spec_decode.verifiers import RejectionChainVerifier
from dflash_ref.testing.lossless import (
    Law,
    assert_lossless,
    check_lossless,
    sampling_law,
    sequence_law,
    toy_target,
)
from tests.testing.policies import (
    MUTATIONS,
    correct_chain_step,
    mutant_chain_step,
    verifier_step,
)

NP = get_backend("numpy")
V, L = 4, 2  # a 3-token completed sequence over 4 tokens: 64 cells
LAWS = {
    "T1": Law(1.0),
    "T0.7-topk3": Law(0.7, top_k=3),
    "T1.3-topp0.8": Law(1.3, top_p=0.8),
    "T0.9-topk3-topp0.9": Law(0.9, top_k=3, top_p=0.9),
}


def draft_logits(seed: int = 7, scale: float = 1.5) -> np.ndarray:
    """[L, V] a drafter that is neither right nor wrong everywhere."""
    return scale * np.random.default_rng(seed).standard_normal((L, V))


# -- the harness's pieces, against hand values -------------------------------------------------


def test_sampling_law_hand_values():
    # logits log([1, 2, 3, 4]): softmax = [0.1, 0.2, 0.3, 0.4].
    x = np.log([1.0, 2.0, 3.0, 4.0])
    assert np.allclose(sampling_law(x, Law(1.0)), [0.1, 0.2, 0.3, 0.4], atol=1e-15)
    # T = 0.5 squares the weights: [1, 4, 9, 16] / 30.
    assert np.allclose(sampling_law(x, Law(0.5)), np.array([1, 4, 9, 16]) / 30, atol=1e-15)
    # top-k 2 keeps tokens 2 and 3: [0, 0, 3/7, 4/7].
    assert np.allclose(sampling_law(x, Law(1.0, top_k=2)), [0, 0, 3 / 7, 4 / 7], atol=1e-15)
    # top-p 0.5: sorted 0.4, 0.3 (mass before 0.3 is 0.4 < 0.5), 0.2 (0.7 >= 0.5): cut.
    assert np.allclose(sampling_law(x, Law(1.0, top_p=0.5)), [0, 0, 3 / 7, 4 / 7], atol=1e-15)
    # top-p 0.4: the mass before 0.3 is 0.4, not < 0.4: only token 3.
    assert np.allclose(sampling_law(x, Law(1.0, top_p=0.4)), [0, 0, 0, 1], atol=1e-15)


@pytest.mark.parametrize("name", sorted(LAWS))
def test_sampling_law_equals_the_package_form(name):
    law = LAWS[name]
    rows = 2.0 * np.random.default_rng(3).standard_normal((20, 7))
    ours = np.stack([sampling_law(r, law) for r in rows])
    theirs = sampling_probs(NP, rows, law.temperature, law.top_p, law.top_k)
    assert np.allclose(ours, theirs, atol=1e-14)


def test_sequence_law_is_the_product_of_the_rows():
    target, law = toy_target(3, seed=1), Law(1.0)
    exact = sequence_law(target, law, 2)
    assert math.isclose(sum(exact.values()), 1.0, rel_tol=1e-12)
    p0 = sampling_law(target(()), law)
    p1 = sampling_law(target((2,)), law)
    assert math.isclose(exact[(2, 1)], p0[2] * p1[1], rel_tol=1e-12)
    assert not np.allclose(target(()), target((2,)))  # each prefix has its own row


def test_plain_sampling_passes_and_a_wrong_law_fails():
    law = LAWS["T1"]

    def plain(target, dl, rng):  # one token from the target's law: lossless by definition
        p = sampling_law(target(()), law)
        return (int(rng.choice(V, p=p)),)

    def too_cold(target, dl, rng):  # the law at T = 0.8: a plausible one-number bug
        p = sampling_law(target(()), Law(0.8))
        return (int(rng.choice(V, p=p)),)

    target = toy_target(V, seed=0)
    assert check_lossless(plain, target, draft_logits(), law, n_trials=4000).ok()
    report = check_lossless(too_cold, target, draft_logits(), law, n_trials=4000)
    assert not report.ok() and report.marginal_p[0] < 1e-4
    with pytest.raises(AssertionError, match="not lossless"):
        assert_lossless(too_cold, target, draft_logits(), law, n_trials=4000)


# -- the package's rules are lossless ----------------------------------------------------------

RULES = {
    "rejection, sampled drafts": (RejectionChainVerifier(), False),
    "rejection, DFlash 2 sparse proposal": (RejectionChainVerifier(), True),
    "argmax drafts, sampled rows": (GreedyDraftChainVerifier(), False),
    "tree, without replacement": (SampledTreeVerifier(widths=(2, 2)), False),
    "tree, with replacement": (SampledTreeVerifier(widths=(3,), replacement=True), False),
}


N_TRIALS = 4000  # ~1.5 ms a step on one core; the mutants below fail by p < 1e-10 at 3000
CASES = [(rule, law) for rule in sorted(RULES) for law in ("T1", "T0.9-topk3-topp0.9")] + [
    ("rejection, sampled drafts", "T0.7-topk3"), ("rejection, sampled drafts", "T1.3-topp0.8"),
    ("tree, without replacement", "T1.3-topp0.8")]


@pytest.mark.parametrize(("rule", "law_name"), CASES)
def test_rule_is_lossless(rule, law_name):
    verifier, sparse = RULES[rule]
    law = LAWS[law_name]
    report = assert_lossless(verifier_step(verifier, law, sparse), toy_target(V, seed=11),
                             draft_logits(), law, n_trials=N_TRIALS)
    assert 1.0 <= report.acceptance <= L + 1


def test_rejection_with_argmax_drafts_is_lossless():
    # The release's rejection rule fed greedy drafts with their one-hot law q = e_d.
    from dflash_ref.ops.sampling import DraftProposal
    from dflash_ref.spec_decode.verify import verify_chain_sampled
    from tests.testing.policies import ANCHOR, block_logits, params

    law = LAWS["T0.9-topk3-topp0.9"]

    def step(target, dl, rng):
        d = np.argmax(dl, axis=-1)
        prop = DraftProposal(d.astype(np.int64), np.eye(V)[d])
        from dflash_ref.spec_decode.verifiers import ChainBlock
        block = ChainBlock(np.concatenate([[ANCHOR], d]).astype(np.int64), prop)
        return verify_chain_sampled(NP, block.tokens, block_logits(target, block), prop,
                                    params(law, rng), rng).committed

    assert_lossless(step, toy_target(V, seed=5), draft_logits(), law, n_trials=N_TRIALS)


# -- and the harness has the power to say when one line is wrong -------------------------------


MUTANT_LAW = LAWS["T1.3-topp0.8"]  # top-p cuts, so the top-p-after-the-ratio mutant is visible


def test_the_unmutated_mutant_code_passes():
    assert_lossless(correct_chain_step(MUTANT_LAW), toy_target(V, seed=11), draft_logits(),
                    MUTANT_LAW, n_trials=N_TRIALS)


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_harness_rejects_a_one_line_mutant(mutation):
    report = check_lossless(mutant_chain_step(MUTANT_LAW, mutation), toy_target(V, seed=11),
                            draft_logits(), MUTANT_LAW, n_trials=3000)
    assert not report.ok()
    assert report.p_value < 1e-10, report.explain()
