"""The drafts the drafter is sure of: llama.cpp's ``--spec-draft-p-min`` rule as a verifier.

Expected values: the probabilities from a float64 softmax written out here (not the code under
test); the rule's cut from llama.cpp's common/speculative.cpp (DFlash greedy drafting: stop at
the first row whose top candidate has p < p_min, over the draft sampler's top 10; clear the
drafts when fewer than n_min); the tokens from plain greedy decoding.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import dflash_ref
from dflash_ref.backend import get_backend
from dflash_ref.errors import ConfigError
from dflash_ref.models.draft_head import draft_probs
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.confident_verify import (
    LLAMA_CPP_TOP_K,
    ConfidentChainVerifier,
    confident_prefix,
)
from dflash_ref.spec_decode.lazy_verify import LazyChainVerifier
from dflash_ref.spec_decode.loop import generate
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target
from tests.models.reduced import TEXT_IDS, write_reduced_drafter
from tests.spec_decode.drafters import ScriptedDrafter

DEMO = Path(dflash_ref.__file__).parent / "data" / "demo"


def softmax64(row):
    e = np.exp(np.asarray(row, np.float64) - np.max(row))
    return e / e.sum()


# -- the rule -----------------------------------------------------------------------------------

def test_the_prefix_stops_at_the_first_draft_below_p_min_and_keeps_one_equal_to_it():
    # Catches > for >= (a draft exactly at p_min dropped), a count of all confident drafts
    # instead of the leading ones, NaN read as confident.
    assert confident_prefix([0.9, 0.5, 0.49, 0.99], 0.5) == 2
    assert confident_prefix([0.9, 0.8], 0.5) == 2  # all kept
    assert confident_prefix([0.4, 0.9, 0.9], 0.5) == 0
    assert confident_prefix([0.9, np.nan, 0.9], 0.5) == 1
    assert confident_prefix([], 0.5) == 0
    assert confident_prefix([0.1, 0.0], 0.0) == 2  # p_min 0 keeps every draft


def test_fewer_than_n_min_confident_drafts_are_all_dropped():
    # llama.cpp: result.size() < n_min -> result.clear(). Catches <= for <.
    assert confident_prefix([0.9, 0.9, 0.1], 0.5, n_min=2) == 2
    assert confident_prefix([0.9, 0.1, 0.9], 0.5, n_min=2) == 0
    assert confident_prefix([0.9, 0.9, 0.1], 0.5, n_min=3) == 0


def test_a_verifier_with_a_bad_p_min_n_min_or_top_k_is_refused():
    for kw in [dict(p_min=-0.1), dict(p_min=float("nan")), dict(n_min=-1), dict(top_k=0)]:
        with pytest.raises(ConfigError):
            ConfidentChainVerifier(**kw)


# -- the drafter's probabilities ----------------------------------------------------------------

def test_draft_probs_are_the_softmax_over_the_top_k_of_each_row():
    # Catches the full softmax where the top k was asked (llama.cpp renormalises over its
    # top 10), the wrong column gathered, a column outside the top k given mass.
    be = get_backend("numpy")
    rng = np.random.default_rng(0)
    rows = rng.normal(0, 2, (4, 50)).astype(np.float32)
    cols = np.argmax(rows, axis=1)
    cols[3] = int(np.argmin(rows[3]))  # not among the best 10
    got = draft_probs(be, rows, cols, 10)
    for r in range(3):
        best = np.sort(rows[r].astype(np.float64))[-10:]
        np.testing.assert_allclose(got[r], softmax64(best)[-1], rtol=1e-6)
    assert got[3] == 0.0
    full = draft_probs(be, rows, cols, 50)  # top_k == C: the whole softmax
    for r in range(4):
        np.testing.assert_allclose(full[r], softmax64(rows[r])[cols[r]], rtol=1e-5)
    assert draft_probs(be, rows, cols, 1)[:3].tolist() == [1.0, 1.0, 1.0]


def test_the_reduced_head_gives_the_probabilities_of_its_own_rows(tmp_path):
    # A drafter with a reduced vocabulary, its rows in an order that is not the ids' order: the
    # scattered FILL columns carry no mass, so p is the softmax over its own rows. Catches the
    # scattered row's softmax taken over V (FILL is finite), a draft id mapped to the wrong row.
    target = TargetModel.from_pretrained(DEMO / "target")
    ids = TEXT_IDS[::-1].copy()  # d2t not sorted
    drafter = DFlashDrafter.from_pretrained(write_reduced_drafter(tmp_path / "r", ids), target)
    head = drafter.draft_head
    rng = np.random.default_rng(1)
    own = rng.normal(0, 2, (3, ids.size)).astype(np.float32)  # [3, Vd]
    logits = np.concatenate([np.zeros((1, target.config.vocab_size), np.float32),
                             head.scatter(own)])  # [4, V]: row 0 the anchor's
    second = np.argsort(own, axis=1)[:, -2]  # each row's second best draft row
    got = drafter.draft_probs(logits, ids[second], ids.size)
    want = [softmax64(own[r])[second[r]] for r in range(3)]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    outside = next(i for i in range(target.config.vocab_size) if i not in set(ids.tolist()))
    assert drafter.draft_probs(logits, [outside] * 3, ids.size).tolist() == [0.0] * 3


# -- the verifier: lossless, and the rows it verifies ------------------------------------------

@pytest.fixture(scope="module")
def demo():
    target = TargetModel.from_pretrained(DEMO / "target")
    drafter = DFlashDrafter.from_pretrained(DEMO / "drafter", target)
    prompts = json.loads((DEMO / "held_out_prompts.json").read_text())["prompts"][:2]
    return target, drafter, [np.asarray(p, np.int64) for p in prompts]


def test_every_p_min_emits_plain_greedy_on_the_demo_pair(demo):
    # The trained pair (tau near 4) crosses every cut. Catches a cut that drops an accepted
    # draft's bonus, a block of the wrong rows, the drafts taken past the cut.
    target, drafter, prompts = demo
    for prompt in prompts:
        plain = generate(target, None, prompt, 32).tokens
        taus = []
        for p_min in (0.0, 0.5, 0.9, 1.5):
            for groups, later in [((1, 1), True), ((), False)]:
                v = ConfidentChainVerifier(p_min=p_min, head_groups=groups, layers_later=later)
                res = generate(target, drafter, prompt, 32, verify=v)
                assert res.tokens == plain, (p_min, groups)
            taus.append(res.tau)
        assert taus[0] > 1.5 and taus[-1] == 1.0  # every draft kept ... none


def test_p_min_0_is_the_lazy_chain_and_above_1_verifies_the_anchor_alone(demo):
    # Catches p_min 0 cutting anything, p_min > 1 still verifying a draft.
    target, drafter, prompts = demo
    lazy = generate(target, drafter, prompts[0], 32, verify=LazyChainVerifier())
    keep = generate(target, drafter, prompts[0], 32, verify=ConfidentChainVerifier(p_min=0.0))
    assert keep.acceptance_lengths == lazy.acceptance_lengths
    none = generate(target, drafter, prompts[0], 32, verify=ConfidentChainVerifier(p_min=1.01))
    assert set(none.acceptance_lengths) == {1} and len(none.acceptance_lengths) == 31  # a + 1


def test_the_target_runs_exactly_the_anchor_and_the_confident_drafts(tmp_path):
    # A scripted drafter on a tiny Gemma: each step's verify block must be 1 + k rows, k the
    # confident prefix of that step's drafts (recomputed here from its logits in float64; a
    # corrupted row's top-10 p is about 0.88, a true row's about 0.9996).
    # Catches the whole block verified anyway, the cut off by one.
    t = write_tiny_target(tmp_path / "t", "gemma3", seed=31, tie_word_embeddings=False)
    target = TargetModel.from_pretrained(t)
    DFlashDrafter.from_pretrained(write_tiny_drafter(tmp_path / "d", t, seed=32, block_size=8),
                                  target)  # binds the target: it captures features
    prompt = np.array([3, 17, 42, 99, 5])
    plain = generate(target, None, prompt, 30).tokens
    truth = np.concatenate([prompt, generate(target, None, prompt, 50).tokens])
    drafter = ScriptedDrafter(target, truth, 8, error_rate=0.3, seed=4)
    seen_logits, seen_rows = [], []
    draft_logits = drafter.logits_for

    def logits_for(pos):
        out = draft_logits(pos)
        seen_logits.append(np.asarray(out))
        return out

    drafter.logits_for = logits_for
    forward = target.forward_head_later

    def counted(tokens, state, **kw):
        seen_rows.append(len(tokens))
        return forward(tokens, state, **kw)

    target.forward_head_later = counted
    v = ConfidentChainVerifier(p_min=0.9, head_groups=(), layers_later=False)
    try:
        res = generate(target, drafter, prompt, 30, verify=v)
    finally:
        del target.forward_head_later
    assert res.tokens == plain
    want = []
    for lg in seen_logits:
        p = [np.sort(softmax64(np.sort(r)[-LLAMA_CPP_TOP_K:]))[-1] for r in lg[1:]]
        k = next((j for j, x in enumerate(p) if x < 0.9), len(p))
        want.append(k + 1)
    assert seen_rows == want and 1 in want and max(want) > 2
