"""Per-sequence state of the target: its stores, the committed tokens, commit and rollback.

:class:`TargetState` is everything a continuation depends on: its stores (models/stores.py),
the captured :class:`~dflash_ref.models.cache.FeatureBuffer`, the committed tokens and length,
a pending tree verify. The model talks to it through two calls::

    batch = state.begin_batch(ids, parents=None) # arrays on the backend once, a view per layer
    ... every layer runs on batch.kv[i] or batch.gdn[i] ...
    state.end_batch(batch, features)             # chain: committed; tree: pending

and runs each forward's step through ``state.runner`` (:class:`EagerRunner` by default). The
loop calls :meth:`TargetState.rollback` (chain) or :meth:`TargetState.commit_path` (tree); each
is the same call on every store. The state never calls into the model's layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dflash_ref.errors import StateError
from dflash_ref.models.batch_arrays import BatchArrays
from dflash_ref.models.cache import FeatureBuffer
from dflash_ref.models.fixed_stores import FixedCacheStore
from dflash_ref.models.gdn_store import GDNStore
from dflash_ref.models.kv_store import KVStore
from dflash_ref.models.pool_store import PoolStore
from dflash_ref.models.snapshot import StateSnapshot, restore_stores, take_snapshot
from dflash_ref.models.stores import CacheStore, Store
from dflash_ref.models.tree import TreeArrays, TreePath
from dflash_ref.models.tree_verify import PendingTree
from dflash_ref.ops.masks import tree_depths


def no_tap(layer: int, name: str, x) -> None:
    """The default observer of intermediate tensors: ignores them (see ``TargetModel.forward``)."""


class EagerRunner:
    """A state's step runner by default: ``run(batch, rows, step)`` is ``step()`` (the target's
    forward); ``draft_cache(drafter)`` an empty draft cache over the state; ``buffers`` where a
    batch's backend arrays are written (None: new arrays per batch)."""

    buffers = None
    lazy_rows = True  # a forward may run its head and later rows when asked (head_rows.py)

    def run(self, batch, rows, step: Callable):
        return step()

    def draft_cache(self, drafter):
        return drafter.new_cache()


@dataclass(frozen=True)
class StorePlan:
    """Where each layer of a target keeps its per-position state, read from its config once
    (:meth:`of`, when the target loads)."""

    caches: tuple[tuple[int, int, int, int | None], ...]  # (layer, Hkv, D, window or None)
    full: tuple[int, ...]  # the full-attention layers among them (a pager pools these)
    gdn: tuple[int, ...]  # the linear-attention (Gated DeltaNet) layers

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
    """``(attention stores, GDN stores)`` of a new state: a ``CacheStore`` per attention layer
    (``FixedCacheStore`` with ``kv_capacity``), the full-attention ones in one ``PoolStore``
    with a ``pager``; a ``GDNStore`` per linear-attention layer."""
    dims = {i: (n_kv, d) for i, n_kv, d, _ in plan.caches}
    pool = [PoolStore(pager, be, list(plan.full), dims)] if pager is not None else []
    in_pool = {i for store in pool for i in store.layers}
    make = CacheStore if kv_capacity is None else FixedCacheStore.with_capacity(kv_capacity)
    plain = [make(be, *c) for c in plan.caches if c[0] not in in_pool]  # c: (i, n_kv, d, window)
    gdn = [GDNStore(be, i) for i in plan.gdn]
    return plain + pool, gdn


@dataclass
class Batch:
    """One forward's view of the state (made by :meth:`TargetState.begin_batch`)."""

    start: int  # the first position (the committed length before the batch)
    positions: np.ndarray  # [T] host absolute positions (start + depth for a tree)
    parents: np.ndarray | None  # [T] tree parents, or None for a chain
    ids: np.ndarray  # [T] host token ids (node order for a tree)
    kv: dict[int, KVStore]  # attention layer id -> its view
    gdn: dict[int, object]  # GDN layer id -> its view (models/gdn_store.py)
    tap: Callable  # tap(layer, name, x): observer of intermediate tensors
    arrays: BatchArrays  # ids, positions, masks on the backend, once per batch


