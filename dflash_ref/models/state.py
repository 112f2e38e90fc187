"""Per-sequence state of the target: KV stores, GDN states, captured features, commit and rollback.

:class:`TargetState` is everything a continuation depends on: one
:class:`~dflash_ref.models.cache.KVCache` per attention layer (or the KVFlash pager's pool for the
full-attention layers), one :class:`~dflash_ref.models.gdn_layer.GDNState` per Gated DeltaNet
layer, the captured :class:`~dflash_ref.models.cache.FeatureBuffer`, the committed length, and
what the last batch needs to be rolled back. The model talks to it through three calls::

    batch = state.begin_batch(ids, parents=None) # arrays on the backend once, a store per layer
    ... every layer runs on batch.kv[i] or batch.gdn[i] ...
    state.end_batch(batch, features)             # chain: committed; tree: pending

and the loop through two: :meth:`TargetState.rollback` (chain verify: keep the accepted rows) and
:meth:`TargetState.commit_path` (tree verify: keep the accepted branch). The state never calls
into the model's layers: a GDN rewind needs only the layer's saved trace
(:func:`~dflash_ref.models.gdn_layer.rewind_state`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dflash_ref.errors import ConfigError, StateError
from dflash_ref.models.batch_arrays import BatchArrays
from dflash_ref.models.cache import FeatureBuffer, KVCache
from dflash_ref.models.gdn_layer import rewind_state
from dflash_ref.models.kv_store import CacheKV, KVStore, PooledKVStore, PooledTreeKV, TreeKV
from dflash_ref.ops.masks import tree_depths

TRACE_MAX_TOKENS = 64
"""A batch of at most this many tokens keeps the GDN per-token trace (recurrent scan) so that
rollback can rewind into it; longer batches (prefill) take the chunked scan and keep none."""


def no_tap(layer: int, name: str, x) -> None:
    """The default observer of intermediate tensors: ignores them (see ``TargetModel.forward``)."""


@dataclass
class _BatchRecord:
    """What rollback / commit_path need from the last forward: its span and GDN rewind data."""

    start: int
    length: int
    ids: np.ndarray  # [T] the batch's tokens (node order for a tree)
    gdn: dict = field(default_factory=dict)  # layer -> (state before, trace) | GDNTreeStates
    pooled: dict = field(default_factory=dict)  # pooled layer -> node (k, v) (tree verify only)
    tree_features: object = None  # features of every tree node (tree verify only)


class ChainGDN:
    """A chain batch through one GDN layer: run from the committed state, keep the trace."""

    def __init__(self, states: dict, layer: int, record: _BatchRecord, keep_trace: bool):
        self.states, self.layer, self.record, self.keep_trace = states, layer, record, keep_trace

    def run(self, mixer, u):
        """``mixer`` (a GDNLayer) over u [T, hidden] from the committed state; returns y."""
        before = self.states[self.layer] or mixer.initial_state()
        y, after, trace = mixer.forward(u, before, return_trace=self.keep_trace)
        self.states[self.layer] = after
        if self.keep_trace:
            self.record.gdn[self.layer] = (before, trace)
        return y


class TreeGDN:
    """A tree batch through one GDN layer: the layer runs once over all nodes, node i from its
    parent's state (``GDNLayer.forward_tree``).

    The root starts from the committed state. Every node's state is recorded
    (:class:`~dflash_ref.models.gdn_layer.GDNTreeStates`) so that
    :meth:`TargetState.commit_path` can keep the state after the accepted path's last node.
    """

    def __init__(self, states: dict, layer: int, record: _BatchRecord, parents):
        self.states, self.layer, self.record, self.parents = states, layer, record, parents

    def run(self, mixer, u):
        """``mixer`` (a GDNLayer) over the tree's nodes u [n, hidden]; returns y [n, hidden]."""
        root = self.states[self.layer] or mixer.initial_state()
        y, node_states = mixer.forward_tree(u, root, self.parents)
        self.record.gdn[self.layer] = node_states
        return y


