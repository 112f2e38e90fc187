"""Snapshot and restore of a state whose full-attention layers live in a KVFlash pool.

The pool store gathers its rows by position for a snapshot and refills a pool chunk by chunk on
restore (models/pool_store.py, ``PoolStore``), so a snapshot does not depend on slot order. The
reference is the same computation on the plain KV cache (an independent store): a pooled state
restored into another pool, even one that hands its blocks out in another order, continues as
the restored plain state does, to float32 reassociation.
"""

from __future__ import annotations

import pytest

from dflash_ref.errors import StateError
from dflash_ref.kvflash.pager import KVFlashPager
from dflash_ref.testing import assert_close
from tests.kvflash.pagers import CHUNK, POOLED, random_ids, tiny_targets


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    return tiny_targets(tmp_path_factory.mktemp("psnap"), seed=71)


def _prefill(target, state, ids):
    for a in range(0, ids.size, 8):  # chunk-aligned pieces for both, so GDN layers reduce alike
        target.forward(ids[a:a + 8], state)


@pytest.mark.parametrize("fam", ["qwen3", "qwen3_5", "gemma3"])
def test_a_pooled_snapshot_restores_into_another_pool_as_the_plain_cache_does(targets, fam):
    target, ids = targets[fam], random_ids(60)
    shuffled = KVFlashPager(64, **CHUNK)
    shuffled.set_block_order([5, 2, 7, 0, 3, 6, 1, 4])  # other slots for the same positions
    outs = []
    for src_pager, dst_pager in ((None, None), (KVFlashPager(64, **CHUNK), shuffled)):
        src = target.new_state(pager=src_pager)
        _prefill(target, src, ids[:40])
        snap = src.snapshot()
        target.forward(ids[40:44], src)  # the live state moves on; the snapshot must not
        dst = target.new_state(pager=dst_pager)
        dst.restore(snap)
        assert dst.length == 40 and dst.tokens.tolist() == ids[:40].tolist()
        out = target.forward(ids[40:52], dst)
        outs.append((snap, out.logits, target.be.to_numpy(dst.features.rows())))
    (plain, lp, fp), (pooled, lq, fq) = outs
    assert set(pooled.kv) == set(plain.kv) and set(pooled.gdn) == set(plain.gdn)
    for i, (k, v) in plain.kv.items():
        assert_close(pooled.kv[i][0], k, POOLED, op="PoolStore.snapshot", tensor=f"k[{i}]")
        assert_close(pooled.kv[i][1], v, POOLED, op="PoolStore.snapshot", tensor=f"v[{i}]")
    assert_close(lq, lp, POOLED, op="restored pooled state", tensor="logits", case=fam)
    assert_close(fq, fp, POOLED, op="restored pooled state", tensor="features", case=fam)


def test_a_pooled_snapshot_of_no_position_empties_the_state(targets):
    target, ids = targets["qwen3"], random_ids(30, 1)
    state = target.new_state(pager=KVFlashPager(64, **CHUNK))
    _prefill(target, state, ids[:24])
    state.restore(state.snapshot(upto=0))
    assert state.length == 0 and len(state.features) == 0
    got = target.forward(ids[24:30], state).logits
    ref = target.forward(ids[24:30], target.new_state()).logits
    assert_close(got, ref, POOLED, op="restore(snapshot(0))", tensor="logits")


def test_a_pooled_snapshot_refuses_paged_out_chunks(targets):
    target = targets["qwen3"]
    pager = KVFlashPager(32, **CHUNK)  # 4 chunks: a 48-token context evicts some of them
    state = target.new_state(pager=pager)
    _prefill(target, state, random_ids(48, 2))
    assert pager.host_only_chunks().size > 0
    with pytest.raises(StateError, match="paged out"):
        state.snapshot()
