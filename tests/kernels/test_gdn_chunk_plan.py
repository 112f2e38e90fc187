"""The chunked GDN prefill's three kernels (kernels_cupy/cuda/gdn_chunk.cu), emulated on CPU.

``gdn_chunked`` (CuPy) runs, per block of chunks, ``gdn_chunk_prep_f32`` -> ``gdn_chunk_state_f32``
-> ``gdn_chunk_output_f32``. Each is emulated here in NumPy float32 with the kernel's index maps
(reads of the raw [T, H, K] inputs, zero padding past T, grouped GQA) and summation orders (the
running gate sum in token order, the score sums over channels in order, the blocked inverse
and its product (tests/kernels/test_gdn_prep_inverse.py), the output's K + C terms in order);
outputs start as NaN and every write is counted, so an element written twice or never fails.
The three are chained and compared with the recurrence in float64
(``dflash_ref.ops.gdn.gdn_recurrent``: an independent form, itself checked against a closed form
in tests/ops/test_gdn.py), at the tolerance the twin is held to, ``float32_gdn``.

One float32 rounding per product and per sum here; the kernels fuse them with ``fmaf`` (within
the tolerance: the state kernel's emulation, tests/kernels/test_gdn_plan.py, does the same).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from dflash_ref.ops.gdn import gdn_recurrent
from dflash_ref.testing import assert_close
from kernels_cupy import _build
from kernels_cupy import gdn as kgdn
from tests.kernels.test_gdn_plan import SM80_OPTIN, SM86_OPTIN, SM90_OPTIN, emulate_state_kernel
from tests.kernels.test_gdn_prep_inverse import apply_inverse, blocked_inverse
from tests.ops.test_gdn import make_inputs

f = np.float32


def _define(name: str) -> int:
    src = (_build.CUDA_DIR / "gdn_chunk.cu").read_text()
    return int(re.search(rf"#define {name} (\d+)", src).group(1))


def test_constants_match_the_cuda_source():
    assert kgdn.PREP_THREADS == _define("GDN_PREP_THREADS")
    assert (kgdn.OUT_VT, kgdn.OUT_TX) == (_define("GDN_OUT_VT"), _define("GDN_OUT_TX"))
    # the output block's 4 x 4 register tile covers the chunk's rows and the column tile
    assert 4 * kgdn.OUT_TX >= kgdn.MAX_C and 4 * kgdn.OUT_TX == kgdn.OUT_VT
    assert kgdn.MAX_C == _define("GDN_MAX_C") and kgdn.MAX_K_CHUNK == _define("GDN_MAX_K")


# ---------------------------------------------------------------- gdn_chunk_prep_f32: plan


def test_prep_plan_hand_count():
    # C = 2, K = 3, scalar gate: keys 2*4, G 2*1, beta 2, A 2*3, max(queries 2*4, slots 2*128)
    # = 8 + 2 + 2 + 6 + 256 = 274 floats.
    assert kgdn.plan_chunk_prep(2, 3, False, SM90_OPTIN) == {"block": (128,), "shared_mem": 4 * 274}
    # KDA: G is [2, 4] -> 6 more floats.
    assert kgdn.plan_chunk_prep(2, 3, True, SM90_OPTIN)["shared_mem"] == 4 * 280


def test_prep_plan_fits_the_qwen_shapes_and_refuses_clearly():
    # Qwen3.5 (K = 128, C = 64): 83,200 bytes, under every opt-in limit including sm_86's.
    for limit in (SM80_OPTIN, SM86_OPTIN, SM90_OPTIN):
        assert kgdn.plan_chunk_prep(64, 128, False, limit)["shared_mem"] == 83200
    assert kgdn.plan_chunk_prep(64, 256, True, SM90_OPTIN)["shared_mem"] <= SM90_OPTIN
    with pytest.raises(ValueError, match="smaller chunk_size"):
        kgdn.plan_chunk_prep(64, 256, True, SM80_OPTIN)
    assert kgdn.plan_chunk_prep(32, 256, True, SM80_OPTIN)["shared_mem"] <= SM80_OPTIN


def test_per_chunk_bytes_hand_count():
    # HV = 1, K = V = C = 2 (Kp = Cp = 4), scalar gate: W 2*4, KdT 2*4, U 4, fold 2, dC 2, P 4,
    # G 2, S0s 4, Delta 4 -> 38 floats; KDA: G is [2, 2], 2 more.
    assert kgdn.chunk_bytes_per_chunk(1, 2, 2, 2, kda=False) == 4 * 38
    assert kgdn.chunk_bytes_per_chunk(1, 2, 2, 2, kda=True) == 4 * 40


# ---------------------------------------------------------------- the three kernels, emulated


def emulate_prep_kernel(q, k, v, g, beta, C: int, scale: float):
    """gdn_chunk_prep_f32, block (hv, n) by block, the block's threads vectorised.

    Returns the kernel's outputs ([HV, N, ...], NaN where never written) and per-output write
    counts: W [C, Kp], KdT [K, Cp], U [C, V], fold [C], dC [K], P [C, C], G [C, gk]."""
    T, H, K = q.shape
    HV, V = v.shape[1:]
    kda = g.ndim == 3
    gk = K if kda else 1
    N = -(-T // C)
    Kp, Cp = -(-K // 4) * 4, -(-C // 4) * 4
    shapes = {"W": (C, Kp), "KdT": (K, Cp), "U": (C, V), "fold": (C,), "dC": (K,),
              "P": (C, C), "G": (C, gk)}
    out = {n: np.full((HV, N) + s, np.nan, f) for n, s in shapes.items()}
    writes = {n: np.zeros(a.shape, int) for n, a in out.items()}

    def put(name, hv, n, index, value):
        out[name][hv, n][index] = value
        np.add.at(writes[name][hv, n], index, 1)

    g3 = g.reshape(T, HV, gk)
    for hv in range(HV):
        hk = hv // (HV // H)
        for n in range(N):
            t0 = n * C
            nT = min(C, T - t0)
            sK, sQ = np.zeros((C, K), f), np.zeros((C, K), f)  # zero past T
            sK[:nT], sQ[:nT] = k[t0:t0 + nT, hk], q[t0:t0 + nT, hk]
            sG, sB = np.zeros((C, gk), f), np.zeros(C, f)
            sG[:nT], sB[:nT] = g3[t0:t0 + nT, hv], beta[t0:t0 + nT, hv]
            rising = bool((sG > 0).any())  # the log-decay rule, on the device
            for i in range(1, C):  # the running sum, token by token
                sG[i] = sG[i - 1] + sG[i]
            if rising:
                sB[:] = np.nan
            # scores: one (i, j) per thread, the channels summed in order
            i_, j_ = np.meshgrid(np.arange(C), np.arange(C), indexing="ij")
            low = i_ >= j_
            if not kda:
                qk, kk = np.zeros((C, C), f), np.zeros((C, C), f)
                for c in range(K):
                    qk = qk + sQ[:, None, c] * sK[None, :, c]
                    kk = kk + sK[:, None, c] * sK[None, :, c]
                gamma = np.exp(np.where(low, sG[:, None, 0] - sG[None, :, 0], f(0)))  # masked
                p = np.where(low, f(scale) * qk * gamma, f(0))
                a = np.where(low, sB[:, None] * kk * gamma, f(0))
            else:
                p, a = np.zeros((C, C), f), np.zeros((C, C), f)
                for c in range(K):
                    ex = np.exp(np.where(low, sG[:, None, c] - sG[None, :, c], f(0)))
                    p = p + sQ[:, None, c] * sK[None, :, c] * ex
                    a = a + sK[:, None, c] * sK[None, :, c] * ex
                p = np.where(low, f(scale) * p, f(0))
                a = np.where(low, sB[:, None] * a, f(0))
            put("P", hv, n, (i_, j_), p)
            A = np.where(i_ > j_, a, f(0))
            # the state pass's operands and G
            gC = sG[C - 1]
            r_, ii = np.meshgrid(np.arange(K), np.arange(Cp), indexing="ij")  # e -> (r, i)
            iv = np.minimum(ii, C - 1)
            kdt = sK[iv, r_] if not kda else sK[iv, r_] * np.exp(gC[r_] - sG[iv, r_])
            put("KdT", hv, n, (r_, ii), np.where(ii < C, kdt, f(0)))
            put("fold", hv, n, np.arange(C), np.exp(gC[0] - sG[:, 0]) if not kda else f(1))
            put("dC", hv, n, np.arange(K), np.exp(gC[np.arange(K) if kda else 0]))
            put("G", hv, n, slice(None), sG)
            if Kp > K:
                put("W", hv, n, (slice(None), slice(K, Kp)), f(0))
            # the solve: (I + A)^-1 by blocks, then times the columns [beta e^G K | beta V]
            rhs_k = sB[:, None] * np.exp(sG if kda else sG[:, :1]) * sK  # [C, K]
            rhs_v = np.zeros((C, V), f)
            rhs_v[:nT] = sB[:nT, None] * v[t0:t0 + nT, hv]
            X = np.concatenate([rhs_k, rhs_v], axis=1)  # [C, K + V]: one column per thread
            X = apply_inverse(blocked_inverse(A.astype(f)), X)
            put("W", hv, n, (slice(None), slice(0, K)), X[:, :K])
            put("U", hv, n, slice(None), X[:, K:])
    return out, writes


def emulate_output_kernel(q, G, P, S0s, Delta, T: int, HV: int, scale: float):
    """gdn_chunk_output_f32: per (hv, n), the [C, V] tile [scale Q e^G | P] [S0 ; Delta] with one
    accumulator per output and the K + C terms in order. Returns (o, write counts) with o
    [T, HV, V] NaN where never written; rows past T are not written."""
    _, H, K = q.shape
    _, N, C, V = Delta.shape
    o = np.full((T, HV, V), np.nan, f)
    writes = np.zeros(o.shape, int)
    for hv in range(HV):
        hk = hv // (HV // H)
        for n in range(N):
            t0 = n * C
            nT = min(C, T - t0)
            Qg = np.zeros((C, K), f)
            eG = np.exp(G[hv, n, :nT])  # [nT, gk]: gk = 1 broadcasts over the channels
            Qg[:nT] = q[t0:t0 + nT, hk] * (f(scale) * eG)
            Arow = np.concatenate([Qg, P[hv, n]], axis=1)  # [C, K + C]; rows past T read as 0
            Arow[nT:] = 0
            Bcol = np.concatenate([S0s[hv, n], Delta[hv, n]], axis=0)  # [K + C, V]
            acc = np.zeros((C, V), f)
            for r in range(K + C):
                acc = acc + Arow[:, r, None] * Bcol[r]
            o[t0:t0 + nT, hv] = acc[:nT]
            writes[t0:t0 + nT, hv] += 1
    return o, writes


def emulate_gdn_chunked_block(q, k, v, g, beta, state, scale: float, C: int):
    """The twin's three launches of one block, chained: prep -> state pass -> output."""
    T, HV = v.shape[:2]
    prep, writes = emulate_prep_kernel(q, k, v, g, beta, C, scale)
    for name, count in writes.items():
        assert np.all(count == 1), f"gdn_chunk_prep_f32 wrote {name} unevenly"
    S0s, Delta, S, w = emulate_state_kernel(prep["W"], prep["KdT"], prep["U"], prep["fold"],
                                            prep["dC"], state)
    for name, count in w.items():
        assert np.all(count == 1), f"gdn_chunk_state_f32 wrote {name} unevenly"
    o, w = emulate_output_kernel(q, prep["G"], prep["P"], S0s, Delta, T, HV, scale)
    assert np.all(w == 1), "gdn_chunk_output_f32 wrote o unevenly"
    return o, S


