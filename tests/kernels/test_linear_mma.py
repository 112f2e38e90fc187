"""The tensor-core projection ``linear_mma_rows16_*`` (cuda/linear_mma.cu): layout, plan, bound.

On CPU, the kernel's data movement is emulated lane by lane: each lane loads its A (x) and B (w)
registers by the kernel's own index expressions, an MMA reads them into matrices through the
PTX ISA's m16n8k8 .tf32 fragment tables (kernels_cupy/linear_mma_plan.py), multiplies with the
3xTF32 split (kernels_cupy/tf32.py: exact products, float32 additions in any of several orders)
and scatters D back to the lanes' registers; accumulators, warps and the final store follow the
kernel. Against the float64 product (an independent evaluation), the result stays within the
derived bound ``bound_coefficient(d_hi, d_lo) * sum_k |x_k w_k|`` for awkward shapes, every
emulated MMA order and adversarial inputs; a kernel whose loads miss the ISA's layout does
not. The .cu source's load and store expressions are read back and checked against the tables.
On a GPU (``gpu``): the kernel against the float64 product within the same bound.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cupy import _build
from kernels_cupy.linear_mma_plan import (
    COLS,
    FRAGMENT_A,
    FRAGMENT_B,
    FRAGMENT_C,
    KERNELS,
    KSTEP,
    NACC,
    ROWS,
    THREADS,
    WARPS,
    mma_depths,
    plan_mma,
)
from kernels_cupy.linear_plan import plan_linear
from kernels_cupy.tf32 import (
    ORDERS,
    bf16_coefficient,
    bound_coefficient,
    mma_m16n8k8,
    round_bf16,
    split_tf32,
)
from tests.strategies import AWKWARD, f32_arrays

LANE = np.arange(32)
G, TG = LANE >> 2, LANE & 3  # groupID, threadID_in_group


def _table(fragment) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) [32, regs]: the matrix element each lane's register holds, per the ISA."""
    rc = np.array([[f(int(g), int(t)) for f in fragment] for g, t in zip(G, TG)])
    return rc[..., 0], rc[..., 1]


A_RC, B_RC, C_RC = _table(FRAGMENT_A), _table(FRAGMENT_B), _table(FRAGMENT_C)


def _gather(regs: np.ndarray, rc, shape) -> np.ndarray:
    """Registers [..., 32, r] -> the matrix [..., *shape] they hold (each element once)."""
    m = np.full(regs.shape[:-2] + shape, np.nan, np.float32)
    m[..., rc[0], rc[1]] = regs
    return m


def _kernel_loads(x16, wt, k0, a_regs=(0, 1, 2, 3)):
    """The kernel's loads at k-step k0: av [32, 4] and bv [tiles, 32, 2], as the .cu writes
    them: av0 = x[g][ka], av1 = x[g + 8][ka], av2 = x[g][kb], av3 = x[g + 8][kb]; bv0 = w[n0 + g]
    [ka], bv1 = w[n0 + g][kb] (ka = k0 + t, kb = ka + 4). ``a_regs`` permutes the A registers
    (a test's wrong layout)."""
    ka, kb = k0 + TG, k0 + TG + 4
    av = np.stack([x16[G, ka], x16[G + 8, ka], x16[G, kb], x16[G + 8, kb]], -1)[:, list(a_regs)]
    bv = np.stack([wt[:, G, ka], wt[:, G, kb]], -1)  # [tiles, 32, 2]
    return av, bv


