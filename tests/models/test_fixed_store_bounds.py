"""Fixed-capacity (graphed) stores: what a snapshot or a returned array holds stays put, the
exact capacity is allowed and one past it refused, and a replay key tells apart every call whose
non-shape arguments differ (dflash_ref/models/fixed_stores.py, dflash_ref/models/graphs.py).

The rows of a fixed store are rewritten in place after a rollback, and a CUDA graph rewrites its
output buffers at every replay; an array that aliases either changes under its holder. The NumPy
backend's capture calls the step again (new arrays each time), so the test of the runner's copy
uses a capture that keeps the first outputs and writes each replay into them, as a CUDA graph
does (:func:`buffer_reusing_capture`). The oracles: copies taken by the test, eager states, and
states that never went through a rollback. The recording backend's tape (tests/device_counter.py),
which the CPU graph tests compare between replays, is checked to see every value a launch bakes in.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from dflash_ref.backend import Backend, get_backend
from dflash_ref.errors import ConfigError, StateError
from dflash_ref.models.cache import FeatureBuffer
from dflash_ref.models.graphs import StepGraphs
from dflash_ref.ops.masks import MaskSpec
from tests.device_counter import _signature, counting_backend
from tests.models.test_batch_arrays import tiny_model
from tests.models.test_graphs import tiny_pair

ATOL = 1e-5  # the same rows computed in batches of other sizes (float32 reassociation)


def buffer_reusing_capture(step):
    """A capture with a CUDA graph's output rule: the replay returns the arrays of the first
    run, rewritten in place with each replay's values (models/graphs.py: "the outputs of a
    replay are the recording's buffers, rewritten by the next replay")."""
    first = step()

    def write(dst, src):
        if isinstance(dst, tuple):
            for d, s in zip(dst, src):
                write(d, s)
        elif dst is not None:
            dst[...] = src

    def replay():
        write(first, step())
        return first
    return replay


def reusing_backend() -> Backend:
    ref = get_backend("numpy")
    return Backend("numpy", ref.xp, ref.ops, capture=buffer_reusing_capture)


# ----------------------------------------------------------------------- snapshot isolation


def test_a_fixed_store_snapshot_survives_a_rollback_and_rewrite():
    # Catches FixedCacheStore.snapshot returning views of its rows: the rollback below rewrites
    # rows 5..13 in place (a fixed store moves no data on rollback).
    model = tiny_model("qwen3", 2, get_backend("numpy"))
    rng = np.random.default_rng(0)
    prompt, other, cont = (rng.integers(0, 256, n) for n in (12, 9, 4))
    state = model.new_state(kv_capacity=32, graphs=True)
    model.forward(prompt, state)
    snap = state.snapshot(upto=8)
    held = copy.deepcopy(snap.kv)  # the snapshot's rows as taken
    state.rollback(5)
    model.forward(other, state)  # positions 5..13 rewritten with other tokens
    for layer, (k, v) in held.items():
        assert np.array_equal(snap.kv[layer][0], k) and np.array_equal(snap.kv[layer][1], v), (
            f"layer {layer}: the snapshot changed when its state was written")
    again = model.new_state(kv_capacity=32, graphs=True)
    again.restore(snap)
    fresh = model.new_state(kv_capacity=32)
    model.forward(prompt[:8], fresh)
    np.testing.assert_allclose(model.forward(cont, again).logits,
                               model.forward(cont, fresh).logits, rtol=0, atol=ATOL)


def test_graphed_logits_stay_what_they_were_after_the_next_replay():
    # Catches GraphRunner handing out the recording's output buffers (no copy): with a CUDA
    # graph's output rule the next replay of the same shape rewrites them.
    model = tiny_model("qwen3", 2, reusing_backend())
    graphed = model.new_state(kv_capacity=64, graphs=True)
    eager = model.new_state(kv_capacity=64)
    prompt = np.arange(3, 15)
    model.forward(prompt, graphed, logits_rows=slice(-1, None))  # eager
    model.forward(prompt, eager, logits_rows=slice(-1, None))
    outs = [model.forward([t], graphed) for t in (7, 8, 9)]  # one shape: replays of one key
    want = [model.forward([t], eager) for t in (7, 8, 9)]
    assert graphed.runner.captured == [1]
    for i, (o, w) in enumerate(zip(outs, want)):
        assert np.array_equal(o.logits, w.logits), f"step {i}: logits moved after a replay"
        assert np.array_equal(o.features, w.features), f"step {i}: features moved"


def test_graphed_draft_logits_stay_what_they_were_after_the_next_replay(tmp_path):
    # The same for the draft step of a graphed state's runner (GraphRunner.draft_cache).
    target, drafter = tiny_pair(tmp_path, backend=reusing_backend())
    state = target.new_state(kv_capacity=64, graphs=True)
    cache = state.runner.draft_cache(drafter)
    feats = np.random.default_rng(1).standard_normal((20, drafter.fc.shape[1]))
    cache.extend(feats.astype(np.float32), np.arange(20))
    first = cache.forward_block(5, 20)
    held = first.copy()
    cache.forward_block(9, 20)
    assert np.array_equal(first, held), "the first draft's logits moved after a replay"


# ---------------------------------------------------------------- the exact-capacity boundary


def test_a_batch_ending_exactly_at_kv_capacity_runs_one_past_it_is_refused():
    # Catches ``start + n >= capacity`` in FixedCacheStore.reserve (the last row never used).
    model = tiny_model("qwen3", 2, get_backend("numpy"))
    ids = np.arange(3, 19)  # 16 tokens: positions 0..15
    state = model.new_state(kv_capacity=16, graphs=True)
    got = model.forward(ids, state).logits  # ends exactly at the capacity
    np.testing.assert_allclose(got, model.forward(ids, model.new_state()).logits, rtol=0,
                               atol=ATOL)
    with pytest.raises(StateError, match="kv_capacity=16"):
        model.forward([5], state)  # position 16: one past
    state.rollback(15)
    model.forward([5], state)  # a decode step onto the last row
    assert state.length == 16


