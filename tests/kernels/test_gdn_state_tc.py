"""The GDN state pass on tensor cores (``gdn_chunk_state_tc_f32``, cuda/gdn_chunk_tc.cu).

On CPU: the plan and the constants against the source, the selection, and a NumPy emulation of
the kernel lane by lane: shared memory zeroed as the kernel zeroes it, each lane's A and B
registers loaded by the kernel's index expressions and read into matrices through the PTX ISA's
m16n8k8 .tf32 fragment tables, the 3xTF32 split with its non-finite guard, MMAs as exact
products summed in float32 in several orders (kernels_cupy/tf32.py), the C registers read back
through the ISA's table and interpreted as the kernel does. Each chunk's Delta and next state
are held to the derived per-chunk bound (``gdn_state_tc.chunk_bounds``, float64 evaluations of
the same inputs); one TF32 pass, or a split that drops a cross product, breaks it. Chained with
the prep and output kernels' emulations (tests/kernels/test_gdn_chunk_plan.py) the result meets
the float64 recurrence (``dflash_ref.ops.gdn.gdn_recurrent``) at the twins' ``float32_gdn``
tolerance. On a GPU (``gpu``): the kernel within the same per-chunk bound, and the chunked op
on tensor cores against its float32 twin and the recurrence.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_ref.ops.gdn import gdn_recurrent
from dflash_ref.testing import assert_close
from kernels_cupy import _build
from kernels_cupy import gdn as kgdn
from kernels_cupy import gdn_state_tc as ktc
from kernels_cupy.tf32 import ORDERS, U_TF32, bound_coefficient, gamma
from tests.kernels.test_attention_prefill_tc import ALL_MMAS, _split_regs, mma3
from tests.kernels.test_gdn_chunk_plan import emulate_output_kernel, emulate_prep_kernel
from tests.kernels.test_gdn_plan import SM80_OPTIN, SM86_OPTIN, SM90_OPTIN
from tests.kernels.test_linear_mma import A_RC, B_RC, C_RC
from tests.ops.test_gdn import make_inputs

f = np.float32
LANE = np.arange(32)
G, TG = LANE >> 2, LANE & 3  # groupID, threadID_in_group
WARP = np.arange(ktc.WARPS)


def _src() -> str:
    return (_build.CUDA_DIR / "gdn_chunk_tc.cu").read_text()


def _fmaf(a, b, c):
    return (np.asarray(a, np.float64) * b + c).astype(f)


def emulate_state_tc(W, KdT, U, fold, dC, state, order="sequential", seed=0, mmas=ALL_MMAS):
    """gdn_chunk_state_tc_f32 in NumPy, block by block (value head, slice of 16 columns), the
    warps and lanes vectorised. Shapes as the kernel's; outputs start as NaN and every write is
    counted. Returns (S0s, Delta, state_out, writes)."""
    rng = np.random.default_rng(seed)
    HV, N, C, Kp = W.shape
    K, Cp, V = KdT.shape[2], KdT.shape[3], U.shape[-1]
    lay = ktc.layout(C, K)
    VS, LDS = ktc.VS, ktc.LDS
    S0s, Delta = np.full((HV, N, K, V), np.nan, f), np.full((HV, N, C, V), np.nan, f)
    out = np.full((HV, K, V), np.nan, f)
    writes = {n: np.zeros(a.shape, int) for n, a in (("S0s", S0s), ("Delta", Delta),
                                                     ("state", out))}
    e_ = np.arange(4)
    # element e of (m-tile mt, n-tile x): row 16 mt + g + 8 (e >> 1), column 8 x + 2 t + (e & 1)
    row_in = G[:, None] + 8 * (e_[None] >> 1)  # [32, 4]
    col_in = 2 * TG[:, None] + (e_[None] & 1)  # [32, 4]
    for hv in range(HV):
        for by in range(-(-V // VS)):
            c0 = by * VS
            s = np.zeros((ktc.WARPS, 2, 2, 32, 4), f)  # [warp, j, x, lane, e]
            rows = 16 * (WARP[:, None, None, None, None] + 8 * np.arange(2)[None, :, None, None,
                                                                            None]) + row_in
            cols = 8 * np.arange(2)[None, None, :, None, None] + col_in  # slice columns
            rows, cols = np.broadcast_arrays(rows, cols)
            ok = (rows < K) & (c0 + cols < V)
            s[ok] = state[hv][rows[ok], c0 + cols[ok]]
            sS = np.zeros((max(lay["K16"], 16 * 16), LDS), f)  # rows past K stay 0
            sS[rows[rows < K], cols[rows < K]] = s[rows < K]
            for n in range(N):
                sW = np.zeros((64, lay["ldw"]), f)  # rows past C and columns past Kp: 0
                sW[:C, :Kp] = W[hv, n]
                sK = np.zeros((256, lay["ldk"]), f)
                sK[:K, :Cp] = KdT[hv, n]
                sU = np.zeros((C, VS), f)
                live_c = np.arange(VS) + c0 < V
                sU[:, live_c] = U[hv, n][:, c0 + np.arange(VS)[live_c]]
                sF = np.zeros(lay["C8"], f)
                sF[:C] = fold[hv, n]
                sC = dC[hv, n]
                S0s[hv, n][rows[ok], c0 + cols[ok]] = s[ok]
                np.add.at(writes["S0s"][hv, n], (rows[ok], c0 + cols[ok]), 1)
                # 1. Delta: warp w -> chunk rows 16 (w >> 1) .., n-tile w & 1
                dm, dn = WARP >> 1, WARP & 1
                hi = np.zeros((ktc.WARPS, 16, 8), f)
                lo = np.zeros((ktc.WARPS, 16, 8), f)
                w0 = (16 * dm)[:, None] + G[None]  # [warps, 32]: A rows g (and g + 8)
                bcol = (8 * dn)[:, None] + G[None]  # [warps, 32]: B column g
                for ks in range(lay["Kp8"] // 8):
                    c = 8 * ks + TG
                    a_regs = np.stack([sW[w0, c], sW[w0 + 8, c], sW[w0, c + 4],
                                       sW[w0 + 8, c + 4]], -1)  # [warps, 32, 4]
                    b_regs = np.stack([sS[c[None], bcol], sS[(c + 4)[None], bcol]], -1)
                    hi, lo = mma3(hi, lo, _split_regs(a_regs, A_RC, (16, 8)),
                                  _split_regs(b_regs, B_RC, (8, 8)), order, rng, mmas)
                x = (hi + lo)[:, C_RC[0], C_RC[1]]  # [warps, 32, 4]
                sFD = np.zeros((lay["C8"], LDS), f)
                for w in WARP:
                    if 16 * dm[w] >= C:  # warp-uniform skip
                        continue
                    i, cc = 16 * dm[w] + row_in, 8 * dn[w] + col_in  # [32, 4]
                    keep = i < C
                    live = keep & (c0 + cc < V)
                    d = np.where(live, sU[np.minimum(i, C - 1), cc] - x[w], f(0)).astype(f)
                    Delta[hv, n][i[live], c0 + cc[live]] = d[live]
                    np.add.at(writes["Delta"][hv, n], (i[live], c0 + cc[live]), 1)
                    sFD[i[keep], cc[keep]] = sF[i[keep]] * d[keep]
                # 2. the state: warp w -> state m-tiles w, w + 8, both n-tiles
                for j in range(2):
                    mt = WARP + 8 * j
                    act = 16 * mt < K
                    r0 = (16 * mt)[:, None] + G[None]  # [warps, 32]
                    hi = np.zeros((2, ktc.WARPS, 16, 8), f)
                    lo = np.zeros((2, ktc.WARPS, 16, 8), f)
                    for ks in range(lay["C8"] // 8):
                        c = 8 * ks + TG
                        A = _split_regs(np.stack([sK[r0, c], sK[r0 + 8, c], sK[r0, c + 4],
                                                  sK[r0 + 8, c + 4]], -1), A_RC, (16, 8))
                        for xx in range(2):
                            b_regs = np.stack([sFD[c, 8 * xx + G], sFD[c + 4, 8 * xx + G]], -1)
                            hi[xx], lo[xx] = mma3(hi[xx], lo[xx], A,
                                                  _split_regs(b_regs, B_RC, (8, 8)), order, rng,
                                                  mmas)
                    for xx in range(2):
                        y = (hi[xx] + lo[xx])[:, C_RC[0], C_RC[1]]  # [warps, 32, 4]
                        r = (16 * mt)[:, None, None] + row_in[None]  # [warps, 32, 4]
                        upd = act[:, None, None] & (r < K)
                        dc = sC[np.minimum(r, K - 1)]
                        s[:, j, xx] = np.where(upd, _fmaf(dc, s[:, j, xx], y), s[:, j, xx])
                        cc = 8 * xx + col_in
                        sS[r[upd], np.broadcast_to(cc, r.shape)[upd]] = s[:, j, xx][upd]
            out[hv][rows[ok], c0 + cols[ok]] = s[ok]
            np.add.at(writes["state"][hv], (rows[ok], c0 + cols[ok]), 1)
    return S0s, Delta, out, writes


def _operands(rng, HV, N, C, K, V, adversarial=False):
    """Random state-pass operands with the prep kernel's padding (W zero past K, KdT past C)."""
    Kp, Cp = -(-K // 4) * 4, -(-C // 4) * 4

    def draw(shape, scale=1.0):
        x = (rng.standard_normal(shape) * scale).astype(f)
        if adversarial:  # positive, 0x0FFF below a TF32 value: the lossiest split, no cancelling
            base = np.abs(x) + f(0.5)
            x = ((base.view(np.uint32) & np.uint32(0xFFFFE000)) | np.uint32(0x0FFF)).view(f)
        return x

    W = np.zeros((HV, N, C, Kp), f)
    W[..., :K] = draw((HV, N, C, K), K ** -0.5)
    KdT = np.zeros((HV, N, K, Cp), f)
    KdT[..., :C] = draw((HV, N, K, C), C ** -0.5)
    U = draw((HV, N, C, V))
    fold = np.exp(-rng.uniform(0, 2, (HV, N, C))).astype(f)
    dC = np.exp(-rng.uniform(0, 1, (HV, N, K))).astype(f)
    return W, KdT, U, fold, dC, draw((HV, K, V))


def assert_chunks_within_bound(ops, S0s, Delta, S, what=""):
    """Every chunk's Delta and next state within chunk_bounds; returns the worst ratio."""
    W, KdT, U, fold, dC, _ = ops
    HV, N = W.shape[:2]
    worst = 0.0
    for hv in range(HV):
        for n in range(N):
            nxt = S0s[hv, n + 1] if n + 1 < N else S[hv]
            d_err, d_bnd, s_err, s_bnd = ktc.chunk_bounds(
                W[hv, n], KdT[hv, n], U[hv, n], fold[hv, n], dC[hv, n], S0s[hv, n],
                Delta[hv, n], nxt)
            for name, err, bnd in (("Delta", d_err, d_bnd), ("state", s_err, s_bnd)):
                assert not np.isnan(err).any(), f"{what}: {name} unwritten at chunk {n}"
                if (err > bnd).any():
                    i = np.unravel_index(np.argmax(err - bnd), err.shape)
                    raise AssertionError(f"{what}: {name} of chunk {n}, head {hv} past the "
                                         f"bound at {i}: {err[i]:.3g} > {bnd[i]:.3g}")
                worst = max(worst, float((err / np.maximum(bnd, 1e-300)).max()))
    return worst


# ---------------------------------------------------------------- constants, plan, selection


def test_constants_match_the_cuda_source():
    for name, value in (("GTC_VS", ktc.VS), ("GTC_WARPS", ktc.WARPS), ("GTC_THREADS",
                        ktc.THREADS), ("GTC_MAX_C", ktc.MAX_C), ("GTC_MAX_K", ktc.MAX_K),
                        ("GTC_LDS", ktc.LDS)):
        assert re.search(rf"#define {name} {value}\b", _src()), name
    assert _build.kernel_names(ktc.FAMILY) == (ktc.KERNEL,)
    # 8 warps: 4 m-tiles of chunk rows x 2 n-tiles for Delta; m-tiles w, w + 8 of state rows
    assert ktc.WARPS == (ktc.MAX_C // 16) * (ktc.VS // 8) and 2 * 16 * ktc.WARPS == ktc.MAX_K
    assert ktc.MAX_C == kgdn.MAX_C and ktc.MAX_K == kgdn.MAX_K_CHUNK
    # B reads (row t, column g) of the state and fold * Delta tiles: 32 different banks
    assert len({(t * ktc.LDS + g) % 32 for t in range(4) for g in range(8)}) == 32


def test_the_sources_fragment_loads_are_the_emulations():
    for line in ("const float* w0 = sW + (16 * dm + g) * L.ldw;",
                 "const TcSplit a[4] = {tc_split(w0[c]), tc_split(w1[c]), tc_split(w0[c + 4]),",
                 "const float* b0 = sS + c * GTC_LDS + 8 * dn + g;",
                 "const TcSplit b[2] = {tc_split(b0[0]), tc_split(b0[4 * GTC_LDS])};",
                 "const int i = 16 * dm + g + 8 * (e >> 1), cc = 8 * dn + 2 * t + (e & 1);",
                 "const float* k0 = sK + (16 * mt + g) * L.ldk;",
                 "const float* b0 = sFD + c * GTC_LDS + 8 * x + g;",
                 "const int r = 16 * mt + g + 8 * (e >> 1);",
                 "sS[r * GTC_LDS + 8 * x + 2 * t + (e & 1)] = s[j][x][e];"):
        assert line in _src(), line


def test_layout_and_plan_by_hand():
    # K = 128, C = 64: W [64][132], KdT [128][68], U [64][16], fold 64, dC 128 = 18368 floats a
    # stage; the state tile [128][24] and fold * Delta [64][24] = 4608. Two stages: 165,376
    # bytes, within sm_80's and sm_90's opt-in; sm_86: one stage.
    lay = ktc.layout(64, 128)
    assert (lay["ldw"], lay["ldk"], lay["stage"], lay["fixed"]) == (132, 68, 18368, 4608)
    for limit in (SM80_OPTIN, SM90_OPTIN):
        plan = ktc.plan_state_tc(16, 128, 128, 64, limit)
        assert plan["nbuf"] == 2 and plan["shared_mem"] == 165376
        assert plan["grid"] == (16, 8) and plan["block"] == (256, 1, 1)
    assert ktc.plan_state_tc(16, 128, 128, 64, SM86_OPTIN)["nbuf"] == 1
    with pytest.raises(ValueError, match="beyond"):
        ktc.plan_state_tc(4, 260, 64, 64, SM90_OPTIN)
    with pytest.raises(ValueError, match="smaller chunk_size"):
        ktc.plan_state_tc(4, 256, 64, 64, SM80_OPTIN)  # 172,288 bytes in one stage


def test_the_state_pass_takes_tensor_cores_on_sm80_where_it_fits(monkeypatch):
    assert kgdn.plan_state(16, 128, 128, 64, SM90_OPTIN, True)["kernel"] == ktc.KERNEL
    twin = kgdn.plan_state(16, 128, 128, 64, SM90_OPTIN, False)
    assert twin["kernel"] == "gdn_chunk_state_f32" and twin["family"] == "gdn_chunk"
    assert kgdn.plan_state(16, 128, 128, 64, SM90_OPTIN, True)["family"] == ktc.FAMILY
    # K = 256, C = 64 on an sm_80: the tensor-core tiles do not fit, the twin's do
    assert kgdn.plan_state(4, 256, 64, 64, SM80_OPTIN, True)["kernel"] == "gdn_chunk_state_f32"
    monkeypatch.setattr(ktc, "STATE_TC", False)  # read at call time
    assert kgdn.plan_state(16, 128, 128, 64, SM90_OPTIN, True)["kernel"] == "gdn_chunk_state_f32"


def test_the_wrapper_asks_plan_state_with_the_devices_tensor_cores():
    import inspect

    body = inspect.getsource(kgdn._chunked_block)
    assert "plan_state(HV, K, V, C, limit, has_tensor_cores(cp.cuda.Device().id))" in body


def test_ptxas_keeps_the_kernel_out_of_local_memory():
    from tests.kernels.ptxas import ptxas_entries

    for arch in ("sm_80", "sm_90"):
        entries, log = ptxas_entries(ktc.FAMILY, arch)
        assert [(name, spill) for name, spill, _ in entries] == [(ktc.KERNEL, "0")], log


def test_the_bound_by_hand_at_K128_C64():
    # K = 128: 16 k-steps -> (129, 257); C = 64: 8 k-steps -> (65, 129).
    assert ktc.delta_depths(128) == (129, 257) and ktc.state_depths(64) == (65, 129)
    c_w, c_k = bound_coefficient(129, 257), bound_coefficient(65, 129)
    assert c_k == pytest.approx(3 * U_TF32**2 + gamma(65) + gamma(129) * 2 * U_TF32, rel=1e-3)
    assert 1.6e-5 < c_w < 1.62e-5 and 8.4e-6 < c_k < 8.6e-6
    assert (2 * U_TF32 + U_TF32**2) / c_k > 100  # one TF32 pass: far outside


# ---------------------------------------------------------------- the emulation in the bound

SHAPES = [
    # HV, N, C, K, V
    (2, 3, 16, 16, 40),  # V not a multiple of 16: dead columns
    (1, 2, 10, 33, 7),  # C, K not multiples of 8 or 16: padding rows and columns
    (1, 2, 64, 128, 16),  # the Qwen3.5 shape's chunk and state rows
    (1, 1, 64, 256, 8),  # K = 256: every warp owns two state m-tiles
]


@pytest.mark.parametrize("order", ["sequential", "random"])
@pytest.mark.parametrize(("HV", "N", "C", "K", "V"), SHAPES, ids=str)
def test_emulation_is_within_the_chunk_bound(rng, order, HV, N, C, K, V):
    ops = _operands(rng, HV, N, C, K, V)
    S0s, Delta, S, writes = emulate_state_tc(*ops, order, seed=C)
    for name, count in writes.items():  # every output element written exactly once
        assert np.all(count == 1), name
    np.testing.assert_array_equal(S0s[:, 0], ops[-1])  # the state in, as given
    assert assert_chunks_within_bound(ops, S0s, Delta, S, f"{order}") < 1


@pytest.mark.parametrize(("mmas", "what"), [(("hi_hi",), "one TF32 pass"),
                                            (("lo_hc", "hi_hi"), "a dropped cross product")])
def test_the_bound_is_not_vacuous(rng, mmas, what):
    # The plausible bugs: no split, or a split missing one cross product. On adversarial
    # operands both break the per-chunk bound, where 3xTF32 uses a small part of it.
    ops = _operands(rng, 1, 2, 32, 64, 16, adversarial=True)
    assert assert_chunks_within_bound(ops, *emulate_state_tc(*ops)[:3], "3xTF32") < 0.5
    with pytest.raises(AssertionError, match="past the bound"):
        assert_chunks_within_bound(ops, *emulate_state_tc(*ops, mmas=mmas)[:3], what)


@settings(max_examples=15)
@given(st.data())
def test_emulation_within_the_chunk_bound_over_shapes(data):
    # K in {64, 128, 256} and awkward ones, C up to 64 (a tile, a tile + 1, odd), V around the
    # 16-column slice, every MMA order.
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    K = data.draw(st.sampled_from([5, 64, 100, 128, 256]))
    C = data.draw(st.sampled_from([1, 8, 15, 16, 17, 64]))
    V = data.draw(st.sampled_from([1, 7, 16, 17]))
    N = data.draw(st.integers(1, 3))
    ops = _operands(rng, 1, N, C, K, V)
    out = emulate_state_tc(*ops, data.draw(st.sampled_from(ORDERS)))
    assert_chunks_within_bound(ops, *out[:3], f"K={K} C={C} V={V} N={N}")


def _chained(q, k, v, g, beta, state, scale, C, order="sequential"):
    """prep (emulated) -> the tensor-core state pass (emulated) -> output (emulated)."""
    T, HV = v.shape[:2]
    prep, _ = emulate_prep_kernel(q, k, v, g, beta, C, scale)
    S0s, Delta, S, _ = emulate_state_tc(prep["W"], prep["KdT"], prep["U"], prep["fold"],
                                        prep["dC"], state, order)
    o, _ = emulate_output_kernel(q, prep["G"], prep["P"], S0s, Delta, T, HV, scale)
    return o, S


CASES = [
    # T, H, HV, K, V, C, kda
    (100, 1, 2, 16, 40, 16, False),
    (70, 2, 4, 33, 7, 10, False),  # K, C not multiples of 8, GQA, a padded tail
    (40, 1, 2, 20, 17, 8, True),  # KDA
    (64, 1, 1, 12, 16, 64, False),  # one whole chunk of the largest size
]


@pytest.mark.parametrize("shape", CASES, ids=str)
def test_three_kernels_with_the_tc_state_pass_match_the_float64_recurrence(rng, shape):
    T, H, HV, K, V, C, kda = shape
    args = make_inputs(rng, T, H, HV, K, V, kda=kda, gmin=-3.0)
    o_r, S_r = gdn_recurrent(*args)  # float64
    o, S = _chained(*(a.astype(f) for a in args), K ** -0.5, C, "random")
    assert_close(o, o_r, "float32_gdn", op="gdn_chunk_state_tc_f32 chained (emulated)",
                 case=str(shape))
    assert_close(S, S_r, "float32_gdn", op="gdn_chunk_state_tc_f32 chained (emulated)",
                 tensor="state", case=str(shape))


def test_a_rising_gate_still_poisons_its_head(rng):
    # The prep kernel's stand-in for the reference's ValueError (beta = NaN from the chunk with
    # g > 0 on): through the tensor-core pass the head's outputs from that chunk on and its
    # state are NaN, everything before and every other head finite (the split's guard keeps
    # NaN as NaN; a NaN that a split turned into 0 would hide the rising gate).
    T, H, HV, K, V, C = 60, 1, 2, 8, 6, 16
    args = [a.astype(f) for a in make_inputs(rng, T, H, HV, K, V)]
    args[3][37, 1] = 0.25
    with np.errstate(invalid="ignore"):
        o, S = _chained(*args, K ** -0.5, C)
    assert np.isnan(o[32:, 1]).all() and np.isnan(S[1]).all()
    assert np.isfinite(o[:32, 1]).all() and np.isfinite(o[:, 0]).all() and np.isfinite(S[0]).all()


# ---------------------------------------------------------------- on a GPU


def _tc_or_skip():
    import cupy as cp

    from kernels_cupy.linear import has_tensor_cores

    if not has_tensor_cores(cp.cuda.Device().id):
        pytest.skip("the tensor-core state pass needs sm_80+")
    return cp


@pytest.mark.gpu
@pytest.mark.parametrize(("HV", "N", "C", "K", "V"), SHAPES + [(16, 8, 64, 128, 128)], ids=str)
def test_kernel_is_within_the_chunk_bound(rng, HV, N, C, K, V):
    cp = _tc_or_skip()
    from kernels_cupy._build import get_kernel
    from kernels_cupy._launch import i32

    ops = _operands(rng, HV, N, C, K, V)
    W, KdT, U, fold, dC, state = (cp.asarray(a) for a in ops)
    plan = ktc.plan_state_tc(HV, K, V, C, kgdn._shared_limit())
    S0s, Delta = cp.full((HV, N, K, V), cp.nan, cp.float32), cp.full((HV, N, C, V), cp.nan,
                                                                      cp.float32)
    S = cp.full((HV, K, V), cp.nan, cp.float32)
    kernel = get_kernel(ktc.FAMILY, ktc.KERNEL)
    kgdn._opt_in(kernel, plan["shared_mem"])
    kernel(plan["grid"], plan["block"],
           (W, KdT, U, fold, dC, state, S, S0s, Delta, i32(N), i32(C), i32(K), i32(V),
            i32(plan["Kp"]), i32(plan["Cp"]), i32(plan["nbuf"])), shared_mem=plan["shared_mem"])
    assert_chunks_within_bound(ops, S0s.get(), Delta.get(), S.get(), "kernel")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", CASES + [(2048, 16, 16, 128, 128, 64, False)], ids=str)
def test_chunked_op_on_tensor_cores_beside_its_float32_twin(rng, monkeypatch, shape):
    cp = _tc_or_skip()
    T, H, HV, K, V, C, kda = shape
    args = make_inputs(rng, T, H, HV, K, V, kda=kda, gmin=-3.0)
    o_r, S_r = gdn_recurrent(*args)
    dev = [cp.asarray(a.astype(f)) for a in args]
    o_tc, S_tc = (x.get() for x in kgdn.gdn_chunked(*dev, chunk_size=C))
    monkeypatch.setattr(ktc, "STATE_TC", False)
    o_32, S_32 = (x.get() for x in kgdn.gdn_chunked(*dev, chunk_size=C))
    for o, S, name in ((o_tc, S_tc, "tc"), (o_32, S_32, "float32")):
        assert_close(o, o_r, "float32_gdn", op=f"gdn_chunked ({name})", case=str(shape))
        assert_close(S, S_r, "float32_gdn", op=f"gdn_chunked ({name})", tensor="state")
    assert_close(o_tc, o_32, "float32_gdn", op="gdn_chunked (tc vs float32)", case=str(shape))