def emulate_linear_mma(x, w, order="sequential", weights="float32", a_regs=(0, 1, 2, 3),
                       seed=0):
    """``linear_mma_rows16_*``'s result [T, N], lane by lane (module docstring)."""
    rng = np.random.default_rng(seed)
    T, K = x.shape
    N = w.shape[0]
    tiles, ksteps = math.ceil(N / COLS), math.ceil(K / KSTEP)
    Kp = ksteps * KSTEP
    x16 = np.zeros((ROWS, Kp), np.float32)
    x16[:T, :K] = x  # rows >= T and k >= K: the kernel's guarded loads read 0
    wt = np.zeros((tiles * COLS, Kp), np.float32)
    wt[:N, :K] = round_bf16(w) if weights == "bf16" else w
    wt = wt.reshape(tiles, COLS, Kp)
    red = np.zeros((WARPS, tiles, 32, 4), np.float32)
    for warp in range(WARPS):
        hi = np.zeros((NACC, tiles, 32, 4), np.float32)
        lo = np.zeros((NACC, tiles, 32, 4), np.float32)
        for m, s in enumerate(range(warp, ksteps, WARPS)):
            q = m % NACC
            av, bv = _kernel_loads(x16, wt, s * KSTEP, a_regs)
            ah, al = split_tf32(av)
            bh, bl = (bv, None) if weights == "bf16" else split_tf32(bv)
            mmas = [(al, bh, lo)] + ([] if bl is None else [(ah, bl, lo)]) + [(ah, bh, hi)]
            for a, b, acc in mmas:
                D = mma_m16n8k8(_gather(a, A_RC, (16, 8)), _gather(b, B_RC, (8, 8)),
                                _gather(acc[q], C_RC, (16, 8)), order, rng)  # [tiles, 16, 8]
                acc[q] = D[:, C_RC[0], C_RC[1]]
        h, lsum = hi[0], lo[0]
        for q in range(1, NACC):
            h, lsum = h + hi[q], lsum + lo[q]
        red[warp] = h + lsum
    s = red[0]
    for w8 in range(1, WARPS):
        s = s + red[w8]  # [tiles, 32, 4]
    y = np.full((T, N), np.nan, np.float32)
    for tid in range(32 * 4):  # the kernel's store, as written in the .cu
        ln, i = tid >> 2, tid & 3
        row, col = (ln >> 2) + 8 * (i >> 1), 2 * (ln & 3) + (i & 1)
        n = np.arange(tiles) * COLS + col
        if row < T:
            y[row, n[n < N]] = s[n < N, ln, i]
    return y


def bound(x, w, weights="float32") -> np.ndarray:
    """[T, N]: the stated tolerance of the kernel against the float64 product x w^T."""
    c = (bf16_coefficient if weights == "bf16" else bound_coefficient)(
        *mma_depths(x.shape[1], weights))
    return c * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T)


def assert_within(y, x, w, weights="float32", what=""):
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    err = np.abs(y.astype(np.float64) - exact)
    b = bound(x, w, weights)
    assert not np.isnan(y).any(), f"{what}: an output was never written"
    bad = err > b
    if bad.any():
        i = np.unravel_index(np.argmax(err - b), err.shape)
        raise AssertionError(f"{what}: {bad.sum()} of {err.size} past the bound; worst at {i}: "
                             f"{err[i]:.3g} > {b[i]:.3g}")
    return float((err / np.maximum(b, 1e-300)).max())


def _inputs(T, N, K, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / math.sqrt(max(K, 1))).astype(np.float32)
    return x, w


# ---------------------------------------------------------------- the ISA's tables


@pytest.mark.parametrize(("rc", "shape"), [(A_RC, (16, 8)), (B_RC, (8, 8)), (C_RC, (16, 8))])
def test_fragments_hold_each_element_once(rc, shape):
    # 32 lanes x registers cover the matrix exactly once (a table typo double-covers).
    counts = np.zeros(shape, int)
    np.add.at(counts, (rc[0], rc[1]), 1)
    assert (counts == 1).all()


