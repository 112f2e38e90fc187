"""KVFlashPager, paging: bit-exact round trips, the host store, reselect, relocation invariance
(shuffled blocks, pool attention vs full-cache attention) and the same op script on CuPy.

Expected contents come from the rows the test wrote (bit-exact), hand-walked chunk tables
(docs/kvflash.md, "Paging" and "Reselect") and a float64 attention over the full cache.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.errors import PagerError
from dflash_ref.kvflash import KVFlashPager
from dflash_ref.kvflash.scorers import hook_from_scores
from dflash_ref.testing import assert_close
from tests.kvflash.pagers import content_by_position, small_pager, write_positions

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

    The project's masks live in ops/masks.py; this is the position-aware rule (docs/kvflash.md,
    "The validity rule and the decode mask") written out to check that slot_positions is what
    such a mask needs.
    """
    visible = (k_pos >= 0) & (k_pos <= q_pos)  # [P]
    logits = np.einsum("hd,phd->hp", q, K) / np.sqrt(q.shape[-1])  # [H, P]
    logits = np.where(visible[None], logits, -np.inf)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hp,phd->hd", p, V)


def test_pool_attention_equals_full_cache_attention_over_resident_positions(rng):
    # The pager's relocation invariant (docs/kvflash.md, "The validity rule and the decode
    # mask"): masked attention over the pool (any block permutation, after paging) equals
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