class TargetState:
    """Per-sequence state (module docstring), made by ``TargetModel.new_state``: the stores
    of ``plan`` (:func:`build_stores`), ``features`` (C * hidden = ``capture_width`` wide; None
    without capture), the committed ``length``; ``runner`` :class:`EagerRunner` by default."""

    def __init__(self, plan: StorePlan, be, capture_width: int = 0,
                 feature_capacity: int | None = None, feature_window: int | None = None,
                 pager=None, kv_capacity: int | None = None, runner=None):
        self.be, self.pager = be, pager
        self.runner = EagerRunner() if runner is None else runner
        self.kv_stores, self.gdn_stores = build_stores(plan, be, pager, kv_capacity)
        self.stores: list[Store] = [*self.kv_stores, *self.gdn_stores]
        self._reserving = [s for s in self.stores if s.reserve is not None]
        self._refusing = [s for s in self.stores if s.refusal is not None]
        self.features = (FeatureBuffer(be, capture_width, capacity=feature_capacity,
                                       window=feature_window) if capture_width else None)
        self.length = 0
        self._pending: PendingTree | None = None
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
        """Layer id -> the plain KVCache of each layer that keeps one (for inspection)."""
        return {i: c for store in self.kv_stores for i, c in store.caches().items()}

    @property
    def gdn(self) -> dict:
        """GDN layer id -> its current state (None before any token), for inspection."""
        return {store.layer: store.state for store in self.gdn_stores}

    # ------------------------------------------------------------------ one forward batch

    def begin_batch(self, ids, parents=None, tap: Callable | None = None) -> Batch:
        """Open a batch of tokens ``ids`` [T] at positions length.. (a chain), or a tree with
        ``parents`` (node i at length + depth(i)): the stores reserve room, the arrays go to the
        backend in one piece, each store opens its layers' views."""
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
            self._pending = PendingTree(batch.start, batch.ids, features)
            return
        if features is not None:
            self.features.append(batch.start, features)
        self._tokens[batch.start:] = batch.ids.tolist()
        self.length = batch.start + batch.ids.size

    # ------------------------------------------------------------------ commit and rollback

    def commit_path(self, path) -> None:
        """Keep the accepted branch ``path`` (node indices, root 0 first) of the pending tree
        verify at positions start, start+1, ..., as if its tokens had run as a chain."""
        tree = self._pending
        if tree is None:
            raise ValueError("commit_path: no tree verify is pending (call forward_tree first)")
        path = np.asarray(path, dtype=np.int64)
        tree.check(path)
        kept = TreePath.upload(self.be, tree.start, path)
        for store in self.stores:
            store.keep_path(kept)
        if self.features is not None:
            self.features.keep_path(kept, tree.features)
        self._tokens[tree.start:] = tree.ids[path].tolist()
        self.length = tree.start + path.size
        self._pending = None

    def rollback(self, n_keep: int) -> None:
        """Drop positions >= n_keep from every store and the features. A GDN state is rewound
        from the last batch's trace, so ``n_keep`` must lie within the last batch; further is
        an error, raised before any store changes."""
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
        """Keep positions < n_keep (a prompt cache's common prefix): :meth:`rollback`, but a
        GDN state that cannot be rewound there raises :class:`StateError` naming the fix."""
        if n_keep < self.length and any(s.refusal(n_keep) is not None for s in self._refusing):
            raise StateError(
                f"truncate({n_keep}): a GDN state cannot be truncated to an earlier position "
                f"than its last batch; restore a checkpoint snapshot taken at or before "
                f"position {n_keep} instead (models/prompt_cache.py restore_checkpoint)")
        self.rollback(n_keep)

    # ------------------------------------------------------------------ snapshot and restore

    def snapshot(self, upto: int | None = None) -> StateSnapshot:
        """A copy of the first ``upto`` positions (default: all; models/snapshot.py)."""
        return take_snapshot(self, self.length if upto is None else int(upto))

    def restore(self, snap: StateSnapshot) -> None:
        """Make this state hold exactly ``snap`` (checked: models/snapshot.py)."""
        restore_stores(self, snap)
        self._tokens = np.asarray(snap.tokens, dtype=np.int64).tolist()
        self.length = snap.length
