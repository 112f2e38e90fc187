"""Where a target state keeps its per-position state, and the transitions each place owns.

A :class:`~dflash_ref.models.state.TargetState` holds a few **stores** for the whole sequence
and asks every one of them the same things (HF's ``Cache.update`` / ``crop`` is the model: the
storage decides how it appends and cuts, the caller only says what)::

    reserve(start, n, parents)  make room for a batch of n rows at positions start..; returns
                                host arrays for the batch's one upload (the pool's slots)
    views(arrays, parents)      layer id -> the per-forward view a layer runs on
                                (``batch.kv[i].update(k, v)``, ``batch.gdn[i].run(mixer, u)``)
    refusal(n)                  why it cannot go back to n positions, or None
    truncate(n)                 keep positions < n (rollback of rejected drafts)
    keep_path(path)             keep a tree verify's accepted branch at start, start+1, ...
    snapshot(n)                 layer id -> a copy of positions < n
    restore(length, pieces)     hold exactly a snapshot's positions 0..length-1

store               what it holds                                  views it opens per forward
------------------  ---------------------------------------------  --------------------------
:class:`CacheStore` one attention layer's K/V, in a KVCache        CacheKV (chain), TreeKV
``FixedCacheStore`` the same in C fixed rows (for CUDA graphs)     FixedKV (chains only)
:class:`PoolStore`  the K/V of every full-attention layer, in a    PooledKVStore, PooledTreeKV
                    KVFlash pager's pool (one allocation for all)
``GDNStore``        one Gated DeltaNet layer's state, the last     ChainGDN, TreeGDN
                    chain batch's trace, a tree's node states
                    (models/gdn_store.py)

The captured features (:class:`~dflash_ref.models.cache.FeatureBuffer`) go through the same
transitions (``truncate``, ``keep_path``, ``snapshot``, ``restore``), with the rows passed in.
Which store a layer gets is read from the config once per model
(:class:`~dflash_ref.models.state.StorePlan`) and the stores are built from it with the state
(:func:`~dflash_ref.models.state.build_stores`); the views are in models/kv_store.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from dflash_ref.errors import ConfigError, StateError
from dflash_ref.models.batch_arrays import BatchArrays
from dflash_ref.models.cache import KVCache
from dflash_ref.models.kv_store import (
    CacheKV,
    FixedKV,
    KVStore,
    PooledKVStore,
    PooledTreeKV,
    TreeKV,
)
from dflash_ref.models.tree import TreePath


class Store(ABC):
    """The transitions of a store (module docstring). ``layers``: the model layer ids it holds.

    Two transitions are optional, None on a store that never needs them, and the state calls
    each only on the stores that have it (a list it makes once, when it is built):

    - ``reserve(start, n, parents) -> dict``: make room for a batch of ``n`` rows at positions
      ``start``.. (``parents``: [n] tree parents, or None for a chain) and return host arrays to
      upload with the batch, by :class:`~dflash_ref.models.batch_arrays.BatchArrays` keyword
      (:meth:`PoolStore.reserve`); None: the store makes room as its layers write;
    - ``refusal(n) -> str | None``: why the store cannot go back to ``n`` committed positions,
      or None when it can (:meth:`~dflash_ref.models.gdn_store.GDNStore.refusal`); None: it can
      always go back.
    """

    layers: tuple[int, ...] = ()
    reserve = None
    refusal = None

    @abstractmethod
    def views(self, arrays: BatchArrays, parents) -> dict:
        """Layer id -> the view its layer runs this batch on."""

    @abstractmethod
    def truncate(self, n: int) -> None:
        """Keep positions < n (where the store has a ``refusal``, ``refusal(n)`` is None)."""

    @abstractmethod
    def keep_path(self, path: TreePath) -> None:
        """Keep the accepted branch of the pending tree verify; drop the other nodes."""

    @abstractmethod
    def snapshot(self, n: int) -> dict:
        """Layer id -> a copy of what positions < n left in this store."""

    @abstractmethod
    def restore(self, length: int, pieces: dict) -> None:
        """Hold exactly ``pieces[layer]`` (what :meth:`snapshot` made) for positions < length."""

    def caches(self) -> dict[int, KVCache]:
        """Layer id -> the plain KVCache it keeps (for inspection); none by default."""
        return {}


class CacheStore(Store):
    """One attention layer's K/V in a plain :class:`KVCache` (rows in position order).

    Args:
        be: the Backend.
        layer: the model layer id.
        n_kv_heads, head_dim: the layer's K/V shape.
        window: the layer's sliding window W, or None for full attention.
    """

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


class FixedCacheStore(Store):
    """One attention layer's K/V in ``capacity`` rows allocated once: row p holds position p.

    The store of a state made for CUDA graphs (models/graphs.py): nothing it does inside a
    forward depends on the length, so a step over it replays. Rollback moves no data (the next
    batch overwrites the rows it needs; rows past its queries are hidden by the causal rule).
    Chain batches only: a tree verify needs the growing :class:`CacheStore`.

    Args:
        be: the Backend.
        layer: the model layer id.
        n_kv_heads, head_dim: the layer's K/V shape.
        window: the layer's sliding window W, or None for full attention.
        capacity: C, the positions the store can hold (0..C-1).
    """

    def __init__(self, be, layer: int, n_kv_heads: int, head_dim: int, window: int | None,
                 capacity: int):
        if int(capacity) != capacity or capacity < 1:
            raise ConfigError(f"kv_capacity must be a positive int (the positions the state "
                              f"will hold), got {capacity!r}")
        xp = be.xp
        self.be, self.layers, self.window, self.capacity = be, (layer,), window, int(capacity)
        self.kv = xp.zeros((2, self.capacity, n_kv_heads, head_dim), dtype=xp.float32)
        self.k_pos = xp.arange(self.capacity, dtype=xp.int32)  # [C] slot j holds position j

    @classmethod
    def with_capacity(cls, capacity: int):
        """A maker of stores like :class:`CacheStore`'s constructor, of ``capacity`` rows."""
        return lambda be, layer, n_kv_heads, head_dim, window: cls(
            be, layer, n_kv_heads, head_dim, window, capacity)

    def reserve(self, start: int, n: int, parents) -> dict:
        """Check that positions start..start+n-1 fit; nothing to upload."""
        if parents is not None:
            raise StateError("a state made with kv_capacity (fixed K/V rows, each step's shape "
                             "fixed) runs chain batches only; make the state without "
                             "kv_capacity to verify a tree")
        if start + n > self.capacity:
            raise StateError(f"the batch needs positions {start}..{start + n - 1}, but the state "
                             f"was made with kv_capacity={self.capacity} (positions 0.."
                             f"{self.capacity - 1}); make it with a larger kv_capacity")
        return {}

    def views(self, arrays, parents) -> dict[int, KVStore]:
        return {self.layers[0]: FixedKV(self.be, self.kv, self.k_pos, arrays, self.window)}

    def truncate(self, n: int) -> None:
        """Nothing to move (class docstring)."""

    def keep_path(self, path: TreePath) -> None:
        raise StateError("a fixed-capacity store holds no tree verify")  # reserve refused it

    def snapshot(self, n: int) -> dict:
        """Layer id -> (k, v) [n, Hkv, D], copies of rows 0..n-1."""
        return {self.layers[0]: (self.kv[0, :n].copy(), self.kv[1, :n].copy())}

    def restore(self, length: int, pieces: dict) -> None:
        if length > self.capacity:
            raise StateError(f"restore: the snapshot holds {length} positions, more than this "
                             f"state's kv_capacity={self.capacity}; make it with a larger one")
        if length:
            k, v = pieces[self.layers[0]]
            self.kv[0, :length], self.kv[1, :length] = k, v


