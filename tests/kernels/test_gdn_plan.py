"""The CuPy GDN twins' launch plans and index arithmetic, checked on CPU (no GPU needed).

- gdn_chunked works in blocks of whole chunks (kernels_cupy.gdn.plan_chunk_blocks) sized by a
  byte budget (chunks_per_block_for): the plan must tile [0, T) on chunk boundaries, and the
  temporaries of one block must stay bounded however long T is (128k tokens included).
- gdn_recurrent_f32 gives lane x of warp y column ``tile * 32 + x`` and rows y, y + 8, ...: the
  emulation below runs that ownership and summation order in NumPy float32 and is compared with
  the reference; the address arithmetic is checked to be a bijection and coalesced.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from dflash_ref.ops.gdn import CHUNKS_PER_BLOCK, gdn_chunked, gdn_recurrent
from dflash_ref.testing import assert_close
from kernels_cupy import _build
from kernels_cupy import gdn as kgdn
from tests.ops.test_gdn import make_inputs


def _define(name: str) -> int:
    src = "".join((_build.CUDA_DIR / f).read_text() for f in ("gdn.cu", "gdn_chunk.cu"))
    return int(re.search(rf"#define {name} (\d+)", src).group(1))


def test_constants_match_the_cuda_source():
    assert (kgdn.REC_COLS, kgdn.REC_WARPS) == (_define("GDN_REC_COLS"), _define("GDN_REC_WARPS"))
    assert kgdn.MAX_K_RECURRENT == _define("GDN_REC_WARPS") * _define("GDN_REC_MAX_ROWS")
    assert kgdn.MAX_C == _define("GDN_MAX_C") and kgdn.MAX_K_CHUNK == _define("GDN_MAX_K")
    assert (kgdn.ST_VS, kgdn.ST_TY) == (_define("GDN_ST_VS"), _define("GDN_ST_TY"))
    assert kgdn.ST_VS * kgdn.ST_TY == _define("GDN_ST_THREADS")
    assert (kgdn.ST_MAX_RPT, kgdn.ST_MAX_IPT) == (_define("GDN_ST_MAX_RPT"),
                                                  _define("GDN_ST_MAX_IPT"))
    assert kgdn.ST_TY * kgdn.ST_MAX_RPT >= kgdn.MAX_K_CHUNK
    assert kgdn.ST_TY * kgdn.ST_MAX_IPT >= kgdn.MAX_C


# ---------------------------------------------------------------- gdn_chunked: the block plan


@pytest.mark.parametrize("T", [1, 63, 64, 65, 1023, 1024, 1025, 5000, 131072 + 17])
@pytest.mark.parametrize(("C", "n"), [(64, 16), (16, 16), (1, 3), (64, 32)])
def test_block_plan_tiles_the_sequence_on_chunk_boundaries(T, C, n):
    plan = kgdn.plan_chunk_blocks(T, C, n)
    assert plan[0][0] == 0 and plan[-1][1] == T
    assert all(a[1] == b[0] for a, b in zip(plan, plan[1:]))  # no gap, no overlap
    assert all(t1 - t0 == C * n for t0, t1 in plan[:-1])  # whole chunks: boundaries unchanged
    assert 0 < plan[-1][1] - plan[-1][0] <= C * n
    assert len(plan) == math.ceil(T / (C * n))


def test_block_plan_of_an_empty_sequence_is_empty():
    assert kgdn.plan_chunk_blocks(0, 64, 16) == []
    with pytest.raises(ValueError, match="chunks_per_block"):
        kgdn.plan_chunk_blocks(10, 64, 0)


@pytest.mark.parametrize(("HV", "K", "V", "kda"), [(32, 128, 128, False), (16, 128, 128, False),
                                                   (64, 128, 128, False), (4, 256, 64, True)])
def test_one_block_stays_within_the_budget_and_does_not_grow_with_T(HV, K, V, kda):
    C = 64
    n = kgdn.chunks_per_block_for(HV, K, V, C, kda)
    assert n >= CHUNKS_PER_BLOCK and n & (n - 1) == 0  # a power of two, at least the reference's
    block = n * kgdn.chunk_bytes_per_chunk(HV, K, V, C, kda)
    floor = CHUNKS_PER_BLOCK * kgdn.chunk_bytes_per_chunk(HV, K, V, C, kda)
    assert block <= max(kgdn.BLOCK_BYTES, floor)
    # At 128k tokens the one-pass wrapper needed every temporary over the whole prompt (4 heads
    # of K = 256: a block is 1/8 of it, 16 heads of 128: 1/16):
    whole = math.ceil(131072 / C) * kgdn.chunk_bytes_per_chunk(HV, K, V, C, kda)
    assert block * 4 <= whole, (block, whole)
    assert block <= 2**30  # <= 1 GiB whatever T is


def test_budget_is_read_at_call_time(monkeypatch):
    monkeypatch.setattr(kgdn, "BLOCK_BYTES", 1)
    assert kgdn.chunks_per_block_for(16, 128, 128, 64, False) == CHUNKS_PER_BLOCK


def test_reference_blocking_is_exact_for_any_block_size(monkeypatch, rng):
    # The premise of the blocked twin: carrying the state between blocks of whole chunks is the
    # recurrence itself. Oracle: the recurrent form (the ground truth), float64.
    import dflash_ref.ops.gdn as ref

    args = make_inputs(rng, 200, 2, 4, 16, 12, gmin=-5.0)
    o_r, S_r = gdn_recurrent(*args)
    for n in (1, 3, 1000):
        monkeypatch.setattr(ref, "CHUNKS_PER_BLOCK", n)
        o_c, S_c = gdn_chunked(*args, chunk_size=16)
        assert_close(o_c, o_r, "float64_gdn", op="gdn_chunked", case=f"{n} chunks per block")
        assert_close(S_c, S_r, "float64_gdn", op="gdn_chunked", tensor="state", case=f"{n}")


# ---------------------------------------------------------------- gdn_recurrent_f32: mapping


def _thread_rows(K: int, wy: int) -> list[int]:
    """Rows of warp wy in gdn_recurrent_f32: kk = wy + GDN_REC_WARPS * i, i < GDN_REC_MAX_ROWS."""
    return [wy + kgdn.REC_WARPS * i for i in range(_define("GDN_REC_MAX_ROWS"))
            if wy + kgdn.REC_WARPS * i < K]


def emulate_recurrent_kernel(q, k, v, g, beta, state, scale):
    """gdn_recurrent_f32 in NumPy float32, thread by thread (one value head, one column tile at
    a time, lanes vectorised), with the kernel's summation order: a thread's rows in i order,
    then the warps' partials in w order. Returns (o, final_state, addresses written)."""
    T, H, K = q.shape
    HV, V = v.shape[1:]
    W, L = kgdn.REC_WARPS, kgdn.REC_COLS
    f = np.float32
    o = np.zeros((T, HV, V), f)
    S_out = np.zeros((HV, K, V), f)
    state_addr, trace_addr = [], []
    for hv in range(HV):
        hk = hv // (HV // H)
        for tile in range(-(-V // L)):
            cols = tile * L + np.arange(L)
            live = cols < V
            c = np.where(live, cols, 0)
            rows = [_thread_rows(K, wy) for wy in range(W)]
            s = [np.stack([np.where(live, state[hv, kk, c], f(0)) for kk in r]) if r else
                 np.zeros((0, L), f) for r in rows]  # s[wy]: [rows of wy, lanes]
            for t in range(T):
                decay = f(np.exp(g[t, hv])) if g.ndim == 2 else None
                part = np.zeros((W, L), f)
                for wy in range(W):
                    for i, kk in enumerate(rows[wy]):
                        d = f(np.exp(g[t, hv, kk])) if decay is None else decay
                        s[wy][i] = s[wy][i] * d
                        part[wy] = part[wy] + s[wy][i] * k[t, hk, kk]
                rd = np.zeros(L, f)
                for wy in range(W):
                    rd = rd + part[wy]
                delta = beta[t, hv] * (np.where(live, v[t, hv, c], f(0)) - rd)
                part = np.zeros((W, L), f)
                for wy in range(W):
                    for i, kk in enumerate(rows[wy]):
                        s[wy][i] = s[wy][i] + k[t, hk, kk] * delta
                        part[wy] = part[wy] + s[wy][i] * q[t, hk, kk]
                out = np.zeros(L, f)
                for wy in range(W):
                    out = out + part[wy]
                o[t, hv, cols[live]] = (f(scale) * out)[live]
                th = t * HV + hv
                for wy in range(W):
                    for kk in rows[wy]:
                        trace_addr.append((th * K + kk) * V + cols[live])
            for wy in range(W):
                for i, kk in enumerate(rows[wy]):
                    S_out[hv, kk, cols[live]] = s[wy][i][live]
                    state_addr.append((hv * K + kk) * V + cols[live])
    return o, S_out, state_addr, trace_addr


@pytest.mark.parametrize("shape", [(3, 1, 2, 16, 40, False), (2, 2, 4, 33, 7, False),
                                   (2, 1, 1, 20, 33, True), (1, 1, 1, 256, 3, False)], ids=str)
def test_recurrent_kernel_mapping_matches_the_reference(rng, shape):
    T, H, HV, K, V, kda = shape
    args = tuple(a.astype(np.float32) for a in make_inputs(rng, T, H, HV, K, V, kda=kda))
    scale = K ** -0.5
    o, S, state_addr, trace_addr = emulate_recurrent_kernel(*args, scale)
    o_r, S_r = gdn_recurrent(*args)  # the reference, float32 (another summation order)
    assert_close(o, o_r, "float32_gdn", op="gdn_recurrent_f32 (emulated)", case=str(shape))
    assert_close(S, S_r, "float32_gdn", op="gdn_recurrent_f32 (emulated)", tensor="state")
    # Every state element written exactly once; every trace element exactly once.
    flat = np.concatenate(state_addr)
    assert np.array_equal(np.sort(flat), np.arange(HV * K * V))
    flat = np.concatenate(trace_addr)
    assert np.array_equal(np.sort(flat), np.arange(T * HV * K * V))


def test_recurrent_state_accesses_are_coalesced():
    # For a fixed (head, row), the 32 lanes of a warp touch 32 consecutive floats of the state
    # (one 128-byte transaction), where the old lane -> row mapping strode V floats (512 bytes).
    K, V, hv, kk, tile = 128, 128, 3, 17, 2
    lanes = np.arange(kgdn.REC_COLS)
    addr = (hv * K + kk) * V + tile * kgdn.REC_COLS + lanes
    assert np.all(np.diff(addr) == 1) and addr[0] % 32 == 0


# ---------------------------------------------------------------- gdn_chunk_state_f32: plan


SM80_OPTIN, SM86_OPTIN, SM90_OPTIN = 166912, 101376, 232448  # bytes, CUDA programming guide


def test_state_plan_hand_count():
    # K = C = 2 -> Kp = Cp = 4. Stage: W 2*8 + KdT 2*8 + U 2*16 + fold 4 + dC 4 = 72 floats;
    # once: state tile 16*8 + fold*Delta 16*8 = 256 floats. Two stages: 4 * (144 + 256) bytes.
    plan = kgdn.plan_state_pass(3, 2, 40, 2, SM90_OPTIN)
    assert plan == {"grid": (3, 3), "block": (16, 16), "Kp": 4, "Cp": 4, "nbuf": 2,
                    "shared_mem": 1600}


def test_state_plan_fills_the_gpu_and_fits_each_architecture():
    # Qwen3.5's GDN (16 value heads, K = V = 128, C = 64): 128 blocks (the old pass had 64),
    # double-buffered on sm_80 and sm_90, single-buffered within sm_86's 99 KiB.
    for limit in (SM80_OPTIN, SM90_OPTIN):
        plan = kgdn.plan_state_pass(16, 128, 128, 64, limit)
        assert plan["grid"] == (16, 8) and plan["nbuf"] == 2 and plan["shared_mem"] <= limit
    plan = kgdn.plan_state_pass(16, 128, 128, 64, SM86_OPTIN)
    assert plan["nbuf"] == 1 and plan["shared_mem"] <= SM86_OPTIN
    big = kgdn.plan_state_pass(4, 256, 64, 64, SM80_OPTIN)  # K = 256: one stage
    assert big["nbuf"] == 1 and big["shared_mem"] <= SM80_OPTIN
    with pytest.raises(ValueError, match="smaller chunk_size"):
        kgdn.plan_state_pass(4, 256, 64, 64, SM86_OPTIN)
    with pytest.raises(ValueError, match="beyond the state kernel"):
        kgdn.plan_state_pass(4, 260, 64, 64, SM90_OPTIN)


# ---------------------------------------------------------------- gdn_chunk_state_f32: mapping


def emulate_state_kernel(W, KdT, U, fold, dC, state):
    """gdn_chunk_state_f32 in NumPy float32, block by block (value head, slice of ST_VS
    columns), the block's threads vectorised: Delta rows summed over r = 0 .. Kp-1 in order,
    state rows over i = 0 .. Cp-1 in order (one float32 rounding per product and per sum; the
    kernel fuses them with fmaf). Shapes as the kernel's; outputs start as NaN and every write
    is counted, so an element written twice or never fails.
    Returns (S0s, Delta, state_out, writes) with writes[name] the per-element write counts."""
    HV, N, C, Kp = W.shape
    K, Cp, V = KdT.shape[2], KdT.shape[3], U.shape[-1]
    f, VS = np.float32, kgdn.ST_VS
    S0s, Delta = np.full((HV, N, K, V), np.nan, f), np.full((HV, N, C, V), np.nan, f)
    out = np.full((HV, K, V), np.nan, f)
    writes = {n: np.zeros(a.shape, int) for n, a in (("S0s", S0s), ("Delta", Delta),
                                                     ("state", out))}
    for hv in range(HV):
        for by in range(-(-V // VS)):
            cols = by * VS + np.arange(VS)
            live = cols < V
            c = np.where(live, cols, 0)
            s = np.zeros((Kp, VS), f)  # the state tile; rows past K stay 0 (the zero fill)
            s[:K] = np.where(live, state[hv][:, c], f(0))
            for n in range(N):
                S0s[hv, n][:, cols[live]] = s[:K, live]
                writes["S0s"][hv, n][:, cols[live]] += 1
                acc = np.zeros((C, VS), f)
                for r in range(Kp):  # W is zero past K
                    acc = acc + W[hv, n, :, r, None] * s[r]
                d = np.where(live, np.where(live, U[hv, n][:, c], f(0)) - acc, f(0))
                Delta[hv, n][:, cols[live]] = d[:, live]
                writes["Delta"][hv, n][:, cols[live]] += 1
                dT = np.zeros((Cp, VS), f)
                dT[:C] = fold[hv, n, :, None] * d  # fold * Delta, zero past C
                acc2 = np.zeros((K, VS), f)
                for i in range(Cp):
                    acc2 = acc2 + KdT[hv, n, :, i, None] * dT[i]
                s[:K] = dC[hv, n, :, None] * s[:K] + acc2
            out[hv][:, cols[live]] = s[:K, live]
            writes["state"][hv][:, cols[live]] += 1
    return S0s, Delta, out, writes


def emulate_chunked_block(q, k, v, g, beta, state, scale, C):
    """The state kernel alone on one block in NumPy float32: the reference's intra-chunk algebra
    (ops/_gdn_chunk.py) for W, U, P, Q e^G; the operands the prep kernel builds for the state
    kernel (K^T and fold = e^(G_C - G) for a scalar gate, decayed K^T and fold = 1 for KDA; W and
    KdT zero-padded to Kp, Cp); :func:`emulate_state_kernel`; O = (Q e^G) S0 + P Delta. (The
    three kernels chained, prep and output emulated too: tests/kernels/test_gdn_chunk_plan.py.)"""
    from dflash_ref.ops._gdn_chunk import chunk_view, intra_chunk_kda, intra_chunk_scalar

    T, H, K = q.shape
    HV, V = v.shape[1:]
    kda = g.ndim == 3
    N, r = -(-T // C), HV // H
    f = np.float32
    Qc, Kc = (chunk_view(np.repeat(x, r, axis=1), N, C) for x in (q, k))  # [N, HV, C, K]
    Vc, bc = chunk_view(v, N, C), chunk_view(beta[:, :, None], N, C)
    G = np.cumsum(chunk_view(g if kda else g[:, :, None], N, C), axis=2, dtype=f)
    if kda:
        parts = [intra_chunk_kda(Qc[n], Kc[n], Vc[n], bc[n], G[n], f(scale)) for n in range(N)]
        WQ, U, P, KdTc, dCk = (np.stack(p) for p in zip(*parts))
        fold = np.ones((N, HV, C), f)
        dC = dCk[..., 0]  # [N, HV, K]
    else:
        WQ, U, P, _, _ = intra_chunk_scalar(Qc, Kc, Vc, bc, G[..., 0], f(scale))
        KdTc = Kc.swapaxes(-1, -2)  # [N, HV, K, C]
        fold = np.exp(G[..., -1:, 0] - G[..., 0])  # [N, HV, C]
        dC = np.broadcast_to(np.exp(G[..., -1:, 0]), (N, HV, K))
    Kp, Cp = -(-K // 4) * 4, -(-C // 4) * 4
    W = np.zeros((HV, N, C, Kp), f)
    W[..., :K] = WQ[:, :, :C].transpose(1, 0, 2, 3)
    KdT = np.zeros((HV, N, K, Cp), f)
    KdT[..., :C] = KdTc.transpose(1, 0, 2, 3)

    def hvn(a):  # [N, HV, ..] -> [HV, N, ..]
        return np.ascontiguousarray(np.swapaxes(a, 0, 1))

    S0s, Delta, S, writes = emulate_state_kernel(W, KdT, hvn(U), hvn(fold), hvn(dC), state)
    O = hvn(WQ[:, :, C:]) @ S0s + hvn(P) @ Delta  # [HV, N, C, V]
    o = O.reshape(HV, N * C, V)[:, :T].transpose(1, 0, 2)  # [T, HV, V]
    return o, S, writes


@pytest.mark.parametrize("shape", [(100, 1, 2, 16, 40, 16, False), (70, 2, 4, 33, 7, 10, False),
                                   (40, 1, 2, 20, 17, 8, True), (64, 1, 1, 12, 16, 64, False)],
                         ids=str)
def test_state_kernel_mapping_matches_the_float64_recurrence(rng, shape):
    # Awkward sizes: V not a multiple of the 16-column slice (dead columns), K and C not
    # multiples of 4 (the zero padding), a padded last chunk, GQA, KDA. Oracle: the recurrent
    # form in float64 (itself checked against a closed form, tests/ops/test_gdn.py).
    T, H, HV, K, V, C, kda = shape
    args = make_inputs(rng, T, H, HV, K, V, kda=kda, gmin=-3.0)
    o_r, S_r = gdn_recurrent(*args)
    args32 = tuple(a.astype(np.float32) for a in args)
    o, S, writes = emulate_chunked_block(*args32, K ** -0.5, C)
    assert_close(o, o_r, "float32_gdn", op="gdn_chunk_state_f32 (emulated)", case=str(shape))
    assert_close(S, S_r, "float32_gdn", op="gdn_chunk_state_f32 (emulated)", tensor="state",
                 case=str(shape))
    for name, count in writes.items():  # every output element written exactly once
        assert np.all(count == 1), name
