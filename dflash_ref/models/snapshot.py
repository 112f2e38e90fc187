"""Snapshot and restore of a target state: a copy of its first n positions, and back.

A server keeps states between requests (docs/serving.md). :class:`StateSnapshot` is everything a
continuation depends on, as copies that outlive the state; each store makes and refills its own
part (``snapshot(n)`` / ``restore(length, pieces)``, models/stores.py), so this module only
checks and assembles::

    snap = state.snapshot(upto)   # take_snapshot: every store's pieces, features, tokens
    state.restore(snap)           # restore_stores: checks, then every store refilled

A restore is refused (:class:`~dflash_ref.errors.StateError`) when the snapshot's layers are
not this state's, or when this state captures features for a drafter and the snapshot lacks
rows the drafter would read. The three prompt-cache paths built on these are in
models/prompt_cache.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash_ref.errors import StateError


@dataclass
class StateSnapshot:
    """Everything a continuation depends on, for positions 0..length-1 (a copy, not a view).

    Attributes:
        length: committed positions covered.
        tokens: [length] their token ids (a restore checks a new prompt against them).
        kv: attention layer id -> (k, v) [length, Hkv, D] (plain caches and pooled layers alike:
            pooled rows are gathered by position, so a snapshot is independent of slot order).
        gdn: GDN layer id -> the GDNState after position length-1 (None before any token).
        features: [length - start, C*H] captured rows for positions start..length-1, or None
            when the state captured nothing; ``feature_start`` is start (> 0 after eviction).
    """

    length: int
    tokens: np.ndarray
    kv: dict
    gdn: dict
    features: object | None
    feature_start: int = 0


def take_snapshot(state, n: int) -> StateSnapshot:
    """A copy of ``state``'s first ``n`` positions (a
    :class:`~dflash_ref.models.state.TargetState`; ``0 <= n <= state.length``, nothing
    pending): each store's pieces, the feature rows and the tokens.

    Attention rows and features can be cut anywhere. A GDN state exists only at the committed
    length or inside the last chain batch (from its trace): a hybrid model's ``n`` must lie
    there, so a server takes checkpoints while it prefills."""
    if state.pending:
        raise StateError("snapshot: a tree verify is pending; call commit_path(path) first")
    if not 0 <= n <= state.length:
        raise StateError(f"snapshot(upto={n}): the state holds {state.length} positions")
    kv = {i: p for store in state.kv_stores for i, p in store.snapshot(n).items()}
    gdn = {i: p for store in state.gdn_stores for i, p in store.snapshot(n).items()}
    features, start = (None, 0) if state.features is None else state.features.snapshot(n)
    return StateSnapshot(n, state.tokens[:n], kv, gdn, features, start)


def empty_snapshot(state) -> StateSnapshot:
    """A snapshot of no position with ``state``'s layers: restoring it empties the state."""
    kv = dict.fromkeys(i for store in state.kv_stores for i in store.layers)
    gdn = dict.fromkeys(i for store in state.gdn_stores for i in store.layers)
    return StateSnapshot(0, np.zeros(0, np.int64), kv, gdn, None)


def check_restorable(state, snap: StateSnapshot) -> None:
    """Raise :class:`StateError` unless ``snap`` fits ``state``: nothing pending, the same
    layers, and every feature row the state's drafter window needs at ``snap.length`` (rather
    than drafting from garbage later)."""
    if state.pending:
        raise StateError("restore: a tree verify is pending; call commit_path(path) first")
    kv_layers = {i for store in state.kv_stores for i in store.layers}
    gdn_layers = {i for store in state.gdn_stores for i in store.layers}
    if set(snap.kv) != kv_layers or set(snap.gdn) != gdn_layers:
        raise StateError("restore: the snapshot was taken from a different model (its "
                         "layers do not match this state's)")
    features = state.features
    if features is not None and snap.length:
        need_from = max(0, snap.length - (features.window or snap.length))
        held = "none" if snap.features is None else f"positions {snap.feature_start}.."
        if snap.features is None or snap.feature_start > need_from:
            raise StateError(
                f"restore: this state captures features for the drafter, which needs "
                f"positions {need_from}..{snap.length - 1}, but the snapshot holds {held}; "
                f"the drafter would read rows that do not exist. Snapshot a state that "
                f"captured features (same target_layer_ids, no smaller window)")


def restore_stores(state, snap: StateSnapshot) -> None:
    """Check ``snap`` (:func:`check_restorable`), then make every store of ``state`` and its
    feature buffer hold exactly the snapshot's positions (the state sets its own tokens and
    length)."""
    check_restorable(state, snap)
    for store in state.kv_stores:
        store.restore(snap.length, snap.kv)
    for store in state.gdn_stores:
        store.restore(snap.length, snap.gdn)
    if state.features is not None:
        state.features.restore(snap.feature_start, snap.features, snap.length)
