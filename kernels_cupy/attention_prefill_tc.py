"""Prefill attention on tensor cores in 3xTF32 (``attention_prefill_tc_f32`` in
cuda/attention_prefill_tc.cu): layout, plan, selection, error bound (pure: no CuPy).

Same signature and meaning as the prefill op (``kernels_cupy.attention.attention`` on many query
rows), and the same online softmax and non-finite rule (docs/conventions.md, "Non-finite
attention") as its float32 CUDA-core twin ``attention_prefill_v2_f32``
(:mod:`kernels_cupy.attention_prefill`); only the two products run on tensor cores:
S = Q K^T and the step's P V, each an ``mma.sync.m16n8k8`` with TF32 operands split hi / lo
(:mod:`kernels_cupy.tf32`). Emulated lane by lane on CPU by
tests/kernels/test_attention_prefill_tc.py.

Layout. A block of :data:`WARPS` warps owns :data:`BQ` = 64 consecutive query rows of one query
head (query tiles in reverse, as v2); warp w owns rows 16 w .. 16 w + 15 (the MMA's M). The keys
of kv head h / g are walked in steps of :data:`BK` = 32 through the cp.async ring of v2 (block
visibility, zero rows for invalid slots and slots past Tk). Per step and warp:

1. S [16, 32] = Q K^T: four n-tiles of 8 keys, ceil(d / 8) k-steps over the head dim; A = Q
   rows (:data:`kernels_cupy.linear_mma_plan.FRAGMENT_A`), B = K rows as columns (``.col``:
   B[k][n] = K[key n][dim k], :data:`FRAGMENT_B`), two accumulators per n-tile (hi: a_hi b_hi;
   lo: a_lo b_hi + a_hi b_lo), added once at the end.
2. In the C layout (:data:`FRAGMENT_C`: lane (g, t) holds rows g, g + 8 and keys 2 t, 2 t + 1
   of each n-tile): scale, softcap, the mask, the row's max and sum over its quad (xor shuffles
   1, 2), whether the row sees a key of the step from the mask (a ballot), m, l and corr as v2.
3. p [16, 32] through the warp's shared tile into the A layout; T [16, d] = P V with B = V
   (B[k][n] = V[key k][column n]), per n-tile of 8 columns two accumulators over the four
   k-steps of 8 keys; then O <- fmaf(O, corr, T) for a row that sees the step (else O kept).

The non-finite rule on tensor cores. An MMA multiplies every p_j by every V row: a masked
p_j = -0 times a NaN or inf in V would reach a row that does not see the key. So a warp whose
step has a key some of its rows mask checks those keys' V in shared memory; if one holds a
non-finite value, the warp computes that step's T on CUDA cores, skipping the masked keys as v2
does (``attention_prefill_tc.cu``, ``ptc_pv_skip``). A non-finite operand x is split as
hi = tf32(x) (inf stays inf, NaN NaN), lo = 0, and enters the cross products as 0 (``hc``):
otherwise tf32(inf - inf) = NaN, or 0 * inf in a cross product, would turn a -inf score into
NaN (rule 3) where hi x hi alone gives the product's own class.

The bound, derived (per query row i and column c; u = 2^-24, float32's unit roundoff)
------------------------------------------------------------------------------------
1. **A score, a dot of length d.** From kernels_cupy/tf32.py (representation, then float32
   accumulation in any order): |s^_ij - s_ij| <= c_qk sum_k |q_ik k_jk| with
   ``c_qk = bound_coefficient(d_hi, d_lo)``, d_hi = 8 ceil(d / 8) + 1 (ceil(d / 8) MMAs of 8
   products on one accumulator, then hi + lo), d_lo = 16 ceil(d / 8) + 1 (two MMAs a k-step).
   After the scale (one rounding): |x^_ij - x_ij| <= eps_ij = scale c_qk sum_k |q_ik k_jk|
   + u |x^_ij| (softcap off; :func:`score_depths`); eps_i = max over the row's visible keys.
2. **Softmax perturbation.** The exact softmax of x^ has weights w'_ij in
   [e^(-2 eps_i), e^(2 eps_i)] w_ij, so |o(x^) - o(x)| <= (e^(2 eps_i) - 1) A_ic with
   A_ic = sum_j w_ij |v_jc| (w: the exact softmax).
3. **P V over n keys.** The computed weight of key j is p_j times the corr of each later step,
   e^(x^_j - M) (1 + eta) with |eta| <= eta_i = 2 u R_i + n_s (u_e + u) to first order: the
   exponent arguments' roundings telescope to at most 2 u R_i (R_i = M - min_j x^_ij over the
   visible keys, M the final shift), n_s = ceil(n / 32) steps each with at most one expf
   (u_e = 2^-22: CUDA's expf is within 2 ulp) and one multiply. The products of a step: a
   3xTF32 dot of 32 terms, then hi + lo and one fmaf per later step:
   ``c_pv = bound_coefficient(32 + 1 + n_s, 64 + 1 + n_s)`` (:func:`pv_depths`) relative to
   sum_j p_j |v_jc|. l: the lane's 8 terms, 2 shuffles, one fmaf per step, all positive:
   gamma_l = gamma(9 + n_s, u). The division: u.
4. **Altogether**

       |o^_ic - o_ic| <= [(e^(2 eps_i) - 1)
                          + e^(2 eps_i) (2 eta_i + c_pv + gamma_l + u) / (1 - eta_i - gamma_l)] A_ic

   (:func:`output_bound`), for finite inputs whose scores stay far from float32's range.

At d = 128 and 4096 keys, c_qk = 1.61e-5 and c_pv = 1.99e-5 (:func:`score_depths`,
:func:`pv_depths`; tests check the hand numbers); one TF32 pass has a representation error up
to 2 u_t + u_t^2 = 9.8e-4 per product (the test shows it breaking the bound, and a split that
drops a cross product).

Selection (:func:`prefill_kernel`): where the prefill kernels take the shape, this kernel on
sm_80+ when it fits (:func:`tc_fits`: d % 4 == 0, d <= 128, 16-byte aligned q, k, v) and
:data:`PREFILL_TC` is on; v2 where it fits; v1 otherwise.
"""

