"""Prefill attention on tensor cores (``attention_prefill_tc_f32``, cuda/attention_prefill_tc.cu).

On CPU: the plan and the constants against the source; a NumPy emulation of the kernel, lane by
lane: shared memory as the kernel lays it out (NaN where it never writes), each lane's A and B
registers loaded by the kernel's own index expressions and read into matrices through the PTX
ISA's m16n8k8 .tf32 fragment tables (kernels_cupy/linear_mma_plan.py), the 3xTF32 split with
its non-finite convention, MMAs as exact products summed in float32 in several orders
(kernels_cupy/tf32.py), the C registers read back through the ISA's table and interpreted as the
kernel does (row r0 + 8 (i >> 1), key 8 nt + 2 t + (i & 1)), the online softmax in float32, the
p tile, the masked-key V check and its CUDA-core fallback. Against the float64 reference
(``dflash_ref.ops.attention.attention``: an independent evaluation) the result stays within the
derived bound (``attention_prefill_tc.output_bound``); one TF32 pass, or a split that drops a
cross product, does not. On a GPU (``gpu``): the kernel against the reference within the same
bound, and against its float32 twin v2.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_ref.ops.masks import visible
from kernels_cupy import _build
from kernels_cupy import attention_prefill_tc as ktc
from kernels_cupy.tf32 import (
    ORDERS,
    U_TF32,
    bound_coefficient,
    gamma,
    mma_m16n8k8,
    round_tf32,
)
from tests.kernels.test_attention_prefill import masked_case
from tests.kernels.test_linear_mma import A_RC, B_RC, C_RC, _gather

f32 = np.float32
LANE = np.arange(32)
G, TG = LANE >> 2, LANE & 3  # groupID, threadID_in_group
SM80 = (166912, 167936)  # (opt-in per block, per SM) bytes, CUDA programming guide
SM86 = (101376, 102400)
SM90 = (232448, 233472)
ALL_MMAS = ("lo_hc", "hc_lo", "hi_hi")  # the three products of a 3xTF32 step


def _src() -> str:
    return (_build.CUDA_DIR / "attention_prefill_tc.cu").read_text()


def tc_split(x, guard=True):
    """tf32_mma.cuh's tc_split: (hi, lo, hc) as float32 arrays (lo = hc = 0 where hi is not
    finite; ``guard=False``: the plain split, lo = tf32(x - hi), hc = hi, a test's bug)."""
    x = np.asarray(x, f32)
    hi = round_tf32(x)
    fin = np.abs(hi) < np.inf if guard else np.ones(x.shape, bool)
    with np.errstate(invalid="ignore"):
        lo = np.where(fin, round_tf32(np.where(fin, x - hi, f32(0))), f32(0)).astype(f32)
    return hi, lo, np.where(fin, hi, f32(0)).astype(f32)


def mma3(hi, lo, a, b, order, rng, mmas=ALL_MMAS):
    """tc_mma3 on matrices: lo += a_lo b_hc, lo += a_hc b_lo, hi += a_hi b_hi (``mmas`` keeps a
    subset: a test's broken split). a, b: (hi, lo, hc) of A [..., 16, 8] and B [..., 8, 8]."""
    (ah, al, ac), (bh, bl, bc) = a, b
    with np.errstate(invalid="ignore", over="ignore"):
        if "lo_hc" in mmas:
            lo = mma_m16n8k8(al, bc, lo, order, rng)
        if "hc_lo" in mmas:
            lo = mma_m16n8k8(ac, bl, lo, order, rng)
        if "hi_hi" in mmas:
            hi = mma_m16n8k8(ah, bh, hi, order, rng)
    return hi, lo


def _split_regs(regs, rc, shape, guard=True):
    """Registers [..., 32, r] -> (hi, lo, hc) matrices [..., *shape] (the ISA's table rc)."""
    return tuple(_gather(x, rc, shape) for x in tc_split(regs, guard))


def _fmaf(a, b, c):
    return (np.asarray(a, np.float64) * b + c).astype(f32)


