"""CuPy twins of :mod:`dflash_ref.ops.pager` (kernels in cuda/pager.cu).

The copies move 32-bit words, so they are bit-exact for any dtype whose rows are a whole number of
words (float32; float16 / bfloat16 with an even row width). The argument checks of the reference
(slots in range, distinct slots for writes, distinct blocks) are repeated here: host slots (the
per-step path: the pager computes slots on the host) with the reference's own check before the
upload, so no KV write waits for the GPU; device slots on the device, with one synchronisation
(see :func:`_check_slots`). The kernels also skip any slot outside [0, P), so an unchecked slot
can never read or corrupt unrelated memory. ``write_kv`` (a KV cache's K and V rows in one
launch) is float32, the caches' dtype, and reads its k and v rows in place.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from dflash_ref.ops.pager import check_chunk_blocks, check_kv_args
from dflash_ref.ops.pager import check_slots as check_host_slots
from kernels_cupy._launch import f32_strided, i32, i64, launch_elementwise


def _check_pool(pool, op: str) -> cp.ndarray:
    if not isinstance(pool, cp.ndarray):  # keep the caller's array itself: scatter writes into it
        pool = cp.asarray(pool)
    if pool.ndim != 3:
        raise ValueError(
            f"{op}: pool has shape {pool.shape}; expected [S, P, W] (segments, slots, row width). "
            f"Reshape a [P, H, D] layer as pool[None].reshape(1, P, H * D)"
        )
    if pool.shape[2] * pool.itemsize % 4:
        raise TypeError(
            f"{op}: a pool row is {pool.shape[2]} x {pool.dtype} = "
            f"{pool.shape[2] * pool.itemsize} bytes; the CuPy copies move 32-bit words, so a row "
            f"must be a multiple of 4 bytes (use an even head_dim for 16-bit dtypes)"
        )
    return pool


def _words(a: cp.ndarray) -> cp.ndarray:
    """A C-contiguous [S, X, W] array viewed as uint32 words [S, X, W * itemsize / 4] (no copy)."""
    return a.view(cp.uint32)


def _check_slots(slots, n_slots: int, op: str, *, distinct: bool,
                 checked: bool = False) -> cp.ndarray:
    """``slots`` as a contiguous int32 device array, checked like the reference does.

    Host slots (a NumPy array or a list: what the pager computes, once per step, on the host)
    are checked on the host with the reference's own check and then uploaded; CuPy copies a
    host array through pinned memory asynchronously, so nothing waits for the GPU. This is the
    per-step path (KV writes, page-in). Slots already on the device are checked on the device
    with one host synchronisation (``cp.unique`` and a copy of three numbers), the price of an
    error at the call rather than corrupted memory; skip that with ``check_device_slots(False)``
    once a caller is trusted, or per call with ``checked=True`` (slots the caller checked on
    the host before uploading them: the pager's per-forward slots). Either way the kernels also
    drop out-of-range slots themselves.
    """
    if not isinstance(slots, cp.ndarray):
        host = check_host_slots(slots, n_slots, op, distinct=distinct)  # [n] int64, validated
        return cp.asarray(host.astype(np.int32))
    if slots.ndim != 1 or not (slots.size == 0 or cp.issubdtype(slots.dtype, cp.integer)):
        raise ValueError(f"{op}: slots must be a 1-D integer array, "
                         f"got {slots.dtype} {slots.shape}")
    if slots.size == 0:
        return cp.zeros(0, dtype=cp.int32)
    if _CHECK_DEVICE_SLOTS[0] and not checked:
        _check_device_slots(slots, n_slots, op, distinct=distinct)
    return cp.ascontiguousarray(slots.astype(cp.int32, copy=False))


_CHECK_DEVICE_SLOTS = [True]


def check_device_slots(enabled: bool) -> bool:
    """Turn the synchronising check of device-resident slots on or off; returns the old setting.

    On by default. Host slots are always checked (on the host, without synchronising).
    """
    old, _CHECK_DEVICE_SLOTS[0] = _CHECK_DEVICE_SLOTS[0], bool(enabled)
    return old


def _check_device_slots(slots: cp.ndarray, n_slots: int, op: str, *, distinct: bool) -> None:
    """The reference's range and distinctness checks for device slots (one host sync)."""
    uniq = cp.unique(slots)  # sorted
    lo, hi, n_uniq = (int(v) for v in cp.asnumpy(cp.stack([uniq[0], uniq[-1],
                                                           cp.asarray(uniq.size, uniq.dtype)])))
    if lo < 0 or hi >= n_slots:
        raise ValueError(
            f"{op}: slots must lie in [0, {n_slots}), got min {lo} max {hi}; "
            f"a -1 slot means the position was never allocated (call slot_for / alloc_span)"
        )
    if distinct and n_uniq != slots.size:
        raise ValueError(
            f"{op}: slots must be distinct (two rows written to one slot would race on the GPU); "
            f"got {slots.size} slots, {n_uniq} distinct"
        )


def gather_rows(pool, slots, out=None) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.pager.gather_rows`: pool [S, P, W], slots [n] -> [S, n, W]."""
    pool = cp.ascontiguousarray(_check_pool(pool, "gather_rows"))
    S, P, W = pool.shape
    slots = _check_slots(slots, P, "gather_rows", distinct=False)
    n = slots.size
    if out is None:
        rows = cp.empty((S, n, W), dtype=pool.dtype)
    else:
        if (not isinstance(out, cp.ndarray) or out.shape != (S, n, W) or out.dtype != pool.dtype
                or not out.flags.c_contiguous):
            raise ValueError(f"gather_rows: out must be a C-contiguous {(S, n, W)} {pool.dtype} "
                             f"CuPy array, got {type(out).__name__} {getattr(out, 'shape', '')}")
        rows = out
    src, dst = _words(pool), _words(rows)
    Ww = src.shape[2]
    launch_elementwise("pager", "gather_rows_u32", S * n * Ww,
                       (src, slots, dst, i32(S), i32(P), i32(n), i32(Ww)))
    return rows


def scatter_rows(pool, slots, rows, checked: bool = False):
    """Twin of :func:`dflash_ref.ops.pager.scatter_rows`: writes ``pool`` in place, returns it.

    ``checked=True``: device slots the caller checked on the host are not checked again here
    (no synchronisation); host slots are always checked on the host."""
    pool = _check_pool(pool, "scatter_rows")
    if not pool.flags.c_contiguous:
        raise ValueError("scatter_rows: pool must be C-contiguous (it is updated in place; a "
                         "strided view would be written through a copy on the GPU)")
    S, P, W = pool.shape
    slots = _check_slots(slots, P, "scatter_rows", distinct=True, checked=checked)
    n = slots.size
    rows = cp.asarray(rows)
    if rows.shape != (S, n, W):
        raise ValueError(f"scatter_rows: rows have shape {rows.shape}, expected [S, n, W] = "
                         f"{(S, n, W)}")
    rows = cp.ascontiguousarray(rows.astype(pool.dtype, copy=False))  # the reference's cast
    dst, src = _words(pool), _words(rows)
    Ww = dst.shape[2]
    launch_elementwise("pager", "scatter_rows_u32", S * n * Ww,
                       (dst, slots, src, i32(S), i32(P), i32(n), i32(Ww)))
    return pool


def fill_slot_pos(chunk_block, chunk_tokens: int, pool_tokens: int) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.pager.fill_slot_pos`: [n_chunks] -> [P] int32 positions.

    A host table (what the pager passes: its chunk table lives on the host) is checked on the
    host with the reference's own check, then uploaded: nothing waits for the GPU. A device
    table is checked on the device with one synchronisation (``cp.unique``), as device slots
    are in :func:`scatter_rows`.
    """
    T, P = int(chunk_tokens), int(pool_tokens)
    if not isinstance(chunk_block, cp.ndarray):
        host = check_chunk_blocks(chunk_block, T, P)  # [n_chunks] int64, validated
        cb = cp.asarray(host.astype(np.int32))
    else:
        check_chunk_blocks(np.zeros(0, np.int64), T, P)  # T and P alone
        cb = _check_device_chunk_blocks(chunk_block.reshape(-1), T, P)
    out = cp.full(P, -1, dtype=cp.int32)
    launch_elementwise("pager", "fill_slot_pos_i32", cb.size * T,
                       (cb, out, i32(cb.size), i32(T)))
    return out


def _check_device_chunk_blocks(cb: cp.ndarray, T: int, P: int) -> cp.ndarray:
    """The reference's block checks for a device chunk table (one host synchronisation)."""
    n_blocks = P // T
    blocks = cb[cb >= 0]
    if blocks.size:
        uniq = cp.unique(blocks)
        if int(uniq[-1]) >= n_blocks or uniq.size != blocks.size:
            raise ValueError(
                f"fill_slot_pos: resident chunks must map to distinct blocks in [0, {n_blocks}); "
                f"got blocks {cp.asnumpy(blocks).tolist()}"
            )
    if cb.size * T > np.iinfo(np.int32).max:
        raise ValueError(f"fill_slot_pos: positions up to {cb.size * T} overflow int32")
    return cp.ascontiguousarray(cb.astype(cp.int32))


def write_kv(kv, k, v, rows=None, start: int = 0, checked: bool = False):
    """Twin of :func:`dflash_ref.ops.pager.write_kv`: one launch writes the batch's K and V rows
    into ``kv`` [2, C, H, D] in place; returns ``kv``.

    ``k``, ``v`` [T, H, D] are read in place with strided rows and heads (``f32_strided``: the
    v column slice of a stacked q/k/v product costs no copy). ``rows``: host rows are checked on
    the host and uploaded; device rows (a fixed store's positions, read by a captured step) are
    used as they are with ``checked=True``, else checked on the device with one
    synchronisation (:func:`_check_slots`). Without rows, ``start`` is a host int.
    """
    if not isinstance(kv, cp.ndarray) or kv.dtype != cp.float32:
        raise TypeError(f"write_kv: kv must be a float32 CuPy array (it is written in place), "
                        f"got {type(kv).__name__} {getattr(kv, 'dtype', '')}")
    T = check_kv_args(kv, k, v, start, rows is not None)
    k, (ks_r, ks_h, _) = f32_strided(k, "write_kv", "k")
    v, (vs_r, vs_h, _) = f32_strided(v, "write_kv", "v")
    _, C, H, D = kv.shape
    strides = (i32(T), i32(C), i32(H), i32(D), i64(ks_r), i64(ks_h), i64(vs_r), i64(vs_h))
    if rows is None:
        launch_elementwise("pager", "write_kv_from_f32", 2 * T * H * D,
                           (kv, k, v, i32(start), *strides))
        return kv
    rows = _check_slots(rows, C, "write_kv", distinct=True, checked=checked)
    if rows.size != T:
        raise ValueError(f"write_kv: {rows.size} rows for {T} K/V rows; give one row each")
    launch_elementwise("pager", "write_kv_rows_f32", 2 * T * H * D, (kv, k, v, rows, *strides))
    return kv
