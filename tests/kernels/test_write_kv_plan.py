"""The index arithmetic of ``write_kv_rows_f32`` / ``write_kv_from_f32`` (cuda/pager.cu),
emulated on the CPU.

Thread t of the batch's ``2 T H D`` elements (a grid-stride loop, every t once: the loop of
tests/kernels/test_strided_elementwise_plan.py) takes ``d = t % D``, ``h = (t / D) % H``,
``i = (t / (D H)) % T``, half ``s = t / (T H D)``, reads ``k`` (s = 0) or ``v`` (s = 1) at
``i rs + h hs + d`` with the strides ``f32_strided`` passes (a view's strides in floats; the
pointer is the view's first element) and writes ``kv[((s C + p) H + h) D + d]`` with ``p =
rows[i]`` or ``start + i``, skipping a p outside [0, C). The emulation runs that arithmetic, as
the kernel writes it, over the flat memory of a stacked q/k/v product and checks that each
destination is written at most once, that exactly the batch's rows are written, and that the
result equals the reference op (so the kernel computes the reference's function on the
reference's values, never another projection's columns).
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.ops.pager import write_kv


def strides_in_elements(view: np.ndarray) -> tuple[int, ...]:
    return tuple(s // view.itemsize for s in view.strides)


def offset_of(view: np.ndarray, base: np.ndarray) -> int:
    return (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // 4


def emulate(kv, k_mem, k_off, k_strides, v_mem, v_off, v_strides, T, rows, start):
    """write_kv_body over flat memories, as pager.cu writes it; returns the write counts."""
    _, C, H, D = kv.shape
    flat = kv.reshape(-1)  # the kernel's float* kv (C-contiguous)
    writes = np.zeros(flat.size, int)
    per_half = T * H * D
    for t in range(2 * per_half):
        d, h = t % D, (t // D) % H
        i, s = (t // (D * H)) % T, t // per_half
        p = int(rows[i]) if rows is not None else start + i
        if p < 0 or p >= C:
            continue
        if s == 0:
            x = k_mem[k_off + i * k_strides[0] + h * k_strides[1] + d]
        else:
            x = v_mem[v_off + i * v_strides[0] + h * v_strides[1] + d]
        dst = ((s * C + p) * H + h) * D + d
        flat[dst] = x
        writes[dst] += 1
    return writes.reshape(kv.shape)


@pytest.mark.parametrize(("T", "H", "D", "C"), [(1, 1, 1, 1), (1, 4, 8, 9), (3, 2, 6, 7),
                                                (16, 2, 4, 40)])
@pytest.mark.parametrize("form", ["rows", "start"])
def test_the_kernel_writes_the_reference_rows_once(T, H, D, C, form):
    # A stacked [T, (Hq + 2 H) D] q/k/v product whose values are their own addresses; k is
    # the qk_norm_rope output (contiguous), v the product's column slice (strided rows).
    Hq = 3
    mem = np.arange(T * (Hq + 2 * H) * D, dtype=np.float32)
    qkv = mem.reshape(T, (Hq + 2 * H) * D)
    v = qkv[:, (Hq + H) * D:].reshape(T, H, D)
    k = -1.0 - np.arange(T * H * D, dtype=np.float32).reshape(T, H, D)
    rng = np.random.default_rng(T * 100 + C)
    rows = rng.permutation(C)[:T] if form == "rows" else None
    start = 0 if form == "rows" else C - T
    kv = np.full((2, C, H, D), np.nan, np.float32)
    writes = emulate(kv, k.reshape(-1), 0, strides_in_elements(k), mem, offset_of(v, mem),
                     strides_in_elements(v), T, rows, start)
    expected = write_kv(np.full((2, C, H, D), np.nan, np.float32), k, v, rows=rows, start=start)
    np.testing.assert_array_equal(kv, expected)  # NaN where the reference left NaN, too
    at = rows if rows is not None else np.arange(start, start + T)
    assert (writes[:, at] == 1).all() and writes.sum() == 2 * T * H * D
    assert set(kv[1, at].ravel().tolist()) <= set(v.ravel().tolist())  # never q's or k's columns


def test_a_row_outside_the_storage_is_skipped():
    # The guard for unchecked device rows: no write outside [0, C), the others still land.
    kv = np.zeros((2, 3, 1, 2), np.float32)
    k = np.ones((2, 1, 2), np.float32)
    writes = emulate(kv, k.reshape(-1), 0, (2, 2), k.reshape(-1), 0, (2, 2), 2,
                     np.array([5, 1]), 0)
    assert writes.sum() == 4 and (writes[:, 1] == 1).all()
