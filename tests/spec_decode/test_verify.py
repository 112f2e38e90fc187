"""Greedy chain verify: hand cases, properties, NumPy vs CuPy (docs/spec_decode.md)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.backend import get_backend
from dflash_ref.ops.sampling import SamplingParams, sample_tokens
from dflash_ref.spec_decode.verify import accept_length, greedy_posterior, verify_chain_greedy
from tests.spec_decode.oracle_sampling import hf_verify_chain_sampled, verify_one_hot
from tests.spec_decode.targets import greedy_next, greedy_rollout, logits_for

NP = get_backend("numpy")


# -- hand cases --------------------------------------------------------------------------------


def test_brief_example_ids_and_logits():
    # block [5, 7, 9, 2], target argmax rows [7, 9, 4, x]: 7 == 7, 9 == 9, 2 != 4 -> a = 2, bonus 4.
    for target in (np.array([7, 9, 4, 11]), logits_for([7, 9, 4, 11], V=12)):
        r = verify_chain_greedy(NP, [5, 7, 9, 2], target)
        assert r.a == 2
        assert r.accepted == (7, 9)
        assert r.bonus == 4
        assert r.committed == (7, 9, 4)
        assert r.acceptance_length == 3 and r.n_keep_rows == 3
        assert r.posterior.tolist() == [7, 9, 4, 11]
        assert all(type(t) is int for t in (r.a, r.bonus, *r.committed))


def test_full_accept_takes_the_last_row_as_bonus():
    # All B-1 drafts match: a = B-1 = 2 and the bonus is row B-1 (free extra token).
    r = verify_chain_greedy(NP, [1, 2, 3], np.array([2, 3, 8]))
    assert (r.a, r.accepted, r.bonus, r.committed) == (2, (2, 3), 8, (2, 3, 8))


def test_first_draft_rejected():
    # Row 0 says 4, the first draft is 2: nothing accepted, the target's 4 is emitted.
    r = verify_chain_greedy(NP, [1, 2, 3], np.array([4, 3, 8]))
    assert (r.a, r.accepted, r.bonus, r.committed) == (0, (), 4, (4,))


def test_later_match_after_a_mismatch_does_not_count():
    # Only the prefix counts: draft 2 matches row 1 but draft 1 already failed.
    r = verify_chain_greedy(NP, [1, 5, 3], np.array([4, 3, 8]))
    assert r.a == 0 and r.bonus == 4


def test_block_of_one_is_plain_decoding():
    # B = 1 degenerates to AR: a = 0, the bonus is the target's next token (``dflash_generate``).
    r = verify_chain_greedy(NP, [5], np.array([6]))
    assert (r.a, r.committed) == (0, (6,))


def test_logit_ties_go_to_the_lowest_id():
    logits = np.array([[0.0, 3.0, 3.0], [1.0, 1.0, 0.0]], np.float32)
    r = verify_chain_greedy(NP, [0, 1], logits)
    assert r.posterior.tolist() == [1, 0] and r.a == 1 and r.bonus == 0


def test_bad_inputs_say_what_is_wrong():
    with pytest.raises(ValueError, match="rows but the block"):
        verify_chain_greedy(NP, [1, 2, 3], np.array([2, 3]))
    with pytest.raises(ValueError, match="1-D integer"):
        verify_chain_greedy(NP, [[1, 2]], np.array([2, 3]))
    with pytest.raises(ValueError, match="logits"):
        greedy_posterior(NP, np.zeros(3, np.float32))


def test_accept_length_batched_hand_values():
    drafts = np.array([[1, 2, 3], [1, 9, 3], [7, 2, 3]])
    posterior = np.array([[1, 2, 3, 0], [1, 2, 3, 0], [1, 2, 3, 0]])
    assert accept_length(drafts, posterior).tolist() == [3, 1, 0]


def test_greedy_below_1e5_temperature():
    # HF ref sample(): T < 1e-5 is argmax, so the sampled verifiers reduce to the greedy one.
    logits = logits_for([7, 9, 4, 11], V=12)
    g = verify_chain_greedy(NP, [5, 7, 9, 2], logits)
    for fn in (hf_verify_chain_sampled, verify_one_hot):
        r = fn(NP, [5, 7, 9, 2], logits, 0.0, rng=0)
        assert (r.a, r.committed) == (g.a, g.committed)
    assert sample_tokens(NP, logits, SamplingParams(1e-6), rng=0).tolist() == [7, 9, 4, 11]


# -- properties --------------------------------------------------------------------------------


@st.composite
def block_and_posterior(draw, max_b: int = 9, V: int = 5):
    B = draw(st.integers(1, max_b))
    block = draw(st.lists(st.integers(0, V - 1), min_size=B, max_size=B))
    posterior = draw(st.lists(st.integers(0, V - 1), min_size=B, max_size=B))
    return np.array(block), np.array(posterior)


@given(block_and_posterior())
def test_a_is_the_first_mismatch(bp):
    block, posterior = bp
    B = block.shape[0]
    r = verify_chain_greedy(NP, block, posterior)
    assert 0 <= r.a <= B - 1
    mismatches = [j for j in range(B - 1) if block[1 + j] != posterior[j]]
    assert r.a == (mismatches[0] if mismatches else B - 1)
    assert r.bonus == posterior[r.a]
    assert r.committed == (*block[1 : 1 + r.a].tolist(), posterior[r.a])


@given(st.lists(st.integers(0, 6), min_size=1, max_size=5), st.integers(1, 10),
       st.data())
def test_committed_tokens_are_the_targets_greedy_continuation(prompt, B, data):
    # Target row j saw prompt + block[0..j]; whatever the drafts are, the committed tokens equal
    # the target's own greedy continuation after the anchor (lossless at T = 0).
    V = 7
    anchor = greedy_next(prompt, V)
    greedy = greedy_rollout([*prompt, anchor], B, V)
    exact = data.draw(st.booleans())
    drafts = greedy[: B - 1] if exact else data.draw(
        st.lists(st.integers(0, V - 1), min_size=B - 1, max_size=B - 1))
    block = [anchor, *drafts]
    posterior = [greedy_next([*prompt, *block[: j + 1]], V) for j in range(B)]
    r = verify_chain_greedy(NP, block, logits_for(posterior, V))
    assert list(r.committed) == greedy[: r.a + 1]
    if exact:  # the draft is the greedy continuation: everything is accepted, plus the bonus
        assert r.a == B - 1 and list(r.committed) == greedy


# -- NumPy vs CuPy -----------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("B,V", [(1, 7), (4, 33), (16, 151936)])
def test_greedy_verify_cupy_matches_numpy(rng, B, V):
    cp_be = get_backend("cupy")
    logits = (4 * rng.standard_normal((B, V))).astype(np.float32)
    posterior = np.argmax(logits, -1)
    for keep in range(B):  # drafts matching the first `keep` rows, then a mismatch
        block = np.concatenate([[3], posterior[: B - 1]])
        if keep < B - 1:
            block[1 + keep] = (posterior[keep] + 1) % V
        a = verify_chain_greedy(NP, block, logits)
        b = verify_chain_greedy(cp_be, cp_be.to_backend(block), cp_be.to_backend(logits))
        assert (a.a, a.committed) == (b.a, b.committed)
        assert a.posterior.tolist() == b.posterior.tolist()
        assert isinstance(b.posterior, np.ndarray)


@pytest.mark.gpu
def test_sampled_verify_cupy_matches_numpy_for_a_seed(rng):
    # Probabilities are formed on the host in float64, so a seed gives the same tokens.
    cp_be = get_backend("cupy")
    logits = (2 * rng.standard_normal((8, 50))).astype(np.float32)
    block = np.array([1, 2, 3, 4, 5, 6, 7, 8])
    for fn in (hf_verify_chain_sampled, verify_one_hot):
        for seed in range(5):
            a = fn(NP, block, logits, 0.7, rng=seed)
            b = fn(cp_be, block, cp_be.to_backend(logits), 0.7, rng=seed)
            assert (a.a, a.committed) == (b.a, b.committed)
