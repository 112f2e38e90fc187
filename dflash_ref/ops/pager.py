"""Pager copies: moving KV rows between pool slots, and the slot -> position table.

The KVFlash pool (docs/kvflash.md, "The data model") stores the K and V rows of every pooled layer
in *slots*; a logical position p lives in slot ``block(p // T) * T + p % T`` (T = chunk_tokens).
These ops are the only array work the pager does, so they are the ones with CuPy twins:

- :func:`gather_rows`: copy chosen slots out of a pool (page-out staging, reads by position);
- :func:`scatter_rows`: copy rows into chosen slots of a pool **in place** (KV writes, page-in);
- :func:`fill_slot_pos`: the absolute position held by every slot, -1 for free slots, the
  ``k_pos`` array that the attention masks consume (docs/kvflash.md, "The validity rule and the
  decode mask");
- :func:`write_kv`: a batch's K and V rows into a layer's ``[2, C, H, D]`` storage **in place**,
  both in one call (one kernel on CuPy: the KV caches' write, models/cache.py and
  models/kv_store.py).

The pool of a pager is one array ``[S, P, W]``: S segments (one per (layer, K|V) pair), P slots,
W = n_kv_heads * head_dim elements per row. Copies are bit moves: any dtype, no arithmetic, so a
page round trip is bit-exact (docs/kvflash.md, "Paging"). Public source: Luce-Org/lucebox
``server/src/common/kvflash_pager.h``.
"""

from __future__ import annotations

import numpy as np


def _check_pool(pool, op: str) -> None:
    if pool.ndim != 3:
        raise ValueError(
            f"{op}: pool has shape {pool.shape}; expected [S, P, W] (segments, slots, row width). "
            f"Reshape a [P, H, D] layer as pool[None].reshape(1, P, H * D)"
        )


def check_slots(slots, n_slots: int, op: str, *, distinct: bool) -> np.ndarray:
    """``slots`` as a 1-D int64 array of in-range (and, for writes, distinct) slot indices."""
    slots = np.asarray(slots)
    if slots.ndim != 1 or not (slots.size == 0 or np.issubdtype(slots.dtype, np.integer)):
        raise ValueError(f"{op}: slots must be a 1-D integer array, "
                         f"got {slots.dtype} {slots.shape}")
    slots = slots.astype(np.int64, copy=False)
    if slots.size and (slots.min() < 0 or slots.max() >= n_slots):
        raise ValueError(
            f"{op}: slots must lie in [0, {n_slots}), got min {slots.min()} max {slots.max()}; "
            f"a -1 slot means the position was never allocated (call slot_for / alloc_span)"
        )
    if distinct and np.unique(slots).size != slots.size:
        raise ValueError(
            f"{op}: slots must be distinct (two rows written to one slot would race on the GPU); "
            f"got {slots.size} slots, {np.unique(slots).size} distinct"
        )
    return slots


def _check_out(out, shape, dtype) -> None:
    if tuple(out.shape) != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"gather_rows: out must be a C-contiguous {shape} {dtype} array, got "
                         f"{tuple(out.shape)} {out.dtype}")


def gather_rows(pool, slots, out=None) -> np.ndarray:
    """Copy the rows of ``slots`` out of every segment: ``rows[s, i] = pool[s, slots[i]]``.

    Args:
        pool: [S, P, W] any dtype.
        slots: [n] integer slot indices in [0, P) (repeats allowed).
        out: optional C-contiguous [S, n, W] array of the pool's dtype to write into (the pager
            passes its host buffer, saving an allocation per page-out).
    Returns:
        [S, n, W] of the pool's dtype (bit copies): ``out`` when given, else a new array.
    """
    _check_pool(pool, "gather_rows")
    slots = check_slots(slots, pool.shape[1], "gather_rows", distinct=False)
    if out is None:
        return np.ascontiguousarray(pool[:, slots])  # [S, P, W] -> [S, n, W]
    _check_out(out, (pool.shape[0], slots.size, pool.shape[2]), pool.dtype)
    return np.take(pool, slots, axis=1, out=out)


