"""What an attention layer sees of the place its keys and values live: one small interface.

A decoder layer does not know whether its K/V sit in a plain cache, in the KVFlash pool, or in a
tree verify's scratch rows. It hands the batch's new keys and values to a **KV store** (the
per-forward view of one layer's storage) and gets back everything its queries attend to, with
the mask that says which key each query may see::

    keys, values, mask = store.update(k, v)      # k, v: [T, Hkv, D] post-norm, post-RoPE
    o = attention(q, keys, values, mask)          # keys, values: [S, Hkv, D]; mask: [T, S]

A view is opened per forward batch by the store that keeps the rows for the whole sequence
(``views(arrays, parents)`` of :class:`~dflash_ref.models.stores.CacheStore` for a plain cache,
of :class:`~dflash_ref.models.stores.PoolStore` for the pool; models/stores.py), which also owns
what happens to the rows afterwards (rollback, tree commit, snapshot, restore). The masks come
from the batch's :class:`~dflash_ref.models.batch_arrays.BatchArrays`, built on the backend once
per batch and window kind, so every layer of a kind attends with the same spec.

======================  ===========================  =========================================
view                    storage                      mask (key at position p, query at q)
======================  ===========================  =========================================
:class:`CacheKV`        KVCache rows 0..S-1          causal ``p <= q``; sliding: ``q - p < W``
:class:`TreeKV`         KVCache + the tree's nodes   committed prefix, then ancestors only
:class:`FixedKV`        fixed rows 0..C-1 (graphs)   causal ``p <= q`` over all C slots
:class:`PooledKVStore`  the pager's slot pool        committed prefix, causal in the batch
:class:`PooledTreeKV`   pool + the nodes, aside      committed slots, then ancestors only
======================  ===========================  =========================================

The sliding inequality is HF's (the window includes the current token; docs/conventions.md).
"""

from __future__ import annotations

from typing import Protocol

from dflash_ref.models.cache import KVCache
from dflash_ref.ops.masks import MaskSpec


class KVStore(Protocol):
    """What an attention layer needs from the place its K/V live (one forward batch)."""

    def update(self, k, v) -> tuple[object, object, MaskSpec]:
        """Store the batch's ``k``, ``v`` [T, Hkv, D]; return ``(keys, values, mask)``.

        ``keys``/``values`` [S, Hkv, D] are every row the batch's T queries may read (committed
        rows and the batch's own); ``mask`` [T, S] says which ones each query sees.
        """
        ...

    def read(self) -> tuple[object, object, MaskSpec]:
        """What the last :meth:`update` of this batch returned (a Gemma 4 KV-sharing layer
        attends over its source layer's K/V with the same mask)."""
        ...


class _Remember:
    """``read()`` returns what ``update`` returned last."""

    last = None

    def read(self):
        if self.last is None:
            raise ValueError("read() before update(): the KV-sharing source layer has not run "
                             "in this batch")
        return self.last


class CacheKV(_Remember):
    """A chain batch over a plain :class:`KVCache`: append, then causal (or sliding) mask.

    Args:
        cache: the layer's cache (rows in position order, positions 0..len-1).
        arrays: the batch's :class:`~dflash_ref.models.batch_arrays.BatchArrays` (positions
            len(cache) .. len(cache)+T-1 on the backend; the mask is built there once per window
            kind and batch, and shared by the layers).
        window: the layer's sliding window W, or None for full attention.
    """

    def __init__(self, cache: KVCache, arrays, window: int | None):
        self.cache, self.arrays, self.window = cache, arrays, window

    def update(self, k, v):
        keys, values = self.cache.append(k, v)
        self.last = keys, values, self.arrays.causal_mask(self.cache.length, self.window)
        return self.last


class TreeKV(_Remember):
    """A tree verify batch over a plain :class:`KVCache`.

    The nodes' K/V are appended after the committed rows in node order; node i (at position
    base + depth(i)) sees the committed prefix and its own ancestors
    (:func:`~dflash_ref.ops.masks.tree_mask`). The rows stay until
    :meth:`~dflash_ref.models.stores.CacheStore.keep_path` keeps the accepted branch.

    Args:
        cache: the layer's cache holding the committed prefix 0..base-1.
        arrays: the batch's BatchArrays (node positions and ancestor rows on the backend).
        window: the layer's sliding window, measured along the branch.
    """

    def __init__(self, cache: KVCache, arrays, window: int | None):
        self.cache, self.arrays, self.window = cache, arrays, window

    def update(self, k, v):
        base = self.cache.length
        keys, values = self.cache.append(k, v)
        self.last = keys, values, self.arrays.tree_mask(base, self.window)
        return self.last


