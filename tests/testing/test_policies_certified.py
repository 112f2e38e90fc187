"""The lossless certificate (dflash_ref.testing.lossless: chi-square, per-position marginals, exact
tails and ds4's max deviation against the exact law of plain sampling) on every sampled policy of
docs/lossless.md, run through its Verifier class as the loop runs it (tests/testing/policies.py),
and the biased top-k ratio rule, which it must reject.

POLICIES here and in scripts/lossless_policies.py name the same rules: the doc's table lists each
with the verdict asserted below.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.spec_decode.ddtree import DDTreeOptions
from dflash_ref.spec_decode.extra_verifiers import SampledTreeVerifier
from dflash_ref.spec_decode.sampled_policies import (
    DDTreeSampleMatchVerifier,
    OneHotRejectionChainVerifier,
    TopKRatioTreeVerifier,
)
from dflash_ref.spec_decode.verifiers import RejectionChainVerifier
from dflash_ref.testing.lossless import (
    P_VALUE_THRESHOLD,
    Law,
    check_lossless,
    sampling_law,
    toy_target,
)
from tests.testing.policies import verifier_step

V, L = 4, 2
N_TRIALS = 6000  # ~0.2-0.8 ms a step; the biased rule fails by p < 1e-10 at this count
TREE = DDTreeOptions(budget=4)  # 4 nodes below the root: 2 children at depth 1 or a deeper path
POLICIES = {  # name: (verifier, sparse DFlash 2 proposal, lossless)
    "chain, argmax drafts, one-hot q": (OneHotRejectionChainVerifier(), False, True),
    "chain, v1 independent per-position sampling": (RejectionChainVerifier(), False, True),
    "chain, DFlash 2 sparse q": (RejectionChainVerifier(), True, True),
    "DDTree, sample-and-match": (DDTreeSampleMatchVerifier(TREE), False, True),
    "sampled tree, drawn children": (SampledTreeVerifier(widths=(2, 2)), False, True),
    "DDTree, min(1, p/q) over top-k children": (TopKRatioTreeVerifier(TREE), False, False),
}
LAWS = {"T0.6": Law(0.6), "T1": Law(1.0), "T0.9-topk3-topp0.9": Law(0.9, top_k=3, top_p=0.9)}


def draft_logits(seed: int = 7, scale: float = 1.5) -> np.ndarray:
    """[L, V] a drafter that is neither right nor wrong everywhere."""
    return scale * np.random.default_rng(seed).standard_normal((L, V))


def certify(name: str, law_name: str, n_trials: int = N_TRIALS):
    verifier, sparse, _ = POLICIES[name]
    law = LAWS[law_name]
    return check_lossless(verifier_step(verifier, law, sparse), toy_target(V, seed=11),
                          draft_logits(), law, n_trials=n_trials)


LOSSLESS = [n for n, (_, _, ok) in POLICIES.items() if ok]
# The doc's two temperatures for every policy; top-k and top-p for the two policies that
# tests/testing/test_lossless.py does not already run under them.
CASES = [(n, T) for n in LOSSLESS for T in ("T0.6", "T1")] + [
    (n, "T0.9-topk3-topp0.9") for n in ("chain, argmax drafts, one-hot q",
                                        "DDTree, sample-and-match")]


@pytest.mark.parametrize(("name", "law_name"), CASES)
def test_policy_is_certified_lossless(name, law_name):
    report = certify(name, law_name)
    assert report.ok(), report.explain()
    assert report.max_deviation < report.max_deviation_bound
    assert 1.0 <= report.acceptance <= L + 1


@pytest.mark.parametrize("law_name", ["T0.6", "T1"])
def test_the_biased_top_k_ratio_rule_is_rejected(law_name):
    # The deterministic top-k children verified by min(1, r/q) as if drawn from q: the first
    # child is over-accepted; chi-square and ds4's max deviation both see it.
    report = certify("DDTree, min(1, p/q) over top-k children", law_name)
    assert not report.ok()
    assert report.p_value < 1e-10, report.explain()
    assert report.max_deviation > report.max_deviation_bound


def test_the_biased_rule_accepts_a_lone_child_with_min_1_p_over_q():
    # The exact law of the counterexample, by hand: a tree with one child c at depth 1 (budget 1,
    # L = 1). The rule emits c with probability min(1, p(c)/q(c)) (c is proposed with
    # probability 1, not q(c)), where plain sampling emits it with p(c); sample-and-match on the
    # same tree emits it with p(c).
    law = Law(1.0)
    dl = np.array([[1.0, 0.2, -0.5, 0.3]])  # [L=1, V]
    target = toy_target(V, seed=0)
    p = sampling_law(target(()), law)
    c = int(np.argmax(dl[0]))
    q_c = float(sampling_law(dl[0], law)[c])
    assert min(1.0, p[c] / q_c) - p[c] > 0.05  # a bias far outside the 5-sigma band below
    n = 5000
    for verifier, expected in [(TopKRatioTreeVerifier(DDTreeOptions(budget=1)),
                                min(1.0, p[c] / q_c)),
                               (DDTreeSampleMatchVerifier(DDTreeOptions(budget=1)), p[c])]:
        step = verifier_step(verifier, law)
        rng = np.random.default_rng(0)
        freq = np.mean([step(target, dl, rng)[0] == c for _ in range(n)])
        se = np.sqrt(expected * (1 - expected) / n)
        assert abs(freq - expected) < 5 * se, (type(verifier).__name__, freq, expected)


def test_the_certificate_is_a_function_of_the_implementers_sampler():
    # The documented entry point: any callable step(target, draft_logits, rng) -> tokens. A
    # sampler that ignores the temperature of its drafts (argmax drafts accepted on equality
    # with a target draw at T = 1, but the target drawn at T = 0.6's law) fails at T = 1.
    law = LAWS["T1"]

    def step(target, dl, rng):
        d = int(np.argmax(dl[0]))
        x = int(rng.choice(V, p=sampling_law(target(()), Law(0.6))))
        return (d, int(rng.choice(V, p=sampling_law(target((d,)), law)))) if x == d else (x,)

    report = check_lossless(step, toy_target(V, seed=11), draft_logits(), law, n_trials=3000)
    assert not report.ok() and report.p_value < P_VALUE_THRESHOLD, report.explain()