def emulate_prefill_tc(q, k, v, spec, scale, softcap, plan, order="sequential", seed=0,
                       mmas=ALL_MMAS, guard=True, check_v=True):
    """attention_prefill_tc_f32 in NumPy, block by block, the warps and lanes vectorised.

    ``mmas``, ``guard`` (tc_split's non-finite guard) and ``check_v`` (the masked keys' V
    check before the MMA) exist so that tests can show what each part prevents. Returns
    (out [Tq, nh, d] float32, NaN where never written; stats: computed steps, warp steps on the
    CUDA-core fallback)."""
    rng = np.random.default_rng(seed)
    q, k, v = (np.asarray(a, f32) for a in (q, k, v))
    Tq, nh, d = q.shape
    Tk, nkv, _ = k.shape
    BQ, BK, LDP, W = ktc.BQ, ktc.BK, ktc.LDP, ktc.WARPS
    stages, ldk, ldv, gx = plan["stages"], plan["ldk"], plan["ldv"], plan["grid"][0]
    dp, _, _ = ktc.padded_dims(d)
    dt = dp // 8
    k_pos = np.asarray(spec.k_pos) if spec is not None else np.zeros(Tk, int)
    vis_all = np.asarray(visible(spec)) if spec is not None else np.ones((Tq, Tk), bool)
    out = np.full((Tq, nh, d), np.nan, f32)
    stats = {"computed": 0, "fallback": 0}
    n_steps = -(-Tk // BK)
    r0 = 16 * np.arange(W)[:, None] + G[None]  # [W, 32]: the lane's rows r0, r0 + 8
    for bx in range(gx):
        for h in range(nh):
            kvh, i0 = h // (nh // nkv), (gx - 1 - bx) * BQ
            sQ = np.full((BQ, ldk), np.nan, f32)
            sQ[:, :dp] = 0
            n_q = max(0, min(BQ, Tq - i0))
            sQ[:n_q, :d] = q[i0:i0 + n_q, h]
            sK = np.full((stages, BK, ldk), np.nan, f32)
            sV = np.full((stages, BK, ldv), np.nan, f32)
            sK[:, :, d:dp] = sV[:, :, d:dp] = 0  # the pad columns, zeroed once
            sP = np.full((W, 16, LDP), np.nan, f32)
            rows = i0 + np.stack([r0, r0 + 8], -1)  # [W, 32, 2]
            row_ok = rows < Tq
            m = np.full((W, 32, 2), -np.inf, f32)
            lsum = np.zeros((W, 32, 2), f32)
            O = np.zeros((W, 32, dt, 4), f32)

            def vis(t, rows=rows, row_ok=row_ok):  # [W, 32, 4 nt, 4 i]: the C layout's pairs
                hr = np.array([0, 0, 1, 1])  # element i's row: r0 + 8 (i >> 1)
                r, ok = rows[:, :, None, hr], row_ok[:, :, None, hr]  # [W, 32, 1, 4]
                j = (t * BK + 8 * np.arange(4)[:, None] + 2 * TG[:, None, None]
                     + (np.arange(4) & 1))  # [32, 4 nt, 4 i]: key 8 nt + 2 t + (i & 1)
                inside = ok & (j < Tk)
                return inside & vis_all[np.where(inside, r, 0), np.where(inside, j, 0)]

            def issue(t, kvh=kvh, sK=sK, sV=sV):
                b = t % stages
                for jj in range(BK):
                    j = t * BK + jj
                    ok = j < Tk and k_pos[j] >= 0
                    sK[b, jj, :d] = k[j, kvh] if ok else 0
                    sV[b, jj, :d] = v[j, kvh] if ok else 0

            ring = 0
            for s in range(stages - 1):
                flag = s < n_steps and vis(s).any()
                if flag:
                    issue(s)
                ring |= int(flag) << s
            for t in range(n_steps):
                ta = t + stages - 1
                flag = ta < n_steps and vis(ta).any()
                if flag:
                    issue(ta)
                ring |= int(flag) << (stages - 1)
                seen_step, ring = ring & 1, ring >> 1
                if not seen_step:
                    continue
                stats["computed"] += 1
                Ks, Vs = sK[t % stages], sV[t % stages]
                # 1. S = Q K^T: the kernel's loads, then the ISA's tables
                sh = np.zeros((W, 4, 16, 8), f32)
                sl = np.zeros((W, 4, 16, 8), f32)
                for ks in range(dt):
                    c = 8 * ks + TG  # [32]
                    a_regs = np.stack([sQ[r0, c], sQ[r0 + 8, c], sQ[r0, c + 4],
                                       sQ[r0 + 8, c + 4]], -1)  # [W, 32, 4]
                    kr = 8 * np.arange(4)[:, None] + G[None]  # [4 nt, 32]: key 8 nt + g
                    b_regs = np.stack([Ks[kr, c], Ks[kr, c + 4]], -1)  # [4, 32, 2]
                    A = _split_regs(a_regs, A_RC, (16, 8), guard)  # [W, 16, 8] each
                    B = _split_regs(b_regs, B_RC, (8, 8), guard)  # [4, 8, 8]
                    sh, sl = mma3(sh, sl, tuple(x[:, None] for x in A), B, order, rng, mmas)
                S = sh + sl  # [W, 4 nt, 16, 8]
                regs = np.moveaxis(S[..., C_RC[0], C_RC[1]], 1, 2)  # [W, 32, 4 nt, 4 i]
                # 2. mask and the online softmax, per row half hr (i >> 1)
                vb = vis(t)
                with np.errstate(invalid="ignore", over="ignore"):
                    y = regs * f32(scale)
                    if softcap:
                        y = (f32(softcap) * np.tanh(y / f32(softcap))).astype(f32)
                x = np.where(vb, y, f32(-np.inf))
                p = np.zeros_like(x)
                seen = np.zeros((W, 32, 2), bool)
                corr = np.zeros((W, 32, 2), f32)
                quad = (LANE[:, None] & ~3) + np.arange(4)  # [32, 4]: the lanes of a row
                for hr in range(2):
                    xs, vs = x[..., 2 * hr:2 * hr + 2], vb[..., 2 * hr:2 * hr + 2]
                    mx = np.fmax.reduce(xs.reshape(W, 32, 8), axis=-1)
                    mx = np.fmax.reduce(mx[:, quad], axis=-1)  # fmaxf over the quad
                    seen[..., hr] = vs.reshape(W, 32, 8).any(-1)[:, quad].any(-1)
                    m_new = np.fmax(m[..., hr], mx)
                    shift = np.where(m_new == -np.inf, f32(0), m_new).astype(f32)
                    with np.errstate(invalid="ignore", over="ignore"):
                        ph = np.where(vs, np.exp(xs - shift[..., None, None]), f32(-0.0))
                    p[..., 2 * hr:2 * hr + 2] = ph
                    part = np.zeros((W, 32), f32)
                    for j in range(8):  # the lane's 8 in (nt, c) order
                        part = part + ph.reshape(W, 32, 8)[..., j]
                    part = part + part[:, LANE ^ 1]
                    part = part + part[:, LANE ^ 2]
                    with np.errstate(invalid="ignore", over="ignore"):
                        corr[..., hr] = np.exp(m[..., hr] - shift)
                        upd = _fmaf(lsum[..., hr], corr[..., hr], part)
                    lsum[..., hr] = np.where(seen[..., hr], upd, lsum[..., hr])
                    m[..., hr] = np.where(seen[..., hr], m_new, m[..., hr])
                # 3. p -> the warp's tile (C layout), the masked keys' V check
                for nt in range(4):
                    for hr in range(2):
                        for cc in range(2):
                            sP[np.arange(W)[:, None], (G + 8 * hr)[None],
                               (8 * nt + 2 * TG + cc)[None]] = p[:, :, nt, 2 * hr + cc]
                bad = np.zeros(W, bool)
                for w in range(W):
                    kmask = 0
                    for nt in range(4):
                        for cc in range(2):
                            mk = ((row_ok[w, :, 0] & ~vb[w, :, nt, cc])
                                  | (row_ok[w, :, 1] & ~vb[w, :, nt, 2 + cc]))
                            bits = int(np.sum(mk.astype(np.int64) << LANE))  # the ballot
                            for tt in range(4):
                                if bits & (0x11111111 << tt):
                                    kmask |= 1 << (8 * nt + 2 * tt + cc)
                    keys = [j for j in range(BK) if kmask >> j & 1]
                    bad[w] = check_v and bool(keys) and not np.isfinite(Vs[keys, :d]).all()
                stats["fallback"] += int(bad.sum())
                # 4. T = P V (A from the p tile, B = V by the kernel's loads), O update
                T = np.zeros((W, 32, dt, 4), f32)
                pa = []
                for ks in range(4):
                    col = 8 * ks + TG
                    regs_p = np.stack([sP[:, G, col], sP[:, G + 8, col], sP[:, G, col + 4],
                                       sP[:, G + 8, col + 4]], -1)  # [W, 32, 4]
                    pa.append(_split_regs(regs_p, A_RC, (16, 8), guard))
                for nt in range(dt):
                    th = np.zeros((W, 16, 8), f32)
                    tl = np.zeros((W, 16, 8), f32)
                    for ks in range(4):
                        vr = (8 * ks + TG, 8 * nt + G)  # [32] each: V[key][column]
                        b_regs = np.stack([Vs[vr[0], vr[1]], Vs[vr[0] + 4, vr[1]]], -1)
                        th, tl = mma3(th, tl, pa[ks], _split_regs(b_regs, B_RC, (8, 8), guard),
                                      order, rng, mmas)
                    with np.errstate(invalid="ignore", over="ignore"):
                        T[:, :, nt] = (th + tl)[:, C_RC[0], C_RC[1]]
                for w in np.flatnonzero(bad):  # ptc_pv_skip: masked keys skipped, j in order
                    P = sP[w, :, :BK]  # [16, 32]
                    skip = (P == 0) & np.signbit(P)
                    acc = np.zeros((16, dp), f32)
                    with np.errstate(invalid="ignore", over="ignore"):
                        for j in range(BK):
                            acc = np.where(skip[:, j, None], acc, _fmaf(P[:, j, None],
                                                                         Vs[j, :dp], acc))
                    rr = G[:, None] + 8 * (np.arange(4)[None] >> 1)  # [32, 4]
                    for nt in range(dt):
                        T[w, :, nt] = acc[rr, 8 * nt + 2 * TG[:, None] + (np.arange(4) & 1)]
                s4 = np.repeat(seen, 2, axis=-1)[:, :, None, :]  # [W, 32, 1, 4]
                c4 = np.repeat(corr, 2, axis=-1)[:, :, None, :]
                with np.errstate(invalid="ignore", over="ignore"):
                    O = np.where(s4, _fmaf(O, c4, T), O)
            # out = O / l: columns 8 nt + 2 t (+ 1) of rows r0, r0 + 8
            with np.errstate(invalid="ignore", divide="ignore"):
                inv = np.where(lsum > 0, f32(1) / lsum, f32(0)).astype(f32)
                for hr in range(2):
                    for nt in range(dt):
                        for cc in range(2):
                            col = 8 * nt + 2 * TG + cc  # [32]
                            ok = row_ok[..., hr] & (col < d)[None]
                            w_, ln = np.nonzero(ok)
                            out[rows[w_, ln, hr], h, col[ln]] = (
                                O[w_, ln, nt, 2 * hr + cc] * inv[w_, ln, hr])
    return out, stats


def _plan(Tq, nh, nkv, d, stages=None):
    plan = ktc.plan_prefill_tc(Tq, nh, nkv, d, 10**6, 10**7)
    if stages is not None:
        plan = {**plan, "stages": stages, "shared_mem": ktc.shared_bytes(d, stages)}
    return plan


def assert_within_bound(out, q, k, v, spec, scale, what=""):
    """out against the float64 reference within output_bound; returns max(err / bound)."""
    from dflash_ref.ops.attention import attention

    ref = attention(*(np.asarray(a, np.float64) for a in (q, k, v)), spec, scale=scale)
    vis = np.asarray(visible(spec))
    bound = ktc.output_bound(q, k, v, vis, scale)
    assert not np.isnan(out).any(), f"{what}: an output was never written"
    err = np.abs(out.astype(np.float64) - ref)
    bad = err > bound
    if bad.any():
        i = np.unravel_index(np.argmax(err - bound), err.shape)
        raise AssertionError(f"{what}: {bad.sum()} of {err.size} past the bound; worst at {i}: "
                             f"{err[i]:.3g} > {bound[i]:.3g}")
    return float((err / np.maximum(bound, 1e-300)).max())


# ---------------------------------------------------------------- constants, plan, selection


def test_constants_match_the_cuda_source():
    for name, value in (("PTC_WARPS", ktc.WARPS), ("PTC_THREADS", ktc.THREADS),
                        ("PTC_BQ", ktc.BQ), ("PTC_BK", ktc.BK), ("PTC_MAX_D", ktc.MAX_D),
                        ("PTC_DT", ktc.MAX_D // 8), ("PTC_MAX_STAGES", ktc.MAX_STAGES),
                        ("PTC_LDP", ktc.LDP)):
        assert re.search(rf"#define {name} {value}\b", _src()), name
    assert _build.kernel_names(ktc.FAMILY) == (ktc.KERNEL,)
    assert "tf32_mma.cuh" in _build.FAMILY_HEADERS[ktc.FAMILY]
    assert ktc.BQ == 16 * ktc.WARPS and ktc.BK == 4 * 8  # warps x M = 16; four n-tiles


def test_the_sources_fragment_loads_are_the_emulations():
    # The emulation transcribes these lines; a changed index in the kernel must fail here.
    for line in ("const TcSplit a[4] = {tc_split(q0[c]), tc_split(q1[c]), tc_split(q0[c + 4]),",
                 "const float* kr = sK + (8 * nt + g) * ldk;",
                 "const TcSplit b[2] = {tc_split(kr[c]), tc_split(kr[c + 4])};",
                 "const float* p0 = sPw + g * PTC_LDP + 8 * ks + t;",
                 "pa[ks][1] = tc_split(p0[8 * PTC_LDP]);", "pa[ks][2] = tc_split(p0[4]);",
                 "const float* vr = sV + (8 * ks + t) * ldv + 8 * nt + g;",
                 "const TcSplit b[2] = {tc_split(vr[0]), tc_split(vr[4 * ldv])};",
                 "t0 + 8 * nt + 2 * t + (i & 1)",
                 "sPw + (g + 8 * hr) * PTC_LDP + 8 * nt + 2 * t"):
        assert line in _src(), line


def test_padded_strides_by_hand():
    # d = 128: rows of 132 (Q, K: 132 % 32 = 4) and 136 (V: 136 % 32 = 8); d = 36 -> 40 -> 68, 72.
    assert ktc.padded_dims(128) == (128, 132, 136)
    assert ktc.padded_dims(36) == (40, 68, 72)
    for d in (4, 12, 36, 64, 100, 128):
        dp, ldk, ldv = ktc.padded_dims(d)
        banks_a = {(g * ldk + t) % 32 for g in range(8) for t in range(4)}
        banks_v = {(t * ldv + g) % 32 for g in range(8) for t in range(4)}
        assert len(banks_a) == 32 and len(banks_v) == 32 and dp % 8 == 0  # conflict-free


def test_shared_bytes_and_ring_depth_by_hand():
    # d = 128: sQ 64 x 132 + stages x 32 x (132 + 136) + p 4 x 16 x 36 floats.
    assert ktc.shared_bytes(128, 1) == 4 * (8448 + 8576 + 2304) == 77312
    assert ktc.shared_bytes(128, 2) == 111616
    assert ktc.plan_prefill_tc(4096, 32, 8, 128, *SM90)["stages"] == 2  # 2 x 112640 <= 233472
    assert ktc.plan_prefill_tc(4096, 32, 8, 128, *SM80)["stages"] == 1  # 2 x 78336 <= 167936
    assert ktc.plan_prefill_tc(4096, 32, 8, 128, *SM86)["stages"] == 1  # within the opt-in
    plan = ktc.plan_prefill_tc(4096, 32, 8, 128, *SM90, blocks_per_sm=1)
    assert plan["stages"] == 3 and plan["grid"] == (64, 32, 1) and plan["block"] == (128, 1, 1)
    with pytest.raises(ValueError, match="prefill v2 or v1"):
        ktc.plan_prefill_tc(512, 8, 2, 256, *SM90)
    with pytest.raises(ValueError, match="cannot share"):
        ktc.plan_prefill_tc(512, 6, 4, 128, *SM90)


def test_selection_takes_tensor_cores_only_on_sm80_and_where_it_fits(monkeypatch):
    from kernels_cupy import attention_prefill as v2

    assert ktc.prefill_kernel(128, True, tensor_cores=True) == "prefill_tc"
    assert ktc.prefill_kernel(128, True, tensor_cores=False) == "prefill_v2"  # older device
    assert ktc.prefill_kernel(256, True, tensor_cores=True) == "prefill"  # neither fits
    assert ktc.prefill_kernel(66, False, tensor_cores=True) == "prefill"
    monkeypatch.setattr(ktc, "PREFILL_TC", False)  # read at call time
    assert ktc.prefill_kernel(128, True, tensor_cores=True) == "prefill_v2"
    monkeypatch.setattr(v2, "PREFILL_V2", False)
    assert ktc.prefill_kernel(128, True, tensor_cores=True) == "prefill"


def test_the_wrapper_chooses_through_prefill_kernel():
    # The one place: attention_using's "auto" asks prefill_kernel with the device's tensor
    # cores (sm_80+, kernels_cupy.linear.has_tensor_cores), as the projection asks plan_linear.
    import inspect

    src = (_build.CUDA_DIR.parent / "attention.py").read_text()
    assert "prefill_kernel(d, vec4, has_tensor_cores(dev))" in src
    assert '"prefill_tc"' in src
    assert "linear" not in inspect.getsource(ktc.prefill_kernel)


def test_ptxas_keeps_the_kernel_out_of_local_memory():
    from tests.kernels.ptxas import ptxas_entries

    for arch in ("sm_80", "sm_90"):
        entries, log = ptxas_entries(ktc.FAMILY, arch)
        assert [(name, spill) for name, spill, _ in entries] == [(ktc.KERNEL, "0")], log


# ---------------------------------------------------------------- the bound, by hand


def test_the_bound_by_hand_at_d128_and_4096_keys():
    # d = 128: 16 k-steps -> d_hi = 129, d_lo = 257; 4096 keys: 128 steps -> PV depths 161, 193.
    assert ktc.score_depths(128) == (129, 257) and ktc.pv_depths(4096) == (161, 193)
    c_qk = bound_coefficient(129, 257)
    c_pv = bound_coefficient(161, 193)
    assert c_qk == pytest.approx(3 * U_TF32**2 + gamma(129) + gamma(257) * 2 * U_TF32, rel=1e-3)
    assert 1.6e-5 < c_qk < 1.62e-5 and 1.99e-5 < c_pv < 2.0e-5
    assert (2 * U_TF32 + U_TF32**2) / c_qk > 60  # one TF32 pass: far outside


# ---------------------------------------------------------------- the emulation in the bound

CASES = [
    # Tq, nh, nkv, d, Tk, kind, softcap
    (100, 4, 2, 8, 100, "causal", None),  # GQA, partial query and key tiles
    (70, 2, 1, 12, 300, "window", None),  # a prefix, a window; d = 12: a half n-tile of pad
    (65, 2, 2, 4, 97, "tree", None),  # ancestors over a committed prefix; d = 4
    (64, 2, 1, 128, 100, "causal", None),  # the largest head dim
    (80, 2, 1, 16, 120, "causal", 5.0),  # softcap
    (64, 1, 1, 8, 64, "empty", None),  # no visible key at all -> zeros
    (130, 3, 1, 36, 140, "none", None),  # g = 3, every slot visible; d = 36
]


@pytest.mark.parametrize("order", ["sequential", "random"])
@pytest.mark.parametrize(("Tq", "nh", "nkv", "d", "Tk", "kind", "softcap"), CASES)
def test_emulation_is_within_the_bound(rng, order, Tq, nh, nkv, d, Tk, kind, softcap):
    q, k, v, spec = masked_case(rng, Tq, nh, nkv, d, Tk, kind)
    stages = 1 + (Tq + Tk) % 3  # every ring depth over the cases
    out, stats = emulate_prefill_tc(q, k, v, spec, 0.3, softcap, _plan(Tq, nh, nkv, d, stages),
                                    order, seed=Tq)
    assert stats["fallback"] == 0  # invalid slots arrive as zeros: no non-finite V to check
    if kind == "empty":
        assert stats["computed"] == 0 and np.array_equal(out, np.zeros_like(out))
        return
    if softcap:  # the bound is stated without softcap: the float32 twins' tolerance here
        from dflash_ref.ops.attention import attention
        from dflash_ref.testing import assert_close

        assert_close(out, attention(q, k, v, spec, scale=0.3, softcap=softcap),
                     "float32_attention", op="attention_prefill_tc_f32 (emulated, softcap)")
        return
    assert assert_within_bound(out, q, k, v, spec, 0.3, f"{kind} {order}") < 1


def _adversarial(shape, rng):
    """Positive operands 0x0FFF below a TF32 value: every split as lossy as float32 allows, the
    errors never cancelling (tests/kernels/test_tf32_bound.py)."""
    base = np.abs(rng.standard_normal(shape)).astype(f32) + f32(0.5)
    bits = (base.view(np.uint32) & np.uint32(0xFFFFE000)) | np.uint32(0x0FFF)
    return bits.view(f32)


def _adversarial_case(rng, Tq=64, Tk=96, d=64):
    from dflash_ref.ops.masks import MaskSpec

    q, k, v = _adversarial((Tq, 1, d), rng), _adversarial((Tk, 1, d), rng), \
        _adversarial((Tk, 1, d), rng)
    return q, k, v, MaskSpec(np.arange(Tk - Tq, Tk), np.arange(Tk), causal=True)


@pytest.mark.parametrize(("mmas", "what"), [(("hi_hi",), "one TF32 pass"),
                                            (("lo_hc", "hi_hi"), "a dropped cross product")])
def test_the_bound_is_not_vacuous(rng, mmas, what):
    # The plausible bugs: one TF32 pass (no split), or a split that forgets one cross product;
    # both break the bound on adversarial operands, where 3xTF32 uses a small part of it.
    q, k, v, spec = _adversarial_case(rng)
    plan = _plan(64, 1, 1, 64)
    out, _ = emulate_prefill_tc(q, k, v, spec, 0.125, None, plan)
    assert assert_within_bound(out, q, k, v, spec, 0.125, "3xTF32") < 0.5
    broken, _ = emulate_prefill_tc(q, k, v, spec, 0.125, None, plan, mmas=mmas)
    with pytest.raises(AssertionError, match="past the bound"):
        assert_within_bound(broken, q, k, v, spec, 0.125, what)


@settings(max_examples=12)
@given(st.data())
def test_emulation_within_the_bound_over_shapes(data):
    # Awkward shapes: rows not a multiple of 64, keys == a step (32) and a step + 1, d over the
    # kernel's range (4 .. 128, multiples of 4), GQA.
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    d = data.draw(st.sampled_from([4, 12, 64, 100, 128]))
    Tk = data.draw(st.sampled_from([32, 33, 64, 65, 97]))
    Tq = data.draw(st.integers(1, Tk))
    nkv = data.draw(st.sampled_from([1, 2]))
    kind = data.draw(st.sampled_from(["causal", "window", "tree", "none"]))
    q, k, v, spec = masked_case(rng, Tq, 2 * nkv, nkv, d, Tk, kind)
    out, _ = emulate_prefill_tc(q, k, v, spec, d ** -0.5, None,
                                _plan(Tq, 2 * nkv, nkv, d, data.draw(st.integers(1, 3))),
                                data.draw(st.sampled_from(ORDERS)))
    assert_within_bound(out, q, k, v, spec, d ** -0.5, f"{Tq, d, Tk, kind}")


# ---------------------------------------------------------------- on a GPU

GPU_CASES = [
    # Tq, nh, nkv, d, Tk, kind
    (512, 32, 8, 128, 512, "causal"),  # Qwen3-shaped prefill (GQA 4)
    (300, 8, 2, 128, 1500, "window"),  # a prompt continued after a cached prefix
    (200, 4, 4, 64, 200, "none"),
    (130, 4, 2, 128, 400, "tree"),
    (96, 2, 1, 36, 250, "causal"),  # d not a multiple of 8: pad columns
    (65, 2, 1, 128, 33, "none"),  # keys = a step + 1
]


@pytest.mark.gpu
@pytest.mark.parametrize(("Tq", "nh", "nkv", "d", "Tk", "kind"), GPU_CASES)
def test_prefill_tc_kernel_within_the_bound_and_beside_v2(rng, Tq, nh, nkv, d, Tk, kind):
    import cupy as cp

    from dflash_ref.testing import assert_close
    from kernels_cupy.attention import attention_using
    from kernels_cupy.linear import has_tensor_cores

    if not has_tensor_cores(cp.cuda.Device().id):
        pytest.skip("the tensor-core prefill kernel needs sm_80+")
    q, k, v, spec = masked_case(rng, Tq, nh, nkv, d, Tk, kind)
    q, k, v = (a.astype(f32) for a in (q, k, v))
    dev = [cp.asarray(a) for a in (q, k, v)]
    got = cp.asnumpy(attention_using("prefill_tc", *dev, spec, scale=d ** -0.5))
    assert_within_bound(got, q, k, v, spec, d ** -0.5, f"kernel {Tq, nh, nkv, d, Tk} {kind}")
    twin = cp.asnumpy(attention_using("prefill_v2", *dev, spec, scale=d ** -0.5))
    assert_close(got, twin, "float32_attention", op="attention (prefill tc vs v2)",
                 case=f"{Tq, nh, nkv, d, Tk} {kind}")
    auto = cp.asnumpy(attention_using("auto", *dev, spec, scale=d ** -0.5))
    if Tq >= 64 and nh * -(-Tq // 64) >= 0.4 * cp.cuda.Device().attributes[
            "MultiProcessorCount"]:
        assert np.array_equal(auto, got)  # the prefill shapes take this kernel on sm_80+


@pytest.mark.gpu
def test_prefill_tc_kernel_on_adversarial_operands(rng):
    import cupy as cp

    from kernels_cupy.attention import attention_using
    from kernels_cupy.linear import has_tensor_cores

    if not has_tensor_cores(cp.cuda.Device().id):
        pytest.skip("the tensor-core prefill kernel needs sm_80+")
    q, k, v, spec = _adversarial_case(rng, 256, 512, 128)
    got = cp.asnumpy(attention_using("prefill_tc", *(cp.asarray(a) for a in (q, k, v)), spec,
                                     scale=0.125))
    assert_within_bound(got, q, k, v, spec, 0.125, "adversarial")
