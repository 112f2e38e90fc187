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
        joins = [functools.partial(c.stage, start=lo) for c in self.kv]  # rows lo.., views
        return d.run_block(d.embed_block(anchor_token, n), joins, ctx_pos, noise_pos,
                           with_hidden)


def step_now(key, step):
    """Run ``step()`` now (``key``, its shape, unread): how a fixed draft cache runs its step
    unless it is handed another way."""
    return step()


class FixedDraftCache(DraftCache):
    """:class:`DraftCache` in fixed rows: every draft of n rows reads the same arrays at the same
    addresses, so the step can be recorded once per row count and replayed (models/graphs.py:
    what a target state made with ``graphs=True`` drafts with; ``drafter.fixed_cache``).

    Each layer keeps ``[2, capacity + B, Hkv, D]`` rows (K, then V): context position p in row
    p (written by :meth:`extend`, outside the step), the block's K/V in rows ``capacity ..``
    (written by the step); each write is one ``write_kv``.
    The step reads one persistent int32 buffer per row count n, written once per draft::

        [ids (n); noise positions (n); key positions (capacity + n)]

    where a key row's position is -1 outside the context window ``lo .. length-1``: the
    drafter's mask (``valid = k >= 0``) hides it, so the key count is a value, not a shape.
    The step is the drafter's own block forward (``embed_ids``, ``run_block``). Same logits as
    :class:`DraftCache` up to the order in which attention sums its masked keys.

    Args:
        drafter: a DFlash drafter.
        capacity: the context positions it can hold (0..capacity-1).
        window: the drafter's context window, or None.
        run_step: how the step runs, ``run_step(key, step)`` with ``key = (n, with_hidden)``:
            :func:`step_now` calls it; a runner's recorder replays it (models/graphs.py).
    """

    def __init__(self, drafter, capacity: int, window: int | None = None, run_step=step_now):
        super().__init__(drafter, window)
        cfg, xp = drafter.config, drafter.be.xp
        self.capacity, self.run_step = int(capacity), run_step
        shape = (2, self.capacity + drafter.block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.kv = [xp.zeros(shape, xp.float32) for _ in range(cfg.num_hidden_layers)]
        self.buffers: dict = {}  # n -> the step's input buffer [3n + capacity] int32

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
        """As :meth:`DraftCache.forward_block`; the step reads only its input buffer and the
        fixed rows."""
        d, C = self.drafter, self.capacity
        n = d.block_rows(n_rows)
        if n > d.block_size:
            raise ValueError(f"FixedDraftCache drafts at most the block size {d.block_size} rows, "
                             f"got {n}; draft with drafter.new_cache() past it")
        lo = 0 if self.window is None else max(0, self.length - self.window)
        k_pos = np.full(C + n, -1, np.int64)
        k_pos[lo:self.length] = np.arange(lo, self.length)
        k_pos[C:] = anchor_position + np.arange(n)  # the block's keys
        pack = np.concatenate([d.block_ids(anchor_token, n), k_pos[C:], k_pos]).astype(np.int32)
        dev = d.be.to_backend(pack)  # [3n + C]: the draft's one host -> backend copy
        buf = self.buffers.setdefault(n, dev)
        if buf is not dev:
            buf[...] = dev
        joins = [functools.partial(_join_block, d.be, kv, C) for kv in self.kv]

        def step():  # reads only buf and the fixed rows: the drafter's embedding and block
            return d.run_block(d.embed_ids(buf[:n]), joins, buf[2 * n: 2 * n + C],
                               buf[n: 2 * n], with_hidden)

        return self.run_step((n, with_hidden), step)
def _join_block(be, kv, C: int, nk, nv):
    """A fixed cache's ``join_kv``: the block's K/V [n, Hkv, D] into rows C..C+n-1 of ``kv``
    (one ``write_kv``; C is the same at every step, so the call replays); returns rows
    0..C+n-1 (context rows, then the block) as [C + n, Hkv, D] views."""
    n = nk.shape[0]
    be.ops.write_kv(kv, nk, nv, start=C)
    return kv[0, :C + n], kv[1, :C + n]
