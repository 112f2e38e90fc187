"""One KVFlashPager object serving several requests: each request starts from a reset pager.

The first request is longer than the pool, so it leaves chunks evicted to the host, the pool full
and the append head far ahead. The second request fits the pool, so with a clean pager it runs
without a single eviction and equals the unpooled run token for token (tests/kvflash/
test_pooled_target.py checks pool >= context == unpooled). A pager carried over unreset keeps
the first request's protected tail and LRU clock, evicts the second request's own chunks, and
its attention loses keys.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.kvflash.pager import KVFlashPager
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import write_tiny_target
from tests.spec_decode.drafters import ScriptedDrafter

# Chunk 8, sink 1, tail 1: the floor is (1 + 1 + 2) x 8 = 32 tokens; the pool holds 9 chunks.
CHUNK = dict(chunk_tokens=8, sink_chunks=1, tail_window_chunks=1)
POOL = 72
POOLED = Tolerance(1e-5, 2e-5, "same visible keys; masked slots add exact zeros")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = write_tiny_target(tmp_path_factory.mktemp("reuse") / "t", "qwen3", seed=31,
                             tie_word_embeddings=False)
    return TargetModel.from_pretrained(path, target_layer_ids=[0, 2])


def _ids(n, seed):
    return np.random.default_rng(seed).integers(0, 256, size=n)


def _scripted(target, prompt, n):
    truth = np.concatenate([prompt, generate(target, None, prompt, n + 10).tokens])
    return ScriptedDrafter(target, truth, 8, error_rate=0.3, seed=4)


def test_reused_pager_equals_fresh_pager(target):
    pager = KVFlashPager(POOL, **CHUNK)
    # Request 1: 20 + 100 tokens = 15 chunks through a 9-chunk pool.
    first = _ids(20, seed=1)
    generate(target, None, first, 100, pager=pager)
    assert pager.stats.page_outs > 0  # it did page (the case this test is about)
    # Request 2: 20 + 40 tokens + up to 8 verify rows = 68 positions <= 72 slots.
    second = _ids(20, seed=2)
    unpooled = generate(target, None, second, 40).tokens  # the reference: plain KV cache
    fresh = generate(target, _scripted(target, second, 40), second, 40,
                     pager=KVFlashPager(POOL, **CHUNK)).tokens
    page_outs = pager.stats.page_outs
    reused = generate(target, _scripted(target, second, 40), second, 40, pager=pager).tokens
    assert fresh == unpooled
    assert reused == fresh == unpooled
    assert pager.stats.page_outs == page_outs, "request 2 fits the pool: nothing is evicted"
    # The same pager once more, teacher forced: logits equal the plain KV cache's.
    ids = _ids(64, seed=3)
    ref = target.forward(ids, target.new_state()).logits
    got = target.forward(ids, target.new_state(pager=pager)).logits
    assert_close(got, ref, POOLED, op="reused pager", case="third request, 64 tokens")
