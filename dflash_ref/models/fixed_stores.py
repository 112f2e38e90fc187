"""K/V in rows allocated once, so that nothing a step does depends on a length.

A state made with ``kv_capacity=C`` keeps each attention layer's K/V in C fixed rows, row p
holding position p (:class:`FixedCacheStore`, its chain view :class:`FixedKV`); the drafter's
:class:`FixedDraftCache` does the same for its context. Every step of a row count reads the
same arrays at the same addresses, so a step runner may record it once and replay it
(``TargetModel.new_state``). The key count is not a shape: a query at q sees slot j when
``j <= q`` (and the window), so rollback is a host length and stale rows stay hidden.
"""

from __future__ import annotations

import functools

import numpy as np

from dflash_ref.errors import ConfigError, StateError
from dflash_ref.models.draft_cache import DraftCache
from dflash_ref.models.kv_store import KVStore, Remember
from dflash_ref.models.stores import Store
from dflash_ref.models.tree import TreePath


class FixedCacheStore(Store):
    """One attention layer's K/V in ``capacity`` rows ``[2, C, Hkv, D]``: row p holds position
    p. Rollback moves no data; chain batches only (a tree verify needs ``CacheStore``).

    Args:
        be: the Backend.
        layer: the model layer id.
        n_kv_heads, head_dim: the layer's K/V shape.
        window: the layer's sliding window W, or None for full attention.
        capacity: C, the positions the store can hold (0..C-1).
    """

    def __init__(self, be, layer: int, n_kv_heads: int, head_dim: int, window: int | None,
                 capacity: int):
        if int(capacity) != capacity or capacity < 1:
            raise ConfigError(f"kv_capacity must be a positive int (the positions the state "
                              f"will hold), got {capacity!r}")
        xp = be.xp
        self.be, self.layers, self.window, self.capacity = be, (layer,), window, int(capacity)
        self.kv = xp.zeros((2, self.capacity, n_kv_heads, head_dim), dtype=xp.float32)
        self.k_pos = xp.arange(self.capacity, dtype=xp.int32)  # [C] slot j holds position j

    @classmethod
    def with_capacity(cls, capacity: int):
        """A maker of stores like ``CacheStore``'s constructor, of ``capacity`` rows."""
        return lambda be, layer, n_kv_heads, head_dim, window: cls(
            be, layer, n_kv_heads, head_dim, window, capacity)

    def reserve(self, start: int, n: int, parents) -> dict:
        """Check that positions start..start+n-1 fit; nothing to upload."""
        if parents is not None:
            raise StateError("a state made with kv_capacity (fixed K/V rows, each step's shape "
                             "fixed) runs chain batches only; make the state without "
                             "kv_capacity to verify a tree")
        if start + n > self.capacity:
            raise StateError(f"the batch needs positions {start}..{start + n - 1}, but the state "
                             f"was made with kv_capacity={self.capacity} (positions 0.."
                             f"{self.capacity - 1}); make it with a larger kv_capacity")
        return {}

    def views(self, arrays, parents) -> dict[int, KVStore]:
        return {self.layers[0]: FixedKV(self.be, self.kv, self.k_pos, arrays, self.window)}

    def truncate(self, n: int) -> None:
        """Nothing to move (the next batch overwrites the rows it needs)."""

    def keep_path(self, path: TreePath) -> None:
        raise StateError("a fixed-capacity store holds no tree verify")  # reserve refused it

    def snapshot(self, n: int) -> dict:
        """Layer id -> (k, v) [n, Hkv, D], copies of rows 0..n-1."""
        return {self.layers[0]: (self.kv[0, :n].copy(), self.kv[1, :n].copy())}

    def restore(self, length: int, pieces: dict) -> None:
        if length > self.capacity:
            raise StateError(f"restore: the snapshot holds {length} positions, more than this "
                             f"state's kv_capacity={self.capacity}; make it with a larger one")
        if length:
            k, v = pieces[self.layers[0]]
            self.kv[0, :length], self.kv[1, :length] = k, v


class FixedKV(Remember):
    """A chain batch over a :class:`FixedCacheStore`: one ``write_kv`` at the batch's device
    positions, then the queries read all C rows ``[C, Hkv, D]`` under ``j <= q`` (and the
    window); nothing here reads a host length."""

    def __init__(self, be, kv, k_pos, arrays, window: int | None):
        self.be, self.kv, self.k_pos, self.arrays, self.window = be, kv, k_pos, arrays, window

    def update(self, k, v):
        self.be.ops.write_kv(self.kv, k, v, rows=self.arrays.positions, checked=True)
        self.last = self.kv[0], self.kv[1], self.arrays.causal_over(self.k_pos, self.window)
        return self.last  # keys, values [C, Hkv, D]: views of the store


def step_now(key, step):
    """Run ``step()`` now (``key``, its shape, unread): a fixed draft cache's default."""
    return step()


class FixedDraftCache(DraftCache):
    """``DraftCache`` in fixed rows: each layer keeps ``[2, capacity + B, Hkv, D]``, context
    position p in row p (:meth:`extend`, outside the step), the block's K/V in rows
    ``capacity ..`` (inside it). The step reads one persistent int32 buffer per row count n,
    written once per draft::

        [ids (n); noise positions (n); key positions (capacity + n)]

    a key row's position being -1 outside the context window (the drafter's mask hides
    ``k < 0``). The step is the drafter's own ``embed_ids`` and ``run_block``; same logits as
    ``DraftCache`` up to the order attention sums its masked keys.

    Args:
        drafter: a DFlash drafter.
        capacity: the context positions it can hold (0..capacity-1).
        window: the drafter's context window, or None.
        run_step: ``run_step(key, step)``, ``key = (n, with_hidden)``: :func:`step_now`, or a
            runner's recorder.
    """

    def __init__(self, drafter, capacity: int, window: int | None = None, run_step=step_now):
        super().__init__(drafter, window)
        cfg, xp = drafter.config, drafter.be.xp
        self.capacity, self.run_step = int(capacity), run_step
        shape = (2, self.capacity + drafter.block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.kv = [xp.zeros(shape, xp.float32) for _ in range(cfg.num_hidden_layers)]
        self.buffers: dict = {}  # n -> the step's input buffer [3n + capacity] int32

    def extend(self, features, positions) -> None:
        """As ``DraftCache.extend``, into the fixed rows (positions < capacity)."""
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
        """As ``DraftCache.forward_block``; the step reads only its buffer and the rows."""
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
        joins = [functools.partial(join_block, d.be, kv, C) for kv in self.kv]

        def step():  # reads only buf and the fixed rows: the drafter's embedding and block
            return d.run_block(d.embed_ids(buf[:n]), joins, buf[2 * n: 2 * n + C],
                               buf[n: 2 * n], with_hidden)

        return self.run_step((n, with_hidden), step)


def join_block(be, kv, C: int, nk, nv):
    """A fixed cache's ``join_kv``: the block's K/V [n, Hkv, D] into rows C..C+n-1 of ``kv``
    (one ``write_kv``); returns rows 0..C+n-1 as [C + n, Hkv, D] views."""
    n = nk.shape[0]
    be.ops.write_kv(kv, nk, nv, start=C)
    return kv[0, :C + n], kv[1, :C + n]