@dataclass
class Batch:
    """One forward's view of the state (made by :meth:`TargetState.begin_batch`).

    Attributes:
        start: the first position (the committed length before the batch).
        positions: [T] host absolute positions (start + depth for a tree).
        parents: [n] tree parents, or None for a chain.
        kv: attention layer id -> its :class:`~dflash_ref.models.kv_store.KVStore`.
        gdn: GDN layer id -> its :class:`ChainGDN` / :class:`TreeGDN`.
        tap: ``tap(layer, name, x)`` observer of intermediate tensors.
        arrays: the ids, positions (and pager slots) on the backend, one copy per batch, and
            the RoPE tables and masks the layers derive from them
            (:class:`~dflash_ref.models.batch_arrays.BatchArrays`).
    """

    start: int
    positions: np.ndarray
    parents: np.ndarray | None
    kv: dict[int, KVStore]
    gdn: dict[int, object]
    tap: Callable
    record: _BatchRecord
    arrays: BatchArrays


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


class TargetState:
    """Per-sequence state (see the module docstring). Made by ``TargetModel.new_state``.

    Args:
        config: the target's :class:`~dflash_ref.config.TargetConfig`.
        be: the Backend the model runs on.
        capture_width: C * hidden, the width of a captured feature row (0: no capture).
        feature_capacity, feature_window: see :class:`~dflash_ref.models.cache.FeatureBuffer`.
        pager: a :class:`~dflash_ref.kvflash.pager.KVFlashPager`; the full-attention layers then
            keep K/V in its bounded pool (attached and reset here, once per sequence).
    """

    def __init__(self, config, be, capture_width: int = 0, feature_capacity: int | None = None,
                 feature_window: int | None = None, pager=None):
        self.config, self.be = config, be
        self.length = 0
        kinds = config.layer_types
        self.pager = pager
        # Gemma 4 KV-sharing layers keep no K/V: they read their source layer's.
        own_kv = [i for i, t in enumerate(kinds)
                  if t != "linear_attention" and config.kv_source_for(i) is None]
        pooled = [i for i in own_kv if kinds[i] == "full_attention"]
        if pager is not None:
            self._attach(pager, pooled)
        self.pooled_layers = frozenset(pooled if pager is not None else ())
        self.kv: dict[int, KVCache] = {
            i: KVCache(be, config.num_key_value_heads_for(i), config.head_dim_for(i))
            for i in own_kv if i not in self.pooled_layers
        }
        self.gdn: dict[int, object] = {i: None for i, t in enumerate(kinds)
                                       if t == "linear_attention"}
        self.features = (FeatureBuffer(be, capture_width, capacity=feature_capacity,
                                       window=feature_window) if capture_width else None)
        self._last: _BatchRecord | None = None  # the last chain batch (rollback rewinds into it)
        self._pending: _BatchRecord | None = None  # an uncommitted tree verify
        self._tokens = np.zeros(0, dtype=np.int64)  # the committed token ids, positions 0..len-1

    def _attach(self, pager, pooled: list[int]) -> None:
        """Attach the pager to this model's full-attention layers and reset it for a new request.

        KVFlash pools full-attention layers only: sliding-window layers are bounded anyway and
        GDN layers hold a fixed-size state.
        """
        cfg = self.config
        if not pooled:
            raise ConfigError("this target has no full-attention layer to page; run it "
                              "without a pager")
        dims = {(cfg.num_key_value_heads_for(i), cfg.head_dim_for(i)) for i in pooled}
        if len(dims) != 1:
            raise ConfigError(f"KVFlash pools one K/V shape; the full-attention layers "
                              f"use {sorted(dims)}")
        (nkv, d), = dims
        pager.attach(self.be, pooled, nkv, d)
        pager.reset()  # a reused pager must not carry the previous request's chunks

    @property
    def tokens(self) -> np.ndarray:
        """[length] the committed token ids (what a prompt cache keys a state by)."""
        return self._tokens[: self.length].copy()

    @property
    def pending(self) -> bool:
        """True while a tree verify waits for :meth:`commit_path`."""
        return self._pending is not None

    # ------------------------------------------------------------------ one forward batch

    def begin_batch(self, ids, parents=None, tap: Callable | None = None) -> Batch:
        """Open a batch of tokens ``ids`` [T] at positions length.. (a chain), or a tree with
        ``parents`` (node i at length + depth(i)).

        Allocates pager slots for a pooled chain batch before any layer writes (a pooled tree
        keeps its nodes beside the pool until :meth:`commit_path`), and copies ids, positions
        and slots to the backend in one piece (:class:`BatchArrays`).
        """
        if self._pending is not None:
            raise ValueError("the state holds an uncommitted tree verify; call "
                             "state.commit_path(path) first")
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        T, start = ids.size, self.length
        depths = np.arange(T) if parents is None else tree_depths(parents)
        positions = (start + depths).astype(np.int64)  # [T]
        slots = None
        if self.pager is not None and parents is None:
            self.pager.alloc_span(start, T)  # slot_for each new position, evicting if needed
            slots = self.pager.batch_slots(positions)  # [T] host, checked once for all layers
        arrays = BatchArrays(self.be, ids, positions, start, slots, parents)
        record = _BatchRecord(start, T, ids)
        kv = {i: self._kv_store(i, arrays, parents, record)
              for i in (*self.kv, *self.pooled_layers)}
        keep_trace = T <= TRACE_MAX_TOKENS
        gdn = {i: (ChainGDN(self.gdn, i, record, keep_trace) if parents is None
                   else TreeGDN(self.gdn, i, record, parents)) for i in self.gdn}
        return Batch(start, positions, parents, kv, gdn, tap or no_tap, record, arrays)

    def _kv_store(self, layer: int, arrays: BatchArrays, parents, record) -> KVStore:
        if layer in self.pooled_layers and parents is not None:
            return PooledTreeKV(self.pager, layer, arrays, record.pooled)
        if layer in self.pooled_layers:
            return PooledKVStore(self.pager, layer, arrays)
        kind = self.config.layer_types[layer]
        window = self.config.sliding_window if kind == "sliding_attention" else None
        return (CacheKV if parents is None else TreeKV)(self.kv[layer], arrays, window)

    def end_batch(self, batch: Batch, features) -> None:
        """Close a batch: a chain is committed (features appended, length advanced); a tree is
        left pending until :meth:`commit_path`."""
        rec = batch.record
        if batch.parents is not None:
            rec.tree_features = features
            self._pending = rec
            return
        if features is not None:
            self.features.append(batch.start, features)
        self._set_tokens(batch.start, rec.ids)
        self.length = batch.start + rec.length
        self._last = rec

    def _set_tokens(self, start: int, ids) -> None:
        need = start + len(ids)
        if need > self._tokens.size:  # grow by doubling
            grown = np.zeros(max(need, 2 * self._tokens.size, 16), dtype=np.int64)
            grown[: start] = self._tokens[: start]
            self._tokens = grown
        self._tokens[start:need] = ids

    # ------------------------------------------------------------------ commit and rollback

    def commit_path(self, path) -> None:
        """Keep the accepted branch of the pending tree verify.

        ``path`` = node indices root first (node 0 is the root). Afterwards the state holds the
        committed prefix plus the path's nodes at positions start, start+1, ...: KV rows of the
        path, their features, and each GDN layer's state after the path's last node, exactly as
        if the path's tokens had been run as a chain.
        """
        rec = self._pending
        if rec is None:
            raise ValueError("commit_path: no tree verify is pending (call forward_tree first)")
        path = np.asarray(path, dtype=np.int64)
        if path.size == 0 or path[0] != 0 or np.any(path >= rec.length):
            raise ValueError(f"commit_path: path must start at the root 0 and index the "
                             f"{rec.length} tree nodes, got {path.tolist()}")
        start = rec.start
        dev = self.be.to_backend(path)  # [m] node indices: one copy for every layer below
        rows = start + dev  # the path's cache rows
        for cache in self.kv.values():
            cache.keep_rows(start, rows)  # the path's K/V, in path order
        for i, node_states in rec.gdn.items():
            self.gdn[i] = node_states.node(int(path[-1]))
        if rec.pooled:  # the path's rows enter the pool at positions start, start+1, ...
            self.pager.alloc_span(start, path.size)
            slots = self.be.to_backend(  # [m] int32, checked on the host, one copy
                self.pager.batch_slots(start + np.arange(path.size)).astype(np.int32))
            for layer, (k, v) in rec.pooled.items():
                self.pager.write_slots(layer, slots, k[dev], v[dev])
        if self.features is not None:
            self.features.append(start, rec.tree_features[dev])
        self._set_tokens(start, rec.ids[path])
        self.length = start + path.size
        self._pending = None
        self._last = None  # a tree commit cannot be rewound further

    def rollback(self, n_keep: int) -> None:
        """Drop positions >= n_keep from every cache and rewind GDN states to match.

        KV caches and features truncate (pooled layers need nothing: rows at positions >= the
        next batch's start are hidden by its mask). A GDN state cannot be truncated: it is
        rewound from the last batch's trace, so ``n_keep`` must lie within the last batch
        ``[start, start + T]`` unless no GDN layer exists. Rolling back further is an error.
        """
        if self._pending is not None:
            raise ValueError("rollback: a tree verify is pending; call commit_path(path)")
        if not 0 <= n_keep <= self.length:
            raise ValueError(f"rollback({n_keep}): the state holds {self.length} positions")
        if n_keep == self.length:
            return
        if self.gdn:
            self._rewind_gdn(n_keep)
        for cache in self.kv.values():
            cache.truncate(n_keep)
        if self.features is not None:
            self.features.truncate(n_keep)
        self.length = n_keep

    def truncate(self, n_keep: int) -> None:
        """Keep positions < n_keep, as a prompt cache reusing a common prefix does.

        Like :meth:`rollback`, but a GDN state that cannot be rewound there (outside the last
        batch) raises :class:`~dflash_ref.errors.StateError` naming the fix.
        """
        last = self._last
        if self.gdn and n_keep < self.length and (
                last is None or len(last.gdn) != len(self.gdn) or n_keep < last.start):
            raise StateError(
                f"truncate({n_keep}): a GDN state cannot be truncated to an earlier position "
                f"than its last batch; restore a checkpoint snapshot taken at or before "
                f"position {n_keep} instead (models/prompt_cache.py restore_checkpoint)")
        self.rollback(n_keep)

    def _rewind_gdn(self, n_keep: int) -> None:
        last = self._last
        if last is None or not last.start <= n_keep <= last.start + last.length:
            span = "none" if last is None else f"[{last.start}, {last.start + last.length}]"
            raise ValueError(
                f"rollback({n_keep}): GDN layers can only rewind within the last forward "
                f"batch (positions {span}); re-run the prefix from a saved state instead"
            )
        if len(last.gdn) != len(self.gdn):
            raise ValueError(
                f"rollback({n_keep}): the last batch had {last.length} tokens, more than "
                f"TRACE_MAX_TOKENS={TRACE_MAX_TOKENS}, so no GDN trace was kept; run long "
                f"prefills before speculating, or in smaller batches"
            )
        for i, (before, trace) in last.gdn.items():
            self.gdn[i] = rewind_state(before, trace, n_keep - last.start, self.be.xp)

    # ------------------------------------------------------------------ snapshot and restore

    def snapshot(self, upto: int | None = None) -> StateSnapshot:
        """A copy of the state's first ``upto`` positions (default: all committed).

        Attention rows and features can be cut anywhere. A GDN state exists only at the
        committed length or inside the last chain batch (from its trace): a hybrid model's
        ``upto`` must lie there, so a server takes checkpoints while it prefills.
        """
        n = self.length if upto is None else int(upto)
        if self._pending is not None:
            raise StateError("snapshot: a tree verify is pending; call commit_path(path) first")
        if not 0 <= n <= self.length:
            raise StateError(f"snapshot(upto={n}): the state holds {self.length} positions")
        kv = {i: (c.k[:n].copy(), c.v[:n].copy()) for i, c in self.kv.items()}
        if self.pooled_layers and n:
            positions = np.arange(n)
            resident = set(int(c) for c in self.pager.resident_chunks())
            missing = sorted({int(p) // self.pager.chunk_tokens for p in positions} - resident)
            if missing:
                raise StateError(f"snapshot: chunks {missing} of the KVFlash pool are paged out; "
                                 f"snapshot before they are evicted, or page them in first")
            kv.update({i: self.pager.read(i, positions) for i in self.pooled_layers})
        gdn = {i: self._gdn_at(i, n) for i in self.gdn}
        features, start = None, 0
        if self.features is not None:
            start = min(self.features.start, n)
            features = self.features.rows(start, n).copy()
        return StateSnapshot(n, self.tokens[:n], kv, gdn, features, start)

    def _gdn_at(self, layer: int, n: int):
        if n == self.length:
            st = self.gdn[layer]
            return None if st is None else st.copy()
        last = self._last
        rec = None if last is None else last.gdn.get(layer)
        if rec is None or not last.start <= n <= last.start + last.length:
            raise StateError(
                f"snapshot(upto={n}): a GDN state cannot be truncated; it exists at the "
                f"committed length {self.length} and inside the last batch only. Take "
                f"checkpoints while prefilling (snapshot after each prefill piece) instead")
        before, trace = rec
        return rewind_state(before, trace, n - last.start, self.be.xp)

    def restore(self, snap: StateSnapshot) -> None:
        """Make this state hold exactly ``snap`` (any previous content is dropped).

        A state that captures features needs them for every position the drafter will read:
        a snapshot without features, or with fewer rows than the drafter's window needs, is
        refused here rather than drafting from garbage later.
        """
        if self._pending is not None:
            raise StateError("restore: a tree verify is pending; call commit_path(path) first")
        layers = set(self.kv) | set(self.pooled_layers)
        if set(snap.kv) != layers or set(snap.gdn) != set(self.gdn):
            raise StateError("restore: the snapshot was taken from a different model (its "
                             "layers do not match this state's)")
        if self.features is not None and snap.length:
            need_from = max(0, snap.length - (self.features.window or snap.length))
            held = "none" if snap.features is None else f"positions {snap.feature_start}.."
            if snap.features is None or snap.feature_start > need_from:
                raise StateError(
                    f"restore: this state captures features for the drafter, which needs "
                    f"positions {need_from}..{snap.length - 1}, but the snapshot holds {held}; "
                    f"the drafter would read rows that do not exist. Snapshot a state that "
                    f"captured features (same target_layer_ids, no smaller window)")
        for i, cache in self.kv.items():
            cache.truncate(0)
            if snap.length:
                cache.append(*snap.kv[i])
        if self.pooled_layers:
            self._restore_pool(snap)
        for i in self.gdn:
            self.gdn[i] = None if snap.gdn[i] is None else snap.gdn[i].copy()
        if self.features is not None:
            self.features.reset(snap.feature_start)
            if snap.features is not None and snap.length > snap.feature_start:
                self.features.append(snap.feature_start, snap.features)
        self._set_tokens(0, snap.tokens)
        self.length = snap.length
        self._last = None

    def _restore_pool(self, snap: StateSnapshot) -> None:
        """Refill the pager's pool with the snapshot's rows, one chunk-aligned piece at a time."""
        pager, T = self.pager, self.pager.chunk_tokens
        pager.reset()
        for a in range(0, snap.length, T):
            b = min(snap.length, a + T)
            pager.alloc_span(a, b - a)
            for i in self.pooled_layers:
                k, v = snap.kv[i]
                pager.write(i, np.arange(a, b), k[a:b], v[a:b])
