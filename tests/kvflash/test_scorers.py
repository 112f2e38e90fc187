"""Chunk scorers and the reselect cadence: hand-computed cases, properties, and a reselect driven
by tail attention. Expected values come from hand math (shown in comments), never from the code.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.kvflash import KVFlashPager
from dflash_ref.kvflash.scorers import (
    LRUScorer,
    TailAttentionScorer,
    box_smooth,
    chunk_means,
    fold_vocab,
    hook_from_scores,
    maybe_reselect,
    qk_chunk_keys,
    qk_chunk_scores,
    reselect_due,
    reselect_interval,
    resilient_token_scores,
    tail_attention_max,
    z_normalise,
)
from dflash_ref.testing import assert_close
from tests.strategies import f32_arrays

# ---------------------------------------------------------------- tail attention


def test_tail_attention_max_hand_case():
    # S = 3 keys, 2 tail queries at positions 1 and 2, D = 1, one head.
    # Layer 0: q = 0, so every visible key gets the same weight: query 0 sees keys 0, 1 -> 1/2
    # each; query 1 sees keys 0..2 -> 1/3 each.
    # Layer 1: keys [0, 0, 1], q = ln 2: query 1's logits [0, 0, ln 2] -> [1, 1, 2] / 4; query 0
    # sees keys 0, 1 with logits 0 -> 1/2 each.
    # Max over layers: query 0 [1/2, 1/2, 0]; query 1 [1/3, 1/3, 1/2].
    q = np.array([[[[0.0]], [[0.0]]], [[[np.log(2)]], [[np.log(2)]]]])  # [2 layers, 2, 1, 1]
    k = np.array([[[[1.0]], [[2.0]], [[3.0]]], [[[0.0]], [[0.0]], [[1.0]]]])  # [2, 3, 1, 1]
    expected = [[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 0.5]]
    assert_close(tail_attention_max(q, k), np.array(expected), "float64", op="tail_attention_max")


def test_tail_attention_max_reads_kv_heads_by_group_and_maxes_over_heads():
    # Hq = 2 query heads share Hkv = 1 kv head. Head 0: q = 0 (uniform over 2 keys: 1/2 each).
    # Head 1: q = ln 3 on keys [0, 1] -> [1, 3] / 4. Max over heads: [1/2, 3/4].
    q = np.array([0.0, np.log(3)]).reshape(1, 1, 2, 1)  # [1 layer, 1 query, 2 heads, D=1]
    k = np.array([0.0, 1.0]).reshape(1, 2, 1, 1)  # [1 layer, S=2, 1 kv head, D=1]
    assert_close(tail_attention_max(q, k), np.array([[0.5, 0.75]]), "float64",
                 op="tail_attention_max", case="GQA")
    with pytest.raises(ValueError, match="multiple"):
        tail_attention_max(np.zeros((1, 1, 3, 1)), np.zeros((1, 2, 2, 1)))


def test_a_query_attending_to_one_chunk_scores_it_highest():
    # 5 chunks of 8 tokens; chunk 2's keys align with every tail query (logit 10*10/2 = 50), all
    # other keys are zero (logit 0). The tail queries (positions 32..39) see all of chunk 2.
    D, T = 4, 8
    k = np.zeros((1, 40, 1, D), np.float32)
    k[0, 16:24, 0, 0] = 10.0
    q = np.zeros((1, 8, 1, D), np.float32)
    q[0, :, 0, 0] = 10.0
    scores = TailAttentionScorer().chunk_scores(q, k, chunk_tokens=T)
    assert scores.shape == (5,)
    assert np.argmax(scores) == 2 and np.all(np.delete(scores, 2) < scores[2])


def test_tail_scorer_needs_lookahead_plus_one_tokens():
    scorer = TailAttentionScorer()
    assert scorer.chunk_scores(np.zeros((1, 8, 1, 2)), np.zeros((1, 8, 1, 2))) is None
    assert scorer.chunk_scores(np.zeros((1, 8, 1, 2)), np.zeros((1, 9, 1, 2))).shape == (1,)
    with pytest.raises(ValueError, match="lookahead=8"):
        scorer.token_scores(np.zeros((1, 4, 1, 2)), np.zeros((1, 9, 1, 2)))


# ---------------------------------------------------------------- smoothing, z, chunk means


def test_box_smooth_hand_values():
    # kernel 3: window [j-1, j+1] clipped; divisor = clipped count.
    assert_close(box_smooth([0, 0, 0, 6, 0, 0, 0], 3), np.array([0, 0, 2, 2, 2, 0, 0.0]),
                 "float64", op="box_smooth")
    assert_close(box_smooth([3, 0, 0, 0, 0], 3), np.array([1.5, 1, 0, 0, 0.0]), "float64",
                 op="box_smooth", case="left edge divides by 2")
    # kernel 13 on 0..19: out[0] = mean(0..6) = 3, out[10] = mean(4..16) = 10,
    # out[19] = mean(13..19) = 16.
    out = box_smooth(np.arange(20.0), 13)
    assert_close(out[[0, 10, 19]], np.array([3.0, 10.0, 16.0]), "float64", op="box_smooth")
    with pytest.raises(ValueError, match="odd"):
        box_smooth([1.0], 4)


def test_z_normalise_hand_values():
    # [1, 2, 3, 4]: mean 2.5, population variance (2.25 + .25 + .25 + 2.25) / 4 = 1.25.
    sd = np.sqrt(1.25)
    expected = np.array([-1.5, -0.5, 0.5, 1.5]) / (sd + 1e-6)
    assert_close(z_normalise([1, 2, 3, 4]), expected, "float64", op="z_normalise")
    assert_close(z_normalise([7.0, 7.0]), np.zeros(2), "float64", op="z_normalise",
                 case="constant: 0 / 1e-6")


def test_chunk_means_hand_values():
    assert_close(chunk_means([1, 2, 3, 4, 5], 2), np.array([1.5, 3.5, 5.0]), "float64",
                 op="chunk_means", case="last chunk partial")
    assert chunk_means([], 64).shape == (0,)


@given(st.data())
def test_z_scores_have_mean_zero_and_unit_deviation(data):
    n = data.draw(st.integers(2, 70))
    v = data.draw(f32_arrays((n,), -5, 5)).astype(np.float64)
    if v.std() < 1e-3:
        return
    z = z_normalise(v)
    assert abs(z.mean()) < 1e-9
    assert abs(z.std() - v.std() / (v.std() + 1e-6)) < 1e-9


@given(st.data())
def test_box_smooth_preserves_constants_and_bounds(data):
    n = data.draw(st.integers(1, 40))
    k = data.draw(st.sampled_from([1, 3, 5, 13]))
    s = data.draw(f32_arrays((n,), 0, 1)).astype(np.float64)
    out = box_smooth(s, k)
    assert np.all(out >= s.min() - 1e-12) and np.all(out <= s.max() + 1e-12)
    assert_close(box_smooth(np.full(n, 0.25), k), np.full(n, 0.25), "float64", op="box_smooth")
    if k == 1:
        assert_close(out, s, "float64", op="box_smooth", case="kernel 1 is the identity")


# ---------------------------------------------------------------- bisection and vocab fold


def test_resilient_scores_bisect_as_the_spec_says():
    # The fake forward fails above 6 tokens and tags its output with 1000 x segment length.
    def forward(ids):
        return None if len(ids) > 6 else np.array(ids, float) + 1000 * len(ids)

    # ids 0..9 (lookahead 2, min_segment 4): fails; mid 5.
    #   left  = [0..4] + [8, 9] (7 tokens): fails; mid 3.
    #     left  = [0, 1, 2] + [8, 9] -> 5000 + ids; right = [3, 4, 8, 9] -> 4000 + ids.
    #     merge: [5000, 5001, 5002] + [4003, 4004, 4008, 4009].
    #   right = [5..9] (5 tokens) -> 5005 .. 5009.
    #   merge: left[:5] + right[:5].
    got = resilient_token_scores(range(10), forward, lookahead=2, min_segment=4)
    expected = [5000, 5001, 5002, 4003, 4004, 5005, 5006, 5007, 5008, 5009]
    np.testing.assert_array_equal(got, expected)
    # A failing segment at or below min_segment gives up.
    assert resilient_token_scores(range(10), lambda ids: None, lookahead=2, min_segment=4) is None


def test_fold_vocab():
    # 100000 -> 1000 + 100000 mod 99000 = 2000; 248076 -> 1000 + 50076 = 51076.
    np.testing.assert_array_equal(fold_vocab([5, 99999, 100000, 248076]),
                                  [5, 99999, 2000, 51076])
    np.testing.assert_array_equal(fold_vocab([5, 2000], clamp=1000), [5, 2000])  # clamp <= 1001


# ---------------------------------------------------------------- target-QK scorer


def test_qk_scores_hand_values():
    # One layer, 2 query heads [1, 0] and [0, 1] over one kv head.
    q = np.array([[[1.0, 0.0], [0.0, 1.0]]])  # [1, 2, 2]
    a = qk_chunk_keys(np.array([[[[2.0, 0.0]], [[0.0, 0.0]]]]))  # mean [1, 0]
    b = qk_chunk_keys(np.array([[[[1.0, 1.0]], [[1.0, 1.0]]]]))  # mean [1, 1] -> 45 degrees
    assert_close(a, np.array([[[1 / (1 + 1e-6), 0.0]]]), "float64", op="qk_chunk_keys")
    assert qk_chunk_keys(np.array([[[[np.nan, 0.0]]]])) is None
    scores = qk_chunk_scores(q, [a, b, None])
    # Each side is divided by (|x| + 1e-6): |q| = 1, |mean K| = 1 for a and sqrt 2 for b.
    # a: head 0 gives 1 / ((1 + 1e-6)(1 + 1e-6)), head 1 gives 0; b: both heads give
    # 1 / ((1 + 1e-6)(sqrt 2 + 1e-6)) (cos 45 degrees); missing: -2.
    e = 1e-6
    expected = [1 / ((1 + e) * (1 + e)), 1 / ((1 + e) * (np.sqrt(2) + e)), -2.0]
    assert_close(scores, np.array(expected), "float64", op="qk_chunk_scores")


def test_qk_scores_average_layers():
    # Layer 0 matches the chunk (cos 1), layer 1 is orthogonal (cos 0): mean 0.5.
    q = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # [2 layers, 1 head, 2]
    k = np.array([[[1.0, 0.0]], [[1.0, 0.0]]])  # [2 layers, 1 kv head, 2], unit
    assert_close(qk_chunk_scores(q, [k]), np.array([0.5 / (1 + 1e-6)]), "float64",
                 op="qk_chunk_scores", case="layer mean")


# ---------------------------------------------------------------- cadence and hooks


def test_reselect_cadence():
    # tau_eff = max(tau, history // 45).
    assert reselect_interval(64, 100) == 64
    assert reselect_interval(64, 2925) == 65  # 2925 / 45 = 65
    assert reselect_interval(64, 4500) == 100
    assert reselect_due(128, 64, 1000) and not reselect_due(100, 64, 1000)
    assert reselect_due(100, 64, 4500) and not reselect_due(64, 64, 4500)
    assert not reselect_due(0, 64, 10)
    with pytest.raises(ValueError, match=">= 1"):
        reselect_interval(0, 10)


def test_hook_from_scores_keeps_chunks_newer_than_the_rescore():
    hook = hook_from_scores([0.1, 0.2, 0.3])
    np.testing.assert_array_equal(hook(np.array([0, 2, 5])), [0.1, 0.3, 1e30])
    assert LRUScorer().hook() is None


def test_maybe_reselect_installs_the_hook_only_when_due_and_scored():
    pager = KVFlashPager(4 * 4, 4, 1, 1)
    for p in range(24):
        pager.slot_for(p)
    # Chunks 0..3 fill 4 blocks; chunk 4 evicts chunk 1 (LRU of 1 <= c <= 2), chunk 5 evicts
    # chunk 2 (LRU of 1 <= c <= 3).
    assert pager.host_only_chunks().tolist() == [1, 2]
    assert maybe_reselect(pager, 10, 100, lambda: [0.0] * 6) == 0  # not due (tau 64)
    assert maybe_reselect(pager, 64, 100, lambda: None) == 0 and pager.score_hook is None
    # Due; protected 0 (sink) and 4, 5 (c > 5 - 1 - 1); one place left: chunk 1 (5.0) beats 2
    # (1.0) and 3 (0.0). Events: page out 3, recall 1.
    assert maybe_reselect(pager, 64, 100, lambda: [0.0, 5.0, 1.0, 0.0]) == 2
    assert set(pager.resident_chunks().tolist()) == {0, 1, 4, 5}


def test_tail_attention_drives_a_recall():
    # A needle chunk paged out by LRU comes back when the tail queries attend to it (test F).
    T, D = 4, 4
    pager = KVFlashPager(5 * T, T, 1, 1)
    for p in range(40):
        pager.slot_for(p)  # chunks 0..9; LRU leaves 0 and the last four resident
    assert pager.resident_chunks().tolist() == [0, 6, 7, 8, 9] and pager.is_on_host(2)
    k = np.zeros((1, 40, 1, D), np.float32)
    k[0, 8:12, 0, 1] = 10.0  # chunk 2 is the needle
    q = np.zeros((1, 8, 1, D), np.float32)
    q[0, :, 0, 1] = 10.0
    scores = TailAttentionScorer().chunk_scores(q, k, chunk_tokens=T)
    pager.score_hook = hook_from_scores(scores)
    pager.reselect()
    assert pager.block_of(2) >= 0, "the attended chunk was not recalled"