CASES = [
    # T, H, HV, K, V, C, kda
    (100, 1, 2, 16, 40, 16, False),  # V not a multiple of the 64-column output tile
    (70, 2, 4, 33, 7, 10, False),  # K, C not multiples of 4 (padding), GQA r = 2, padded tail
    (40, 1, 2, 20, 17, 8, True),  # KDA
    (64, 1, 1, 12, 16, 64, False),  # one whole chunk of the largest size
    (5, 1, 3, 9, 5, 16, False),  # one padded chunk, r = 3
]


@pytest.mark.parametrize("shape", CASES, ids=str)
def test_three_kernels_match_the_float64_recurrence(rng, shape):
    T, H, HV, K, V, C, kda = shape
    args = make_inputs(rng, T, H, HV, K, V, kda=kda, gmin=-3.0)
    o_r, S_r = gdn_recurrent(*args)  # float64
    args32 = tuple(a.astype(f) for a in args)
    o, S = emulate_gdn_chunked_block(*args32, K ** -0.5, C)
    assert_close(o, o_r, "float32_gdn", op="gdn_chunk_{prep,state,output}_f32 (emulated)",
                 case=str(shape))
    assert_close(S, S_r, "float32_gdn", op="gdn_chunk_{prep,state,output}_f32 (emulated)",
                 tensor="state", case=str(shape))


