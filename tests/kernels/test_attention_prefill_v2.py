"""Prefill attention v2 (``attention_prefill_v2_f32`` in kernels_cupy/cuda/attention_prefill.cu).

On CPU: the launch plan (kernels_cupy/attention_prefill.py ``plan_prefill_v2``: ring depth by
shared memory, counted by hand), the constants against the CUDA source, and a NumPy emulation of
the kernel's step loop: flat shared memory filled with NaN and addressed with the kernel's
offsets, the cp.async ring (which step lands in which buffer, issued ``stages - 1`` steps ahead,
zero rows for invalid slots and slots past Tk), the block-wide visibility that skips steps, the
online-softmax update per row, p through shared memory, and the barrier count. Expected values
come from the NumPy reference ``dflash_ref.ops.attention.attention`` (two-pass softmax over the
materialised mask: an independent evaluation), in float64. On a GPU (``gpu``): the kernel against
the NumPy reference and against the v1 prefill kernel.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from kernels_cupy import _build
from kernels_cupy import attention_prefill as kpf
from tests.kernels.test_attention_prefill import masked_case

SM80 = (166912, 167936)  # (opt-in per block, per SM) bytes, CUDA programming guide
SM86 = (101376, 102400)
SM90 = (232448, 233472)


def test_constants_match_the_cuda_source():
    src = (_build.CUDA_DIR / "attention_prefill.cu").read_text()
    for name, value in (("PF2_BQ", kpf.PF2_BQ), ("PF2_BK", kpf.PF2_BK), ("PF2_TX", kpf.PF2_TX),
                        ("PF2_MAX_D", kpf.PF2_MAX_D), ("PF2_MAX_STAGES", kpf.PF2_MAX_STAGES),
                        ("PF2_LDP", kpf.PF2_LDP)):
        assert re.search(rf"#define {name} {value}\b", src), name
    assert f"void {kpf.KERNEL_V2}(" in src
    # thread (tx, ty): rows ty + 16 a (a < 4) cover the 64-row tile, keys tx + 16 b (b < 2) the
    # 32-key step, columns 4 tx + 64 c (c < 2) the head dim
    assert 4 * kpf.PF2_TX == kpf.PF2_BQ and 2 * kpf.PF2_TX == kpf.PF2_BK
    assert 2 * 64 == kpf.PF2_MAX_D and kpf.PF2_LDP >= kpf.PF2_BK and kpf.PF2_LDP % 4 == 0


# ---------------------------------------------------------------- the plan


def test_shared_bytes_hand_count():
    # d = 128: sQ 64 x 128 + stages x 2 x 32 x 132 + p 64 x 36 floats.
    assert kpf.prefill_v2_shared_bytes(128, 1) == 4 * (8192 + 8448 + 2304) == 75776
    assert kpf.prefill_v2_shared_bytes(128, 2) == 109568
    assert kpf.prefill_v2_shared_bytes(128, 3) == 143360


@pytest.mark.parametrize(("device", "blocks", "stages"), [
    (SM90, 2, 2),  # 2 x (109568 + 1024) <= 233472; three stages would leave one block per SM
    (SM90, 1, 3),
    (SM80, 2, 1),  # 2 x (75776 + 1024) <= 167936, two stages do not
    (SM80, 1, 3),
    (SM86, 2, 1),  # two blocks fit nowhere: the deepest ring within the opt-in limit
])
def test_ring_depth_by_shared_memory(device, blocks, stages):
    plan = kpf.plan_prefill_v2(4096, 32, 8, 128, *device, blocks_per_sm=blocks)
    assert plan["stages"] == stages and plan["shared_mem"] <= device[0]
    assert plan["grid"] == (64, 32, 1) and plan["block"] == (16, 16, 1)
    assert plan["kernel"] == kpf.KERNEL_V2


def test_v2_refuses_what_it_cannot_take():
    assert kpf.v2_fits(128, True) and kpf.v2_fits(4, True)
    assert not kpf.v2_fits(256, True) and not kpf.v2_fits(66, False) and not kpf.v2_fits(64, False)
    with pytest.raises(ValueError, match="v1 prefill kernel"):
        kpf.plan_prefill_v2(512, 8, 2, 256, *SM90)
    with pytest.raises(ValueError, match="cannot share"):
        kpf.plan_prefill_v2(512, 6, 4, 128, *SM90)
    with pytest.raises(ValueError, match="shared memory"):
        kpf.plan_prefill_v2(512, 8, 2, 128, 32 * 1024, 64 * 1024)


# ---------------------------------------------------------------- the step loop, emulated


def emulate_prefill_v2(q, k, v, spec, scale, softcap, plan):
    """attention_prefill_v2_f32 in NumPy (float64), block by block.

    Returns (out, barriers, steps, loaded, computed): out [Tq, nh, d] NaN where never written;
    barriers counted per block as the kernel executes them."""
    from tests.ops.test_masks import key_visible  # att_key_visible, transcribed

    Tq, nh, d = q.shape
    Tk, nkv, _ = k.shape
    g, BQ, BK, LDP = nh // nkv, kpf.PF2_BQ, kpf.PF2_BK, kpf.PF2_LDP
    stages, ld, gx = plan["stages"], d + 4, plan["grid"][0]
    k_pos = np.asarray(spec.k_pos) if spec is not None else np.zeros(Tk, int)
    out = np.full((Tq, nh, d), np.nan)
    barriers = steps = loaded = computed = 0
    n_steps = -(-Tk // BK)
    for bx in range(gx):
        for h in range(nh):
            kvh, i0 = h // g, (gx - 1 - bx) * BQ
            smem = np.full(plan["shared_mem"] // 4, np.nan)
            sKV, sP = BQ * d, BQ * d + stages * 2 * BK * ld
            for r in range(BQ):  # queries; zero rows past Tq
                smem[r * d:(r + 1) * d] = q[i0 + r, h] if i0 + r < Tq else 0.0
            rows_ok = np.array([i0 + r < Tq for r in range(BQ)])

            def vis(t, i0=i0, rows_ok=rows_ok):  # [BQ, BK]: step t's (row, key) pairs, all threads'
                return np.array([[rows_ok[r] and t * BK + j < Tk
                                  and key_visible(spec, i0 + r, t * BK + j)
                                  for j in range(BK)] for r in range(BQ)])

            def issue(t, smem=smem, sKV=sKV, kvh=kvh):  # pf2_issue_step: buffer t % stages; zero
                # rows for invalid slots and slots past Tk
                base = sKV + (t % stages) * 2 * BK * ld
                for jj in range(BK):
                    j = t * BK + jj
                    ok = j < Tk and k_pos[j] >= 0
                    for off, src in ((0, k), (BK * ld, v)):
                        row = base + off + jj * ld
                        smem[row:row + d] = src[j, kvh] if ok else 0.0

            m, l, acc = np.full(BQ, -np.inf), np.zeros(BQ), np.zeros((BQ, d))
            ring = 0
            for s in range(stages - 1):  # prologue
                barriers += 1
                flag = s < n_steps and vis(s).any()
                if flag:
                    issue(s)
                    loaded += 1
                ring |= int(flag) << s
            for t in range(n_steps):
                steps += 1
                ta = t + stages - 1
                barriers += 1  # the step ahead's visibility
                flag = ta < n_steps and vis(ta).any()
                if flag:
                    issue(ta)
                    loaded += 1
                ring |= int(flag) << (stages - 1)
                seen_step, ring = ring & 1, ring >> 1
                barriers += 1  # copies landed
                if not seen_step:
                    continue
                computed += 1
                base = sKV + (t % stages) * 2 * BK * ld
                Ks = smem[base:base + BK * ld].reshape(BK, ld)[:, :d]
                Vs = smem[base + BK * ld:base + 2 * BK * ld].reshape(BK, ld)[:, :d]
                Qs = smem[:BQ * d].reshape(BQ, d)
                bits = vis(t)
                x = (Qs @ Ks.T) * scale  # [BQ, BK]
                if softcap:
                    x = softcap * np.tanh(x / softcap)
                x = np.where(bits, x, -np.inf)
                p = np.full((BQ, BK), -0.0)  # -0: masked
                for r in range(BQ):
                    if not bits[r].any():  # the row sees nothing in this step (from the mask)
                        continue
                    # fmaxf drops NaN; att_softmax_shift: 0 while the max is -inf
                    m_new = np.fmax(m[r], np.fmax.reduce(x[r], initial=-np.inf))
                    sh = 0.0 if m_new == -np.inf else m_new
                    p[r] = np.where(bits[r], np.exp(x[r] - sh), -0.0)
                    corr = np.exp(m[r] - sh)
                    l[r] = l[r] * corr + p[r].sum()
                    acc[r] *= corr
                    m[r] = m_new
                for r in range(BQ):
                    smem[sP + r * LDP:sP + r * LDP + BK] = p[r]
                barriers += 1  # p complete (and whether a row has a masked key)
                P = smem[sP:sP + BQ * LDP].reshape(BQ, LDP)[:, :BK]
                if (rows_ok[:, None] & ~bits).any():  # pf2_accumulate<true>: skip p_j = -0
                    masked = (P == 0) & np.signbit(P)
                    acc += np.where(masked[:, :, None], 0.0, P[:, :, None] * Vs[None]).sum(axis=1)
                else:
                    acc += P @ Vs  # j in order
            for r in range(BQ):
                if rows_ok[r]:  # inv = l > 0 ? 1 / l : 0; a NaN acc stays NaN
                    out[i0 + r, h] = acc[r] * (1 / l[r] if l[r] > 0 else 0.0)
    return out, barriers, steps, loaded, computed


CASES = [
    # Tq, nh, nkv, d, Tk, kind, softcap
    (100, 4, 2, 8, 100, "causal", None),  # GQA, partial query and key tiles
    (70, 2, 1, 8, 300, "window", None),  # a prefix, sliding window: skipped steps
    (65, 2, 2, 4, 97, "tree", None),  # ancestors over a committed prefix
    (64, 2, 1, 128, 100, "causal", None),  # the largest head dim
    (80, 2, 1, 16, 120, "causal", 5.0),  # softcap
    (64, 1, 1, 8, 64, "empty", None),  # no visible key at all -> zeros
    (130, 3, 1, 12, 140, "none", None),  # g = 3, every slot visible
]


@pytest.mark.parametrize("stages", [1, 2, 3])
@pytest.mark.parametrize(("Tq", "nh", "nkv", "d", "Tk", "kind", "softcap"), CASES)
def test_step_loop_matches_the_reference(rng, stages, Tq, nh, nkv, d, Tk, kind, softcap):
    from dflash_ref.ops.attention import attention

    q, k, v, spec = masked_case(rng, Tq, nh, nkv, d, Tk, kind)
    plan = kpf.plan_prefill_v2(Tq, nh, nkv, d, 10**6, 10**7)  # the deepest ring ...
    plan = {**plan, "stages": stages,  # ... then each depth, with its own shared memory
            "shared_mem": kpf.prefill_v2_shared_bytes(d, stages)}
    out, barriers, steps, loaded, computed = emulate_prefill_v2(q, k, v, spec, 0.3, softcap, plan)
    expected = attention(q, k, v, spec, scale=0.3, softcap=softcap)  # float64 reference
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)
    blocks = plan["grid"][0] * nh
    assert barriers == blocks * (stages - 1) + 2 * steps + computed  # 3 per computed step
    assert computed <= loaded and (computed == 0) == (kind == "empty")
    if kind == "window":  # keys more than 40 positions before the first query never load
        assert loaded < steps


# ---------------------------------------------------------------- on a GPU

GPU_CASES = [
    # Tq, nh, nkv, d, Tk, kind
    (512, 32, 8, 128, 512, "causal"),  # Qwen3-shaped prefill (GQA 4)
    (300, 8, 2, 128, 1500, "window"),  # a prompt continued after a cached prefix
    (200, 4, 4, 64, 200, "none"),
    (130, 4, 2, 128, 400, "tree"),
    (96, 2, 1, 36, 250, "causal"),  # d not a multiple of 32: dead columns
]


@pytest.mark.gpu
@pytest.mark.parametrize(("Tq", "nh", "nkv", "d", "Tk", "kind"), GPU_CASES)
def test_prefill_v2_kernel_matches_numpy_and_v1(rng, Tq, nh, nkv, d, Tk, kind):
    import cupy as cp

    from dflash_ref.ops.attention import attention
    from dflash_ref.testing import assert_close
    from kernels_cupy.attention import attention_using
    from tests.kernels.test_attention_prefill import _inputs

    q, k, v, mask = _inputs(rng, Tq, nh, nkv, d, Tk, kind)
    expected = attention(q, k, v, mask)
    dev = [cp.asarray(a) for a in (q, k, v)]
    got = attention_using("prefill_v2", *dev, mask)
    assert_close(got, expected, "float32_attention", op="attention (prefill v2)",
                 case=f"{Tq, nh, nkv, d, Tk} {kind}")
    v1 = attention_using("prefill", *dev, mask)  # the same per-row arithmetic and order
    assert_close(got, v1, "float32_attention", op="attention (prefill v2 vs v1)",
                 case=f"{Tq, nh, nkv, d, Tk} {kind}")
    softcapped = attention_using("prefill_v2", *dev, mask, softcap=5.0)
    assert_close(softcapped, attention(q, k, v, mask, softcap=5.0), "float32_attention",
                 op="attention (prefill v2, softcap)", case=kind)


# ---------------------------------------------------------------- float32: v2's order is v1's


def _butterfly(x, offsets):
    """xor-shuffle sums over the last axis (lanes): x_t <- x_t + x_(t ^ o) for each offset."""
    lanes = np.arange(x.shape[-1])
    for o in offsets:
        x = x + x[..., lanes ^ o]
    return x


def _rows_f32(q, K, V, vis, scale, order):
    """One query head's rows over the key steps of 32 slots, float32, one rounding per product
    and per sum (both kernels contract the same expressions into fmaf). ``order``: "v1" (lane j
    holds slot j, 32-lane butterfly 16 .. 1, V added over the visible slots only) or "v2" (thread
    tx holds slots tx and tx + 16, adds them, 16-lane butterfly 8 .. 1, V added over all 32
    slots, masked ones with p = 0)."""
    f = np.float32
    Tq, d = q.shape
    m, l = np.full(Tq, -np.inf, f), np.zeros(Tq, f)
    acc = np.zeros((Tq, d), f)
    for t0 in range(0, K.shape[0], 32):
        Ks, Vs, bits = K[t0:t0 + 32], V[t0:t0 + 32], vis[:, t0:t0 + 32]
        s = np.zeros((Tq, 32), f)
        for dd in range(d):  # the fmaf chain over dd
            s = s + q[:, dd, None] * Ks[None, :, dd]
        x = np.where(bits, s * f(scale), f(-np.inf))
        for r in np.flatnonzero(bits.any(axis=1)):  # rows that see a slot of this step
            m_new = max(m[r], x[r].max())
            p = np.where(bits[r], np.exp(x[r] - m_new), f(0))
            if order == "v1":
                total = _butterfly(p, (16, 8, 4, 2, 1))[0]
            else:
                total = _butterfly(p[:16] + p[16:], (8, 4, 2, 1))[0]
            corr = np.exp(m[r] - m_new)
            l[r] = l[r] * corr + total
            acc[r] = acc[r] * corr
            for j in (np.flatnonzero(bits[r]) if order == "v1" else range(32)):
                acc[r] = acc[r] + p[j] * Vs[j]
            m[r] = m_new
    inv = np.where(l > 0, f(1) / np.where(l > 0, l, f(1)), f(0))
    return acc * inv[:, None]


def test_v2_sums_in_v1s_order_bit_for_bit_in_float32(rng):
    # The claim of the kernel's header: pairing slots tx and tx + 16 and then the 16-lane
    # butterfly is the 32-lane butterfly's first step and the rest of it, and a masked slot's
    # p = 0 leaves acc unchanged, so v2 rounds exactly as v1. Both against the reference too.
    from dflash_ref.ops.attention import attention
    from dflash_ref.ops.masks import MaskSpec, visible
    from dflash_ref.testing import assert_close

    Tq, Tk, d = 48, 100, 16
    q = rng.standard_normal((Tq, 1, d)).astype(np.float32)
    k, v = (rng.standard_normal((Tk, 1, d)).astype(np.float32) for _ in range(2))
    k_pos = np.arange(Tk)
    k_pos[rng.random(Tk) < 0.1] = -1
    spec = MaskSpec(np.arange(Tk - Tq, Tk), k_pos, causal=True, window=30)
    vis = np.zeros((Tq, 128), bool)
    vis[:, :Tk] = np.asarray(visible(spec))
    K, V = np.zeros((128, d), np.float32), np.zeros((128, d), np.float32)
    K[:Tk], V[:Tk] = k[:, 0], v[:, 0]
    K[:Tk][k_pos < 0] = V[:Tk][k_pos < 0] = 0  # invalid slots arrive as zero rows in v2
    out1 = _rows_f32(q[:, 0], K, V, vis, 0.25, "v1")
    out2 = _rows_f32(q[:, 0], K, V, vis, 0.25, "v2")
    assert np.array_equal(out1, out2)
    assert_close(out2[:, None], attention(q.astype(np.float64), k.astype(np.float64),
                                          v.astype(np.float64), spec, scale=0.25),
                 "float32_attention", op="attention_prefill_v2_f32 (emulated, float32)")
