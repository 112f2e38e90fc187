"""Needle in a haystack under a bounded pool: LRU loses the needle, the attention scorer keeps it.

The target is :func:`dflash_ref.kvflash.needle.make_needle_target`: a 1-layer tiny Qwen3 whose
question token Q puts all its attention on the needle token N (logit 144, every other key ~0)
and emits the answer A when it sees the needle, Q again when it does not. The context is
160 haystack tokens (20 chunks of 8) with the needle at position 43 (chunk 5), then 8 question
tokens at 160..167 (chunk 20); the pool holds 6 chunks (48 slots: sink chunk 0, the tail window
of 2 chunks, 3 more), so the needle's chunk is evicted long before the question.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.kvflash import KVFlashPager
from dflash_ref.kvflash.needle import ANSWER, QUESTION, make_needle_target, needle_context
from dflash_ref.kvflash.scorers import LRUScorer, ModelTailScorer
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import write_tiny_target

CHUNK = dict(chunk_tokens=8, sink_chunks=1, tail_window_chunks=1)
POOL = 48
NEEDLE_POS, NEEDLE_CHUNK, CONTEXT = 43, 5, 160
# The keys the pool lacks carry weight e^-144 (< 1e-62) in the full-cache softmax: below float32's
# smallest subnormal, i.e. exactly 0. Both runs sum the same non-zero terms (the needle, whose
# weight is 1, plus exact zeros), so the question's logits agree to float32 reassociation.
NEEDLE_MATCH = Tolerance(1e-5, 2e-5, "evicted haystack keys carry attention weight e^-144 = 0")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("needle")
    target = TargetModel.from_pretrained(_needle(root / "target", seed=5))
    # A separate scoring model (upstream scores with a small LM, not the target): the same
    # construction with other random weights everywhere else.
    scorer_model = TargetModel.from_pretrained(_needle(root / "scorer", seed=9))
    return target, scorer_model


def _needle(path, seed):
    return make_needle_target(write_tiny_target(path, "qwen3", seed=seed, num_hidden_layers=1))


def _context():
    return needle_context(CONTEXT, NEEDLE_POS, seed=0)


def _question_logits(target, pager):
    """Teacher forced: the context, 8 questions (the loop's reselect step after each), then the
    question once more; returns its logits [vocab]."""
    ctx = _context()
    state = target.new_state(pager=pager)
    target.forward(ctx, state)
    for g in range(1, 9):
        target.forward([QUESTION], state)
        if pager is not None:  # what generate() calls after each decode step
            pager.maybe_reselect(np.concatenate([ctx, [QUESTION] * g]), generated=g, n_new=1)
    return target.be.to_numpy(target.forward([QUESTION], state).logits[0])


def test_the_question_answers_only_when_it_sees_the_needle(models):
    target, _ = models
    full = _question_logits(target, None)
    assert np.argmax(full) == ANSWER
    ctx = _context()
    ctx[NEEDLE_POS] = 7  # no needle: the question asks again
    state = target.new_state()
    target.forward(ctx, state)
    assert np.argmax(target.be.to_numpy(target.forward([QUESTION], state).logits[0])) == QUESTION
    # The design: the question's attention (post-RoPE, as the model computes it) is one-hot on
    # the needle, every other logit within 0.1 of zero.
    q, k = target.attention_qk(np.concatenate([_context(), [QUESTION] * 8]), rope=True)
    logits = np.einsum("hd,shd->hs", q[0, -1], np.repeat(k[0], 2, axis=1)) / 4.0  # [Hq, S]
    assert np.all(np.abs(logits[:, NEEDLE_POS] - 144.0) < 0.05)
    assert np.abs(np.delete(logits, NEEDLE_POS, axis=1)).max() < 0.1


def test_lru_evicts_the_needle_and_the_answer_is_lost(models):
    target, _ = models
    full = _question_logits(target, None)
    pager = KVFlashPager(POOL, **CHUNK, scorer=LRUScorer(), tau=8)
    got = _question_logits(target, pager)
    assert pager.block_of(NEEDLE_CHUNK) < 0 and pager.is_on_host(NEEDLE_CHUNK)
    assert pager.stats.rescores == 1 and pager.stats.reselects == 0  # LRU never reselects
    # The answer channel: logit[A] = 6 x[2] is ~30 with the needle and exactly 0 without it.
    assert full[ANSWER] > 20.0 and got[ANSWER] == 0.0
    assert np.argmax(got) == QUESTION


@pytest.mark.parametrize("which, rope", [("target", False), ("target", True),
                                         ("separate model", False)])
def test_attention_scorer_keeps_the_needle_and_matches_the_full_cache(models, which, rope):
    target, scorer_model = models
    full = _question_logits(target, None)
    scorer = ModelTailScorer(target if which == "target" else scorer_model, rope=rope)
    # tau 8: with a history of 168, max(8, 168 // 45) = 8, so the rescore fires after the 8th
    # question: the tail queries are the 8 questions, all attending to the needle.
    pager = KVFlashPager(POOL, **CHUNK, scorer=scorer, tau=8)
    got = _question_logits(target, pager)
    assert pager.stats.rescores == 1 and pager.stats.page_ins >= 1
    assert pager.block_of(NEEDLE_CHUNK) >= 0  # recalled, and kept through the next eviction
    assert pager.resident_chunks().size <= pager.n_blocks
    assert np.argmax(got) == ANSWER
    assert_close(got, full, NEEDLE_MATCH, op="pooled target", case=f"needle, {which}")


def test_generate_recalls_the_needle_at_the_first_reselect(models):
    # Prompt = context + 8 questions. The full cache answers A from the first token. Under a
    # 48-slot pool the prefill evicts the needle (no scores yet: LRU), so the first tokens are Q.
    # The cadence is max(tau=4, (168 + g) // 45 = 3) = 4: after the 4th token the history is
    # rescored (tail = 8 questions), the needle's chunk is recalled and every later token is A.
    target, _ = models
    prompt = np.concatenate([_context(), [QUESTION] * 8])
    full = generate(target, None, prompt, 12).tokens
    lru = generate(target, None, prompt, 12, pager=KVFlashPager(POOL, **CHUNK)).tokens
    pager = KVFlashPager(POOL, **CHUNK, scorer=ModelTailScorer(target), tau=4)
    scored = generate(target, None, prompt, 12, pager=pager)
    assert full == [ANSWER] * 12
    assert lru == [QUESTION] * 12
    assert scored.tokens == [QUESTION] * 4 + [ANSWER] * 8
    # Rescores at g = 4 and 8 (g = 12 ends the generation: nothing left to decode).
    assert pager.stats.rescores == 2 and pager.block_of(NEEDLE_CHUNK) >= 0
    assert "reselect" in scored.timings