class FixedKV(_Remember):
    """A chain batch over a fixed-capacity store (models/stores.py ``FixedCacheStore``; the
    shape of a CUDA-graph step, models/graphs.py).

    The batch's K/V rows are written at the rows of their device positions (one ``write_kv``:
    K and V in one kernel); the queries read all C rows, slot j holding position j, under the
    causal rule ``j <= q`` (and the window): rows past the queries (never written, or rejected
    drafts of an earlier step) stay hidden, so nothing here reads a host length.

    Args:
        kv: the store's [2, C, Hkv, D] rows (K, then V), updated in place.
        k_pos: [C] the slots' positions 0..C-1 on the backend (made once with the store).
        arrays: the batch's BatchArrays (device positions, checked < C by the store).
        window: the layer's sliding window W, or None for full attention.
    """

    def __init__(self, be, kv, k_pos, arrays, window: int | None):
        self.be, self.kv, self.k_pos, self.arrays, self.window = be, kv, k_pos, arrays, window

    def update(self, k, v):
        self.be.ops.write_kv(self.kv, k, v, rows=self.arrays.positions, checked=True)
        self.last = self.kv[0], self.kv[1], self.arrays.causal_over(self.k_pos, self.window)
        return self.last  # keys, values [C, Hkv, D]: views of the store


class PooledKVStore(_Remember):
    """A chain batch whose K/V live in the KVFlash pager's pool (docs/kvflash.md).

    The batch's rows are written into the slots of their positions first; then every query sees
    the slots whose position p satisfies ``p >= 0 and (p < base or p <= q)`` (base = the batch's
    first position): the committed prefix plus causal within the batch. Slots are in any order,
    and rejected drafts left in slots at p >= base stay hidden, so rollback needs nothing here.

    Args:
        pager: a :class:`~dflash_ref.kvflash.pager.KVFlashPager` attached to the model.
        layer: the model layer id (the pager pools the full-attention layers).
        arrays: the batch's BatchArrays: positions contiguous from base, and the slots the
            pager allocated for them (checked on the host once, one backend copy for every
            layer's write).
    """

    def __init__(self, pager, layer: int, arrays):
        self.pager, self.layer, self.arrays = pager, layer, arrays

    def update(self, k, v):
        self.pager.write_slots(self.layer, self.arrays.slots, k, v)
        keys, values, k_pos = self.pager.kv(self.layer)  # [P, Hkv, D] x2, [P]
        self.last = (keys, values, self.arrays.committed_mask(k_pos))
        return self.last


class PooledTreeKV(_Remember):
    """A tree verify batch over the KVFlash pool: the nodes' K/V stay beside the pool.

    Tree nodes at one depth share a position, so they cannot live in the slots of their
    positions. They are kept aside (in ``nodes``) and appended after the pool's slots for
    attention: node i sees the committed slots (``0 <= p < base``) and the nodes that are itself
    or its ancestors (:func:`~dflash_ref.ops.masks.tree_mask` in slot space, ``node_slots`` after
    the pool). Slots at ``p >= base`` (rejected drafts of an earlier step) stay hidden.
    :meth:`~dflash_ref.models.stores.PoolStore.keep_path` writes the accepted path's rows into
    the pool at positions base, base+1, ...; the others are dropped.

    Args:
        pager: the attached :class:`~dflash_ref.kvflash.pager.KVFlashPager`.
        layer: the model layer id.
        arrays: the batch's BatchArrays (node positions, ancestor rows; base = its start).
        nodes: the pool store's dict layer -> (k, v) [n, Hkv, D], which its keep_path reads.
    """

    def __init__(self, pager, layer: int, arrays, nodes: dict):
        self.pager, self.layer, self.arrays, self.nodes = pager, layer, arrays, nodes

    def update(self, k, v):
        self.nodes[self.layer] = (k, v)
        keys, values, k_pos = self.pager.kv(self.layer)  # [P, Hkv, D] x2, [P]
        xp = self.pager.be.xp
        self.last = (xp.concatenate([keys, k], axis=0), xp.concatenate([values, v], axis=0),
                     self.arrays.tree_mask(k_pos, None))  # [P + n, Hkv, D] x2
        return self.last
