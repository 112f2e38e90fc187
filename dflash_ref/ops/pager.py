"""Pager copies: KV rows between pool slots, and the slot -> position table (docs/kvflash.md).

A pool is one array [S, P, W]: S segments (one per (layer, K|V)), P slots, W = n_kv_heads *
head_dim; position p lives in slot ``block(p // T) * T + p % T`` (T = chunk_tokens). Copies are
bit moves (any dtype), so a page round trip is bit-exact.
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
    """``rows[s, i] = pool[s, slots[i]]``: pool [S, P, W], slots [n] in [0, P) -> [S, n, W],
    written into ``out`` (C-contiguous [S, n, W]) when given."""
    _check_pool(pool, "gather_rows")
    slots = check_slots(slots, pool.shape[1], "gather_rows", distinct=False)
    if out is None:
        return np.ascontiguousarray(pool[:, slots])  # [S, P, W] -> [S, n, W]
    _check_out(out, (pool.shape[0], slots.size, pool.shape[2]), pool.dtype)
    return np.take(pool, slots, axis=1, out=out)


def scatter_rows(pool, slots, rows, checked: bool = False):
    """In place: ``pool[s, slots[i]] = rows[s, i]``; returns ``pool``.

    pool: [S, P, W] C-contiguous; slots: [n] distinct in [0, P); rows: [S, n, W]. ``checked``:
    the caller checked ``slots``, so the CuPy twin skips its synchronising check.
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
    """[P] int32: the position held by each slot, -1 for free slots; slot ``b*T + i`` of
    chunk c in block b = chunk_block[c] >= 0 holds ``c*T + i`` (``out[slot_for(p)] == p``).

    chunk_block: [n_chunks], distinct blocks or -1; T = chunk_tokens; P = pool_tokens, a
    multiple of T.
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
    """In place: ``kv[0, r_i] = k[i]``, ``kv[1, r_i] = v[i]``, r_i = ``rows[i]`` or
    ``start + i``; returns ``kv``.

    kv: [2, C, H, D] C-contiguous; k, v: [T, H, D]; rows: [T] distinct in [0, C) or None
    (then start + T <= C; with rows, start = 0). ``checked`` as in :func:`scatter_rows`.
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
    """:func:`write_kv`'s checks but the rows' own (the twin runs them too); returns T."""
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
