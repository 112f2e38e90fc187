"""Per-sequence state of the target: its stores, the committed tokens, commit and rollback.

:class:`TargetState` is everything a continuation depends on. The per-position state lives in
stores that own their transitions (models/stores.py): a
:class:`~dflash_ref.models.stores.CacheStore` per attention layer, or one
:class:`~dflash_ref.models.stores.PoolStore` for the full-attention layers a KVFlash pager
pools; a :class:`~dflash_ref.models.gdn_store.GDNStore` per Gated DeltaNet layer; and the
captured :class:`~dflash_ref.models.cache.FeatureBuffer`. The state itself keeps the committed
tokens and length, and a pending tree verify. The model talks to it through two calls::

    batch = state.begin_batch(ids, parents=None) # arrays on the backend once, a view per layer
    ... every layer runs on batch.kv[i] or batch.gdn[i] ...
    state.end_batch(batch, features)             # chain: committed; tree: pending

Every forward's step runs through the state's step runner (``state.runner``, an
:class:`EagerRunner` unless the state was made to replay its steps: models/graphs.py), which
also hands the drafter its draft cache. The loop talks to the state through two calls:
:meth:`TargetState.rollback` (chain verify: keep the accepted rows) and
:meth:`TargetState.commit_path` (tree verify: keep the accepted branch). Each transition is
the same call on every store; which store a layer gets is read from the config once per
model (:class:`StorePlan`) and the stores are built from it (:func:`build_stores`). Snapshot and
restore are in models/snapshot.py. The state never calls into the model's layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dflash_ref.errors import StateError
from dflash_ref.models.batch_arrays import BatchArrays
from dflash_ref.models.cache import FeatureBuffer
from dflash_ref.models.gdn_store import GDNStore
from dflash_ref.models.kv_store import KVStore
from dflash_ref.models.snapshot import StateSnapshot, restore_stores, take_snapshot
from dflash_ref.models.stores import CacheStore, FixedCacheStore, PoolStore, Store
from dflash_ref.models.tree import TreeArrays, TreePath
from dflash_ref.ops.masks import tree_depths


def no_tap(layer: int, name: str, x) -> None:
    """The default observer of intermediate tensors: ignores them (see ``TargetModel.forward``)."""


class EagerRunner:
    """A state's step runner by default: every step runs as it comes. A runner (models/graphs.py
    has the other) is asked for ``run(batch, rows, step)``, ``step()``'s result (the target's
    forward of ``batch`` computing the logits ``rows``); ``draft_cache(drafter)``, an empty draft
    cache for drafting over the state; ``buffers``, where a batch's backend arrays are written
    (:class:`~dflash_ref.models.batch_arrays.BatchArrays`; None: new arrays per batch)."""

    buffers = None

    def run(self, batch, rows, step: Callable):
        return step()

    def draft_cache(self, drafter):
        return drafter.new_cache()


@dataclass(frozen=True)
class StorePlan:
    """Where each layer of a target keeps its per-position state, read from its config once.

    :class:`~dflash_ref.models.target.TargetModel` makes it when it loads (:meth:`of`); every
    new state builds its stores from it (:func:`build_stores`) and asks the config nothing.

    Attributes:
        caches: ``(layer, n_kv_heads, head_dim, window)`` of every attention layer that keeps
            its own K/V (Gemma 4 KV-sharing layers read their source layer's); ``window`` is the
            sliding window, None for full attention.
        full: the full-attention layers among them (the ones a KVFlash pager pools).
        gdn: the linear-attention (Gated DeltaNet) layers.
    """

    caches: tuple[tuple[int, int, int, int | None], ...]
    full: tuple[int, ...]
    gdn: tuple[int, ...]

    @classmethod
    def of(cls, config) -> StorePlan:
        """The plan of a :class:`~dflash_ref.config.TargetConfig`."""
        kinds = config.layer_types
        own_kv = [i for i, t in enumerate(kinds)
                  if t != "linear_attention" and config.kv_source_for(i) is None]
        caches = tuple((i, config.num_key_value_heads_for(i), config.head_dim_for(i),
                        config.sliding_window if kinds[i] == "sliding_attention" else None)
                       for i in own_kv)
        return cls(caches, tuple(i for i in own_kv if kinds[i] == "full_attention"),
                   tuple(i for i, t in enumerate(kinds) if t == "linear_attention"))


def build_stores(plan: StorePlan, be, pager=None, kv_capacity=None) -> tuple[list, list]:
    """The stores of a new state: ``(attention stores, GDN stores)``.

    Every attention layer of ``plan.caches`` gets a :class:`CacheStore` (a ``FixedCacheStore``
    of ``kv_capacity`` rows if given); with a ``pager``, the full-attention ones share one
    :class:`PoolStore` instead (sliding-window layers are bounded anyway and GDN layers hold a
    fixed-size state). Each linear-attention layer gets a :class:`GDNStore`.
    """
    dims = {i: (n_kv, d) for i, n_kv, d, _ in plan.caches}
    pool = [PoolStore(pager, be, list(plan.full), dims)] if pager is not None else []
    in_pool = {i for store in pool for i in store.layers}
    make = CacheStore if kv_capacity is None else FixedCacheStore.with_capacity(kv_capacity)
    plain = [make(be, *c) for c in plan.caches if c[0] not in in_pool]  # c: (i, n_kv, d, window)
    gdn = [GDNStore(be, i) for i in plan.gdn]
    return plain + pool, gdn


@dataclass
class Batch:
    """One forward's view of the state (made by :meth:`TargetState.begin_batch`).

    Attributes:
        start: the first position (the committed length before the batch).
        positions: [T] host absolute positions (start + depth for a tree).
        parents: [n] tree parents, or None for a chain.
        ids: [T] host token ids (node order for a tree).
        kv: attention layer id -> its :class:`~dflash_ref.models.kv_store.KVStore`.
        gdn: GDN layer id -> its ``ChainGDN`` / ``TreeGDN`` view (models/gdn_store.py).
        tap: ``tap(layer, name, x)`` observer of intermediate tensors.
        arrays: the ids, positions (and pager slots) on the backend, one copy per batch, and the
            masks derived there (:class:`~dflash_ref.models.batch_arrays.BatchArrays`).
    """

    start: int
    positions: np.ndarray
    parents: np.ndarray | None
    ids: np.ndarray
    kv: dict[int, KVStore]
    gdn: dict[int, object]
    tap: Callable
    arrays: BatchArrays


@dataclass
class _PendingTree:
    """A tree verify waiting for :meth:`TargetState.commit_path`: its span and node features."""

    start: int
    ids: np.ndarray  # [n] node tokens
    features: object  # [n, C*H] every node's features, or None without capture


class TargetState:
    """Per-sequence state (see the module docstring). Made by ``TargetModel.new_state``.

    Args:
        plan: the target's :class:`StorePlan` (which store each layer gets).
        be: the Backend the model runs on.
        capture_width: C * hidden, the width of a captured feature row (0: no capture).
        feature_capacity, feature_window: see :class:`~dflash_ref.models.cache.FeatureBuffer`.
        pager: a :class:`~dflash_ref.kvflash.pager.KVFlashPager`; the full-attention layers then
            keep K/V in its bounded pool (attached and reset here, once per sequence).
        kv_capacity: K/V in that many fixed rows (``TargetModel.new_state``).
        runner: the step runner (:class:`EagerRunner` when None; ``TargetModel.new_state``).

    Attributes:
        kv_stores, gdn_stores: the attention stores and the GDN stores (:func:`build_stores`).
        stores: every store: the attention stores, then the GDN stores.
        runner: the step runner every forward of the state runs its step through.
        features: the captured :class:`~dflash_ref.models.cache.FeatureBuffer`, or None.
        length: the committed positions.
    """

    def __init__(self, plan: StorePlan, be, capture_width: int = 0,
                 feature_capacity: int | None = None, feature_window: int | None = None,
                 pager=None, kv_capacity: int | None = None, runner=None):
        self.be, self.pager = be, pager
        self.runner = EagerRunner() if runner is None else runner
        self.kv_stores, self.gdn_stores = build_stores(plan, be, pager, kv_capacity)
        self.stores: list[Store] = [*self.kv_stores, *self.gdn_stores]
        # the optional transitions (models/stores.py, Store), asked of the stores that have them
        self._reserving = [s for s in self.stores if s.reserve is not None]
        self._refusing = [s for s in self.stores if s.refusal is not None]
        self.features = (FeatureBuffer(be, capture_width, capacity=feature_capacity,
                                       window=feature_window) if capture_width else None)
        self.length = 0
        self._pending: _PendingTree | None = None
        self._tokens: list[int] = []  # the token ids at positions 0..; those past length are stale

    @property
    def tokens(self) -> np.ndarray:
        """[length] the committed token ids (what a prompt cache keys a state by)."""
        return np.array(self._tokens[: self.length], dtype=np.int64)

    @property
    def pending(self) -> bool:
        """True while a tree verify waits for :meth:`commit_path`."""
        return self._pending is not None

    @property
    def kv(self) -> dict:
        """Layer id -> the plain :class:`~dflash_ref.models.cache.KVCache` of each layer that
        keeps one, for inspection (pooled layers' rows are in ``pager``)."""
        return {i: c for store in self.kv_stores for i, c in store.caches().items()}

    @property
    def gdn(self) -> dict:
        """GDN layer id -> its current state (None before any token), for inspection."""
        return {store.layer: store.state for store in self.gdn_stores}

    # ------------------------------------------------------------------ one forward batch

    def begin_batch(self, ids, parents=None, tap: Callable | None = None) -> Batch:
        """Open a batch of tokens ``ids`` [T] at positions length.. (a chain), or a tree with
        ``parents`` (node i at length + depth(i)).

        The stores that reserve first make room for the batch (the pool allocates a chain's
        slots before any layer writes), then ids, positions and whatever the stores ask for go
        to the backend in one piece (:class:`BatchArrays`) and each store opens its layers'
        views on it.
        """
        if self._pending is not None:
            raise ValueError("the state holds an uncommitted tree verify; call "
                             "state.commit_path(path) first")
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        T, start = ids.size, self.length
        depths = np.arange(T) if parents is None else tree_depths(parents)
        positions = (start + depths).astype(np.int64)  # [T]
        uploads = {"buffers": self.runner.buffers}
        for store in self._reserving:
            uploads.update(store.reserve(start, T, parents))
        arrays = (BatchArrays if parents is None else TreeArrays)(self.be, ids, positions, start,
                                                                  parents=parents, **uploads)
        kv = {i: v for store in self.kv_stores for i, v in store.views(arrays, parents).items()}
        gdn = {i: v for store in self.gdn_stores for i, v in store.views(arrays, parents).items()}
        return Batch(start, positions, parents, ids, kv, gdn, tap or no_tap, arrays)

    def end_batch(self, batch: Batch, features) -> None:
        """Close a batch: a chain is committed (features appended, length advanced); a tree is
        left pending until :meth:`commit_path`."""
        if batch.parents is not None:
            self._pending = _PendingTree(batch.start, batch.ids, features)
            return
        if features is not None:
            self.features.append(batch.start, features)
        self._tokens[batch.start:] = batch.ids.tolist()
        self.length = batch.start + batch.ids.size

    # ------------------------------------------------------------------ commit and rollback

    def commit_path(self, path) -> None:
        """Keep the accepted branch of the pending tree verify.

        ``path`` = node indices root first (node 0 is the root). Afterwards the state holds the
        committed prefix plus the path's nodes at positions start, start+1, ...: KV rows of the
        path, their features, and each GDN layer's state after the path's last node, exactly as
        if the path's tokens had been run as a chain.
        """
        tree = self._pending
        if tree is None:
            raise ValueError("commit_path: no tree verify is pending (call forward_tree first)")
        path = np.asarray(path, dtype=np.int64)
        n = tree.ids.size
        if path.size == 0 or path[0] != 0 or np.any(path >= n):
            raise ValueError(f"commit_path: path must start at the root 0 and index the "
                             f"{n} tree nodes, got {path.tolist()}")
        kept = TreePath.upload(self.be, tree.start, path)
        for store in self.stores:
            store.keep_path(kept)
        if self.features is not None:
            self.features.keep_path(kept, tree.features)
        self._tokens[tree.start:] = tree.ids[path].tolist()
        self.length = tree.start + path.size
        self._pending = None

    def rollback(self, n_keep: int) -> None:
        """Drop positions >= n_keep from every store and the features.

        Attention rows and features truncate; a GDN state cannot be truncated: it is rewound
        from the last batch's trace, so ``n_keep`` must lie within the last batch
        ``[start, start + T]`` unless no GDN layer exists. Rolling back further is an error,
        raised before any store changes.
        """
        if self._pending is not None:
            raise ValueError("rollback: a tree verify is pending; call commit_path(path)")
        if not 0 <= n_keep <= self.length:
            raise ValueError(f"rollback({n_keep}): the state holds {self.length} positions")
        if n_keep == self.length:
            return
        for store in self._refusing:
            why = store.refusal(n_keep)
            if why is not None:
                raise ValueError(f"rollback({n_keep}): {why}")
        for store in self.stores:
            store.truncate(n_keep)
        if self.features is not None:
            self.features.truncate(n_keep)
        self.length = n_keep

    def truncate(self, n_keep: int) -> None:
        """Keep positions < n_keep, as a prompt cache reusing a common prefix does.

        Like :meth:`rollback`, but a GDN state that cannot be rewound there (outside the last
        batch) raises :class:`~dflash_ref.errors.StateError` naming the fix.
        """
        if n_keep < self.length and any(s.refusal(n_keep) is not None for s in self._refusing):
            raise StateError(
                f"truncate({n_keep}): a GDN state cannot be truncated to an earlier position "
                f"than its last batch; restore a checkpoint snapshot taken at or before "
                f"position {n_keep} instead (models/prompt_cache.py restore_checkpoint)")
        self.rollback(n_keep)

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
        return take_snapshot(self, n)

    def restore(self, snap: StateSnapshot) -> None:
        """Make this state hold exactly ``snap`` (any previous content is dropped).

        A state that captures features needs them for every position the drafter will read:
        a snapshot without features, or with fewer rows than the drafter's window needs, is
        refused here rather than drafting from garbage later
        (:func:`~dflash_ref.models.snapshot.restore_stores`).
        """
        if self._pending is not None:
            raise StateError("restore: a tree verify is pending; call commit_path(path) first")
        restore_stores(self, snap)
        self._tokens = np.asarray(snap.tokens, dtype=np.int64).tolist()
        self.length = snap.length
