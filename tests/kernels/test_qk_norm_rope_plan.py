"""``qk_norm_rope_f32`` (kernels_cupy/cuda/rope.cu) emulated on the CPU: its mapping and its order.

The emulation runs the kernel's index arithmetic on the flat memory of a stacked q/k/v product
(block ``row`` -> token t and head h, q's heads first; a head's channels at
``base + t * row_stride + h * head_stride``; the output contiguous), its sum of squares in the
kernel's order (thread ``tid`` adds channels tid, tid + QK_THREADS, ... in float32, then
``block_sum``: the xor butterfly within each warp, warp 0 combining the warps' lane-0 sums,
common.cuh), and its per-channel float32 formula (``x * inv * (offset + w)``, the rotation
partner j +- rd/2 normed by the same thread, the pass-through channels past rd). ``sincosf`` is
taken as the correctly rounded float32 cos / sin (CUDA documents 1-2 ulp).

Checked here: every output element written once; the reads touch exactly the q (or k) head's
channels of the stacked product, never v's columns or a [q | gate] head's gate half; the
emulation is within the op's tolerance of the reference (dflash_ref/ops/rope.py
``qk_norm_rope``) and of a float64 closed form, for awkward shapes (d = 2, 6, 66, 130 > the
block, partial rotary, one side normed). The ``gpu`` tests in tests/ops/test_qk_norm_rope.py
run the kernel itself on the same layouts.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from dflash_ref.ops.rope import qk_norm_rope, rope_inv_freq
from dflash_ref.testing import assert_close
from kernels_cupy import _build
from kernels_cupy._build import QK_THREADS
from tests.ops.test_qk_norm_rope import closed_form

F32 = np.float32


def block_sum(partials: np.ndarray) -> np.float32:
    """common.cuh's ``block_sum`` over one value per thread [QK_THREADS], in its float32 order:
    the xor butterfly within each warp, then warp 0 over the warps' lane-0 values (0 past the
    last warp), the result read from lane 0."""
    lanes = np.arange(32)
    warps = partials.astype(F32).reshape(-1, 32)  # [nw, 32]
    for o in (16, 8, 4, 2, 1):
        warps = warps + warps[:, lanes ^ o]  # every lane: v + shfl_xor(v, o)
    v = np.zeros(32, F32)
    v[: warps.shape[0]] = warps[:, 0]  # buf[wid], written by lane 0
    for o in (16, 8, 4, 2, 1):
        v = v + v[lanes ^ o]
    return v[0]


def emulate(mem, views, T, d, rd, pos, weights, eps, offset, inv_freq):
    """The kernel over flat float32 ``mem``: ``views`` = ((base, row_stride, head_stride, heads)
    of q, then of k), ``weights`` = (qw or None, kw or None). Returns (outputs, writes, reads):
    the two contiguous outputs [T, heads, d], how often each output element was written, and
    the set of addresses of ``mem`` each side read."""
    nq, nk = views[0][3], views[1][3]
    outs = [np.full((T, n, d), np.nan, F32) for n in (nq, nk)]
    writes = [np.zeros((T, n, d), int) for n in (nq, nk)]
    reads = [set(), set()]
    half = rd // 2
    for row in range(T * (nq + nk)):  # blockIdx.x
        t, h = divmod(row, nq + nk)
        side, hh = (0, h) if h < nq else (1, h - nq)
        base, rs, hs, _ = views[side]
        start = base + t * rs + hh * hs
        x = mem[start: start + d]  # the head's channels, contiguous
        reads[side].update(range(start, start + d))
        w = weights[side]
        inv = F32(1)
        if w is not None:
            ss = np.zeros(-(-d // QK_THREADS) * QK_THREADS, F32)
            ss[:d] = x * x
            partials = np.zeros(QK_THREADS, F32)
            for chunk in ss.reshape(-1, QK_THREADS):  # j = tid, tid + QK_THREADS, ... in order
                partials = partials + chunk
            inv = F32(1) / np.sqrt(block_sum(partials) / F32(d) + F32(eps))
        xn = x if w is None else x * inv * (F32(offset) + w)  # [d] float32, as each thread forms it
        j = np.arange(d)
        partner = np.where(j < half, j + half, j - half)
        i = np.where(j < half, j, j - half)
        angle = F32(pos[t]) * inv_freq[np.minimum(i, max(half - 1, 0))]  # float32 product
        c = np.cos(angle.astype(np.float64)).astype(F32)
        s = np.sin(angle.astype(np.float64)).astype(F32)
        rotated = np.where(j < half, xn * c - xn[np.minimum(partner, d - 1)] * s,
                           xn * c + xn[np.minimum(partner, d - 1)] * s)
        outs[side][t, hh] = np.where(j < rd, rotated, xn)
        writes[side][t, hh] += 1
    return outs, writes, reads


def stacked(T, nq, nk, d, layout, rng):
    """The flat memory of one projection output and the (base, row, head, heads) of q and k:
    "qkv": [T, (nq + 2 nk) d] (q | k | v); "gated": each q head packed [q | gate] (2d wide)."""
    qw = 2 * d if layout == "gated" else d
    width = nq * qw + 2 * nk * d
    mem = rng.standard_normal(T * width).astype(F32)
    return mem, ((0, width, qw, nq), (nq * qw, width, d, nk)), width


def as_views(mem, T, views, d):
    """The same q and k as NumPy views of ``mem`` (what the layer passes the op)."""
    return [np.lib.stride_tricks.as_strided(mem[base:], (T, n, d), (rs * 4, hs * 4, 4),
                                            writeable=False) for base, rs, hs, n in views]


CASES = [  # T, nq, nk, d, rd, factor, offset, normed sides
    (1, 4, 2, 128, None, 1.0, 0.0, (True, True)),
    (3, 4, 1, 256, None, 8.0, 1.0, (True, True)),
    (2, 2, 2, 256, 64, 1.0, 1.0, (True, True)),
    (4, 3, 1, 130, 2, 1.0, 0.0, (True, False)),
    (2, 1, 1, 66, None, 1.0, 0.0, (False, False)),
    (5, 2, 1, 6, None, 1.0, 0.0, (True, True)),
    (1, 1, 1, 2, None, 1.0, 1.0, (True, True)),
]


@pytest.mark.parametrize("layout", ["qkv", "gated"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_emulated_kernel_matches_the_reference_and_the_closed_form(case, layout):
    T, nq, nk, d, rd, factor, offset, normed = case
    rng = np.random.default_rng(d + T)
    mem, views, _ = stacked(T, nq, nk, d, layout, rng)
    w = [(0.5 + rng.random(d)).astype(F32) if n else None for n in normed]
    pos = rng.integers(0, 40000, T)
    rdim = d if rd is None else rd
    outs, writes, _ = emulate(mem, views, T, d, rdim, pos, w, 1e-6, offset,
                              rope_inv_freq(1e6, rdim, factor))
    q, k = as_views(mem, T, views, d)
    expected = qk_norm_rope(q, k, pos, w[0], w[1], 1e-6, offset, 1e6, rd, factor)
    for name, got, ref, x, ws, n in zip("qk", outs, expected, (q, k), w, writes):
        assert (n == 1).all(), f"{name}: an output element written {set(n.ravel())} times"
        assert_close(got, ref, "float32_rope", op="qk_norm_rope (emulated)", tensor=name,
                     case=f"{layout} {case}")
        assert_close(got, closed_form(x, pos, ws, 1e-6, offset, 1e6, rd, factor),
                     "float32_rope", op="qk_norm_rope (emulated) vs float64", tensor=name,
                     case=f"{layout} {case}")


@pytest.mark.parametrize("layout", ["qkv", "gated"])
def test_the_reads_are_exactly_the_q_and_k_heads_of_the_stacked_product(layout):
    T, nq, nk, d = 3, 4, 2, 8
    rng = np.random.default_rng(1)
    mem, views, width = stacked(T, nq, nk, d, layout, rng)
    _, _, reads = emulate(mem, views, T, d, d, np.arange(T), (None, None), 1e-6, 0.0,
                          rope_inv_freq(1e4, d))
    address = np.arange(mem.size).reshape(T, width)
    qw = 2 * d if layout == "gated" else d
    q_cols = address[:, : nq * qw].reshape(T, nq, qw)[..., :d]  # never the gate half
    k_cols = address[:, nq * qw: nq * qw + nk * d]  # never v's columns
    assert reads[0] == set(q_cols.ravel().tolist())
    assert reads[1] == set(k_cols.ravel().tolist())


def test_block_sum_is_the_butterfly_order_not_the_plain_sum():
    # Values whose float32 sum depends on the order: the butterfly pairs lanes 16 apart first.
    v = np.zeros(QK_THREADS, F32)
    v[0], v[16], v[1] = 1e8, -1e8, 1.0
    assert block_sum(v) == F32(1.0)
    v = np.ones(QK_THREADS, F32)
    assert block_sum(v) == F32(QK_THREADS)


def test_the_launch_constants_match_the_sources():
    assert QK_THREADS % 32 == 0 and QK_THREADS <= 1024
    wrapper = (_build.CUDA_DIR.parent / "rope.py").read_text()
    assert re.search(r'get_kernel\("rope", "qk_norm_rope_f32"\)\(\(rows,\), \(QK_THREADS,\)',
                     wrapper)
    assert "qk_norm_rope_f32" in _build.kernel_names("rope")
    src = (_build.CUDA_DIR / "rope.cu").read_text()
    assert "blockIdx.x; // (t, h) over q's heads, then k's" in src.replace("  //", " //")
