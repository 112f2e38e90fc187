"""The index arithmetic of the elementwise kernels that read strided rows, emulated on the CPU.

``swiglu_f32`` / ``geglu_f32`` (gate, up), ``gdn_gates_f32`` (b, a) and ``sigmoid_gate_f32`` (x,
gate; cuda/activations.cu) read their inputs where a stacked product left them: output element
e of a [R, n] result (``sigmoid_gate``: [R, H, n]) is computed from ``in + r * row_stride (+ h *
head_stride) + j``. The emulation runs that arithmetic, as the kernels write it, over the flat
memory of a stacked product with the strides the wrappers pass (``f32_strided``: a view's strides
in elements), and checks that every output element reads exactly the element the NumPy view
holds at the same index (so the kernels compute the reference's function on the reference's
values), that each output is written once, and that no read leaves the slice (never another
projection's columns, never a [q | gate] head's q half).
"""

from __future__ import annotations

import numpy as np
import pytest


def strides_in_elements(view: np.ndarray) -> tuple[int, ...]:
    """What ``kernels_cupy._launch.f32_strided`` passes: the view's strides in floats."""
    return tuple(s // view.itemsize for s in view.strides)


def rows_kernel(total: int, F: int, stride: int):
    """swiglu_f32 / geglu_f32 / gdn_gates_f32: e -> (r = e / F, f = e - r F), read at r s + f
    (the offset of the view's first element is the pointer CuPy passes)."""
    e = np.arange(total)
    r = e // F
    return r * stride + (e - r * F)


def heads_kernel(total: int, H: int, n: int, rs: int, hs: int):
    """sigmoid_gate_f32: e -> j = e % n, rh = e / n, h = rh % H, r = rh / H; read at
    r rs + h hs + j."""
    e = np.arange(total)
    j, rh = e % n, e // n
    return (rh // H) * rs + (rh % H) * hs + j


def offset_of(view: np.ndarray, base: np.ndarray) -> int:
    return (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // 4


@pytest.mark.parametrize("T,F,extra", [(1, 7, 0), (16, 257, 3), (5, 64, 11)])
def test_gated_rows_read_the_column_slices_element_for_element(T, F, extra):
    # A [T, 2F + extra] product whose values are their own addresses.
    mem = np.arange(T * (2 * F + extra), dtype=np.float32)
    y = mem.reshape(T, 2 * F + extra)
    for view in (y[:, :F], y[:, F:2 * F]):
        (rs, one) = strides_in_elements(view)
        assert one == 1  # what the kernels need: contiguous channels
        got = mem[offset_of(view, mem) + rows_kernel(T * F, F, rs)]
        np.testing.assert_array_equal(got, view.ravel())  # the same element at every e


def test_gdn_gates_reads_b_and_a_from_the_projections_tail():
    T, other, HV = 4, 10, 6
    mem = np.arange(T * (other + 2 * HV), dtype=np.float32)
    y = mem.reshape(T, -1)
    b, a = y[:, other:other + HV], y[:, other + HV:]
    for view in (b, a):
        got = mem[offset_of(view, mem) + rows_kernel(T * HV, HV, strides_in_elements(view)[0])]
        np.testing.assert_array_equal(got, view.ravel())
        assert set(got.tolist()) == set(view.ravel().tolist())  # nothing outside the slice


@pytest.mark.parametrize("T,nh,d", [(1, 4, 8), (3, 5, 66), (16, 2, 128)])
def test_sigmoid_gate_reads_the_gate_half_of_each_head(T, nh, d):
    mem = np.arange(T * nh * 2 * d, dtype=np.float32)
    heads = mem.reshape(T, nh, 2 * d)
    gate = heads[..., d:]  # [T, nh, d]: row stride 2 nh d, head stride 2d
    rs, hs, one = strides_in_elements(gate)
    assert (rs, hs, one) == (2 * nh * d, 2 * d, 1)
    got = mem[offset_of(gate, mem) + heads_kernel(gate.size, nh, d, rs, hs)]
    np.testing.assert_array_equal(got, gate.ravel())
    assert not set(got.tolist()) & set(heads[..., :d].ravel().tolist())  # never the q half
    # the 2-D form (H = 1, head stride 0) on a contiguous [T, nh d] array
    flat = np.arange(T * nh * d, dtype=np.float32).reshape(T, nh * d)
    got = flat.ravel()[heads_kernel(flat.size, 1, nh * d, nh * d, 0)]
    np.testing.assert_array_equal(got, flat.ravel())


def test_each_output_is_written_once():
    # Grid-stride loops over e in [0, total): every e exactly once for any grid (the kernels'
    # loop, as written, with the wrappers' ELEMENTWISE_BLOCK and the 65536-block cap).
    for total in (1, 255, 256, 257, 70001):
        for blocks, threads in ((1, 256), (3, 256), (min(-(-total // 256), 65536), 256)):
            seen = np.zeros(total, int)
            for tid in range(blocks * threads):
                seen[tid::blocks * threads] += 1
            assert (seen == 1).all(), (total, blocks)
