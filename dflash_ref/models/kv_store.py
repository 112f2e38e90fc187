"""Where an attention layer's keys and values live: one small interface, three stores.

A decoder layer does not know whether its K/V sit in a plain cache, in the KVFlash pool, or in a
tree verify's scratch rows. It hands the batch's new keys and values to a **KV store** and gets
back everything its queries attend to, with the mask that says which key each query may see::

    keys, values, mask = store.update(k, v)      # k, v: [T, Hkv, D] post-norm, post-RoPE
    o = attention(q, keys, values, mask)          # keys, values: [S, Hkv, D]; mask: [T, S]

The store is made per forward batch by :meth:`~dflash_ref.models.state.TargetState.begin_batch`,
which knows the batch's positions (and tree shape); storage and the mask rule are the store's.

======================  ===========================  =========================================
store                   storage                      mask (key at position p, query at q)
======================  ===========================  =========================================
:class:`CacheKV`        KVCache rows 0..S-1          causal ``p <= q``; sliding: ``q - p < W``
:class:`TreeKV`         KVCache + the tree's nodes   committed prefix, then ancestors only
:class:`PooledKVStore`  the pager's slot pool        committed prefix, causal in the batch
:class:`PooledTreeKV`   pool + the nodes, aside      committed slots, then ancestors only
======================  ===========================  =========================================

The sliding inequality is HF's (the window includes the current token; docs/conventions.md).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from dflash_ref.models.cache import KVCache
from dflash_ref.ops.masks import (
    MaskSpec,
    causal_mask,
    committed_prefix_mask,
    tree_depths,
    tree_mask,
)


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
        positions: [T] absolute positions of the batch (len(cache) .. len(cache)+T-1).
        window: the layer's sliding window W, or None for full attention.
    """

    def __init__(self, cache: KVCache, positions, window: int | None):
        self.cache, self.positions, self.window = cache, positions, window

    def update(self, k, v):
        self.cache.append(k, v)
        mask = causal_mask(self.positions, np.arange(self.cache.length), window=self.window)
        self.last = (self.cache.k, self.cache.v, mask)
        return self.last


class TreeKV(_Remember):
    """A tree verify batch over a plain :class:`KVCache`.

    The nodes' K/V are appended after the committed rows in node order; node i (at position
    base + depth(i)) sees the committed prefix and its own ancestors
    (:func:`~dflash_ref.ops.masks.tree_mask`). The rows stay until
    :meth:`~dflash_ref.models.state.TargetState.commit_path` keeps the accepted branch.

    Args:
        cache: the layer's cache holding the committed prefix 0..base-1.
        parents: [n] parent node of each node, -1 for the root.
        window: the layer's sliding window, measured along the branch.
    """

    def __init__(self, cache: KVCache, parents, window: int | None):
        self.cache, self.parents, self.window = cache, parents, window

    def update(self, k, v):
        base = self.cache.length
        self.cache.append(k, v)
        self.last = (self.cache.k, self.cache.v, tree_mask(self.parents, base,
                                                           window=self.window))
        return self.last


class PooledKVStore(_Remember):
    """A chain batch whose K/V live in the KVFlash pager's pool (docs/kvflash.md).

    The batch's rows are written into the slots of their positions first; then every query sees
    the slots whose position p satisfies ``p >= 0 and (p < base or p <= q)`` (base = the batch's
    first position): the committed prefix plus causal within the batch. Slots are in any order,
    and rejected drafts left in slots at p >= base stay hidden, so rollback needs nothing here.

    Args:
        pager: a :class:`~dflash_ref.kvflash.pager.KVFlashPager` attached to the model.
        layer: the model layer id (the pager pools the full-attention layers).
        positions: [T] absolute positions of the batch, contiguous from base.
    """

    def __init__(self, pager, layer: int, positions):
        self.pager, self.layer, self.positions = pager, layer, positions

    def update(self, k, v):
        self.pager.write(self.layer, self.positions, k, v)
        keys, values, k_pos = self.pager.kv(self.layer)  # [P, Hkv, D] x2, [P]
        mask = committed_prefix_mask(self.positions, k_pos, base_pos=int(self.positions[0]))
        self.last = (keys, values, mask)
        return self.last


class PooledTreeKV(_Remember):
    """A tree verify batch over the KVFlash pool: the nodes' K/V stay beside the pool.

    Tree nodes at one depth share a position, so they cannot live in the slots of their
    positions. They are kept aside (in ``record``) and appended after the pool's slots for
    attention: node i sees the committed slots (``0 <= p < base``) and the nodes that are itself
    or its ancestors (:func:`~dflash_ref.ops.masks.tree_mask` in slot space, ``node_slots`` after
    the pool). Slots at ``p >= base`` (rejected drafts of an earlier step) stay hidden.
    :meth:`~dflash_ref.models.state.TargetState.commit_path` writes the accepted path's rows into
    the pool at positions base, base+1, ...; the others are dropped.

    Args:
        pager: the attached :class:`~dflash_ref.kvflash.pager.KVFlashPager`.
        layer: the model layer id.
        parents: [n] tree parents (-1 for the root).
        base: the committed length (the root's position).
        record: dict layer -> (k, v) [n, Hkv, D] that commit_path reads.
    """

    def __init__(self, pager, layer: int, parents, base: int, record: dict):
        self.pager, self.layer, self.parents = pager, layer, parents
        self.base, self.record = base, record

    def update(self, k, v):
        self.record[self.layer] = (k, v)
        keys, values, k_pos = self.pager.kv(self.layer)  # [P, Hkv, D] x2, [P]
        xp = self.pager.be.xp
        P, n = int(k_pos.shape[0]), int(k.shape[0])
        node_pos = self.base + tree_depths(self.parents)  # [n]
        all_pos = np.concatenate([self.pager.be.to_numpy(k_pos).astype(np.int64), node_pos])
        mask = tree_mask(self.parents, self.base, k_pos=all_pos, node_slots=P + np.arange(n))
        self.last = (xp.concatenate([keys, k], axis=0), xp.concatenate([values, v], axis=0),
                     mask)  # [P + n, Hkv, D] x2
        return self.last
