"""Sampled chain verify is lossless in distribution: chi-square tests (docs/spec_decode.md).

The claim: with a greedy (one-hot) draft, accepting a draft iff it equals the target token sampled
from softmax(logits / T) gives the same law as speculative sampling, namely

    P(a = k, bonus = x) = prod_{j<k} p_j(d_j) * p_k(x) [x != d_k]   (k < B-1)
    P(a = B-1, bonus = x) = prod_{j<B-1} p_j(d_j) * p_(B-1)(x)

so the first emitted token is distributed as p_0, whatever the draft. The expected values below
are these products computed in the test from the chosen p; the observed counts come from the
verifiers. Threshold: a chi-square p-value above 1e-4, fixed seeds, 20000 trials (vectorised).
A deliberately wrong verifier must fail the same test (so the test has power).

The vectorised trials run the two independent forms of tests/spec_decode/oracle_sampling.py (the
HF reference's per-row sampling and one-hot rejection sampling); the single-step tests run the
HF form and the package's :func:`verify_chain_sampled` (the release's rejection sampling, here
with greedy drafts' one-hot law).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dflash_ref.backend import get_backend
from dflash_ref.ops.sampling import DraftProposal, SamplingParams, sample_from_probs, target_probs
from dflash_ref.spec_decode.extra_verifiers import chain_sampled_core
from dflash_ref.spec_decode.verify import verify_chain_sampled
from dflash_ref.testing.chisquare import chi2_sf, chi_square_gof, gamma_q
from tests.spec_decode.oracle_sampling import (
    chain_rejection_core,
    hf_verify_chain_sampled,
    verify_one_hot,
)

NP = get_backend("numpy")
P_MIN = 1e-4
N_TRIALS = 20_000

# Target distributions of a 3-row block over V = 6 tokens (rows 0, 1, 2).
P = np.array([
    [0.03, 0.45, 0.20, 0.12, 0.10, 0.10],
    [0.15, 0.05, 0.40, 0.25, 0.10, 0.05],
    [0.10, 0.30, 0.05, 0.20, 0.20, 0.15],
])
LOW, HIGH = 0, 1  # draft tokens of low (0.03) and high (0.45) target probability at row 0


# -- the chi-square machinery, against closed forms --------------------------------------------


@pytest.mark.parametrize("x", [0.01, 0.5, 1.0, 3.841458820694124, 10.0, 40.0])
def test_chi2_sf_closed_forms(x):
    # dof 1: erfc(sqrt(x/2)); dof 2: exp(-x/2); dof 3: erfc(sqrt(x/2)) + sqrt(2x/pi) exp(-x/2);
    # dof 4: exp(-x/2) (1 + x/2). x = 3.8415 is the familiar 5% point of dof 1.
    rel = 1e-10
    assert chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=rel)
    assert chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=rel)
    sf3 = math.erfc(math.sqrt(x / 2)) + math.sqrt(2 * x / math.pi) * math.exp(-x / 2)
    assert chi2_sf(x, 3) == pytest.approx(sf3, rel=rel)
    assert chi2_sf(x, 4) == pytest.approx(math.exp(-x / 2) * (1 + x / 2), rel=rel)
    if x == 3.841458820694124:
        assert chi2_sf(x, 1) == pytest.approx(0.05, rel=1e-9)


def test_gamma_q_edges():
    assert gamma_q(2.5, 0.0) == 1.0
    assert chi2_sf(0.0, 5) == 1.0
    with pytest.raises(ValueError):
        gamma_q(0.0, 1.0)


def test_chi_square_gof_hand_value():
    # counts [10, 30] vs p [0.5, 0.5]: expected 20 each, stat = 100/20 + 100/20 = 10, dof 1.
    stat, dof, pv = chi_square_gof([10, 30], [0.5, 0.5])
    assert (stat, dof) == (10.0, 1)
    assert pv == pytest.approx(math.erfc(math.sqrt(5.0)), rel=1e-10)
    assert chi_square_gof([1, 5], [0.0, 1.0])[2] == 0.0  # a count where p = 0


def test_sample_from_probs_hand_values():
    # cumsum [0.25, 0.25, 1.0]: u * total = 0.1 -> token 0; 0.25 -> token 2 (token 1 has p = 0).
    p = np.array([[0.25, 0.0, 0.75]] * 3)
    assert sample_from_probs(p, np.array([0.1, 0.25, 0.9999999])).tolist() == [0, 2, 2]
    # Unnormalised rows are fine: [2, 0, 6] is the same law.
    assert sample_from_probs(np.array([2.0, 0.0, 6.0]), 0.3).tolist() == 2
    # u just below 1 never selects a trailing zero-probability token.
    assert int(sample_from_probs(np.array([0.5, 0.5, 0.0]), np.nextafter(1.0, 0.0))) == 1


# -- the law of the first emitted token and of (a, bonus) --------------------------------------


def _first_token(block, a, bonus):
    return np.where(a >= 1, block[..., 1], bonus)


def _run_sampled(block, n, seed):
    g = np.random.default_rng(seed)
    blocks = np.broadcast_to(block, (n, block.shape[0]))
    probs = np.broadcast_to(P[: block.shape[0]], (n, *P[: block.shape[0]].shape))
    a, bonus, _ = chain_sampled_core(blocks, probs, g.random((n, block.shape[0])))
    return a, bonus


def _run_rejection(block, n, seed):
    g = np.random.default_rng(seed)
    B = block.shape[0]
    blocks = np.broadcast_to(block, (n, B))
    probs = np.broadcast_to(P[:B], (n, *P[:B].shape))
    return chain_rejection_core(blocks, probs, g.random((n, B - 1)), g.random(n))


RUNNERS = {"sampled": _run_sampled, "rejection": _run_rejection}


@pytest.mark.parametrize("form", sorted(RUNNERS))
@pytest.mark.parametrize("draft", [LOW, HIGH], ids=["low-p-draft", "high-p-draft"])
def test_first_emitted_token_is_distributed_as_the_target(form, draft):
    block = np.array([5, draft, 2])
    a, bonus = RUNNERS[form](block, N_TRIALS, seed=1234 + draft)
    counts = np.bincount(_first_token(block, a, bonus), minlength=6)
    stat, dof, pv = chi_square_gof(counts, P[0])
    assert dof == 5
    assert pv > P_MIN, f"{form}, draft {draft}: chi2 {stat:.1f}, p {pv:.2e}, counts {counts}"


def _joint_law(block):
    """Expected P(a = k, bonus = x) as a [B, V] table, from the formula in the module docstring."""
    B, V = block.shape[0], P.shape[1]
    law = np.zeros((B, V))
    reach = 1.0  # probability that drafts 0..k-1 were all accepted
    for k in range(B):
        if k < B - 1:
            d = block[1 + k]
            law[k] = reach * P[k] * (np.arange(V) != d)
            reach *= P[k, d]
        else:
            law[k] = reach * P[k]
    return law


@pytest.mark.parametrize("form", sorted(RUNNERS))
def test_joint_law_of_accept_count_and_bonus(form):
    # Draft 1 (p 0.45) then draft 2 at row 1 (p 0.40): all three a values are well populated.
    block = np.array([5, HIGH, 2])
    a, bonus = RUNNERS[form](block, N_TRIALS, seed=99)
    counts = np.zeros((3, 6))
    np.add.at(counts, (a, bonus), 1)
    law = _joint_law(block)
    assert law.sum() == pytest.approx(1.0, abs=1e-12)
    stat, dof, pv = chi_square_gof(counts, law)
    assert dof == 15  # 5 + 5 cells after a rejection (x != d), 6 after a full accept, minus 1
    assert pv > P_MIN, f"{form}: chi2 {stat:.1f} on {dof} dof, p {pv:.2e}"


def test_a_wrong_verifier_fails_the_test():
    # Negative control: on rejection, draw the bonus from p itself (forgetting to exclude d).
    # Then P(first = d) = p(d) + (1 - p(d)) p(d) = 0.45 + 0.55 * 0.45 = 0.6975, not 0.45.
    g = np.random.default_rng(7)
    n = N_TRIALS
    accept = g.random(n) < P[0, HIGH]
    wrong_bonus = sample_from_probs(np.broadcast_to(P[0], (n, 6)), g.random(n))
    first = np.where(accept, HIGH, wrong_bonus)
    _, _, pv = chi_square_gof(np.bincount(first, minlength=6), P[0])
    assert pv < 1e-12


@pytest.mark.parametrize("fn", [hf_verify_chain_sampled, verify_one_hot])
def test_wrappers_scale_by_temperature_and_use_the_seed(fn):
    # logits = T log p, so softmax(logits / T) = p: the wrapper must divide by T. 4000 steps
    # through the public single-step API (slower than the cores, hence fewer trials).
    T = 0.7
    logits = (T * np.log(P)).astype(np.float64)
    assert np.allclose(target_probs(NP, logits, T), P, rtol=1e-12, atol=0)
    g = np.random.default_rng(2024)
    block = np.array([5, HIGH, 2])
    firsts = [fn(NP, block, logits, T, g).committed[0] for _ in range(4000)]
    _, _, pv = chi_square_gof(np.bincount(firsts, minlength=6), P[0])
    assert pv > P_MIN
    r1 = fn(NP, block, logits, T, rng=11)
    r2 = fn(NP, block, logits, T, rng=np.random.default_rng(11))
    assert (r1.a, r1.committed) == (r2.a, r2.committed)


def test_sampling_needs_an_explicit_generator():
    with pytest.raises(TypeError, match="Generator or an int seed"):
        verify_chain_sampled(NP, [1, 2], np.zeros((2, 3)),
                             DraftProposal(np.array([2]), np.eye(3)[[2]]), SamplingParams(1.0),
                             rng=None)