def test_a_snapshot_of_exactly_kv_capacity_positions_restores():
    # Catches ``length >= capacity`` in FixedCacheStore.restore.
    model = tiny_model("qwen3", 2, get_backend("numpy"))
    full = model.new_state(kv_capacity=64)
    model.forward(np.arange(3, 20), full)  # 17 positions
    small = model.new_state(kv_capacity=16)
    small.restore(full.snapshot(upto=16))
    assert small.length == 16
    with pytest.raises(StateError, match="kv_capacity=16"):
        small.restore(full.snapshot(upto=17))


def test_a_fixed_draft_cache_holds_exactly_its_capacity(tmp_path):
    # Catches ``b >= capacity`` in FixedDraftCache.extend.
    _, drafter = tiny_pair(tmp_path)
    feats = np.random.default_rng(2).standard_normal((9, drafter.fc.shape[1]))
    feats = feats.astype(np.float32)
    cache = drafter.fixed_cache(8)
    cache.extend(feats[:8], np.arange(8))  # positions 0..7: exactly the capacity
    grown = drafter.new_cache()
    grown.extend(feats[:8], np.arange(8))
    np.testing.assert_allclose(cache.forward_block(4, 8), grown.forward_block(4, 8), rtol=0,
                               atol=ATOL)
    with pytest.raises(ValueError, match="capacity 8"):
        cache.extend(feats[8:], [8])


def test_a_feature_buffer_as_large_as_its_window_is_allowed():
    # Catches ``capacity <= window`` in FeatureBuffer's check: capacity == window keeps exactly
    # the rows the drafter reads.
    be = get_backend("numpy")
    buf = FeatureBuffer(be, 2, capacity=4, window=4)
    buf.append(0, np.arange(12, dtype=np.float32).reshape(6, 2))
    assert (buf.start, buf.end) == (2, 6)
    with pytest.raises(ConfigError, match="smaller than the drafter context window"):
        FeatureBuffer(be, 2, capacity=3, window=4)


# ------------------------------------------------------------------- the replay key's fields


def test_a_tapped_forward_of_a_captured_shape_runs_eagerly():
    # Catches a replay key that ignores the tap: the replay would run the recorded step (no tap,
    # or the first tap), so the observer sees nothing or the wrong batch.
    model = tiny_model("qwen3", 2, get_backend("numpy"))
    state = model.new_state(kv_capacity=64, graphs=True)
    model.forward(np.arange(3, 15), state, logits_rows=slice(-1, None))  # eager
    model.forward([7], state)  # captures the one-row step, untapped
    seen = []
    model.forward([8], state, tap=lambda layer, name, x: seen.append((layer, name)))
    eager_seen = []
    eager = model.new_state()
    model.forward(np.arange(3, 15), eager)
    model.forward([7], eager)
    model.forward([8], eager, tap=lambda layer, name, x: eager_seen.append((layer, name)))
    assert seen and seen == eager_seen
    assert state.runner.captured == [1]


def test_draft_steps_with_and_without_the_hidden_rows_are_two_recordings(tmp_path):
    # Catches a draft replay key of the row count alone: the chain's proposer asks for the
    # hidden rows, the tree's draft_logits does not, at the same row count.
    _, drafter = tiny_pair(tmp_path)
    feats = np.random.default_rng(3).standard_normal((20, drafter.fc.shape[1]))
    feats = feats.astype(np.float32)
    graphed = drafter.fixed_cache(64, run_step=StepGraphs(drafter.be).replay)
    eager = drafter.fixed_cache(64)
    for cache in (graphed, eager):
        cache.extend(feats, np.arange(20))
    n = drafter.block_size
    plain = graphed.forward_block(5, 20, n)
    logits, hidden = graphed.forward_block(5, 20, n, with_hidden=True)
    want_logits, want_hidden = eager.forward_block(5, 20, n, with_hidden=True)
    assert np.array_equal(plain, want_logits)
    assert np.array_equal(logits, want_logits) and np.array_equal(hidden, want_hidden)
    assert hidden.shape == (n, drafter.config.hidden_size)


def test_the_recording_tape_tells_apart_every_value_a_launch_bakes_in():
    # The CPU graph tests call a step graph-safe when every replay's tape is the same; a tape
    # that leaves out a mask's field (base_pos, the window, ...) or a host scalar would call a
    # step whose mask moves between replays graph-safe. Device arrays count by shape and dtype
    # only (their contents are device memory, rewritten before a replay).
    be = counting_backend()
    q, k = be.to_backend(np.arange(4, 8)), be.to_backend(np.arange(8))
    base = MaskSpec(q, k, causal=True, window=4, base_pos=3)
    fields = [dict(causal=False), dict(window=5), dict(window_mode="bidirectional"),
              dict(base_pos=4)]
    for change in fields:
        moved = dataclasses.replace(base, **change)
        assert _signature(moved) != _signature(base), f"the tape misses {change}"
    same = dataclasses.replace(base, q_pos=be.to_backend(np.arange(10, 14)))  # contents only
    assert _signature(same) == _signature(base)
    assert _signature((slice(2, 5), 3, 0.5)) != _signature((slice(2, 6), 3, 0.5))
    assert _signature((slice(2, 5), 3, 0.5)) != _signature((slice(2, 5), 4, 0.5))
