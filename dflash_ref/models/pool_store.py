"""The K/V of the full-attention layers in a KVFlash pager's bounded pool (docs/kvflash.md).

:class:`PoolStore` is the store (models/stores.py has the interface) a state gets with a pager;
it opens one view per pooled layer and forward: :class:`PooledKVStore` for a chain,
:class:`PooledTreeKV` for a tree verify.

============================  ==============================================================
view                          mask (key at position p, query at q, base = the batch's start)
============================  ==============================================================
:class:`PooledKVStore`        ``p >= 0 and (p < base or p <= q)``: committed, causal in batch
:class:`PooledTreeKV`         committed slots, then the node's ancestors (slot-space tree mask)
============================  ==============================================================

Slots are in any order; rows at ``p >= base`` (rejected drafts) stay hidden, so rollback needs
nothing here.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.errors import ConfigError, StateError
from dflash_ref.models.kv_store import KVStore, Remember
from dflash_ref.models.stores import Store
from dflash_ref.models.tree import TreePath


class PoolStore(Store):
    """The pooled layers' K/V: one array ``[L, 2, P, H, D]``, a position's slot allocated once
    for every layer. Built once per sequence, it attaches the pager and resets it (a reused
    pager must not carry the last request's chunks). A tree verify's nodes wait beside the pool
    (``nodes``) until :meth:`keep_path` writes the accepted ones at their positions.

    Args:
        pager: a :class:`~dflash_ref.kvflash.pager.KVFlashPager`.
        be: the Backend.
        layers: the full-attention layer ids (one K/V shape).
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
        """A chain's slots, allocated before any layer writes and checked on the host once for
        all layers; a tree allocates nothing until :meth:`keep_path`."""
        if parents is not None:
            return {}
        self.pager.alloc_span(start, n)
        return {"slots": self.pager.batch_slots(start + np.arange(n))}  # [n] host

    def views(self, arrays, parents) -> dict[int, KVStore]:
        if parents is None:
            return {i: PooledKVStore(self.pager, i, arrays) for i in self.layers}
        self.nodes = {}
        return {i: PooledTreeKV(self.pager, i, arrays, self.nodes) for i in self.layers}

    def truncate(self, n: int) -> None:
        """Nothing to do (module docstring)."""

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
        """Layer id -> (k, v) [n, Hkv, D] gathered by position; every chunk of positions < n
        must be resident."""
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


class PooledKVStore(Remember):
    """A chain batch in the pool: the rows go to the slots the pager allocated
    (``arrays.slots``), then every query reads the whole pool under the committed mask."""

    def __init__(self, pager, layer: int, arrays):
        self.pager, self.layer, self.arrays = pager, layer, arrays

    def update(self, k, v):
        self.pager.write_slots(self.layer, self.arrays.slots, k, v)
        keys, values, k_pos = self.pager.kv(self.layer)  # [P, Hkv, D] x2, [P]
        self.last = (keys, values, self.arrays.committed_mask(k_pos))
        return self.last


class PooledTreeKV(Remember):
    """A tree verify over the pool: nodes at one depth share a position, so their K/V wait in
    ``nodes`` (the store's dict) and are attended after the pool's slots, ``[P + n, Hkv, D]``."""

    def __init__(self, pager, layer: int, arrays, nodes: dict):
        self.pager, self.layer, self.arrays, self.nodes = pager, layer, arrays, nodes

    def update(self, k, v):
        self.nodes[self.layer] = (k, v)
        keys, values, k_pos = self.pager.kv(self.layer)  # [P, Hkv, D] x2, [P]
        xp = self.pager.be.xp
        self.last = (xp.concatenate([keys, k], axis=0), xp.concatenate([values, v], axis=0),
                     self.arrays.tree_mask(k_pos, None))  # [P + n, Hkv, D] x2
        return self.last
