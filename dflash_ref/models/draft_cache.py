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
from dflash_ref.models.graphs import StepGraphs


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


class FixedDraftCache(DraftCache):
    """:class:`DraftCache` in fixed rows, its draft step captured as a CUDA graph per row count
    (models/graphs.py; what a target state made with ``graphs=True`` drafts with).

    Each layer keeps ``[2, capacity + B, Hkv, D]`` rows (K, then V): context position p in row
    p (written by :meth:`extend`, eagerly), the block's K/V in rows ``capacity ..`` (written by
    the step); each write is one ``write_kv``.
    The step reads one persistent int32 buffer per row count n, written once per draft::

        [ids (n); noise positions (n); key positions (capacity + n)]

    where a key row's position is -1 outside the context window ``lo .. length-1``: the
    drafter's mask (``valid = k >= 0``) hides it, so the key count is a value, not a shape.
    Same logits as :class:`DraftCache` up to the order in which attention sums its masked keys.

    Args:
        drafter: a DFlash drafter (not DFlash 2: its convolutions keep their own state).
        window: the drafter's context window, or None.
        capacity: the context positions it can hold (0..capacity-1).
        graphs: capture and replay (True) or run every draft eagerly (False).
    """

    def __init__(self, drafter, window: int | None = None, capacity: int = 0,
                 graphs: bool = True):
        super().__init__(drafter, window)
        if drafter.is_dflash2:
            raise ConfigError("a DFlash 2 drafter's convolutions are not graph-shaped yet: "
                              "run it with a target state made without graphs=True (or "
                              "drafter.new_cache() without a capacity)")
        cfg, xp = drafter.config, drafter.be.xp
        self.capacity = int(capacity)
        shape = (2, self.capacity + drafter.block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.kv = [xp.zeros(shape, xp.float32) for _ in range(cfg.num_hidden_layers)]
        self.graphs = StepGraphs(drafter.be, enabled=graphs)

    def extend(self, features, positions) -> None:
        """As :meth:`DraftCache.extend`, into the fixed rows (positions < capacity)."""
        d, xp = self.drafter, self.drafter.be.xp
        positions = np.asarray(d.be.to_numpy(positions), dtype=np.int64)
        if positions.size == 0:
            return
        a, b = int(positions[0]), int(positions[-1]) + 1
        if a != self.length or b - a != positions.size or b > self.capacity:
            raise ValueError(f"FixedDraftCache.extend: positions {a}..{b - 1} must continue the "
                             f"cache (it ends at {self.length}) within its capacity "
                             f"{self.capacity}")
        c = d.encode(xp.asarray(features, dtype=xp.float32))
        for i, kv in enumerate(self.kv):
            k, v = d.context_kv(i, c, positions)  # [n, Hkv, D] each
            d.be.ops.write_kv(kv, k, v, start=a)  # rows a..b-1
        self.length = b

    def crop(self, n_keep: int) -> None:
        self.length = min(n_keep, self.length)  # rows past it are masked, then overwritten

    def forward_block(self, anchor_token: int, anchor_position: int, n_rows: int | None = None,
                      with_hidden: bool = False):
        """As :meth:`DraftCache.forward_block`; the step over the step buffer is replayed."""
        d, C = self.drafter, self.capacity
        n = d.block_rows(n_rows)
        if n > d.block_size:
            raise ValueError(f"FixedDraftCache drafts at most the block size {d.block_size} rows, "
                             f"got {n}; draft with drafter.new_cache() past it")
        lo = 0 if self.window is None else max(0, self.length - self.window)
        k_pos = np.full(C + n, -1, np.int64)
        k_pos[lo:self.length] = np.arange(lo, self.length)
        k_pos[C:] = anchor_position + np.arange(n)  # the block's keys
        ids = np.full(n, d.config.mask_token_id, np.int64)
        ids[0] = int(anchor_token)
        pack = np.concatenate([ids, k_pos[C:], k_pos]).astype(np.int32)  # [3n + C]
        dev = d.be.to_backend(pack)  # the draft's one host -> backend copy
        buf = self.graphs.buffers.setdefault(n, dev)
        if buf is not dev:
            buf[...] = dev

        def step():  # reads only buf and the fixed rows
            h = d.target.embed_tokens[buf[:n]]  # [n, H]: DFlashDrafter.embed_block's rows
            if d.embedding_scale != 1.0:
                h = h * d.be.xp.float32(d.embedding_scale)
            for i, kv in enumerate(self.kv):
                join_kv = functools.partial(_join_block, d.be, kv, C)
                h = d.decoder_layer(i, h, join_kv, buf[2 * n: 2 * n + C], buf[n: 2 * n])
            return d.head(h, with_hidden)

        out = self.graphs.run((n, with_hidden), step)
        return tuple(x.copy() for x in out) if with_hidden else out.copy()


def _join_block(be, kv, C: int, nk, nv):
    """A fixed cache's ``join_kv``: the block's K/V [n, Hkv, D] into rows C..C+n-1 of ``kv``
    (one ``write_kv``; C is the same at every step, so the call replays); returns rows
    0..C+n-1 (context rows, then the block) as [C + n, Hkv, D] views."""
    n = nk.shape[0]
    be.ops.write_kv(kv, nk, nv, start=C)
    return kv[0, :C + n], kv[1, :C + n]