def scatter_rows(pool, slots, rows, checked: bool = False):
    """In place: ``pool[s, slots[i]] = rows[s, i]`` for every segment s and row i.

    One of the two ops that mutate an argument (with :func:`write_kv`): copying a whole pool to
    change 64 rows would defeat the pager. The CuPy twin writes into the same device array, so
    reference and twin agree on both the returned value and the argument afterwards.

    Args:
        pool: [S, P, W] C-contiguous, modified in place.
        slots: [n] distinct integer slot indices in [0, P).
        rows: [S, n, W] values; cast to the pool's dtype (must be the same dtype for the twin).
        checked: the caller has checked ``slots`` already (the pager checks a forward's slots
            on the host once and every layer writes through one device copy of them); the CuPy
            twin then skips the synchronising check of device slots. The reference checks
            anyway: on the host it costs nothing.
    Returns:
        ``pool`` itself.
    """
    _check_pool(pool, "scatter_rows")
    if not pool.flags.c_contiguous:
        raise ValueError("scatter_rows: pool must be C-contiguous (it is updated in place; a "
                         "strided view would be written through a copy on the GPU)")
    slots = check_slots(slots, pool.shape[1], "scatter_rows", distinct=True)
    rows = np.asarray(rows)
    want = (pool.shape[0], slots.size, pool.shape[2])
    if rows.shape != want:
        raise ValueError(f"scatter_rows: rows have shape {rows.shape}, expected [S, n, W] = {want}")
    pool[:, slots] = rows  # [S, n, W] -> the n chosen slots of each segment
    return pool


def check_chunk_blocks(chunk_block, T: int, P: int) -> np.ndarray:
    """``chunk_block`` as [n_chunks] int64 after :func:`fill_slot_pos`'s argument checks (the
    CuPy twin runs them on the host for a host table)."""
    if T <= 0 or P <= 0 or P % T:
        raise ValueError(f"fill_slot_pos: pool_tokens {P} must be a positive multiple of "
                         f"chunk_tokens {T}")
    n_blocks = P // T
    chunk_block = np.asarray(chunk_block).astype(np.int64, copy=False).reshape(-1)
    blocks = chunk_block[chunk_block >= 0]  # [r]
    if blocks.size and (blocks.max() >= n_blocks or np.unique(blocks).size != blocks.size):
        raise ValueError(
            f"fill_slot_pos: resident chunks must map to distinct blocks in [0, {n_blocks}); "
            f"got blocks {blocks.tolist()}"
        )
    if (chunk_block.size * T) > np.iinfo(np.int32).max:
        raise ValueError(f"fill_slot_pos: positions up to {chunk_block.size * T} overflow int32")
    return chunk_block


def fill_slot_pos(chunk_block, chunk_tokens: int, pool_tokens: int) -> np.ndarray:
    """The absolute position held by each pool slot, -1 for free slots (lucebox's fill_slot_pos).

    For a resident chunk c in block b = chunk_block[c] >= 0, slot ``b*T + i`` holds position
    ``c*T + i`` for every i in [0, T) (all T slots of the chunk, written or not: the attention
    mask's ``k <= q`` and ``k < base_pos`` tests hide the unwritten ones). Slots of blocks that no
    chunk maps to get -1. Inverts the pager's mapping: ``out[slot_for(p)] == p``.

    Args:
        chunk_block: [n_chunks] integer, the block of each chunk or -1 (not resident); the
            non-negative entries must be distinct and below ``pool_tokens // chunk_tokens``.
        chunk_tokens: T, tokens per chunk (64 upstream).
        pool_tokens: P, a positive multiple of T.
    Returns:
        [P] int32 (positions must fit int32, the attention kernels' type).
    """
    T, P = int(chunk_tokens), int(pool_tokens)
    chunk_block = check_chunk_blocks(chunk_block, T, P)  # [n_chunks] int64
    n_blocks = P // T
    resident = np.flatnonzero(chunk_block >= 0)  # [r] chunk ids
    blocks = chunk_block[resident]  # [r]
    out = np.full(P, -1, dtype=np.int32)
    offsets = np.arange(T, dtype=np.int64)  # [T]
    out.reshape(n_blocks, T)[blocks] = resident[:, None] * T + offsets  # [r, T] positions
    return out


