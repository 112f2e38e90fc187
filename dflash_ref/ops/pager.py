"""Pager copies: moving KV rows between pool slots, and the slot -> position table.

The KVFlash pool (docs/kvflash.md, "The data model") stores the K and V rows of every pooled layer
in *slots*; a logical position p lives in slot ``block(p // T) * T + p % T`` (T = chunk_tokens).
These ops are the only array work the pager does, so they are the ones with CuPy twins:

- :func:`gather_rows`: copy chosen slots out of a pool (page-out staging, reads by position);
- :func:`scatter_rows`: copy rows into chosen slots of a pool **in place** (KV writes, page-in);
- :func:`fill_slot_pos`: the absolute position held by every slot, -1 for free slots, the
  ``k_pos`` array that the attention masks consume (docs/kvflash.md, "The validity rule and the
  decode mask").

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

    The one op of the project that mutates an argument: copying a whole pool to change 64 rows
    would defeat the pager. The CuPy twin writes into the same device array, so reference and twin
    agree on both the returned value and the argument afterwards.

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
