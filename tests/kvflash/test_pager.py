"""KVFlashPager: hand-walked allocations, paging, reselect, refusal, relocation invariance.

Every expected slot and block below is derived by hand from the rules of spec/kvflash_gate.md §1
(the derivation is in the comments), never by running the pager. The random-sequence invariants
of §8 are in test_pager_state_machine.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.errors import PagerError
from dflash_ref.kvflash import KVFlashPager, min_pool_tokens
from dflash_ref.kvflash.scorers import hook_from_scores
from dflash_ref.testing import assert_close


def small_pager(n_blocks: int, T: int = 4, sink: int = 1, tail: int = 1, **kw) -> KVFlashPager:
    """A pager with T-token chunks, one pooled layer of one head of width 2 unless overridden."""
    kw = {"layers": 1, "n_kv_heads": 1, "head_dim": 2, **kw}
    return KVFlashPager(n_blocks * T, T, sink, tail, **kw)


def write_positions(pager: KVFlashPager, positions, rng) -> dict[int, np.ndarray]:
    """Decode-style: slot_for then write random rows, one position at a time, in every pooled
    layer; return pos -> [L, 2, H, D]."""
    pool = pager.pool
    written = {}
    for p in positions:
        assert pager.slot_for(p) >= 0
        rows = rng.standard_normal((len(pool.layers), 2, 1, pool.n_kv_heads, pool.head_dim))
        rows = rows.astype(pool.dtype)
        for i, layer in enumerate(pool.layers):
            pager.write(layer, [p], rows[i, 0], rows[i, 1])
        written[p] = rows[:, :, 0]
    return written


def content_by_position(pager: KVFlashPager) -> dict[int, bytes]:
    """position -> bytes of its rows in every pooled layer, over all valid slots of the pool."""
    pos = pager.be.to_numpy(pager.slot_positions())
    data = pager.be.to_numpy(pager.pool.data)  # [L, 2, P, H, D]
    return {int(p): data[:, :, s].tobytes() for s, p in enumerate(pos) if p >= 0}


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


# ---------------------------------------------------------------- paging


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_page_round_trip_is_bit_exact_and_freed_blocks_read_zero(rng, dtype):
    # Awkward sizes: 3 heads of width 5 (30 bytes per f16 row), pooled model layers 1 and 5.
    pager = KVFlashPager(5 * 8, 8, 1, 1, layers=[1, 5], n_kv_heads=3, head_dim=5, dtype=dtype)
    written = write_positions(pager, range(40), rng)
    before = content_by_position(pager)
    assert pager.block_of(2) == 2
    pager.page_out(2)
    assert not pager.pool.data[:, :, 16:24].any()  # the freed block reads as zeros
    assert set(content_by_position(pager)) == set(range(40)) - set(range(16, 24))
    pager.page_in(2)  # the free stack holds only block 2, so it comes back there
    assert content_by_position(pager) == before
    for p in (16, 23):
        k, v = pager.read(5, [p])
        assert k.tobytes() == written[p][1, 0].tobytes()
        assert v.tobytes() == written[p][1, 1].tobytes()
    # chunk_bytes = 2 layers x (K, V) x 8 tokens x 3 heads x 5 dims x itemsize.
    itemsize = np.dtype(dtype).itemsize
    assert pager.chunk_bytes == 2 * 2 * 8 * 3 * 5 * itemsize
    assert pager.stats.moved_bytes == 2 * pager.chunk_bytes
    assert pager.stats.host_bytes == pager.chunk_bytes


def test_round_trip_into_another_block_after_eviction(rng):
    pager = small_pager(4, head_dim=6)
    written = write_positions(pager, range(16), rng)
    pager.page_out(1)  # block 1 free
    write_positions(pager, range(16, 20), rng)  # chunk 4 takes block 1
    # Recall chunk 1 on the full pool: candidates 1 <= c <= 4 - 1 - 1 = 2 resident: chunk 2.
    assert pager.page_in(1) == 2
    for p in range(4, 8):
        k, v = pager.read(0, [p])
        assert k.tobytes() + v.tobytes() == written[p][0, 0].tobytes() + written[p][0, 1].tobytes()


def test_page_preconditions_are_checked():
    pager = small_pager(4)
    pager.alloc_span(0, 8)
    with pytest.raises(PagerError, match="not resident"):
        pager.page_out(3)
    with pytest.raises(PagerError, match="host store"):
        pager.page_in(0)  # resident
    with pytest.raises(PagerError, match="host store"):
        pager.page_in(7)  # never materialised


def test_host_copy_is_kept_after_page_in_and_dropped_by_reset():
    pager = small_pager(4)
    pager.alloc_span(0, 16)
    pager.page_out(2)
    pager.page_in(2)
    assert pager.is_on_host(2) and pager.block_of(2) >= 0
    assert pager.host_only_chunks().size == 0
    pager.page_out(2)  # second page-out reuses the host buffer: host_bytes does not grow
    assert pager.stats.host_bytes == pager.chunk_bytes
    epoch = pager.epoch
    pager.reset()
    assert pager.stats.host_bytes == 0 and pager.stats.page_outs == 2  # cumulative kept
    assert pager.cur_chunk == 0 and pager.n_chunks == 0 and pager.epoch == epoch + 1
    assert pager.free_blocks == [3, 2, 1, 0] and pager.is_identity()


def test_zero_free_blocks_clears_stale_rows_after_reset(rng):
    pager = small_pager(4)
    write_positions(pager, range(16), rng)
    pager.reset()
    assert pager.pool.data.any()  # reset drops mappings, not contents
    pager.zero_free_blocks()
    assert not pager.pool.data.any()


# ---------------------------------------------------------------- reselect


def test_reselect_recalls_the_hot_chunk(rng):
    # Test D of the public suite, by hand. pool 5 blocks, T 4, sink 1, tail 1.
    pager = small_pager(5)
    written = write_positions(pager, range(36), rng)
    # Chunks 0..4 fill blocks 0..4; chunks 5, 6, 7, 8 evict (LRU among 1 <= c <= cur - 2)
    # chunks 1, 2, 3, 4 into blocks 1, 2, 3, 4.
    np.testing.assert_array_equal(pager.chunk_blocks(), [0, -1, -1, -1, -1, 1, 2, 3, 4])
    assert pager.reselect() == 0  # no hook: LRU, nothing to do
    # Earliest paged-out chunk is the hottest (2.0); the others score 1 / (1 + c).
    scores = np.array([1 / (1 + c) for c in range(9)])
    scores[1] = 2.0
    pager.score_hook = hook_from_scores(scores)
    # Protected: chunk 0 (sink) and 7, 8 (c > 8 - 1 - 1). Free places: 5 - 3 = 2, taken by the
    # best unprotected: chunk 1 (2.0) and chunk 2 (1/3). Out (ascending): 5 (block 1), 6
    # (block 2); stack [1, 2]. In (ascending): chunk 1 pops block 2, chunk 2 pops block 1.
    assert pager.reselect() == 4
    np.testing.assert_array_equal(pager.chunk_blocks(), [0, 2, 1, -1, -1, -1, -1, 3, 4])
    for p in range(4, 12):
        k, _ = pager.read(0, [p])
        assert k.tobytes() == written[p][0, 0].tobytes()
    assert pager.reselect() == 0  # already optimal
    # Decoding on: chunk 9 evicts the minimum-score candidate of 1 <= c <= 7: chunk 7 (1/8).
    assert pager.slot_for(36) == 12 and pager.block_of(7) == -1
    assert (pager.stats.reselects, pager.stats.reselect_events) == (2, 4)


def test_reselect_never_drops_protected_chunks_even_under_huge_scores():
    pager = small_pager(5)
    for p in range(36):
        pager.slot_for(p)
    # Every unprotected chunk outranks FLT_MAX; protected chunks 0, 7, 8 must still stay.
    pager.score_hook = lambda chunks: np.full(len(chunks), np.inf)
    pager.reselect()
    assert {0, 7, 8} <= set(pager.resident_chunks().tolist())


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


# ---------------------------------------------------------------- relocation invariance


def _drive(pager: KVFlashPager, rows: np.ndarray) -> None:
    """The same op sequence for any block order: prefill pieces of at most tail + 1 chunks (a
    longer span would evict its own first chunk), decodes with eviction, page events."""
    L = len(pager.pool.layers)
    for start, n in ((0, 12), (12, 10), (22, 8), (30, 1), (31, 7), (38, 9)):
        pager.alloc_span(start, n)
        for i, layer in enumerate(pager.pool.layers):
            pos = np.arange(start, start + n)
            pager.write(layer, pos, rows[i, 0, pos], rows[i, 1, pos])
    pager.page_out(pager.resident_chunks()[1])
    pager.page_in(pager.host_only_chunks()[0])
    assert L == 2


def test_shuffled_block_order_holds_the_same_position_content(rng):
    # Test B of the public suite: a shuffled placement changes slots, not (position -> rows).
    rows = rng.standard_normal((2, 2, 47, 2, 3)).astype(np.float32)  # [L, K|V, pos, H, D]
    a = KVFlashPager(6 * 4, 4, 1, 2, layers=2, n_kv_heads=2, head_dim=3)
    b = KVFlashPager(6 * 4, 4, 1, 2, layers=2, n_kv_heads=2, head_dim=3)
    b.set_block_order([4, 1, 5, 0, 3, 2])
    _drive(a, rows)
    _drive(b, rows)
    assert not np.array_equal(a.fill_slot_pos(), b.fill_slot_pos())
    assert content_by_position(a) == content_by_position(b)
    assert sorted(content_by_position(a)) == sorted(
        p for c in a.resident_chunks() for p in range(4 * c, 4 * c + 4))
    for p in content_by_position(b):
        if p < 47:
            k, v = b.read(1, [p])
            assert k.tobytes() == rows[1, 0, p].tobytes() and v.tobytes() == rows[1, 1, p].tobytes()


def _attend(q, K, V, k_pos, q_pos: int) -> np.ndarray:
    """float64 single-query attention over the slots with 0 <= k_pos <= q_pos (test helper).

    The project's masks live in ops/masks.py; this is the position-aware rule of spec §1.6
    written out to check that slot_positions is what such a mask needs.
    """
    visible = (k_pos >= 0) & (k_pos <= q_pos)  # [P]
    logits = np.einsum("hd,phd->hp", q, K) / np.sqrt(q.shape[-1])  # [H, P]
    logits = np.where(visible[None], logits, -np.inf)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hp,phd->hd", p, V)


def test_pool_attention_equals_full_cache_attention_over_resident_positions(rng):
    # Spec §8.3: masked attention over the pool (any block permutation, after paging) equals
    # attention over the full cache restricted to the resident positions.
    rows = rng.standard_normal((2, 2, 47, 2, 3))  # float64 [L, K|V, pos, H, D]
    pager = KVFlashPager(6 * 4, 4, 1, 2, layers=2, n_kv_heads=2, head_dim=3, dtype="float64")
    pager.set_block_order([3, 5, 0, 2, 4, 1])
    _drive(pager, rows)
    K, V, k_pos = pager.kv(1)
    resident = np.sort(k_pos[k_pos >= 0])
    assert 47 in resident  # allocated chunk 11, never written: hidden from queries below 47
    for q_pos in (33, 40, 46):
        q = rng.standard_normal((2, 3))
        got = _attend(q, K, V, k_pos, q_pos)
        keep = resident[resident <= q_pos]  # [n] positions, in position order
        ref = _attend(q, rows[1, 0, keep], rows[1, 1, keep], keep, q_pos)
        assert_close(got, ref, "float64", op="pool attention", case=f"q_pos={q_pos}")


# ---------------------------------------------------------------- the pager on CuPy (gpu)


def _scripted(backend: str, dtype: str, rows: np.ndarray) -> KVFlashPager:
    """One op sequence (writes, evictions, manual paging, reselect) on a given backend."""
    pager = KVFlashPager(6 * 8, 8, 1, 2, backend=backend, layers=[0, 2, 4], n_kv_heads=2,
                         head_dim=6, dtype=dtype)
    be = pager.be
    pager.set_block_order([5, 3, 1, 0, 2, 4])
    for start in range(0, 96, 8):
        pager.alloc_span(start, 8)
        pos = np.arange(start, start + 8)
        for i, layer in enumerate(pager.pool.layers):
            pager.write(layer, pos, be.to_backend(rows[i, 0, pos]), be.to_backend(rows[i, 1, pos]))
    pager.page_in(pager.host_only_chunks()[0])
    pager.score_hook = hook_from_scores(-np.arange(12.0))  # older chunks are hotter
    pager.reselect()
    return pager


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_pager_on_cupy_matches_numpy_bit_for_bit(rng, dtype):
    rows = rng.standard_normal((3, 2, 96, 2, 6)).astype(dtype)
    ref, dev = _scripted("numpy", dtype, rows), _scripted("cupy", dtype, rows)
    assert dev.be.name == "cupy"
    np.testing.assert_array_equal(ref.chunk_blocks(), dev.chunk_blocks())
    assert ref.stats == dev.stats
    assert ref.pool.data.tobytes() == dev.be.to_numpy(dev.pool.data).tobytes()
    np.testing.assert_array_equal(ref.fill_slot_pos(), dev.be.to_numpy(dev.slot_positions()))
    for c in ref.host_only_chunks():
        assert ref._host[c].tobytes() == dev._host[c].tobytes()


@pytest.mark.gpu
def test_cupy_host_store_is_pinned():
    import cupy

    pager = small_pager(4, backend="cupy")
    pager.alloc_span(0, 16)
    pager.page_out(2)
    buf = pager._host[2]
    attrs = cupy.cuda.runtime.pointerGetAttributes(buf.ctypes.data)
    assert attrs.type == cupy.cuda.runtime.memoryTypeHost, "the host copy is not pinned memory"
