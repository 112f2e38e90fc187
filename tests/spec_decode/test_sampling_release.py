"""The release's sampling (dflash 0.1.0; dflash_ref/ops/sampling.py, the rejection rule in
dflash_ref/spec_decode/verify.py): the top-p / top-k filter by hand, rejection sampling with the
residual, and generate() end to end with both sampled verifiers.

Lossless means: the emitted tokens are distributed as sampling from the (filtered) target one
token at a time. Expected laws are computed in the test, from the target's logits through an
independent float64 filter (:func:`_filtered`, written from the release's description, not from
the code under test). Threshold: chi-square p-value > 1e-4 with fixed seeds; a deliberately
wrong residual must fail the same test (power).
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.errors import ConfigError
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.ops.sampling import SamplingParams, sampling_probs
from dflash_ref.spec_decode.extra_verifiers import GreedyDraftChainVerifier
from dflash_ref.spec_decode.loop import generate
from dflash_ref.spec_decode.verifiers import ChainVerifier, RejectionChainVerifier
from dflash_ref.spec_decode.verify import rejection_core
from dflash_ref.testing.chisquare import chi_square_gof
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target

P_MIN = 1e-4


def _filtered(logits, T, top_p=1.0, top_k=0):
    """Independent float64 filter: keep the top_k largest (lower id on ties), softmax, then the
    smallest descending prefix whose mass before each kept entry is < top_p; renormalise."""
    x = np.asarray(logits, np.float64) / T
    ranked = sorted(range(x.size), key=lambda i: (-x[i], i))
    kept = ranked[:top_k] if 0 < top_k < x.size else ranked
    p = np.zeros(x.size)
    e = np.exp(x[kept] - x[kept].max())
    p[kept] = e / e.sum()
    if top_p < 1.0:
        mass, keep = 0.0, []
        for i in sorted(kept, key=lambda i: (-p[i], i)):
            if mass < top_p:
                keep.append(i)
            mass += p[i]
        q = np.zeros_like(p)
        q[keep] = p[keep]
        p = q / q.sum()
    return p


def test_sampling_probs_hand_values():
    e = np.e
    np.testing.assert_allclose(sampling_probs("numpy", np.array([2.0, 1.0, 0.0, -1.0]), 1.0,
                                              top_k=2), [e / (e + 1), 1 / (e + 1), 0, 0])
    logp = np.log([0.5, 0.3, 0.2])
    np.testing.assert_allclose(sampling_probs("numpy", logp, 1.0, top_p=0.5), [1, 0, 0])
    np.testing.assert_allclose(sampling_probs("numpy", logp, 1.0, top_p=0.6), [0.625, 0.375, 0])
    ties = np.zeros(4)  # four equal tokens, top_p 0.5: the two lowest ids stay
    np.testing.assert_allclose(sampling_probs("numpy", ties, 1.0, top_p=0.5), [0.5, 0.5, 0, 0])
    np.testing.assert_allclose(sampling_probs("numpy", ties, 1.0, top_k=3), [1 / 3] * 3 + [0])
    rng = np.random.default_rng(0)
    for _ in range(20):
        x, T = rng.normal(0, 2, 9), rng.uniform(0.3, 2)
        tp, tk = rng.uniform(0.2, 1.0), int(rng.integers(0, 9))
        np.testing.assert_allclose(sampling_probs("numpy", x, T, tp, tk), _filtered(x, T, tp, tk),
                                   atol=1e-12)


# A context-free toy target: row j's law does not depend on earlier tokens, so the first two
# emitted tokens must be independent with laws P[0] and P[1].
P = np.array([[0.03, 0.45, 0.20, 0.12, 0.10, 0.10],
              [0.15, 0.05, 0.40, 0.25, 0.10, 0.05],
              [0.30, 0.10, 0.10, 0.20, 0.20, 0.10]])
Q = np.array([[0.60, 0.05, 0.05, 0.10, 0.10, 0.10],
              [0.05, 0.05, 0.05, 0.05, 0.70, 0.10]])


def _first_two(q, candidates, n=20_000, seed=3):
    """Counts of the first two emitted tokens over n blocks of two sampled drafts."""
    rng = np.random.default_rng(seed)
    counts = np.zeros((6, 6))
    for _ in range(n):
        if candidates is None:
            drafts = [int(rng.choice(6, p=q[j])) for j in range(2)]
        else:
            drafts = [int(candidates[j][rng.choice(len(q[j]), p=q[j])]) for j in range(2)]
        a, bonus = rejection_core(drafts, P, q, candidates, rng.random(2), rng.random())
        out = (drafts[:a] + [bonus])[:2]
        if a == 0:  # the second token comes from the next step, whose law is P[1]
            out.append(int(rng.choice(6, p=P[1])))
        counts[out[0], out[1]] += 1
    return counts


@pytest.mark.parametrize("form", ["full", "candidates"])
def test_rejection_with_the_residual_is_lossless(form):
    if form == "full":
        q, cand = Q, None
    else:  # DFlash 2: q lives on 3 candidates per row; other tokens only via the residual
        cand = np.array([[0, 4, 5], [4, 2, 1]])
        q = np.array([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1]])
    counts = _first_two(q, cand)
    expected = np.outer(P[0], P[1]).ravel()
    stat, dof, p = chi_square_gof(counts.ravel(), expected)
    assert p > P_MIN, f"chi2={stat:.1f} dof={dof} p={p:.2e}"
    # Power: the bonus drawn from p (no residual) over-produces the drafted token.
    rng = np.random.default_rng(5)
    bad = np.zeros(6)
    for _ in range(20_000):
        d = int(rng.choice(6, p=Q[0]))
        a = int(rng.random() * Q[0, d] < P[0, d])
        bad[d if a else int(rng.choice(6, p=P[0]))] += 1
    assert chi_square_gof(bad, P[0])[2] < 1e-12


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("v8")
    t = write_tiny_target(root / "t", "qwen3", seed=4, vocab_size=8, hidden_size=32,
                          intermediate_size=64, num_hidden_layers=4)
    pairs = {}
    for kind in ("dflash", "dflash2"):
        extra = {}
        if kind == "dflash2":
            extra = {"architectures": ["DFlash2DraftModel"],
                     "dflash_config": {"mask_token_id": 7, "target_layer_ids": [0, 2],
                                       "conv_kernel_size": 3, "conv_group_size": 8,
                                       "selector_rank": 4, "selector_top_k": 4}}
        d = write_tiny_drafter(root / kind, t, seed=5, block_size=4, mask_token_id=7,
                               num_hidden_layers=1, **extra)
        target = TargetModel.from_pretrained(t)
        pairs[kind] = (target, DFlashDrafter.from_pretrained(d, target))
    return pairs


PROMPT = np.array([3, 1, 4])
FORMS = {"rejection": RejectionChainVerifier(), "greedy_draft": GreedyDraftChainVerifier()}
CASES = [(form, kind) for form in FORMS for kind in ("dflash", "dflash2")]


@pytest.mark.parametrize("form, kind", CASES)
def test_generate_samples_the_filtered_target_token_by_token(tiny_pair, form, kind):
    target, drafter = tiny_pair[kind]
    T, top_p, top_k = 1.3, 0.9, 6
    logits = target.be.to_numpy(target.forward(PROMPT, target.new_state()).logits)
    p1 = _filtered(logits[-1], T, top_p, top_k)
    joint = np.zeros((8, 8))
    for t1 in np.flatnonzero(p1):
        row = target.be.to_numpy(target.forward(np.append(PROMPT, t1),
                                                target.new_state()).logits)[-1]
        joint[t1] = p1[t1] * _filtered(row, T, top_p, top_k)
    rng = np.random.default_rng(11)
    counts, accepted = np.zeros((8, 8)), 0
    for _ in range(1500):
        res = generate(target, drafter, PROMPT, 3, sampling=SamplingParams(T, top_p, top_k, rng),
                       verify=FORMS[form])
        counts[res.tokens[0], res.tokens[1]] += 1
        accepted += res.acceptance_lengths[0] > 1
    assert accepted > 50, "drafts must be accepted often enough to test the accept path"
    keep = joint.ravel() > 1e-3
    stat, dof, p = chi_square_gof(counts.ravel()[keep], joint.ravel()[keep] / joint.ravel()[
        keep].sum())
    assert p > P_MIN, f"chi2={stat:.1f} dof={dof} p={p:.2e}"
    assert counts.ravel()[~keep].sum() <= 3  # filtered-out pairs essentially never appear


def test_greedy_output_is_unchanged_by_top_p_top_k(tiny_pair):
    for kind in ("dflash", "dflash2"):
        target, drafter = tiny_pair[kind]
        plain = generate(target, None, PROMPT, 12).tokens
        greedy = SamplingParams(top_p=0.5, top_k=2)
        assert generate(target, drafter, PROMPT, 12, sampling=greedy).tokens == plain
        assert generate(target, drafter, PROMPT, 12,
                        verify=ChainVerifier(draft_rows="verify")).tokens == plain


def test_the_loaders_return_the_dflash2_subclass_which_proposes_its_path(tiny_pair):
    from dflash_ref.models.dflash2 import DFlash2Drafter

    target, d2 = tiny_pair["dflash2"]
    _, d1 = tiny_pair["dflash"]
    assert type(d2) is DFlash2Drafter and type(d1) is DFlashDrafter
    assert d2.is_dflash2 and not d1.is_dflash2
    with pytest.raises(ConfigError, match="from_pretrained"):  # no silent argmax drafter
        DFlashDrafter(d2.config, {}, target)
    cache = d2.new_cache()
    state = target.new_state()
    target.forward(PROMPT, state)
    cache.extend(state.features.rows(0, PROMPT.size), np.arange(PROMPT.size))
    logits, hidden = cache.forward_block(5, PROMPT.size, with_hidden=True)
    greedy = d2.propose(hidden, logits, 5)
    path = d2.selector.select(hidden[1:], logits[1:], 5)
    assert greedy.q is None and greedy.tokens.tolist() == path.tokens.tolist()
    sampled = d2.propose(hidden, logits, 5, SamplingParams(1.0), np.random.default_rng(0))
    assert sampled.q.shape == sampled.candidates.shape == path.candidates.shape
    np.testing.assert_allclose(sampled.q.sum(-1), 1.0)
    assert all(t in c for t, c in zip(sampled.tokens, sampled.candidates))


def test_a_users_drafter_subclass_loads_as_itself(tiny_pair):
    from dflash_ref.models.dflash2 import DFlash2Drafter

    class Mine(DFlashDrafter):
        pass

    target, d1 = tiny_pair["dflash"]
    assert Mine.class_for(d1.config) is Mine  # e.g. the end-to-end notebook's ablation drafter
    assert DFlashDrafter.class_for(tiny_pair["dflash2"][1].config) is DFlash2Drafter
    assert Mine.class_for(tiny_pair["dflash2"][1].config) is DFlash2Drafter