def test_extreme_gates_stay_finite_in_the_emulation(rng):
    # g = -50 per token spans exp(-3200) over a chunk: only masked, non-positive exponents are
    # taken, so nothing overflows (docs/gdn.md, "The fp32-range rule").
    T, H, HV, K, V, C = 40, 1, 2, 8, 6, 16
    args = list(make_inputs(rng, T, H, HV, K, V, gmin=-50.0))
    args[3][::5] = 0.0
    o_r, S_r = gdn_recurrent(*args)
    with np.errstate(over="raise", invalid="raise"):
        o, S = emulate_gdn_chunked_block(*(a.astype(f) for a in args), K ** -0.5, C)
    assert_close(o, o_r, "float32_gdn", op="gdn_chunk (emulated)", case="g to -50")
    assert_close(S, S_r, "float32_gdn", op="gdn_chunk (emulated)", tensor="state")


def test_a_rising_gate_poisons_its_head_from_its_chunk_on(rng):
    # g > 0 at token 37 (chunk 2 of C = 16) of head 1: that head's outputs from token 32 on and
    # its state are NaN, everything before and every other head finite (the device's stand-in
    # for the reference's ValueError; without it the head would come out finite and wrong).
    T, H, HV, K, V, C = 60, 1, 2, 8, 6, 16
    args = [a.astype(f) for a in make_inputs(rng, T, H, HV, K, V)]
    args[3][37, 1] = 0.25
    with np.errstate(invalid="ignore"):
        o, S = emulate_gdn_chunked_block(*args, K ** -0.5, C)
    assert np.isnan(o[32:, 1]).all() and np.isnan(S[1]).all()
    assert np.isfinite(o[:32, 1]).all() and np.isfinite(o[:, 0]).all() and np.isfinite(S[0]).all()


