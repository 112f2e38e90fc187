"""What an attention layer sees of the place its keys and values live: one small interface.

A layer hands the batch's new keys and values to a **KV store** (the per-forward view of one
layer's storage) and gets back everything its queries attend to, with the mask::

    keys, values, mask = store.update(k, v)      # k, v: [T, Hkv, D] post-norm, post-RoPE
    o = attention(q, keys, values, mask)          # keys, values: [S, Hkv, D]; mask: [T, S]

Over a :class:`~dflash_ref.models.cache.KVCache` (:class:`CacheKV`) a query at q sees the key at
p when ``p <= q`` (and ``q - p < W`` on a sliding layer).
"""

from __future__ import annotations

from typing import Protocol

from dflash_ref.models.cache import KVCache
from dflash_ref.ops.masks import MaskSpec


class KVStore(Protocol):
    """What an attention layer needs from the place its K/V live (one forward batch)."""

    def update(self, k, v) -> tuple[object, object, MaskSpec]:
        """Store ``k``, ``v`` [T, Hkv, D]; return ``(keys, values, mask)``: keys, values
        [S, Hkv, D] every row the T queries may read, mask [T, S]."""
        ...

    def read(self) -> tuple[object, object, MaskSpec]:
        """What this batch's last :meth:`update` returned (for a KV-sharing layer)."""
        ...


class Remember:
    """``read()`` returns what ``update`` returned last."""

    last = None

    def read(self):
        if self.last is None:
            raise ValueError("read() before update(): the KV-sharing source layer has not run "
                             "in this batch")
        return self.last


class CacheKV(Remember):
    """A chain batch over a plain :class:`KVCache` (rows 0..len-1): append, then the causal
    (or sliding) mask of the batch's ``arrays``, built once per window kind and batch."""

    def __init__(self, cache: KVCache, arrays, window: int | None):
        self.cache, self.arrays, self.window = cache, arrays, window

    def update(self, k, v):
        keys, values = self.cache.append(k, v)
        self.last = keys, values, self.arrays.causal_mask(self.cache.length, self.window)
        return self.last
