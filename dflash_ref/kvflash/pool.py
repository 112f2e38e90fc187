"""The storage of a KVFlash pager: the device pool and the chunk table. No policy lives here.

- :class:`PooledKV`: the K and V rows of every pooled (full-attention) layer in one backend array
  ``[L, 2, P, H, D]``, with the row copies paging needs (gather, scatter, write, read, zeroing a
  block, the host buffers: pinned memory on CuPy, plain arrays on NumPy).
- :class:`ChunkTable`: per chunk, the block that holds it, whether the host store holds a valid
  copy, the LRU clock value of its last allocation, and the host copies themselves; with the
  read-only queries on them (resident chunks, the slot of a position, the ``k_pos`` table) and
  the pool's rows by position (``write``, ``read``, ``kv``: what the target's pool store uses).

Which chunk goes where, and when it is evicted, paged out or recalled, is decided by
:class:`~dflash_ref.kvflash.pager.KVFlashPager` (a ChunkTable with the policy on top).
docs/kvflash.md, "The data model" and "The pool and the host store", draws both; the public
source is Luce-Org/lucebox ``server/src/common/kvflash_pager.h``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dflash_ref.backend import Backend, as_backend
from dflash_ref.errors import PagerError


class PooledKV:
    """The device pool of the pooled (full-attention) layers: ``data`` [L, 2, P, H, D].

    ``data[i, 0]`` / ``data[i, 1]`` are the K / V rows of the i-th pooled layer, each a contiguous
    [P, H, D] view that attention consumes directly. For copies the pool is seen as segments
    ``[2L, P, H*D]`` (segment 2i is layer i's K, 2i+1 its V), the layout of the ``pager`` ops.

    Args:
        be: the Backend that holds the arrays.
        pool_tokens: P slots.
        n_kv_heads, head_dim: H, D (K and V rows have the same shape).
        layers: the model layer ids served (an int n means ids 0..n-1); ``write(layer, ...)``
            takes a model layer id, so a hybrid model passes its full-attention layer ids.
        dtype: storage dtype (float32 default; float16 halves the pool).
    """

    def __init__(self, be: Backend | str, pool_tokens: int, n_kv_heads: int, head_dim: int,
                 layers: int | Sequence[int], dtype="float32"):
        self.be = as_backend(be)
        self.layers = tuple(range(layers)) if isinstance(layers, int) else tuple(layers)
        if not self.layers or n_kv_heads <= 0 or head_dim <= 0:
            raise PagerError(
                f"PooledKV needs at least one layer and positive n_kv_heads, head_dim; got "
                f"layers={self.layers}, n_kv_heads={n_kv_heads}, head_dim={head_dim}"
            )
        if len(set(self.layers)) != len(self.layers):
            raise PagerError(f"PooledKV: layer ids {self.layers} repeat")
        self._index = {layer: i for i, layer in enumerate(self.layers)}
        self.pool_tokens, self.n_kv_heads, self.head_dim = pool_tokens, n_kv_heads, head_dim
        L, P, H, D = len(self.layers), pool_tokens, n_kv_heads, head_dim
        self.data = self.be.xp.zeros((L, 2, P, H, D), dtype=dtype)
        self.segments = self.data.reshape(2 * L, P, H * D)  # a view: [2L, P, W]
        self.dtype = self.data.dtype

    @property
    def row_bytes(self) -> int:
        """Bytes of one slot of one segment: H * D * itemsize."""
        return self.n_kv_heads * self.head_dim * self.dtype.itemsize

    def chunk_bytes(self, chunk_tokens: int) -> int:
        """Bytes of one chunk over all segments: 2 * L * T * H * D * itemsize."""
        return self.segments.shape[0] * chunk_tokens * self.row_bytes

    def layer_index(self, layer: int) -> int:
        if layer not in self._index:
            raise PagerError(f"layer {layer} is not pooled; pooled layers are {self.layers}")
        return self._index[layer]

    def k(self, layer: int):
        """[P, H, D] K rows of model layer ``layer`` (a view into ``data``)."""
        return self.data[self.layer_index(layer), 0]

    def v(self, layer: int):
        """[P, H, D] V rows of model layer ``layer`` (a view into ``data``)."""
        return self.data[self.layer_index(layer), 1]

    def gather(self, slots, out=None):
        """[2L, n, W] rows of ``slots`` in every segment (the page-out copy), into ``out``."""
        return self.be.ops.gather_rows(self.segments, slots, out)

    def scatter(self, slots, rows) -> None:
        """Write ``rows`` [2L, n, W] into ``slots`` of every segment (page-in)."""
        self.be.ops.scatter_rows(self.segments, slots, rows)

    def write(self, layer: int, slots, k, v, checked: bool = False) -> None:
        """Write ``k``, ``v`` [T, H, D] of one layer into ``slots`` [T] (``checked``: the
        caller checked them already; see the ``scatter_rows`` op)."""
        T = len(slots)
        shape = (T, self.n_kv_heads, self.head_dim)
        if tuple(k.shape) != shape or tuple(v.shape) != shape:
            raise PagerError(f"write: k {tuple(k.shape)} / v {tuple(v.shape)}, expected "
                             f"[T, H, D] = {shape} each")
        i = self.layer_index(layer)
        xp = self.be.xp
        rows = xp.stack([xp.asarray(k), xp.asarray(v)]).reshape(2, T, -1)  # [2, T, W]
        seg = self.data[i].reshape(2, self.pool_tokens, -1)  # [2, P, W] view of this layer
        self.be.ops.scatter_rows(seg, slots, rows.astype(self.dtype, copy=False), checked=checked)

    def read(self, layer: int, slots):
        """``(k, v)`` [n, H, D] of one layer at ``slots`` (copies)."""
        seg = self.data[self.layer_index(layer)].reshape(2, self.pool_tokens, -1)
        rows = self.be.ops.gather_rows(seg, slots)  # [2, n, W]
        n = rows.shape[1]
        return (rows[0].reshape(n, self.n_kv_heads, self.head_dim),
                rows[1].reshape(n, self.n_kv_heads, self.head_dim))

    def zero_block(self, block: int, chunk_tokens: int) -> None:
        """Set the T slots of ``block`` to zero in every segment."""
        self.segments[:, block * chunk_tokens : (block + 1) * chunk_tokens] = 0

    def host_empty(self, chunk_tokens: int) -> np.ndarray:
        """A host buffer for one chunk, [2L, T, W]; pinned memory on CuPy (fast, async-capable)."""
        shape = (self.segments.shape[0], chunk_tokens, self.segments.shape[2])
        if self.be.name == "cupy":  # as cupyx.empty_pinned does
            mem = self.be.xp.cuda.alloc_pinned_memory(math.prod(shape) * self.dtype.itemsize)
            return np.ndarray(shape, dtype=self.dtype, buffer=mem)
        return np.empty(shape, dtype=self.dtype)

    def save_block(self, block: int, chunk_tokens: int, host: np.ndarray) -> None:
        """Page-out copy: the T slots of ``block`` into ``host`` [2L, T, W], then zero the block.

        Synchronous, in the public order (device -> host copy, then zeroing). NumPy gathers
        straight into the host buffer; CuPy gathers on the device, then copies device -> pinned
        host.
        """
        T = chunk_tokens
        slots = np.arange(block * T, (block + 1) * T)
        if self.be.name == "cupy":
            self.gather(slots).get(out=host)
        else:
            self.gather(slots, out=host)
        self.zero_block(block, T)  # defence in depth: freed blocks read as zeros

    def load_block(self, block: int, chunk_tokens: int, host: np.ndarray) -> None:
        """Page-in copy: ``host`` [2L, T, W] into the T slots of ``block``."""
        T = chunk_tokens
        self.scatter(np.arange(block * T, (block + 1) * T), self.be.to_backend(host))


class ChunkTable:
    """Per-chunk state of a pager and its read-only queries (every change is made by the pager).

    The arrays cover chunks ``0 .. n_chunks - 1`` (1 + the largest chunk index touched since the
    last clear) and grow by doubling as chunks appear:

    - ``_block[c]``: the pool block holding chunk c, -1 if it is not resident;
    - ``_on_host[c]``: the host store holds a valid copy (also true once the chunk is recalled);
    - ``_last_use[c]``: the LRU clock value of the last ``slot_for`` on chunk c;
    - ``_host[c]``: the host copy itself, [2L, T, W] (only when the pager has a device pool).

    ``epoch`` is bumped by the pager whenever the mapping changes; :meth:`slot_positions` is
    cached per epoch. ``pool`` is the :class:`PooledKV` the rows live in (None: mapping only);
    :meth:`write`, :meth:`read` and :meth:`kv` move rows in and out of it by position.
    """

    pool: PooledKV | None = None

    def __init__(self, chunk_tokens: int, pool_tokens: int, be: Backend):
        self.chunk_tokens, self.pool_tokens, self.be = chunk_tokens, pool_tokens, be
        self.epoch = 0  # bumped whenever the mapping changes (masks are rebuilt on a change)
        self._slot_pos_cache: tuple[int, object] | None = None
        self._clear()

    def _clear(self) -> None:
        """Empty table, no host copies."""
        self._n = 0  # chunk table length: 1 + the largest chunk index ever touched
        self._block = np.full(16, -1, dtype=np.int64)  # chunk -> block, -1 = not resident
        self._on_host = np.zeros(16, dtype=bool)  # the host copy holds valid bytes
        self._last_use = np.zeros(16, dtype=np.int64)  # clock value of the last slot_for
        self._host: dict[int, np.ndarray] = {}  # chunk -> host copy [2L, T, W]

    def _grow(self, n: int) -> None:
        """Make the chunk table cover chunks 0..n-1."""
        if n > self._block.size:
            cap = max(n, 2 * self._block.size)
            pad = cap - self._block.size
            self._block = np.concatenate([self._block, np.full(pad, -1, np.int64)])
            self._on_host = np.concatenate([self._on_host, np.zeros(pad, bool)])
            self._last_use = np.concatenate([self._last_use, np.zeros(pad, np.int64)])
        self._n = max(self._n, n)

    @property
    def n_chunks(self) -> int:
        """Length of the chunk table (1 + the largest chunk index ever touched since reset)."""
        return self._n

    def block_of(self, chunk: int) -> int:
        """The block holding ``chunk``, or -1 if it is not resident."""
        return int(self._block[chunk]) if 0 <= chunk < self._n else -1

    def is_on_host(self, chunk: int) -> bool:
        """Whether the host store holds a valid copy of ``chunk`` (also true once recalled)."""
        return bool(self._on_host[chunk]) if 0 <= chunk < self._n else False

    def last_use(self, chunk: int) -> int:
        return int(self._last_use[chunk]) if 0 <= chunk < self._n else 0

    def chunk_blocks(self) -> np.ndarray:
        """[n_chunks] int64 copy of the chunk -> block table (-1 = not resident)."""
        return self._block[: self._n].copy()

    def resident_chunks(self) -> np.ndarray:
        """Ascending chunk ids that own a block."""
        return np.flatnonzero(self._block[: self._n] >= 0)

    def host_only_chunks(self) -> np.ndarray:
        """Ascending chunk ids held only by the host store (paged out, not recalled)."""
        n = self._n
        return np.flatnonzero(self._on_host[:n] & (self._block[:n] < 0))

    def materialised_chunks(self) -> np.ndarray:
        """Ascending chunk ids that hold data: resident or host-only (reselect's candidates)."""
        n = self._n
        return np.flatnonzero((self._block[:n] >= 0) | self._on_host[:n])

    def slot_of(self, pos: int) -> int:
        """The slot holding ``pos``, or -1 if its chunk is not resident (lookup: no clock tick)."""
        c = int(pos) // self.chunk_tokens
        b = self.block_of(c) if pos >= 0 else -1
        return -1 if b < 0 else b * self.chunk_tokens + int(pos) % self.chunk_tokens

    def is_identity(self) -> bool:
        """True iff every resident chunk c sits in block c and no chunk is host-only."""
        n = self._n
        blk = self._block[:n]
        resident = blk >= 0
        if np.any(blk[resident] != np.flatnonzero(resident)):
            return False
        return not np.any(self._on_host[:n] & ~resident)

    def identity_prefix_covers(self, n_tokens: int) -> bool:
        """Every chunk overlapping [0, n_tokens) is resident in block == its index."""
        n_ch = -(-int(n_tokens) // self.chunk_tokens)
        if n_ch > self._n:
            return False
        return bool(np.all(self._block[:n_ch] == np.arange(n_ch)))

    def slots_of(self, positions) -> np.ndarray:
        """Vectorised :meth:`slot_of`: [n] positions -> [n] int64 slots (-1 where not resident)."""
        pos = np.asarray(self.be.to_numpy(positions), dtype=np.int64).reshape(-1)
        T = self.chunk_tokens
        c = pos // T
        inside = (pos >= 0) & (c < self._n)
        b = np.full(pos.shape, -1, dtype=np.int64)
        b[inside] = self._block[c[inside]]
        return np.where(b >= 0, b * T + pos % T, -1)

    def resident_slots(self, positions) -> np.ndarray:
        """:meth:`slots_of` for positions that must all be resident (else :class:`PagerError`)."""
        slots = self.slots_of(positions)
        if np.any(slots < 0):
            bad = np.asarray(self.be.to_numpy(positions)).reshape(-1)[slots < 0]
            raise PagerError(f"positions {bad[:8].tolist()} have no resident slot; call "
                             f"alloc_span(start, n) for them before writing or reading")
        return slots

    def batch_slots(self, positions) -> np.ndarray:
        """[T] host slots of a forward's distinct, resident ``positions``, checked once (range
        and distinctness, the ``scatter_rows`` check) so that every layer's write can use one
        backend copy of them (:meth:`~dflash_ref.kvflash.pager.KVFlashPager.write_slots`)."""
        from dflash_ref.ops.pager import check_slots

        return check_slots(self.resident_slots(positions), self.pool_tokens, "batch_slots",
                            distinct=True)

    def fill_slot_pos(self) -> np.ndarray:
        """[P] int32 on the host: the position held by each slot, -1 if free (docs/kvflash.md,
        "The validity rule and the decode mask")."""
        from dflash_ref.ops.pager import fill_slot_pos

        return fill_slot_pos(self._block[: self._n], self.chunk_tokens, self.pool_tokens)

    def slot_positions(self):
        """[P] int32 backend array of :meth:`fill_slot_pos`, the ``k_pos`` of the masks.

        Computed with the backend's ``fill_slot_pos`` op from the host chunk table (the CuPy twin
        checks it on the host and copies it once) and cached until the mapping changes (the
        epoch). Treat it as read-only.
        """
        if self._slot_pos_cache is None or self._slot_pos_cache[0] != self.epoch:
            table = self._block[: self._n]  # [n_chunks] host
            pos = self.be.ops.fill_slot_pos(table, self.chunk_tokens, self.pool_tokens)
            self._slot_pos_cache = (self.epoch, pos)
        return self._slot_pos_cache[1]

    # ------------------------------------------------------------------ the pool's rows by position

    def attach(self, backend: Backend | str, layers: Sequence[int], n_kv_heads: int,
               head_dim: int, dtype="float32") -> None:
        """Give a mapping-only pager its device pool: what ``TargetModel.new_state(pager=...)``
        calls with the target's full-attention layers (``PoolStore``, models/pool_store.py). A
        pager that already holds a pool for the same layers and shapes on the same backend is
        kept as it is; any other is an error."""
        be = as_backend(backend)
        if self.pool is not None:
            p = self.pool
            if (p.be.name, p.layers, p.n_kv_heads, p.head_dim) != (
                    be.name, tuple(layers), n_kv_heads, head_dim):
                raise PagerError(
                    f"this pager's pool serves layers {p.layers} ({p.n_kv_heads} x {p.head_dim}, "
                    f"{p.be.name}) but the target needs layers {tuple(layers)} ({n_kv_heads} x "
                    f"{head_dim}, {be.name}); create KVFlashPager(pool_tokens) without layers "
                    f"and let the target attach it"
                )
            return
        self.be = be
        self.pool = PooledKV(be, self.pool_tokens, n_kv_heads, head_dim, layers, dtype)
        self.chunk_bytes = self.pool.chunk_bytes(self.chunk_tokens)
        self._slot_pos_cache = None

    def _require_pool(self) -> PooledKV:
        if self.pool is None:
            raise PagerError("this pager keeps the mapping only; construct it with layers=..., "
                             "n_kv_heads=..., head_dim=... to hold a KV pool")
        return self.pool

    def write(self, layer: int, positions, k, v) -> None:
        """Write one layer's ``k``, ``v`` [T, H, D] at ``positions`` [T] (already allocated):
        distinct, resident positions (``KVFlashPager.alloc_span`` them first). Does not tick the
        LRU clock."""
        self._require_pool().write(layer, self.resident_slots(positions), k, v)

    def write_slots(self, layer: int, slots, k, v) -> None:
        """:meth:`write` at ``slots``: the backend copy of :meth:`batch_slots`, made once per
        forward (``PoolStore.reserve`` in models/pool_store.py) for every layer, so no lookup, check
        or copy here."""
        self._require_pool().write(layer, slots, k, v, checked=True)

    def read(self, layer: int, positions):
        """``(k, v)`` [T, H, D] of one layer at resident ``positions`` (copies: a state
        snapshot's rows, tests)."""
        return self._require_pool().read(layer, self.resident_slots(positions))

    def kv(self, layer: int):
        """``(K [P, H, D], V [P, H, D], k_pos [P] int32)`` of one layer for attention: views of
        the pool (slot order) and :meth:`slot_positions`."""
        pool = self._require_pool()
        return pool.k(layer), pool.v(layer), self.slot_positions()
