"""Where a target state keeps its per-position state, and the transitions each place owns.

A :class:`~dflash_ref.models.state.TargetState` asks each of its stores the same things::

    reserve(start, n, parents)  make room for a batch of n rows at positions start..; returns
                                host arrays for the batch's one upload (optional)
    views(arrays, parents)      layer id -> the per-forward view a layer runs on (a KVStore)
    refusal(n)                  why it cannot go back to n positions, or None (optional)
    truncate(n)                 keep positions < n (rollback of rejected drafts)
    keep_path(path)             keep a tree verify's accepted branch at start, start+1, ...
    snapshot(n)                 layer id -> a copy of positions < n
    restore(length, pieces)     hold exactly a snapshot's positions 0..length-1

Here :class:`CacheStore`; the others: gdn_store.py, pool_store.py, fixed_stores.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from dflash_ref.models.batch_arrays import BatchArrays
from dflash_ref.models.cache import KVCache
from dflash_ref.models.kv_store import CacheKV, KVStore
from dflash_ref.models.tree import TreePath
from dflash_ref.models.tree_verify import TreeKV


class Store(ABC):
    """The transitions of a store (module docstring); ``layers``: the model layer ids it holds.
    ``reserve`` and ``refusal`` are None on a store that never needs them."""

    layers: tuple[int, ...] = ()
    reserve = None
    refusal = None

    @abstractmethod
    def views(self, arrays: BatchArrays, parents) -> dict: ...

    @abstractmethod
    def truncate(self, n: int) -> None: ...

    @abstractmethod
    def keep_path(self, path: TreePath) -> None: ...

    @abstractmethod
    def snapshot(self, n: int) -> dict: ...

    @abstractmethod
    def restore(self, length: int, pieces: dict) -> None: ...

    def caches(self) -> dict[int, KVCache]:
        """Layer id -> the plain KVCache it keeps (for inspection); none by default."""
        return {}


class CacheStore(Store):
    """One attention layer's K/V [n, n_kv_heads, head_dim] in a :class:`KVCache`, rows in
    position order; ``window``: the sliding window W, or None."""

    def __init__(self, be, layer: int, n_kv_heads: int, head_dim: int, window: int | None):
        self.layers, self.window = (layer,), window
        self.cache = KVCache(be, n_kv_heads, head_dim)

    def views(self, arrays, parents) -> dict[int, KVStore]:
        view = (CacheKV if parents is None else TreeKV)(self.cache, arrays, self.window)
        return {self.layers[0]: view}

    def truncate(self, n: int) -> None:
        self.cache.truncate(n)

    def keep_path(self, path: TreePath) -> None:
        self.cache.keep_rows(path.start, path.rows)  # the path's K/V, in path order

    def snapshot(self, n: int) -> dict:
        """Layer id -> (k, v) [n, Hkv, D], copies of rows 0..n-1."""
        return {self.layers[0]: (self.cache.k[:n].copy(), self.cache.v[:n].copy())}

    def restore(self, length: int, pieces: dict) -> None:
        self.cache.truncate(0)
        if length:
            self.cache.append(*pieces[self.layers[0]])

    def caches(self) -> dict[int, KVCache]:
        return {self.layers[0]: self.cache}
