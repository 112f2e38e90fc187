"""KVFlash: bounded KV residency, exact paging, pluggable relevance (spec/kvflash_gate.md §1-§2).

- :mod:`dflash_ref.kvflash.pager`: :class:`KVFlashPager` (position -> chunk -> block -> slot, free
  list, eviction, page-out / page-in to a host store, reselect) and :class:`PooledKV`, the device
  pool of the full-attention layers it serves.
- :mod:`dflash_ref.kvflash.scorers`: chunk relevance (tail-attention and target-QK scorers,
  :class:`~dflash_ref.kvflash.scorers.ModelTailScorer` that a pager's ``scorer`` runs), the score
  hook, and the reselect cadence.
- :mod:`dflash_ref.kvflash.needle`: a synthetic needle-in-a-haystack target (tests, notebook).
"""

from dflash_ref.kvflash.pager import KVFlashPager, PagerStats, PooledKV, min_pool_tokens

__all__ = ["KVFlashPager", "PagerStats", "PooledKV", "min_pool_tokens"]
