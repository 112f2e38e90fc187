"""A snapshot stays the snapshot while its state is reused, and evicted feature rows round-trip.

A server snapshots a state, then reuses the same state for another request: truncates it and
overwrites the positions the snapshot covers, evicts feature rows, restores, truncates again.
A snapshot (or a restored store) that shared storage with the state instead of copying it reads
the overwritten rows afterwards; no earlier test overwrote a state in place after snapshotting it,
or snapshotted a feature buffer that had evicted rows. The oracle is the same tokens run on a
state that never went through a snapshot.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.errors import StateError
from tests.spec_decode.drafters import FAMILIES, tiny_pairs

# the same rows computed in batches of other sizes (float32 reassociation)
ATOL, RTOL = 1e-5, 1e-4


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_pairs(tmp_path_factory.mktemp("snapreuse"), 51, 52, block_size=8)


def _ids(n, seed):
    return np.random.default_rng(seed).integers(0, 256, size=n)


def _run(target, state, pieces):
    """Forward each piece; the last one's logits and every held feature row (host copies: rows()
    is a view of the buffer)."""
    for piece in pieces:
        out = target.forward(piece, state)
    return (np.array(target.be.to_numpy(out.logits)),
            np.array(target.be.to_numpy(state.features.rows())))


@pytest.mark.parametrize("fam", list(FAMILIES))
def test_snapshot_survives_its_state_truncated_and_overwritten(models, fam):
    target, _ = models[fam]
    prompt, other, cont = _ids(12, 1), _ids(9, 2), _ids(5, 3)
    state = target.new_state()
    target.forward(prompt, state)
    snap = state.snapshot(upto=8)  # inside the last batch: a hybrid's GDN state exists there
    state.truncate(5)  # inside the last batch too, and into the snapshot's positions
    target.forward(other, state)  # positions 5..13 overwritten in place, other tokens

    state.restore(snap)  # the reused state, back to the snapshot
    got = _run(target, state, [cont])
    # reuse the restored state too: truncate into the restored rows and overwrite them (a
    # hybrid's GDN state rewinds only inside its last batch, 8..12)
    state.truncate(8 if state.gdn_stores else 3)
    target.forward(other[:6], state)
    again = target.new_state()
    again.restore(snap)  # the snapshot must still be what it was
    got_again = _run(target, again, [cont])

    fresh = target.new_state()
    expected = _run(target, fresh, [prompt[:8], cont])
    for g in (got, got_again):
        np.testing.assert_allclose(g[0], expected[0], atol=ATOL, rtol=RTOL)  # logits
        np.testing.assert_allclose(g[1], expected[1], atol=ATOL, rtol=RTOL)  # features
    assert snap.tokens.tolist() == prompt[:8].tolist()


def test_snapshot_of_a_feature_buffer_with_evicted_rows(models):
    target, _ = models["qwen3"]
    pieces = [_ids(7, 4), _ids(6, 5), _ids(5, 6)]
    cont = [_ids(3, 7), _ids(4, 8)]
    state = target.new_state(feature_capacity=8, feature_window=5)
    for piece in pieces:
        target.forward(piece, state)
    assert state.features.start == 10  # 18 rows appended, 8 kept
    snap = state.snapshot()
    assert (snap.feature_start, snap.features.shape[0]) == (10, 8)
    held = np.array(target.be.to_numpy(state.features.rows()))  # copy: the rows at snapshot time

    _run(target, state, cont)  # evicts more: held rows shift in place inside the buffer
    state.restore(snap)
    assert (state.features.start, state.features.end) == (10, 18)
    np.testing.assert_array_equal(target.be.to_numpy(state.features.rows()), held)
    rows, pos = state.features.window_rows()
    assert target.be.to_numpy(pos).tolist() == list(range(13, 18))
    got = _run(target, state, cont)

    fresh = target.new_state(feature_capacity=8, feature_window=5)
    expected = _run(target, fresh, pieces + cont)
    assert (state.features.start, state.features.end) == (fresh.features.start, 25)
    np.testing.assert_allclose(got[0], expected[0], atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(got[1], expected[1], atol=ATOL, rtol=RTOL)


def test_rollback_right_after_a_restore_into_a_reused_hybrid_state(models):
    # A reused hybrid state still holds its own last batch (positions 30..35, with the per-token
    # GDN trace) when another prompt's snapshot is restored into it. A rollback right after the
    # restore must be refused (no batch has run since: nothing to rewind from) or give what a
    # fresh state gives; rewinding from the stale trace would give the old prompt's GDN state.
    # The oracle: the snapshot's prompt cut at the rollback point, run on a fresh state.
    target, _ = models["qwen3_5"]
    y, cont = _ids(33, 12), _ids(4, 14)
    donor = target.new_state()
    target.forward(y[:30], donor)
    target.forward(y[30:], donor)
    snap = donor.snapshot()  # 33 positions
    state = target.new_state()
    target.forward(_ids(30, 11), state)
    target.forward(_ids(5, 13), state)  # the last batch: positions 30..34, trace kept
    state.restore(snap)
    try:
        state.rollback(31)  # inside the stale batch's span
        expected = _run(target, target.new_state(), [y[:30], y[30:31], cont])
    except (ValueError, StateError):  # refused: the state is still the snapshot's
        assert state.length == 33
        expected = _run(target, target.new_state(), [y[:30], y[30:], cont])
    got = _run(target, state, [cont])
    np.testing.assert_allclose(got[0], expected[0], atol=ATOL, rtol=RTOL)  # logits
    np.testing.assert_allclose(got[1], expected[1], atol=ATOL, rtol=RTOL)  # features