def test_fragment_tables_by_hand():
    # Lane 5: g = 1, t = 1. A: a0 (1, 1), a1 (9, 1), a2 (1, 5), a3 (9, 5); B: b0 (1, 1) as
    # (k, n), b1 (5, 1); C: c0 (1, 2), c1 (1, 3), c2 (9, 2), c3 (9, 3).
    assert [(int(A_RC[0][5, i]), int(A_RC[1][5, i])) for i in range(4)] == [(1, 1), (9, 1),
                                                                             (1, 5), (9, 5)]
    assert [(int(B_RC[0][5, i]), int(B_RC[1][5, i])) for i in range(2)] == [(1, 1), (5, 1)]
    assert [(int(C_RC[0][5, i]), int(C_RC[1][5, i])) for i in range(4)] == [(1, 2), (1, 3),
                                                                             (9, 2), (9, 3)]


def _src() -> str:
    return (_build.CUDA_DIR / "linear_mma.cu").read_text()


def test_the_sources_loads_follow_the_tables():
    # Each `av[q][i] = (rX && Y_ok) ? __ldg(xX + kY)` names x's row (r0: g, r1: g + 8) and k
    # (ka: t, kb: t + 4); `bv[q][i] = ... (wr + kY)` names B's row k (and column g: wr is row
    # n0 + g). Compared with the ISA's tables at every lane: catches swapped registers.
    rows = {"0": lambda g: g, "1": lambda g: g + 8}
    ks = {"a": lambda t: t, "b": lambda t: t + 4}
    av = re.findall(r"av\[q\]\[(\d)\] = \(r(\d) && (\w)_ok\) \? __ldg\(x(\d) \+ k(\w)\)", _src())
    assert len(av) == 4
    for i, r, ok, xr, k in av:
        assert r == xr and ok == k
        for g, t in zip(G, TG):
            assert FRAGMENT_A[int(i)](g, t) == (rows[r](g), ks[k](t)), (i, g, t)
    bv = re.findall(r"bv\[q\]\[(\d)\] = \(nok && (\w)_ok\) \? LmmWeight<BF16>::load\(wr \+ k(\w)\)",
                    _src())
    assert len(bv) == 2
    for i, ok, k in bv:
        assert ok == k
        for g, t in zip(G, TG):
            assert FRAGMENT_B[int(i)](g, t) == (ks[k](t), g), (i, g, t)
    store = "row = (ln >> 2) + 8 * (i >> 1), col = n0 + 2 * (ln & 3) + (i & 1)"
    assert store in _src()  # the emulation's store; against the C table:
    for ln in range(32):
        for i in range(4):
            want = ((ln >> 2) + 8 * (i >> 1), 2 * (ln & 3) + (i & 1))
            assert FRAGMENT_C[i](ln >> 2, ln & 3) == want


def test_constants_match_the_cuda_source():
    for name, value in (("LMM_THREADS", THREADS), ("LMM_COLS", COLS), ("LMM_KSTEP", KSTEP),
                        ("LMM_NACC", NACC)):
        assert re.search(rf"#define {name} {value}\b", _src()), name
    assert set(KERNELS.values()) | {"weights_to_bf16"} == set(_build.kernel_names("linear_mma"))
    assert "cvt.rna.tf32.f32" in _src()
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in _src()


# ---------------------------------------------------------------- the emulation in the bound

# (T, N, K): N not a multiple of 8, K not a multiple of 8 or of 8 warps' steps, one row, 16
# rows, K shorter than one step, K spanning several accumulator rounds (> 8 * 8 * 8 = 512).
ODD = [(1, 5, 12), (7, 13, 1028), (16, 9, 2560), (3, 6, 1030), (2, 1, 3), (16, 17, 700),
       (5, 7, 0)]


@pytest.mark.parametrize("weights", ["float32", "bf16"])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("T", "N", "K"), ODD, ids=str)
def test_emulation_is_within_the_bound(T, N, K, order, weights):
    x, w = _inputs(T, N, K, seed=T + N + K)
    y = emulate_linear_mma(x, w, order, weights)
    assert y.shape == (T, N)
    if weights == "bf16":  # against the rounded weights: the 3xTF32 bound alone
        assert_within(y, x, round_bf16(w), "float32", f"{T, N, K} {order} bf16 vs rounded")
    assert_within(y, x, w, weights, f"{T, N, K} {order} {weights}")


