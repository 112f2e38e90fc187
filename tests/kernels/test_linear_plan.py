"""The projection kernels ``linear_rows*`` (kernels_cupy/cuda/linear.cu): plan, order, tolerance.

On CPU: the launch plan (which path, which kernel, the grid), the coverage of the mapping (every
weight element read once, every (row, column) written once, for odd shapes), and a NumPy
emulation of the kernel's summation order: per-thread FMA chains over the thread's K slice
(FMA rounded once, emulated exactly), the butterfly across a warp's lanes, the sum across warps
in warp order. The emulation's bookkeeping of the butterfly (which lane keeps which sums, which
lane stores them) is run as the kernel runs it. Against the float64 product (an independent
evaluation) the emulation stays within the stated bound ``gamma_d * sum_k |x_k w_k|``
(``d`` = :func:`kernels_cupy.linear_plan.summation_depth`; docs/performance.md, "The projection
kernel"). On a GPU (``gpu``): the kernel equals the emulation bit for bit.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cupy import _build
from kernels_cupy.linear_plan import (
    COLS,
    MAX_ROWS,
    ROW_TEMPLATES,
    THREADS,
    UNROLL,
    WARPS,
    can_use_vec4,
    kernel_name,
    plan_linear,
    resident_blocks,
    summation_depth,
)
from tests.strategies import AWKWARD, f32_arrays

U32 = 2.0**-24  # unit roundoff of float32

# ---------------------------------------------------------------- exact float32 FMA


def fma32(a, b, c) -> np.ndarray:
    """``fmaf(a, b, c)``: a * b + c rounded once to float32 (broadcasting; float32 inputs).

    a * b is exact in float64 (24 + 24 bits < 53). s = RN64(a * b + c) may round; TwoSum gives
    the exact error e, and s nudged to its odd neighbour towards e (round to odd) rounds to
    float32 exactly as the exact sum would (53 >= 24 + 2 bits: Boldo and Melquiond, "When double
    rounding is odd", 2005), so the emulation is bit exact, not within an ulp.
    """
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    c = np.asarray(c, np.float64)
    s = p + c
    bb = s - p
    e = (p - (s - bb)) + (c - bb)  # TwoSum: p + c == s + e exactly
    even = (s.view(np.uint64) & np.uint64(1)) == 0
    s = np.where((e != 0) & even, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def _rn32_exact(v: Fraction) -> np.float32:
    """The float32 nearest to the rational v (ties to even), by exact comparison."""
    f = np.float32(float(v))
    lo, hi = (np.nextafter(f, np.float32(-np.inf)), f) if Fraction(float(f)) > v else (
        f, np.nextafter(f, np.float32(np.inf)))
    dlo, dhi = v - Fraction(float(lo)), Fraction(float(hi)) - v
    if dlo != dhi:
        return lo if dlo < dhi else hi
    return lo if (lo.view(np.uint32) & 1) == 0 else hi


def test_fma32_rounds_once_where_float64_rounding_twice_fails():
    # a * b = 2^-24 (1 + 2^-23)(1 - 2^-23) = 2^-24 - 2^-70; c = 1 + 2^-23 (odd mantissa).
    # The exact sum is 2^-70 below the float32 midpoint 1 + 3 * 2^-24, so fmaf gives 1 + 2^-23;
    # float64 first rounds it onto the midpoint, whose ties-to-even float32 is 1 + 2^-22.
    a = np.float32(2.0**-12 * (1 + 2.0**-23))
    b = np.float32(2.0**-12 * (1 - 2.0**-23))
    c = np.float32(1 + 2.0**-23)
    assert np.float32(np.float64(a) * np.float64(b) + np.float64(c)) == np.float32(1 + 2.0**-22)
    assert fma32(a, b, c) == np.float32(1 + 2.0**-23)


@given(st.lists(st.floats(-4.0, 4.0, width=32, allow_subnormal=False), min_size=3, max_size=3))
def test_fma32_equals_exact_rational_rounding(abc):
    a, b, c = (np.float32(v) for v in abc)
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    assert fma32(a, b, c) == _rn32_exact(exact)


# ---------------------------------------------------------------- the emulation


def thread_partials(x: np.ndarray, w: np.ndarray, vec4: bool) -> np.ndarray:
    """[THREADS, T, N]: each thread's FMA chain over its element groups j = tid + THREADS m."""
    T, K = x.shape
    N = w.shape[0]
    G = 4 if vec4 else 1
    groups = K // G
    P = np.zeros((THREADS, T, N), np.float32)
    for m in range(math.ceil(groups / THREADS)):
        j = np.arange(THREADS) + m * THREADS  # [THREADS]
        live = j < groups
        for q in range(G):  # the float4's components in order
            k = G * j[live] + q  # [L]
            P[live] = fma32(w[:, k].T[:, None, :], x[:, k].T[:, :, None], P[live])  # [L, T, N]
    return P


def emulate_linear(x: np.ndarray, w: np.ndarray, vec4: bool = True) -> np.ndarray:
    """``linear_rows*``'s result, in its order: thread chains, lane butterfly, warps in order."""
    P = thread_partials(x, w, vec4)
    a = P.reshape(WARPS, 32, *P.shape[1:])  # [warp, lane, T, N]
    for h in (16, 8, 4, 2, 1):  # lane l with l ^ h, l < h: bit 4 first
        a = a[:, :h] + a[:, h:2 * h]
    a = a[:, 0]  # [warp, T, N]
    y = a[0]
    for wi in range(1, WARPS):
        y = y + a[wi]
    return y


def butterfly_as_the_kernel_runs_it(acc: np.ndarray) -> np.ndarray:
    """red [V]: one warp's lin_butterfly steps and stores, lane by lane (acc [32, V]).

    Each step at offset o over H live sums: H >= 2, lanes with bit o set keep the upper half
    (and add base += H / 2), the others the lower half, each adding the partner's copy (the
    shuffle reads lane ^ o); H == 1, both add each other's sum. Lanes store their R sums at
    red[base + i] when their low bits (the H == 1 steps) are clear. Slots start as NaN and a
    second store to a slot fails, so a wrong base or store mask cannot pass.
    """
    acc = acc.copy()
    V = acc.shape[1]
    lane = np.arange(32)
    base = np.zeros(32, int)
    for s, o in enumerate((16, 8, 4, 2, 1)):
        H = max(V >> s, 1)
        partner = lane ^ o
        up = (lane & o) != 0
        if H >= 2:
            half = H // 2
            send = np.where(up[:, None], acc[:, :half], acc[:, half:H])
            keep = np.where(up[:, None], acc[:, half:H], acc[:, :half])
            acc[:, :half] = keep + send[partner]
            base += np.where(up, half, 0)
        else:
            acc[:, 0] = acc[:, 0] + acc[partner, 0]
    R = max(V // 32, 1)
    dup = 1 if V >= 32 else 32 // V
    red = np.full(V, np.nan, np.float32)
    for ln in lane[(lane & (dup - 1)) == 0]:
        for i in range(R):
            assert np.isnan(red[base[ln] + i]), f"V={V}: slot {base[ln] + i} stored twice"
            red[base[ln] + i] = acc[ln, i]
    assert not np.isnan(red).any(), f"V={V}: slots {np.flatnonzero(np.isnan(red))} never stored"
    return red


@pytest.mark.parametrize("TT", ROW_TEMPLATES)
def test_the_kernels_butterfly_stores_each_sum_once_in_the_tree_order(TT):
    V = TT * COLS
    acc = np.random.default_rng(V).standard_normal((32, V)).astype(np.float32)
    red = butterfly_as_the_kernel_runs_it(acc)
    a = acc  # the emulation's tree: lanes l and l ^ 16 first, ..., l ^ 1 last
    for h in (16, 8, 4, 2, 1):
        a = a[:h] + a[h:2 * h]
    np.testing.assert_array_equal(red, a[0])  # bit for bit: the same additions


def linear_bound(x: np.ndarray, w: np.ndarray, d: int) -> np.ndarray:
    """[T, N]: gamma_d * sum_k |x_tk w_nk|, gamma_d = d u / (1 - d u) (Higham, eq. 3.5)."""
    gamma = d * U32 / (1 - d * U32)
    return gamma * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T)


def assert_within(actual, expected, bound, what: str) -> None:
    """|actual - expected| <= bound elementwise, with the worst element in the message."""
    err = np.abs(np.asarray(actual, np.float64) - np.asarray(expected, np.float64))
    bad = err > bound
    if bad.any():
        i = np.unravel_index(np.argmax(err - bound), err.shape)
        raise AssertionError(f"{what}: {bad.sum()} of {err.size} elements past the bound; "
                             f"worst at {i}: error {err[i]:.3g} > bound {bound[i]:.3g}")


def _inputs(T: int, N: int, K: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / math.sqrt(max(K, 1))).astype(np.float32)
    return x, w


# (T, N, K): N not a multiple of COLS, K not a multiple of 4 * THREADS, K % 4 != 0 (scalar),
# K shorter than one group per thread, the Qwen3-4B hidden size.
ODD = [(1, 5, 12), (7, 13, 1028), (16, 9, 2560), (3, 6, 1030), (2, 1, 3), (16, 3, 4100),
       (5, 7, 0)]


@pytest.mark.parametrize(("T", "N", "K"), ODD, ids=str)
def test_emulation_is_within_the_stated_bound_of_float64(T, N, K):
    x, w = _inputs(T, N, K)
    vec4 = K % 4 == 0
    y = emulate_linear(x, w, vec4)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert y.dtype == np.float32 and y.shape == (T, N)
    assert_within(y, exact, linear_bound(x, w, summation_depth(K, vec4)), f"emulation {T, N, K}")


@given(st.data())
def test_emulation_within_the_bound_for_awkward_shapes(data):
    # Any row count the kernel takes, awkward N and K (odd K runs the scalar kernel's order).
    T = data.draw(st.integers(1, MAX_ROWS))
    N, K = data.draw(AWKWARD), data.draw(st.sampled_from([1, 3, 4, 7, 100, 257, 1028, 1030]))
    vec4 = K % 4 == 0 and data.draw(st.booleans())
    x = data.draw(f32_arrays((T, K), -2.0, 2.0, min_abs=2.0**-20))
    w = data.draw(f32_arrays((N, K), -2.0, 2.0, min_abs=2.0**-20))
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert_within(emulate_linear(x, w, vec4), exact, linear_bound(x, w, summation_depth(K, vec4)),
                  f"emulation T={T} N={N} K={K} vec4={vec4}")


def test_the_bound_catches_a_dropped_group():
    # A kernel that skipped the last element group of each thread (an off-by-one in the
    # j < groups guard) is outside the bound: the bound is ~d u of sum |x w|, one term ~1/K of it.
    x, w = _inputs(4, 8, 1028)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    dropped = emulate_linear(x[:, :-4], w[:, :-4])  # the last float4 group missing
    with pytest.raises(AssertionError, match="past the bound"):
        assert_within(dropped, exact, linear_bound(x, w, summation_depth(1028)), "dropped")


# ---------------------------------------------------------------- the plan


@pytest.mark.parametrize(("T", "expected"), [(0, "empty"), (1, "kernel"), (16, "kernel"),
                                             (17, "cublas"), (40, "cublas")])
def test_which_path_runs(T, expected):
    assert plan_linear(T, 2560, 2560)["path"] == expected
    assert plan_linear(T, 0, 2560)["path"] == "empty"


@pytest.mark.parametrize("T", range(1, MAX_ROWS + 1))
def test_rows_round_up_to_the_smallest_template(T):
    p = plan_linear(T, 4096, 2560)
    assert p["TT"] == {1: 1, 2: 2, 3: 4, 4: 4}.get(T, 8 if T <= 8 else 16)
    assert p["kernel"] == f"linear_rows{p['TT']}_vec4_f32"
    assert plan_linear(T, 4096, 2561, vec4=False)["kernel"] == f"linear_rows{p['TT']}_f32"


def test_qwen3_4b_shapes_fill_the_gpu_in_one_wave():
    # (N, K) of every Qwen3-4B projection on 132 SMs: N / 4 tiles, >= 256 (k/v); the grid is
    # one wave of resident blocks (2 per SM at 118-128 registers, 4 at 64) or every tile.
    shapes = [(4096, 2560), (1024, 2560), (6144, 2560), (2560, 4096), (9728, 2560),
              (19456, 2560), (2560, 9728), (151936, 2560)]
    for regs, per_sm in ((128, 2), (118, 2), (64, 4)):
        wave = 132 * resident_blocks(regs)
        assert wave == 132 * per_sm
        for N, K in shapes:
            p = plan_linear(16, N, K, max_blocks=wave)
            assert p["tiles"] == N // 4 >= 256 and p["block"] == (256, 1, 1)
            assert p["grid"] == (min(N // 4, wave), 1, 1) and p["grid"][0] >= min(256, wave)
    assert plan_linear(1, 10, 8)["grid"] == (3, 1, 1)  # no wave given: a block per tile
    # By hand: K = 2560 is 640 float4 groups over 256 threads: 3 for the busiest thread, so
    # d = 3 * 4 FMAs + 5 lane additions + 7 warp additions = 24; K = 9728: 10 * 4 + 12 = 52.
    assert plan_linear(1, 2560, 2560)["depth"] == 24 and summation_depth(9728) == 52
    assert summation_depth(2561, vec4=False) == 11 + 12  # 2561 floats: 11 for thread 0


@pytest.mark.parametrize("m", [0, 1, 3])
@pytest.mark.parametrize("r", [0, 1, 5, THREADS - 1])
@pytest.mark.parametrize("vec4", [True, False])
def test_per_thread_loads_when_k_is_not_a_multiple_of_the_threads(m, r, vec4):
    # K = group * (THREADS * m + r) elements (m = r = 0: K = 0). Thread i takes the groups
    # i, i + THREADS, ...: threads 0..r-1 load m + 1, the others m, so the busiest loads
    # m + (r > 0). Catches a floor instead of a ceiling (the r leftover groups lost) and a count
    # in elements instead of float4 groups.
    group = 4 if vec4 else 1
    groups = THREADS * m + r
    p = plan_linear(1, 8, group * groups, vec4=vec4)
    assert p["group"] == group
    assert p["per_thread"] == m + (1 if r else 0)
    loads = [len(range(i, groups, THREADS)) for i in range(THREADS)]  # the kernel's j loop
    assert max(loads) == p["per_thread"] and loads.count(m + 1) == r


def test_resident_blocks_by_hand():
    # 256 threads = 8 warps. 128 registers: 4096 per warp, 16 warps per 65536 -> 2 blocks;
    # 96: 3072 -> 21 warps -> 2; 40 (-> 1280 per warp): 51 warps -> 6; 32: 8 by threads (2048).
    assert [resident_blocks(r) for r in (128, 96, 40, 32, 255)] == [2, 2, 6, 8, 1]
    # An SM with 1536 threads (sm_86): 6 blocks at most.
    assert resident_blocks(32, threads_per_sm=1536) == 6


def test_vec4_needs_k_and_both_pointers_on_16_bytes():
    assert can_use_vec4(2560, 256, 1024) and not can_use_vec4(2562, 256, 1024)
    assert not can_use_vec4(2560, 256 + 4, 1024) and not can_use_vec4(2560, 256, 1024 + 8)
    with pytest.raises(ValueError, match="K % 4"):
        plan_linear(1, 8, 6, vec4=True)
    with pytest.raises(ValueError, match=">= 0"):
        plan_linear(-1, 8, 8)
    with pytest.raises(ValueError, match="max_blocks >= 1"):
        plan_linear(1, 8, 8, max_blocks=0)


def _coverage(T: int, N: int, K: int, vec4: bool, max_blocks: int | None):
    """(reads [N, K], writes [T, N]): how often the plan's blocks and threads touch each."""
    p = plan_linear(T, N, K, vec4, max_blocks)
    G, groups = p["group"], K // p["group"]
    reads, writes = np.zeros((N, K), int), np.zeros((T, N), int)
    tiles = [tile for b in range(p["grid"][0]) for tile in range(b, p["tiles"], p["grid"][0])]
    for tile in tiles:  # block b: tiles b, b + gridDim.x, ...
        n0 = tile * COLS
        cols = [n0 + c for c in range(COLS) if n0 + c < N]  # the guarded loads
        for tid in range(THREADS):
            for j in range(tid, groups, THREADS):  # j0 += THREADS * UNROLL, u in 0..UNROLL-1
                reads[cols, G * j:G * j + G] += 1
        for v in range(p["TT"] * COLS):  # threads v < V store y[t, n0 + c]
            t, n = divmod(v, COLS)[0], n0 + v % COLS
            if t < T and n < N:
                writes[t, n] += 1
    return reads, writes


@pytest.mark.parametrize(("T", "N", "K"), [(1, 5, 12), (7, 13, 2052), (16, 9, 1030), (16, 4, 8),
                                           (3, 1, 1), (2, 41, 20)], ids=str)
@pytest.mark.parametrize("max_blocks", [None, 1, 3])  # a block per tile; blocks walking tiles
def test_every_weight_read_once_and_every_output_written_once(T, N, K, max_blocks):
    reads, writes = _coverage(T, N, K, K % 4 == 0, max_blocks)
    assert (reads == 1).all(), np.argwhere(reads != 1)[:5]
    assert (writes == 1).all(), np.argwhere(writes != 1)[:5]


@given(st.integers(1, MAX_ROWS), AWKWARD, st.sampled_from([1, 4, 6, 36, 1028]),
       st.one_of(st.none(), st.integers(1, 40)))
def test_coverage_for_any_shape_and_wave(T, N, K, max_blocks):
    reads, writes = _coverage(T, N, K, K % 4 == 0, max_blocks)
    assert (reads == 1).all() and (writes == 1).all()


def test_the_unrolled_loop_visits_the_same_groups_in_the_same_order():
    # The kernel walks j0 = tid, tid + THREADS * UNROLL, ... and j = j0 + u * THREADS inside:
    # the sequence tid, tid + THREADS, tid + 2 THREADS, ... the emulation folds over.
    for tid, groups in [(0, 640), (255, 640), (127, 641), (3, 2)]:
        unrolled = [j0 + u * THREADS for j0 in range(tid, groups, THREADS * UNROLL)
                    for u in range(UNROLL) if j0 + u * THREADS < groups]
        assert unrolled == list(range(tid, groups, THREADS))


def test_constants_match_the_cuda_source():
    src = (_build.CUDA_DIR / "linear.cu").read_text()
    for name, value in (("LIN_THREADS", THREADS), ("LIN_COLS", COLS), ("LIN_UNROLL", UNROLL)):
        assert re.search(rf"#define {name} {value}\b", src), name
    declared = set(_build.kernel_names("linear"))
    for TT in ROW_TEMPLATES:
        for vec4 in (True, False):
            name = kernel_name(TT, vec4)
            assert name in declared
            body = rf"{name}\(LIN_PARAMS\) {{\s*linear_rows_body<{TT}, {str(vec4).lower()}>"
            assert re.search(body, src), name
    assert len(declared) == 2 * len(ROW_TEMPLATES)


# ---------------------------------------------------------------- the kernel (gpu)


@pytest.mark.gpu
@pytest.mark.parametrize(("T", "N", "K", "misalign"), [
    (1, 2560, 2560, False), (16, 1024, 2560, False), (7, 13, 1028, False), (2, 9, 2562, False),
    (16, 37, 4100, False), (5, 11, 1024, True), (3, 3, 1, False), (4, 7, 0, False),
    (2, 40001, 8, False),  # 10001 tiles: more than one wave, blocks walk several tiles
], ids=str)
def test_kernel_equals_the_emulation_bit_for_bit(T, N, K, misalign):
    # Bit for bit: the kernel and the emulation do the same float32 operations in the same
    # order (fmaf emulated exactly by fma32; -ftz=true cannot bite: inputs are N(0, 1), far from
    # subnormals). ``misalign`` shifts x by one float, so the scalar kernel runs.
    import cupy as cp

    from kernels_cupy.linear import linear_cuda_cores as linear  # the float32 twin on any GPU

    x, w = _inputs(T, N, K, seed=T * N + K)
    if misalign:
        buf = cp.empty(T * K + 1, cp.float32)
        xd = buf[1:].reshape(T, K)
        xd[...] = cp.asarray(x)
        assert xd.data.ptr % 16 != 0
    else:
        xd = cp.asarray(x)
    vec4 = can_use_vec4(K, xd.data.ptr, 256)
    y = linear(xd, cp.asarray(w)).get()
    np.testing.assert_array_equal(y, emulate_linear(x, w, vec4), err_msg=f"{T, N, K, misalign}")
