"""KVFlash: bounded KV residency, exact paging, pluggable relevance (docs/kvflash.md).

- :mod:`dflash_ref.kvflash.pager`: :class:`KVFlashPager`, the policy (position -> chunk -> block
  -> slot, free list, eviction, page-out / page-in to a host store, reselect).
- :mod:`dflash_ref.kvflash.pool`: the storage it runs on: :class:`PooledKV`, the device pool of
  the full-attention layers it serves, and :class:`ChunkTable`, its per-chunk state.
- :mod:`dflash_ref.kvflash.scorers`: chunk relevance (tail-attention and target-QK scorers,
  :class:`~dflash_ref.kvflash.scorers.ModelTailScorer` that a pager's ``scorer`` runs), the score
  hook, and the reselect cadence.
- :mod:`dflash_ref.kvflash.needle`: a synthetic needle-in-a-haystack target (tests, notebook).

Public sources: Luce-Org/lucebox ``server/src/common/kvflash_pager.h`` (the pager),
``server/src/common/kvflash_scorer.h`` and ``server/src/common/kvflash_qk.h`` (the scorers).
"""

from dflash_ref.kvflash.pager import KVFlashPager, PagerStats, min_pool_tokens
from dflash_ref.kvflash.pool import ChunkTable, PooledKV

__all__ = ["ChunkTable", "KVFlashPager", "PagerStats", "PooledKV", "min_pool_tokens"]
