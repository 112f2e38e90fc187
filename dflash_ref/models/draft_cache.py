"""The drafter's cached form: context K/V of the committed positions, appended as they arrive.

The same logits as the stateless ``DFlashDrafter.forward_block`` without recomputing the
context every draft: the authors' ``DynamicCache`` + ``crop(s)`` (z-lab/dflash
``dflash/model.py``).
"""

from __future__ import annotations

import functools

import numpy as np

from dflash_ref.errors import ConfigError
from dflash_ref.models.cache import KVCache


class DraftCache:
    """Per-layer context K/V (post k_norm, post RoPE) of positions 0..length-1, one
    :class:`~dflash_ref.models.cache.KVCache` per layer; drafts over all of them, or over the
    last ``window``. A block's K/V go into the spare rows after the context (``KVCache.stage``),
    never committed: no context row is copied per draft.
    """

    def __init__(self, drafter, window: int | None = None):
        if window is not None and window < 1:
            raise ConfigError(f"drafter context window must be >= 1, got {window}")
        self.drafter, self.window = drafter, window
        cfg = drafter.config
        self.kv = [KVCache(drafter.be, cfg.num_key_value_heads, cfg.head_dim)
                   for _ in range(cfg.num_hidden_layers)]
        self.length = 0  # one past the last cached position (the authors' ``cache_len``)

    def extend(self, features, positions) -> None:
        """Append context for ``positions`` (must continue the cache) from features [n, C*H]."""
        d, xp = self.drafter, self.drafter.be.xp
        positions = np.asarray(d.be.to_numpy(positions), dtype=np.int64)
        if positions.size == 0:
            return
        if positions[0] != self.length or np.any(np.diff(positions) != 1):
            raise ValueError(
                f"DraftCache.extend: positions {positions[0]}..{positions[-1]} must continue the "
                f"cache, which ends at {self.length}"
            )
        c = d.encode(xp.asarray(features, dtype=xp.float32))
        for i, cache in enumerate(self.kv):
            cache.append(*d.context_kv(i, c, positions))
        self.length = int(positions[-1]) + 1

    def crop(self, n_keep: int) -> None:
        """Drop cached positions >= n_keep (the authors crop to s after every draft)."""
        self.length = min(n_keep, self.length)
        for cache in self.kv:
            cache.truncate(self.length)

    def forward_block(self, anchor_token: int, anchor_position: int, n_rows: int | None = None,
                      with_hidden: bool = False):
        """Draft logits [n, vocab] over the cached context (arguments as the stateless form's)."""
        d = self.drafter
        lo = 0 if self.window is None else max(0, self.length - self.window)
        ctx_pos = np.arange(lo, self.length)
        n = d.block_rows(n_rows)
        noise_pos = np.arange(anchor_position, anchor_position + n)
        joins = [functools.partial(c.stage, start=lo) for c in self.kv]  # rows lo.., views
        return d.run_block(d.embed_block(anchor_token, n), joins, ctx_pos, noise_pos,
                           with_hidden)