from __future__ import annotations

import math

import numpy as np

from kernels_cupy.tf32 import bound_coefficient, gamma

# Must match attention_prefill_tc.cu (tests/kernels/test_attention_prefill_tc.py checks).
WARPS = 4  # PTC_WARPS: one 16-row MMA tile each
THREADS = 32 * WARPS
BQ = 16 * WARPS  # PTC_BQ: query rows per block
BK = 32  # PTC_BK: keys per step (four n-tiles of 8)
MAX_D = 128  # PTC_MAX_D: head dim limit (O: 16 n-tiles x 4 registers per lane)
MAX_STAGES = 3  # PTC_MAX_STAGES: K/V ring depth
LDP = BK + 4  # PTC_LDP: row stride of a warp's p tile (A reads: banks 4 g + t)
KERNEL = "attention_prefill_tc_f32"
FAMILY = "attention_prefill_tc"
MIN_SM = 80  # mma.sync with .tf32 operands
U_F32 = 2.0**-24
U_EXP = 2.0**-22  # expf: at most 2 ulp (CUDA C++ Programming Guide, mathematical functions)
# Plan parameters, read at call time: run this kernel where it fits on sm_80+ (False: v2 / v1),
# and the blocks per SM the ring depth leaves room for.
PREFILL_TC = True
BLOCKS_PER_SM = 2
RESERVED_PER_BLOCK = 1024  # shared memory the driver reserves per resident block (sm_80+)