@pytest.mark.gpu
def test_a_rising_gate_poisons_its_head_on_the_device(rng):
    # The twin's stand-in for the reference's ValueError, without a host read: the same cut as
    # the emulation above, from the kernels.
    import cupy as cp

    T, H, HV, K, V, C = 60, 1, 2, 8, 6, 16
    args = [a.astype(f) for a in make_inputs(rng, T, H, HV, K, V)]
    args[3][37, 1] = 0.25
    o, S = kgdn.gdn_chunked(*(cp.asarray(a) for a in args), chunk_size=C)
    o, S = o.get(), S.get()
    assert np.isnan(o[32:, 1]).all() and np.isnan(S[1]).all()
    assert np.isfinite(o[:32, 1]).all() and np.isfinite(o[:, 0]).all() and np.isfinite(S[0]).all()


def test_one_block_is_three_launches():
    # The block body launches the prep, state and output kernels and nothing else: the
    # temporaries are cp.empty (no fill), the output is written in place (no copy). Before the
    # fusion a T = 8192 call was 133 launches (docs/performance.md); a new launch here must be a
    # decision, not an accident. Read from the source: the wrapper cannot run without a GPU.
    import inspect

    body = inspect.getsource(kgdn._chunked_block)
    assert re.findall(r'get_kernel\(([^)]*)\)', body) == [
        '"gdn_chunk", "gdn_chunk_prep_f32"', 'plan["family"], plan["kernel"]',
        '"gdn_chunk", "gdn_chunk_output_f32"']
    # the state pass: the float32 kernel, or its tensor-core twin on sm_80+ (plan_state)
    assert {kgdn.plan_state(4, 16, 16, 16, 10**6, tc)["kernel"] for tc in (False, True)} == {
        "gdn_chunk_state_f32", "gdn_chunk_state_tc_f32"}
    calls = set(re.findall(r"\bcp\.(\w+)\(", body))
    assert calls == {"empty"}, calls  # allocation only: no cp.zeros, matmul, exp, copy
    assert "launch_elementwise" not in body and "[...," not in body and "] =" not in body
