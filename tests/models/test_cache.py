"""KVCache and FeatureBuffer: position bookkeeping, capacity, eviction, rollback; the feature
buffer's store transitions (keep a tree path, snapshot, restore)."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.backend import get_backend
from dflash_ref.errors import ConfigError
from dflash_ref.models.cache import FeatureBuffer, KVCache
from dflash_ref.models.tree import TreePath

be = get_backend("numpy")


def rows(start, n, width=3):
    """Rows whose first column is their absolute position (so every check is by eye)."""
    r = np.zeros((n, width), np.float32)
    r[:, 0] = np.arange(start, start + n)
    return r


def test_feature_buffer_accumulates_micro_batches_by_position():
    buf = FeatureBuffer(be, 3)
    buf.append(0, rows(0, 5))
    buf.append(5, rows(5, 512))  # the seed-001 bug kept only this last micro-batch
    buf.append(517, rows(517, 1))
    assert len(buf) == 518
    np.testing.assert_array_equal(buf.rows()[:, 0], np.arange(518))


def test_feature_buffer_refuses_gaps_and_overlaps():
    buf = FeatureBuffer(be, 3)
    buf.append(0, rows(0, 4))
    with pytest.raises(ValueError, match="no gap or overlap"):
        buf.append(6, rows(6, 2))  # a cache restore that skipped features (docs/conventions.md)
    with pytest.raises(ValueError, match="no gap or overlap"):
        buf.append(2, rows(2, 2))


def test_feature_buffer_truncates_on_rollback():
    buf = FeatureBuffer(be, 3)
    buf.append(0, rows(0, 10))
    buf.truncate(7)
    buf.append(7, rows(7, 2))
    np.testing.assert_array_equal(buf.rows()[:, 0], np.arange(9))


def test_feature_buffer_capacity_without_window_raises_never_wraps():
    buf = FeatureBuffer(be, 3, capacity=4096)
    buf.append(0, rows(0, 4096))
    with pytest.raises(ConfigError, match="capacity is 4096"):
        buf.append(4096, rows(4096, 1))  # a ring would overwrite row 0 here
    np.testing.assert_array_equal(buf.rows()[:, 0], np.arange(4096))


def test_feature_buffer_window_evicts_oldest_rows_explicitly():
    buf = FeatureBuffer(be, 3, capacity=8, window=6)
    buf.append(0, rows(0, 7))
    buf.append(7, rows(7, 3))  # 10 rows > capacity 8: the oldest 2 go
    assert (buf.start, buf.end) == (2, 10)
    ctx, pos = buf.window_rows()
    np.testing.assert_array_equal(pos, np.arange(4, 10))
    np.testing.assert_array_equal(ctx[:, 0], np.arange(4, 10))
    with pytest.raises(ValueError, match="held positions are"):
        buf.rows(0, 3)
    with pytest.raises(ConfigError, match="smaller than the drafter context window"):
        FeatureBuffer(be, 3, capacity=4, window=6)


def test_feature_buffer_keeps_a_tree_path_at_consecutive_positions():
    buf = FeatureBuffer(be, 3)
    buf.append(0, rows(0, 4))
    nodes = rows(100, 6)  # six tree nodes; node i's first column is 100 + i
    buf.keep_path(TreePath.upload(be, 4, np.array([0, 2, 5])), nodes)
    np.testing.assert_array_equal(buf.rows()[:, 0], [0, 1, 2, 3, 100, 102, 105])
    assert (buf.start, buf.end) == (0, 7)


def test_feature_buffer_snapshot_and_restore_keep_positions_after_eviction():
    buf = FeatureBuffer(be, 3, capacity=8, window=6)
    buf.append(0, rows(0, 10))  # holds positions 2..9
    snap, start = buf.snapshot(7)
    assert start == 2
    np.testing.assert_array_equal(snap[:, 0], np.arange(2, 7))
    buf.append(10, rows(10, 1))  # the snapshot is a copy: the live buffer moves on
    other = FeatureBuffer(be, 3, capacity=8, window=6)
    other.restore(start, snap, 7)
    assert (other.start, other.end) == (2, 7)
    np.testing.assert_array_equal(other.rows()[:, 0], np.arange(2, 7))
    other.restore(5, None, 5)  # nothing held; the next append starts at 5
    assert len(other) == 0 and other.end == 5
    other.append(5, rows(5, 2))
    np.testing.assert_array_equal(other.rows()[:, 0], [5, 6])


def test_kv_cache_append_truncate_and_shape_errors():
    c = KVCache(be, 2, 4)
    for t in range(40):  # grows past its initial capacity
        c.append(np.full((1, 2, 4), t, np.float32), np.full((1, 2, 4), -t, np.float32))
    np.testing.assert_array_equal(c.k[:, 0, 0], np.arange(40))
    c.truncate(25)
    assert c.k.shape == (25, 2, 4) and c.v[-1, 0, 0] == -24
    with pytest.raises(ValueError, match="expected"):
        c.append(np.zeros((1, 3, 4), np.float32), np.zeros((1, 3, 4), np.float32))
    with pytest.raises(ValueError, match="holds 25"):
        c.truncate(30)


def test_feature_buffer_window_eviction_within_one_append_and_after_truncate():
    # An append longer than the capacity keeps only its own newest rows; a truncate followed
    # by an append overwrites the dropped rows (storage is reused, not reallocated).
    buf = FeatureBuffer(be, 3, capacity=5, window=4)
    buf.append(0, rows(0, 3))
    buf.append(3, rows(3, 9))  # 12 rows through a capacity of 5: positions 7..11 remain
    assert (buf.start, buf.end) == (7, 12)
    np.testing.assert_array_equal(buf.rows()[:, 0], np.arange(7, 12))
    buf.truncate(9)
    buf.append(9, rows(9, 4))  # 7..12 is 6 rows > 5: position 7 goes
    np.testing.assert_array_equal(buf.rows()[:, 0], np.arange(8, 13))


def kv_rows(positions):
    """K rows equal to their position, V rows to minus it ([T, 2, 4] each, checked by eye)."""
    p = np.asarray(positions, np.float32)[:, None, None]
    return np.broadcast_to(p, (len(p), 2, 4)).copy(), np.broadcast_to(-p, (len(p), 2, 4)).copy()


def test_kv_cache_stage_writes_after_the_committed_rows_without_committing():
    c = KVCache(be, 2, 4)
    c.append(*kv_rows(range(16)))  # exactly the initial capacity: staging must grow it
    k, v = c.stage(*kv_rows([100, 101, 102]), start=5)
    assert c.length == 16 and k.shape == v.shape == (14, 2, 4)
    np.testing.assert_array_equal(k[:, 0, 0], [*range(5, 16), 100, 101, 102])
    np.testing.assert_array_equal(v[:, 1, 3], [-x for x in [*range(5, 16), 100, 101, 102]])
    assert np.shares_memory(k, c.k) and np.shares_memory(v, c.v)  # views, not copies
    np.testing.assert_array_equal(c.k[:, 0, 0], np.arange(16))  # committed rows as they were
    k2, _ = c.stage(*kv_rows([200]))  # a second stage overwrites the first's rows
    np.testing.assert_array_equal(k2[:, 0, 0], [*range(16), 200])
    c.append(*kv_rows([16]))  # so does the next append
    np.testing.assert_array_equal(c.k[:, 0, 0], np.arange(17))
    with pytest.raises(ValueError, match="holds 17"):
        c.stage(*kv_rows([17]), start=18)
    with pytest.raises(ValueError, match="expected"):
        c.stage(np.zeros((1, 3, 4), np.float32), np.zeros((1, 3, 4), np.float32))