def write_kv(kv, k, v, rows=None, start: int = 0, checked: bool = False):
    """In place: ``kv[0, r_i] = k[i]`` and ``kv[1, r_i] = v[i]`` for every row i of the batch,
    where ``r_i = rows[i]``, or ``start + i`` when ``rows`` is None.

    One layer's K/V storage holds K in ``kv[0]`` and V in ``kv[1]``, so a batch's keys and
    values are one write (on CuPy one kernel, where two assignments or a stack and a scatter
    were two): the growing cache appends at ``start`` = its length (a host int, that cache is
    never captured), a fixed-capacity store writes at the batch's device positions (``rows``,
    what a captured step reads: models/graphs.py).

    Args:
        kv: [2, C, H, D] C-contiguous, modified in place (K rows, then V rows).
        k, v: [T, H, D] the batch's keys and values (post-norm, post-RoPE keys); any strides,
            cast to kv's dtype.
        rows: [T] distinct integer rows in [0, C), or None: rows ``start .. start+T-1``.
        start: the first row when ``rows`` is None (0 <= start, start + T <= C); must stay 0
            when ``rows`` is given.
        checked: the caller has checked device ``rows`` already (a store checks a forward's
            positions on the host once); the CuPy twin then skips its synchronising check. The
            reference checks anyway (on the host it costs nothing).
    Returns:
        ``kv`` itself.
    """
    T = check_kv_args(kv, k, v, start, rows is not None)
    if rows is None:
        at = slice(start, start + T)  # rows start..start+T-1
    else:
        at = check_slots(rows, kv.shape[1], "write_kv", distinct=True)  # [T]
        if at.size != T:
            raise ValueError(f"write_kv: {at.size} rows for {T} K/V rows; give one row each")
    kv[0, at] = k  # [T, H, D] -> rows r_i of the K half
    kv[1, at] = v  # [T, H, D] -> rows r_i of the V half
    return kv


def check_kv_args(kv, k, v, start, with_rows: bool) -> int:
    """The argument checks of :func:`write_kv` but the rows' own (the twin runs them too):
    shapes, a contiguous ``kv``, and ``start`` (rows start..start+T-1 within the C rows, or
    0 beside ``rows``). Returns T."""
    if kv.ndim != 4 or kv.shape[0] != 2:
        raise ValueError(f"write_kv: kv has shape {tuple(kv.shape)}; expected [2, C, H, D] "
                         f"(K rows, then V rows, of one layer)")
    if not kv.flags.c_contiguous:
        raise ValueError("write_kv: kv must be C-contiguous (it is updated in place; a strided "
                         "view would be written through a copy on the GPU)")
    want = tuple(kv.shape[2:])
    if k.ndim != 3 or tuple(k.shape[1:]) != want or tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"write_kv: k {tuple(k.shape)} / v {tuple(v.shape)}, expected "
                         f"[T, {want[0]}, {want[1]}] each (kv's heads and head dim)")
    T, C = k.shape[0], kv.shape[1]
    if with_rows and start != 0:
        raise ValueError(f"write_kv: give rows or start, not both (got start={start} with "
                         f"rows); rows are absolute")
    if not with_rows and (int(start) != start or start < 0 or start + T > C):
        raise ValueError(f"write_kv: rows {start}..{start + T - 1} do not fit the storage's "
                         f"{C} rows; make room first (a larger capacity)")
    return T
