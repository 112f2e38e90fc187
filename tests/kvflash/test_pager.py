"""KVFlashPager, the allocation policy: the floor, the free list, eviction, refusal and rollback,
and the write / read / kv API. Paging, reselect and relocation are in test_pager_paging.py.

Every expected slot and block below is derived by hand from the rules in docs/kvflash.md (the
pager of Luce-Org/lucebox ``server/src/common/kvflash_pager.h``; the derivation is in the
comments), never by running the pager. The random-sequence invariants are in
test_pager_state_machine.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.errors import PagerError
from dflash_ref.kvflash import KVFlashPager, min_pool_tokens
from dflash_ref.kvflash.scorers import hook_from_scores
from tests.kvflash.pagers import small_pager

# ---------------------------------------------------------------- configuration and the floor


def test_min_pool_is_448_by_default_and_smaller_pools_are_refused():
    # (sink 1 + tail 4 + 2) x 64 = 448; the public sizing rounds it up to 512.
    assert min_pool_tokens() == 448
    assert KVFlashPager(448).min_pool_tokens == 448
    with pytest.raises(PagerError, match=r"below the minimum 448.*512"):
        KVFlashPager(448 - 64)
    with pytest.raises(PagerError, match="minimum 80"):  # (sink 2 + tail 1 + 2) x 16 = 80
        KVFlashPager(64, chunk_tokens=16, sink_chunks=2, tail_window_chunks=1)


def test_pool_must_be_a_positive_multiple_of_the_chunk():
    with pytest.raises(PagerError, match="round it up to 512"):
        KVFlashPager(500)
    with pytest.raises(PagerError, match="positive multiple"):
        KVFlashPager(0)
    with pytest.raises(PagerError, match="chunk_tokens must be > 0"):
        KVFlashPager(448, chunk_tokens=0)


# ---------------------------------------------------------------- the free list


def test_fresh_pager_hands_out_blocks_0_1_2_and_is_identity():
    pager = KVFlashPager(448)
    # The stack is pushed 6 down to 0, so its top (last element) is block 0.
    assert pager.free_blocks == [6, 5, 4, 3, 2, 1, 0]
    np.testing.assert_array_equal(pager.alloc_span(0, 448), np.arange(448))
    assert pager.free_blocks == [] and pager.is_identity() and pager.identity_prefix_covers(448)
    np.testing.assert_array_equal(pager.fill_slot_pos(), np.arange(448))


def test_freed_blocks_are_reused_last_in_first_out():
    pager = small_pager(7)  # T = 4, blocks 0..6
    pager.alloc_span(0, 20)  # chunks 0..4 -> blocks 0..4; the free stack is [6, 5]
    pager.page_out(1)  # pushes block 1
    pager.page_out(3)  # pushes block 3: stack [6, 5, 1, 3]
    assert pager.free_blocks == [6, 5, 1, 3]
    # Chunks 5, 6, 7, 8 (positions 20, 24, 28, 32) get blocks 3, 1, 5, 6: slots 12, 4, 20, 24.
    assert [pager.slot_for(p) for p in (20, 24, 28, 32)] == [12, 4, 20, 24]
    assert pager.slot_for(33) == 25  # same chunk 8, offset 1
    assert pager.stats.evictions == 0 and pager.stats.page_outs == 2


def test_set_block_order_overrides_the_hand_out_order():
    pager = small_pager(4)
    pager.set_block_order([2, 0, 3, 1])  # chunk c gets order[c]
    slots = pager.alloc_span(0, 16)
    # chunk 0 -> block 2 (slots 8..11), chunk 1 -> block 0, chunk 2 -> block 3, chunk 3 -> block 1.
    np.testing.assert_array_equal(slots[[0, 4, 8, 12]], [8, 0, 12, 4])
    np.testing.assert_array_equal(pager.fill_slot_pos(),
                                  [4, 5, 6, 7, 12, 13, 14, 15, 0, 1, 2, 3, 8, 9, 10, 11])
    assert not pager.is_identity() and not pager.identity_prefix_covers(1)
    with pytest.raises(PagerError, match="in use"):
        pager.set_block_order([0, 1, 2, 3])
    pager.reset()
    with pytest.raises(PagerError, match="permutation"):
        pager.set_block_order([0, 1, 1, 3])
    assert pager.alloc_span(0, 4).tolist() == [0, 1, 2, 3]  # reset restored the default order


# ---------------------------------------------------------------- eviction


def test_default_config_eviction_walk():
    # pool 448 = 7 blocks of 64; sink 1, tail 4. Chunk c of the first 448 positions is written by
    # positions 64c .. 64c+63, so last_use[c] = 64 (c + 1) (the clock ticks once per slot_for).
    pager = KVFlashPager(448)
    pager.alloc_span(0, 448)
    assert [pager.last_use(c) for c in range(7)] == [64 * (c + 1) for c in range(7)]
    # Position 448 opens chunk 7: cur = 7 first, so candidates are 1 <= c <= 7 - 1 - 4 = 2.
    # LRU: chunk 1 (last_use 128) beats chunk 2 (192); its block 1 is reused: slot 64.
    assert pager.slot_for(448) == 64
    assert pager.block_of(1) == -1 and pager.is_on_host(1) and pager.block_of(7) == 1
    assert pager.stats.evictions == 1 and pager.stats.page_outs == 1
    np.testing.assert_array_equal(pager.alloc_span(449, 63), np.arange(65, 128))
    # Position 512 opens chunk 8: candidates 1 <= c <= 3, resident 2 and 3; chunk 2 is older.
    assert pager.slot_for(512) == 128 and pager.block_of(8) == 2
    assert not pager.is_identity()
    # page_in(1) on a full pool evicts the only candidate left (chunk 3, block 3) for chunk 1.
    assert pager.page_in(1) == 3
    assert pager.block_of(3) == -1 and pager.cur_chunk == 8
    assert (pager.stats.page_outs, pager.stats.page_ins, pager.stats.evictions) == (3, 1, 3)
    assert pager.last_use(1) == pager.clock  # the recall ticked the clock


def test_reads_do_not_tick_the_clock():
    pager = small_pager(4)
    pager.alloc_span(0, 8)
    clock = pager.clock
    assert pager.slot_of(5) == 5 and pager.slots_of([0, 7, 9]).tolist() == [0, 7, -1]
    pager.fill_slot_pos()
    pager.slot_positions()
    assert pager.clock == clock


def test_score_hook_evicts_the_minimum_score_lowest_chunk_on_ties():
    pager = small_pager(5)  # sink 1, tail 1
    pager.alloc_span(0, 20)  # chunks 0..4 fill blocks 0..4
    # Chunk 5: candidates 1 <= c <= 3. Scores 1: 5.0, 2: 1.0, 3: 1.0 -> tie 2/3 goes to chunk 2.
    pager.score_hook = hook_from_scores([9.0, 5.0, 1.0, 1.0, 0.0])
    assert pager.slot_for(20) == 8 and pager.block_of(2) == -1
    # Chunk 6: candidates 1 <= c <= 4 resident 1, 3, 4; chunk 4 scores 0.0 (the minimum).
    assert pager.slot_for(24) == 16 and pager.block_of(4) == -1
    pager.score_hook = lambda chunks: np.zeros(len(chunks))  # all tie: lowest candidate (1)
    assert pager.slot_for(28) == 4 and pager.block_of(1) == -1


def test_a_hook_returning_nan_is_an_error():
    pager = small_pager(4)
    pager.alloc_span(0, 16)
    pager.score_hook = lambda chunks: np.full(len(chunks), np.nan)
    with pytest.raises(PagerError, match="NaN"):
        pager.slot_for(16)


# ---------------------------------------------------------------- failure and rollback


def test_failed_allocation_rolls_cur_chunk_back():
    # Below the floor on purpose: 2 blocks with sink 1 and tail 1 (the floor is 4 blocks).
    pager = small_pager(2, enforce_min_pool=False)
    pager.alloc_span(0, 4)  # chunk 0
    # Chunk 1 takes the last free block; position 8 opens chunk 2: cur moves to 2, candidates
    # 1 <= c <= 2 - 1 - 1 = 0: none, so slot_for returns -1 and cur goes back to 1.
    with pytest.raises(PagerError, match="no evictable pool block for position 8"):
        pager.alloc_span(4, 8)
    assert pager.cur_chunk == 1 and pager.block_of(2) == -1
    assert pager.block_of(1) == 1  # allocated earlier in the failed span: kept
    assert pager.slot_for(9) == -1 and pager.cur_chunk == 1


def test_failed_recall_leaves_the_head_alone():
    pager = small_pager(3, enforce_min_pool=False)  # 3 blocks, floor 4
    # Chunks 0, 1, 2 fill the pool; chunk 3 evicts chunk 1 (candidates c <= 1), chunk 4 evicts
    # chunk 2 (candidates c <= 2). Resident: 0 (sink), 3, 4 (the tail).
    assert [pager.slot_for(p) for p in range(0, 20, 4)] == [0, 4, 8, 4, 8]
    with pytest.raises(PagerError, match="no evictable"):
        pager.page_in(1)  # candidates c <= 2 hold nothing resident
    assert pager.cur_chunk == 4 and pager.is_on_host(1) and pager.block_of(1) == -1


def test_a_span_that_would_evict_itself_is_refused():
    # Only the sink and tail + 1 chunks are protected: a 5-chunk span in a 4-block pool with
    # tail 1 evicts its own chunk 1 when it opens chunk 4; writes would land in a reused block,
    # so alloc_span refuses (the pooled prefill runs one chunk per forward).
    pager = small_pager(4)
    with pytest.raises(PagerError, match="evicted its own first chunks"):
        pager.alloc_span(0, 20)
    pager.reset()
    for start in range(0, 20, 4):
        pager.alloc_span(start, 4)  # one chunk at a time works


# ---------------------------------------------------------------- the target's API


def test_write_read_kv_api(rng):
    pager = KVFlashPager(4 * 4, 4, 1, 1, layers=[3, 7], n_kv_heads=2, head_dim=3)
    with pytest.raises(PagerError, match="alloc_span"):
        pager.write(3, [0], np.zeros((1, 2, 3)), np.zeros((1, 2, 3)))
    pager.alloc_span(0, 5)
    k = rng.standard_normal((5, 2, 3)).astype(np.float32)
    pager.write(7, np.arange(5), k, -k)
    K, V, k_pos = pager.kv(7)
    assert K.shape == V.shape == (16, 2, 3) and k_pos.dtype == np.int32
    np.testing.assert_array_equal(K[:5], k)
    np.testing.assert_array_equal(V[:5], -k)
    np.testing.assert_array_equal(k_pos, [0, 1, 2, 3, 4, 5, 6, 7] + [-1] * 8)
    assert not pager.kv(3)[0].any()
    with pytest.raises(PagerError, match="not pooled"):
        pager.kv(0)
    with pytest.raises(PagerError, match=r"\[T, H, D\]"):
        pager.write(3, [0], np.zeros((1, 3, 2)), np.zeros((1, 3, 2)))
    with pytest.raises(PagerError, match="mapping only"):
        KVFlashPager(448).kv(0)


def test_slot_positions_is_cached_until_the_mapping_changes():
    pager = small_pager(4)
    pager.alloc_span(0, 3)
    a = pager.slot_positions()
    pager.slot_for(3)  # same chunk: no mapping change
    assert pager.slot_positions() is a
    pager.slot_for(4)  # new chunk: epoch bump
    b = pager.slot_positions()
    assert b is not a and b[4] == 4


def test_identity_prefix_covers():
    pager = small_pager(4)
    assert pager.identity_prefix_covers(0) and not pager.identity_prefix_covers(1)
    pager.alloc_span(0, 9)
    assert pager.identity_prefix_covers(9) and not pager.identity_prefix_covers(13)
    pager.page_out(1)
    assert not pager.identity_prefix_covers(5) and pager.identity_prefix_covers(4)
    assert not pager.is_identity()