def padded_dims(d: int) -> tuple[int, int, int]:
    """(dp, ldk, ldv): the head dim padded to the MMA's 8, and the shared row strides of Q / K
    (round32(dp) + 4: A and B reads of rows g, columns t hit banks 4 g + t) and of V
    (round32(dp) + 8: B reads of rows t, columns g hit banks 8 t + g)."""
    dp = -(-d // 8) * 8
    r32 = -(-dp // 32) * 32
    return dp, r32 + 4, r32 + 8


def tc_fits(d: int, vec4: bool) -> bool:
    """Can ``attention_prefill_tc_f32`` take head dim ``d``? ``vec4``: d % 4 == 0 and q, k, v
    16-byte aligned (the cp.async copies and float4 query loads)."""
    return vec4 and d % 4 == 0 and 1 <= d <= MAX_D


def shared_bytes(d: int, stages: int) -> int:
    """Dynamic shared memory: sQ [BQ, ldk] + stages x (K [BK, ldk] + V [BK, ldv]) + the warps'
    p tiles [WARPS, 16, LDP]."""
    _, ldk, ldv = padded_dims(d)
    return 4 * (BQ * ldk + stages * BK * (ldk + ldv) + WARPS * 16 * LDP)


def plan_prefill_tc(Tq: int, nh: int, nkv: int, d: int, optin: int, shared_per_sm: int,
                    vec4: bool = True, blocks_per_sm: int | None = None) -> dict:
    """The launch of ``attention_prefill_tc_f32``: kernel, grid (ceil(Tq / BQ), nh, 1), block
    (THREADS, 1, 1), stages (the deepest ring, <= MAX_STAGES, that lets ``blocks_per_sm``
    blocks share an SM of ``shared_per_sm`` bytes, else the deepest within ``optin``), ldk,
    ldv, shared_mem.

    Raises:
        ValueError: a head dim or alignment the kernel does not take, heads that cannot share
            kv heads, or no ring depth within ``optin``.
    """
    if not tc_fits(d, vec4):
        raise ValueError(f"plan_prefill_tc: needs d % 4 == 0, d <= {MAX_D} and 16-byte aligned "
                         f"q, k, v; got d={d}, vec4={vec4}: use prefill v2 or v1")
    if nkv < 1 or nh % nkv:
        raise ValueError(f"plan_prefill_tc: {nh} query heads cannot share {nkv} kv heads")
    per_sm = BLOCKS_PER_SM if blocks_per_sm is None else blocks_per_sm
    fits = [s for s in range(MAX_STAGES, 0, -1) if shared_bytes(d, s) <= optin]
    if not fits:
        raise ValueError(f"attention (prefill tc): head dim {d} needs {shared_bytes(d, 1)} "
                         f"bytes of shared memory per block, more than this device's {optin}")
    shared = [s for s in fits if per_sm * (shared_bytes(d, s) + RESERVED_PER_BLOCK)
              <= shared_per_sm]
    stages = (shared or fits)[0]
    _, ldk, ldv = padded_dims(d)
    return {"kernel": KERNEL, "grid": (max(1, math.ceil(Tq / BQ)), nh, 1),
            "block": (THREADS, 1, 1), "stages": stages, "ldk": ldk, "ldv": ldv,
            "shared_mem": shared_bytes(d, stages)}


def prefill_kernel(d: int, vec4: bool, tensor_cores: bool) -> str:
    """Which prefill kernel runs a shape the prefill kernels take: "prefill_tc" (sm_80+,
    :data:`PREFILL_TC`, :func:`tc_fits`), else "prefill_v2" (where it fits and
    ``attention_prefill.PREFILL_V2``), else "prefill" (v1). Flags read at call time."""
    from kernels_cupy import attention_prefill as v2

    if tensor_cores and PREFILL_TC and tc_fits(d, vec4):
        return "prefill_tc"
    if v2.PREFILL_V2 and v2.v2_fits(d, vec4):
        return "prefill_v2"
    return "prefill"


# ---------------------------------------------------------------- the bound


def score_depths(d: int) -> tuple[int, int]:
    """(d_hi, d_lo) of one score: ceil(d / 8) MMAs on each accumulator (two on lo per k-step),
    8 additions each, then hi + lo."""
    ks = -(-d // 8)
    return 8 * ks + 1, 16 * ks + 1


def pv_depths(n_keys: int) -> tuple[int, int]:
    """(d_hi, d_lo) of a product p_j v_jc: its step's four MMAs (eight on lo), hi + lo, then
    one fmaf per step from its own on (ceil(n_keys / BK) at most)."""
    n_s = -(-n_keys // BK)
    return BK + 1 + n_s, 2 * BK + 1 + n_s


def output_bound(q, k, v, vis, scale: float) -> np.ndarray:
    """[Tq, nh, d] float64: the module docstring's bound on |o^ - o| (softcap off).

    q [Tq, nh, d], k / v [Tk, nkv, d], vis [Tq, Tk] bool (the mask); finite inputs. A row
    without a visible key gets 0 (the kernel writes exact zeros)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    k, v = (np.where(np.isfinite(a), a, 0.0) for a in (k, v))  # garbage only in masked slots
    Tq, nh, d = q.shape
    Tk, nkv, _ = k.shape
    grp = nh // nkv
    kh = np.repeat(k, grp, axis=1)  # [Tk, nh, d]
    vh = np.repeat(v, grp, axis=1)
    s = np.einsum("ihd,jhd->hij", q, kh)  # [nh, Tq, Tk]
    absum = np.einsum("ihd,jhd->hij", np.abs(q), np.abs(kh))
    x = scale * s
    eps = scale * bound_coefficient(*score_depths(d)) * absum + U_F32 * np.abs(x) * 1.01
    visb = np.broadcast_to(vis[None], x.shape)
    xm = np.where(visb, x, -np.inf)
    m = xm.max(axis=2, keepdims=True)  # [nh, Tq, 1]
    has = np.isfinite(m)
    m = np.where(has, m, 0.0)
    w = np.where(visb, np.exp(xm - m), 0.0)
    w = w / np.where(has, w.sum(axis=2, keepdims=True), 1.0)
    A = np.einsum("hij,jhc->ihc", w, np.abs(vh))  # [Tq, nh, d]
    e = np.where(visb, eps, 0.0).max(axis=2)  # [nh, Tq]
    R = np.where(visb, m - x, 0.0).max(axis=2) + 2 * e
    n_s = -(-Tk // BK)
    eta = 2 * U_F32 * R + n_s * (U_EXP + U_F32)
    c_pv = bound_coefficient(*pv_depths(Tk))
    g_l = gamma(9 + n_s, U_F32)
    grow = np.exp(2 * e)
    coef = (grow - 1) + grow * (2 * eta + c_pv + g_l + U_F32) / (1 - eta - g_l)  # [nh, Tq]
    return coef.T[:, :, None] * A