@given(st.data())
def test_emulation_within_the_bound_for_awkward_shapes(data):
    T = data.draw(st.integers(1, ROWS))
    N, K = data.draw(AWKWARD), data.draw(st.sampled_from([1, 3, 8, 9, 63, 100, 257, 520]))
    x = data.draw(f32_arrays((T, K), -2.0, 2.0, min_abs=2.0**-20))
    w = data.draw(f32_arrays((N, K), -2.0, 2.0, min_abs=2.0**-20))
    order = data.draw(st.sampled_from(ORDERS))
    assert_within(emulate_linear_mma(x, w, order), x, w, what=f"T={T} N={N} K={K} {order}")


def _adversarial(shape, rng, sign=1.0):
    """Operands 0x0FFF below a TF32 value (the largest TF32 rounding error float32 allows)."""
    base = np.abs(rng.standard_normal(shape)).astype(np.float32) + np.float32(0.5)
    bits = (base.view(np.uint32) & np.uint32(0xFFFFE000)) | np.uint32(0x0FFF)
    return (bits.view(np.float32) * np.float32(sign)).astype(np.float32)


@pytest.mark.parametrize("case", ["same_sign", "cancelling", "wide_range"])
def test_adversarial_inputs_stay_within_the_bound(case):
    # same_sign: every product positive and every split as lossy as float32 allows (errors
    # never cancel); cancelling: x's second half the negation of its first, against w's two
    # equal halves (sum ~ 0, sum |x w| large: the bound is relative to the latter); wide_range:
    # magnitudes 2^-30 .. 2^30 (lo parts stay normal).
    rng = np.random.default_rng(11)
    T, N, K = 16, 12, 1040
    if case == "same_sign":
        x, w = _adversarial((T, K), rng), _adversarial((N, K), rng)
    elif case == "cancelling":
        h = _adversarial((T, K // 2), rng)
        x = np.concatenate([h, -h], axis=1)
        wh = _adversarial((N, K // 2), rng)
        w = np.concatenate([wh, wh], axis=1)
    else:
        scale = 2.0 ** rng.integers(-30, 31, (T, K))
        x = (rng.standard_normal((T, K)) * scale).astype(np.float32)
        w = (rng.standard_normal((N, K)) * 2.0 ** rng.integers(-30, 31, (N, K))).astype(np.float32)
    for order in ("sequential", "random"):
        assert_within(emulate_linear_mma(x, w, order), x, w, what=f"{case} {order}")


@pytest.mark.parametrize(("T", "N", "K"), [(16, 9, 2560), (7, 13, 1028)], ids=str)
def test_the_bound_is_not_vacuous_on_plain_inputs(T, N, K):
    # On N(0, 1) inputs one TF32 pass (a_hi b_hi alone) is already outside the bound (3x and 8x
    # here), while float32 (NumPy's matmul) and the 3xTF32 emulation use under 1% of it.
    from kernels_cupy.tf32 import round_tf32

    x, w = _inputs(T, N, K, seed=1)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    one_pass = round_tf32(x).astype(np.float64) @ round_tf32(w).astype(np.float64).T
    assert (np.abs(one_pass - exact) > bound(x, w)).any()
    assert assert_within(x @ w.T, x, w, what="float32") < 0.01
    assert assert_within(emulate_linear_mma(x, w, "random"), x, w, what="3xTF32") < 0.01


def test_a_load_outside_the_isas_layout_breaks_the_bound():
    # a1 and a2 swapped (x[g + 8][t] and x[g][t + 4] crossed): a plausible one-line bug.
    x, w = _inputs(16, 8, 64, seed=5)
    with pytest.raises(AssertionError, match="past the bound"):
        assert_within(emulate_linear_mma(x, w, a_regs=(0, 2, 1, 3)), x, w, what="swapped")


# ---------------------------------------------------------------- the plan


def test_the_plan_takes_tensor_cores_only_when_told():
    # sm_80+ (tensor_cores=True): every 1-16-row product; more rows stay on cuBLAS, none empty.
    for T in (1, 7, 16):
        p = plan_linear(T, 2560, 2560, tensor_cores=True)
        assert (p["family"], p["kernel"], p["TT"]) == ("linear_mma", "linear_mma_rows16_f32", 16)
        assert plan_linear(T, 2560, 2560)["family"] == "linear"
    assert plan_linear(17, 2560, 2560, tensor_cores=True)["path"] == "cublas"
    assert plan_linear(0, 2560, 2560, tensor_cores=True)["path"] == "empty"
    assert plan_linear(4, 2561, 2561, vec4=False, tensor_cores=True)["tiles"] == 321


def test_grid_and_depths_by_hand():
    # N = 4100: 513 tiles of 8; a wave of 264 blocks walks them. K = 1028: 129 k-steps, warp 0
    # takes 17 (steps 0, 8, ..., 128), so its first accumulator takes 3: d_hi = 8 * 3 + 15 = 39,
    # d_lo = 16 * 3 + 15 = 63 (bf16: one lo MMA per step, 39).
    p = plan_mma(16, 4100, 1028, max_blocks=264)
    assert p["tiles"] == 513 and p["grid"] == (264, 1, 1) and p["block"] == (256, 1, 1)
    assert p["depths"] == (39, 63) and mma_depths(1028, "bf16") == (39, 39)
    assert plan_mma(1, 5, 8)["grid"] == (1, 1, 1)
    assert plan_mma(1, 5, 8, weights="bf16")["kernel"] == "linear_mma_rows16_bf16w"


# ---------------------------------------------------------------- the kernels (gpu)

GPU_CASES = [(1, 2560, 2560), (16, 1024, 2560), (7, 13, 1028), (2, 9, 2562), (16, 37, 4100),
             (3, 3, 1), (4, 7, 0), (2, 40001, 8), (16, 151, 9728)]


@pytest.mark.gpu
@pytest.mark.parametrize(("T", "N", "K"), GPU_CASES, ids=str)
def test_kernel_is_within_the_bound(T, N, K):
    import cupy as cp

    from kernels_cupy.linear import has_tensor_cores, linear

    if not has_tensor_cores(cp.cuda.Device().id):
        pytest.skip("the tensor-core kernel needs sm_80+")
    from kernels_cupy.linear import linear_cuda_cores
    from kernels_cupy.linear_plan import summation_depth
    from tests.kernels.test_linear_plan import linear_bound

    x, w = _inputs(T, N, K, seed=T * N + K)
    xd, wd = cp.asarray(x), cp.asarray(w)
    y = linear(xd, wd).get()
    assert_within(y, x, w, what=f"kernel {T, N, K}")
    # Against its twin, the float32 CUDA-core kernel: within the sum of the two bounds.
    twin = linear_cuda_cores(xd, wd).get()
    err = np.abs(y.astype(np.float64) - twin)
    assert (err <= bound(x, w) + linear_bound(x, w, summation_depth(K, K % 4 == 0))).all()


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["same_sign", "cancelling"])
def test_kernel_on_adversarial_inputs(case):
    import cupy as cp

    from kernels_cupy.linear import has_tensor_cores, linear

    if not has_tensor_cores(cp.cuda.Device().id):
        pytest.skip("the tensor-core kernel needs sm_80+")
    rng = np.random.default_rng(2)
    x, w = _adversarial((16, 2048), rng), _adversarial((64, 2048), rng)
    if case == "cancelling":
        x[:, 1024:] = -x[:, :1024]
        w[:, 1024:] = w[:, :1024]
    assert_within(linear(cp.asarray(x), cp.asarray(w)).get(), x, w, what=case)