class PoolStore(Store):
    """The K/V of the full-attention layers in a KVFlash pager's bounded pool (docs/kvflash.md).

    One store for all the pooled layers: the pool is one array ``[L, 2, P, H, D]`` and a
    position's slot is allocated once for every layer. Built once per sequence, it attaches the
    pager to the layers and resets it (a reused pager must not carry the last request's chunks).

    Rollback needs nothing here: rows at positions >= the next batch's start are hidden by that
    batch's mask. A tree verify's nodes wait beside the pool (``PooledTreeKV``) until
    :meth:`keep_path` writes the accepted ones at their positions.

    Args:
        pager: a :class:`~dflash_ref.kvflash.pager.KVFlashPager`.
        be: the Backend the model runs on.
        layers: the full-attention layer ids (they must share one K/V shape).
        dims: layer id -> (n_kv_heads, head_dim).
    """

    def __init__(self, pager, be, layers: list[int], dims: dict):
        if not layers:
            raise ConfigError("this target has no full-attention layer to page; run it "
                              "without a pager")
        shapes = {dims[i] for i in layers}
        if len(shapes) != 1:
            raise ConfigError(f"KVFlash pools one K/V shape; the full-attention layers "
                              f"use {sorted(shapes)}")
        (nkv, d), = shapes
        pager.attach(be, layers, nkv, d)
        pager.reset()  # a reused pager must not carry the previous request's chunks
        self.pager, self.be, self.layers = pager, be, tuple(layers)
        self.nodes: dict = {}  # layer -> (k, v) [n, Hkv, D] of a pending tree's nodes

    def reserve(self, start: int, n: int, parents) -> dict:
        """A chain's slots, allocated before any layer writes (evicting if needed) and checked
        on the host once for all layers; a tree allocates nothing until :meth:`keep_path`."""
        if parents is not None:
            return {}
        self.pager.alloc_span(start, n)  # slot_for each new position
        return {"slots": self.pager.batch_slots(start + np.arange(n))}  # [n] host

    def views(self, arrays, parents) -> dict[int, KVStore]:
        if parents is None:
            return {i: PooledKVStore(self.pager, i, arrays) for i in self.layers}
        self.nodes = {}
        return {i: PooledTreeKV(self.pager, i, arrays, self.nodes) for i in self.layers}

    def truncate(self, n: int) -> None:
        """Nothing to do (class docstring)."""

    def keep_path(self, path: TreePath) -> None:
        """The path's rows enter the pool at positions start, start+1, ..."""
        if not self.nodes:
            return
        m = path.nodes.size
        self.pager.alloc_span(path.start, m)
        slots = self.be.to_backend(  # [m] int32, checked on the host, one copy
            self.pager.batch_slots(path.start + np.arange(m)).astype(np.int32))
        for layer, (k, v) in self.nodes.items():
            self.pager.write_slots(layer, slots, k[path.dev], v[path.dev])
        self.nodes = {}

    def snapshot(self, n: int) -> dict:
        """Layer id -> (k, v) [n, Hkv, D] gathered by position (a snapshot does not depend on
        slot order); every chunk of positions < n must be resident."""
        positions = np.arange(n)
        resident = set(int(c) for c in self.pager.resident_chunks())
        missing = sorted({int(p) // self.pager.chunk_tokens for p in positions} - resident)
        if missing:
            raise StateError(f"snapshot: chunks {missing} of the KVFlash pool are paged out; "
                             f"snapshot before they are evicted, or page them in first")
        return {i: self.pager.read(i, positions) for i in self.layers}

    def restore(self, length: int, pieces: dict) -> None:
        """Refill the pool with the snapshot's rows, one chunk-aligned piece at a time."""
        pager, T = self.pager, self.pager.chunk_tokens
        pager.reset()
        for a in range(0, length, T):
            b = min(length, a + T)
            pager.alloc_span(a, b - a)
            for i in self.layers:
                k, v = pieces[i]
                pager.write(i, np.arange(a, b), k[a:b], v[a:b])
