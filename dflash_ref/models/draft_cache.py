"""The drafter's cached form: context K/V of the committed positions, appended as they arrive.

:class:`DraftCache` gives the same logits as the stateless
:meth:`DFlashDrafter.forward_block <dflash_ref.models.drafter.DFlashDrafter.forward_block>`
(tests/models/test_drafter.py checks cached == stateless) without recomputing the context every
draft: the authors' ``DynamicCache`` + ``crop(s)`` (z-lab/dflash ``dflash/model.py``).
"""

from __future__ import annotations

import functools

import numpy as np

from dflash_ref.errors import ConfigError
from dflash_ref.models.cache import KVCache


class DraftCache:
    """Per-layer context K/V of the committed positions 0..length-1, for one ``drafter``
    (a :class:`~dflash_ref.models.drafter.DFlashDrafter`; ``drafter.new_cache()`` makes one).

    ``extend(features, positions)`` appends new committed context (post-norm, post-RoPE keys)
    to one :class:`~dflash_ref.models.cache.KVCache` per layer; ``forward_block(anchor_token,
    anchor_position)`` drafts over the cached context, or over its last ``window`` positions
    when a drafter context window is set. Each layer's block K/V are written into the cache's
    spare rows right after the context (``KVCache.stage``) and attended as one view, so no
    context row is copied per draft; they are never committed and the next ``extend`` or draft
    overwrites them (the authors append then ``crop(s)``, which nets to the same thing).
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
        """Draft logits [B, vocab] over the cached context (same result as the stateless form;
        ``n_rows`` and ``with_hidden`` as in ``DFlashDrafter.forward_block``)."""
        d = self.drafter
        lo = 0 if self.window is None else max(0, self.length - self.window)
        ctx_pos = np.arange(lo, self.length)
        n = d.block_rows(n_rows)
        noise_pos = np.arange(anchor_position, anchor_position + n)
        h = d.embed_block(anchor_token, n)
        for i, cache in enumerate(self.kv):
            join_kv = functools.partial(cache.stage, start=lo)  # rows lo..length+n-1, a view
            h = d.decoder_layer(i, h, join_kv, ctx_pos, noise_pos)
        return d.head(h, with_hidden)
