// attention_prefill_tc.cu: prefill attention with Q K^T and P V on tensor cores in 3xTF32.
// Reference: dflash_ref/ops/attention.py (attention); float32 CUDA-core twin:
// attention_prefill_v2_f32 (attention_prefill.cu), whose online softmax, ring and non-finite
// rule this kernel keeps. Plan, layout and error bound: kernels_cupy/attention_prefill_tc.py;
// the split and the MMA: tf32_mma.cuh; the mask predicate: attention_mask.cuh. Wrapper:
// kernels_cupy/attention.py (kernel "prefill_tc"). Emulated lane by lane on CPU by
// tests/kernels/test_attention_prefill_tc.py.
//
// Kernels (float32, contiguous; q [Tq, nh, d], k / v [Tk, nkv, d], q_pos [Tq] int32, k_pos [Tk]
// int32 with -1 = invalid slot, anc [Tq, Tk] uint8 or a dummy when has_anc == 0):
//   attention_prefill_tc_f32   grid (ceil(Tq / PTC_BQ), nh); block PTC_THREADS = 4 warps. A
//       block owns PTC_BQ = 64 query rows of ONE query head h (query tiles in reverse, as v2);
//       warp w owns rows 16 w .. 16 w + 15, one MMA tile of M = 16. Keys of kv head h / g in
//       steps of PTC_BK = 32 through v2's cp.async ring (`stages` buffers, the step
//       `stages - 1` ahead issued while the current one computes, zero rows for invalid slots
//       and slots past Tk, a step no row of the block sees neither loaded nor computed). Per
//       step, each warp:
//       1. S [16, 32] = Q K^T in 3xTF32: n-tiles nt < 4 of 8 keys, k-steps ks of 8 dims, hi and
//          lo accumulators per n-tile, s = hi + lo.
//       2. In the C layout (lane (g, t): rows g and g + 8, keys 8 nt + 2 t, + 1): scale,
//          softcap, the mask (invisible -> -inf); per row, the max and the sum of p over the
//          lane's 8 keys then the quad (xor shuffles 1, 2); whether the row sees a key of the
//          step from the mask (a ballot, never from the fmaxf max); m, l, corr as v2
//          (att_softmax_shift), p_j = -0 for a masked key.
//       3. p into the warp's tile [16][PTC_LDP] in shared memory, read back in the A layout;
//          T [16, 32 keys] x [32, d] = P V in 3xTF32 per n-tile of 8 columns over four k-steps
//          of 8 keys; O <- fmaf(O, corr, T) for a row that sees the step. If a key some row of
//          the warp masks has a NaN or inf in its V, the warp forms T on CUDA cores instead,
//          skipping masked keys (ptc_pv_skip), so the value never reaches a row that does not
//          see it (docs/conventions.md, "Non-finite attention", rule 1).
//       Writes out = O / l (0 when l == 0). The MMA's internal order is the hardware's: held to
//       the error bound of attention_prefill_tc.py, not bit for bit.
// Launch assumptions: sm_80+ (mma.sync .tf32, cp.async); blockDim == (PTC_THREADS, 1, 1);
// d % 4 == 0, d <= PTC_MAX_D; q, k, v 16-byte aligned; ldk = round32(round8(d)) + 4,
// ldv = round32(round8(d)) + 8; dynamic shared memory = (PTC_BQ * ldk + stages * PTC_BK * (ldk +
// ldv) + PTC_WARPS * 16 * PTC_LDP) * 4 bytes (plan_prefill_tc). Positions int32, indices 64-bit.

#define PTC_WARPS 4        // warps per block, one 16-row MMA tile each
#define PTC_THREADS 128    // 32 * PTC_WARPS
#define PTC_BQ 64          // query rows per block: 16 * PTC_WARPS
#define PTC_BK 32          // keys per step: four n-tiles of 8
#define PTC_MAX_D 128      // head dim limit
#define PTC_DT 16          // n-tiles of O per lane at PTC_MAX_D: PTC_MAX_D / 8
#define PTC_MAX_STAGES 3   // K/V ring depth
#define PTC_LDP 36         // row stride of a warp's p tile: A reads (g, t) hit banks 4 g + t
#define PTC_NEG_INF __int_as_float(0xff800000)

// 16-byte global -> shared copy; ok == false reads nothing and writes zeros (sm_80+).
__device__ __forceinline__ void ptc_cp_async16(float* dst, const float* src, const bool ok) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void ptc_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void ptc_cp_wait(const int stages) {  // all but stages - 1 groups
    if (stages >= 3) asm volatile("cp.async.wait_group 2;\n" ::);
    else if (stages == 2) asm volatile("cp.async.wait_group 1;\n" ::);
    else asm volatile("cp.async.wait_group 0;\n" ::);
}

// K rows (stride ldk) and V rows (stride ldv) t0 .. t0 + PTC_BK - 1 of kv head kvh.
__device__ __forceinline__ void ptc_issue_step(float* sK, float* sV, const float* __restrict__ k,
                                               const float* __restrict__ v,
                                               const int* __restrict__ k_pos,
                                               const long long t0, const int Tk, const int nkv,
                                               const int kvh, const int d, const int ldk,
                                               const int ldv, const int tid) {
    const int d4 = d >> 2;
    for (int e = tid; e < PTC_BK * d4; e += PTC_THREADS) {
        const int jj = e / d4, c = 4 * (e - jj * d4);
        const long long j = t0 + jj;
        const bool ok = j < Tk && k_pos[j] >= 0;
        const long long src = ok ? (j * nkv + kvh) * d + c : 0;
        ptc_cp_async16(sK + jj * ldk + c, k + src, ok);
        ptc_cp_async16(sV + jj * ldv + c, v + src, ok);
    }
}

// Does query row qi (position qp) see key slot j? (false for rows past Tq and slots past Tk)
__device__ __forceinline__ bool ptc_visible(const long long qi, const int qp, const bool row_ok,
                                            const long long j, const int Tk,
                                            const int* __restrict__ k_pos,
                                            const unsigned char* __restrict__ anc,
                                            const int causal, const int window,
                                            const int window_mode, const int has_base,
                                            const int base_pos, const int has_anc) {
    if (!row_ok || j >= Tk) return false;
    const unsigned char* anc_row = has_anc ? anc + qi * (long long)Tk : anc;
    return att_key_visible(qp, k_pos[j], anc_row, j, causal, window, window_mode, has_base,
                           base_pos, has_anc);
}

// T [16, 8] of n-tile nt on CUDA cores, in the C layout: element i of lane (g, t) is row
// g + 8 (i >> 1), column 8 nt + 2 t + (i & 1); keys j = 0 .. PTC_BK - 1 in order, a masked key
// (p = -0) skipped.
__device__ __forceinline__ void ptc_pv_skip(float (&T)[4], const float* sPw, const float* sV,
                                            const int ldv, const int nt, const int g,
                                            const int t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float* pr = sPw + (g + 8 * (i >> 1)) * PTC_LDP;
        const int col = 8 * nt + 2 * t + (i & 1);
        float acc = 0.0f;
        for (int j = 0; j < PTC_BK; ++j) {
            const float pj = pr[j];
            if (__float_as_uint(pj) != 0x80000000u) acc = fmaf(pj, sV[j * ldv + col], acc);
        }
        T[i] = acc;
    }
}

extern "C" __global__ void __launch_bounds__(PTC_THREADS) attention_prefill_tc_f32(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const int* __restrict__ q_pos, const int* __restrict__ k_pos,
    const unsigned char* __restrict__ anc, float* __restrict__ out, const int Tq, const int Tk,
    const int nh, const int nkv, const int d, const float scale, const float softcap,
    const int causal, const int window, const int window_mode, const int has_base,
    const int base_pos, const int has_anc, const int stages, const int ldk, const int ldv) {
    extern __shared__ __align__(16) float ptc_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;  // the PTX ISA's groupID, threadID_in_group
    const int stage_sz = PTC_BK * (ldk + ldv);
    float* sQ = ptc_smem;                                    // [PTC_BQ][ldk]
    float* sKV = sQ + PTC_BQ * ldk;                          // stages x {K [PTC_BK][ldk], V [..][ldv]}
    float* sPw = sKV + stages * stage_sz + warp * 16 * PTC_LDP;  // this warp's p [16][PTC_LDP]
    const int h = blockIdx.y, kvh = h / (nh / nkv);
    const long long i0 = (long long)(gridDim.x - 1 - blockIdx.x) * PTC_BQ;  // first query row
    const int d4 = d >> 2, dp4 = ((d + 7) & ~7) >> 2, dt = dp4 >> 1;  // dt: 8-wide tiles of d

    for (int e = tid; e < PTC_BQ * dp4; e += PTC_THREADS) {  // queries; zeros past Tq and d
        const int r = e / dp4, c4 = e - r * dp4;
        const long long i = i0 + r;
        float4 val = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < Tq && c4 < d4) val = reinterpret_cast<const float4*>(q + (i * nh + h) * d)[c4];
        reinterpret_cast<float4*>(sQ + r * ldk)[c4] = val;
    }
    for (int e = tid; e < stages * PTC_BK * (dp4 - d4); e += PTC_THREADS) {  // K/V pad columns
        const int row = e / (dp4 - d4), c = d + 4 * (e - row * (dp4 - d4));
        float* st = sKV + (row / PTC_BK) * stage_sz;
        *reinterpret_cast<float4*>(st + (row % PTC_BK) * ldk + c) = make_float4(0, 0, 0, 0);
        *reinterpret_cast<float4*>(st + PTC_BK * ldk + (row % PTC_BK) * ldv + c) =
            make_float4(0, 0, 0, 0);
    }
    const int r0 = 16 * warp + g;  // this lane's rows r0 (C registers 0, 1) and r0 + 8 (2, 3)
    bool row_ok[2];
    int qp[2];
    float m[2], l[2], O[PTC_DT][4];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const long long i = i0 + r0 + 8 * hr;
        row_ok[hr] = i < Tq;
        qp[hr] = row_ok[hr] ? q_pos[i] : 0;
        m[hr] = PTC_NEG_INF;
        l[hr] = 0.0f;
    }
#pragma unroll
    for (int nt = 0; nt < PTC_DT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) O[nt][i] = 0.0f;

    // Does any (row, key) pair of this thread's C layout see a key of the step at t0?
    auto any_visible = [&](const long long t0) {
        bool any = false;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i)
                any |= ptc_visible(i0 + r0 + 8 * (i >> 1), qp[i >> 1], row_ok[i >> 1],
                                   t0 + 8 * nt + 2 * t + (i & 1), Tk, k_pos, anc, causal, window,
                                   window_mode, has_base, base_pos, has_anc);
        return any;
    };

    const int n_steps = (Tk + PTC_BK - 1) / PTC_BK;
    unsigned ring = 0u;  // bit s: step t + s is visible to some row of the block (block-uniform)
    for (int s = 0; s < stages - 1; ++s) {  // prologue: steps 0 .. stages - 2
        const long long t0 = (long long)s * PTC_BK;
        const bool vis = __syncthreads_or(s < n_steps && any_visible(t0)) != 0;
        if (vis) {
            float* sK = sKV + s * stage_sz;
            ptc_issue_step(sK, sK + PTC_BK * ldk, k, v, k_pos, t0, Tk, nkv, kvh, d, ldk, ldv, tid);
        }
        ptc_cp_commit();
        ring |= (unsigned)vis << s;
    }
    for (int st = 0; st < n_steps; ++st) {
        // The step stages - 1 ahead: its visibility decides its load; the barrier also means
        // every thread is done with step st - 1, whose buffer that load reuses.
        const int ta = st + stages - 1;
        const bool vis_a =
            __syncthreads_or(ta < n_steps && any_visible((long long)ta * PTC_BK)) != 0;
        if (vis_a) {
            float* sK = sKV + (ta % stages) * stage_sz;
            ptc_issue_step(sK, sK + PTC_BK * ldk, k, v, k_pos, (long long)ta * PTC_BK, Tk, nkv,
                           kvh, d, ldk, ldv, tid);
        }
        ptc_cp_commit();  // possibly empty: one group per step keeps the count
        ring |= (unsigned)vis_a << (stages - 1);
        const bool vis = ring & 1u;
        ring >>= 1;
        ptc_cp_wait(stages);
        __syncthreads();  // step st's copies landed, everyone's
        if (!vis) continue;  // block-uniform
        const long long t0 = (long long)st * PTC_BK;
        const float* sK = sKV + (st % stages) * stage_sz;
        const float* sV = sK + PTC_BK * ldk;

        // 1. S = Q K^T. A = Q: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4) of
        //    rows r0, r0 + 8 and dims 8 ks + t (+ 4) (PTX ISA, mma.m16n8k8 .tf32, fragment A).
        //    B = K^T (.col: B[k][n] = K[key n][dim k]): b0 (k = t, n = g), b1 (k = t + 4, n = g),
        //    i.e. key 8 nt + g, dims 8 ks + t and + 4 (fragment B).
        float sh[4][4], sl[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) sh[nt][i] = sl[nt][i] = 0.0f;
        const float* q0 = sQ + r0 * ldk;
        const float* q1 = q0 + 8 * ldk;
        for (int ks = 0; ks < dt; ++ks) {
            const int c = 8 * ks + t;
            const TcSplit a[4] = {tc_split(q0[c]), tc_split(q1[c]), tc_split(q0[c + 4]),
                                  tc_split(q1[c + 4])};
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const float* kr = sK + (8 * nt + g) * ldk;
                const TcSplit b[2] = {tc_split(kr[c]), tc_split(kr[c + 4])};
                tc_mma3(sh[nt], sl[nt], a, b);
            }
        }

        // 2. The C layout (fragment C: c0 (g, 2 t), c1 (g, 2 t + 1), c2 (g + 8, 2 t),
        //    c3 (g + 8, 2 t + 1)): element i of n-tile nt is row r0 + 8 (i >> 1), key
        //    t0 + 8 nt + 2 t + (i & 1). Mask, then each row's online-softmax update.
        bool vb[4][4];
        float p[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int hr = i >> 1;
                vb[nt][i] = ptc_visible(i0 + r0 + 8 * hr, qp[hr], row_ok[hr],
                                        t0 + 8 * nt + 2 * t + (i & 1), Tk, k_pos, anc, causal,
                                        window, window_mode, has_base, base_pos, has_anc);
                float y = (sh[nt][i] + sl[nt][i]) * scale;
                if (softcap > 0.0f) y = softcap * tanhf(y / softcap);  // before the mask
                p[nt][i] = vb[nt][i] ? y : PTC_NEG_INF;  // the score x, then p in place
            }
        bool seen[2];
        float corr[2];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            float mx = PTC_NEG_INF;
            bool any = false;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    mx = fmaxf(mx, p[nt][2 * hr + c]);
                    any |= vb[nt][2 * hr + c];
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the row's quad: 4 g .. + 3
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // Whether the row sees a key of the step: from the mask (its quad's ballot bits),
            // never from mx (fmaxf drops NaN).
            seen[hr] = ((__ballot_sync(0xffffffffu, any) >> (4 * g)) & 0xfu) != 0u;
            const float m_new = fmaxf(m[hr], mx);
            const float shift = att_softmax_shift(m_new);  // 0 while m_new is -inf
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int i = 2 * hr + c;
                    p[nt][i] = vb[nt][i] ? expf(p[nt][i] - shift) : -0.0f;  // -0: masked
                    sum += p[nt][i];
                }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            corr[hr] = expf(m[hr] - shift);  // 0 when m was -inf
            if (seen[hr]) {
                l[hr] = l[hr] * corr[hr] + sum;
                m[hr] = m_new;
            }
        }

        // 3. p -> the warp's tile (C layout), and the keys some existing row of the warp masks.
        unsigned kmask = 0u;  // bit j: key t0 + j is masked for some row r < Tq of this warp
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int hr = 0; hr < 2; ++hr)
                *reinterpret_cast<float2*>(sPw + (g + 8 * hr) * PTC_LDP + 8 * nt + 2 * t) =
                    make_float2(p[nt][2 * hr], p[nt][2 * hr + 1]);
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const bool mk = (row_ok[0] && !vb[nt][c]) || (row_ok[1] && !vb[nt][2 + c]);
                const unsigned bits = __ballot_sync(0xffffffffu, mk);  // lane 4 g + t's key
#pragma unroll
                for (int tt = 0; tt < 4; ++tt)  // 8 nt + 2 tt + c, over every g
                    if (bits & (0x11111111u << tt)) kmask |= 1u << (8 * nt + 2 * tt + c);
            }
        }
        bool bad = false;  // a non-finite V in a key some row of the warp masks
        for (unsigned km = kmask; km != 0u; km &= km - 1u) {
            const int j = __ffs(km) - 1;
            for (int c = lane; c < d; c += 32) bad |= !(fabsf(sV[j * ldv + c]) < INFINITY);
        }
        bad = __any_sync(0xffffffffu, bad);
        __syncwarp();  // the p tile complete

        // 4. T = P V, then O <- fmaf(O, corr, T) for the rows that see the step. A = P: keys
        //    8 ks + t (+ 4) of rows g, g + 8 (fragment A); B = V: b0 (k = t, n = g), b1 (k = t + 4,
        //    n = g), i.e. V[key 8 ks + t (+ 4)][column 8 nt + g] (fragment B).
        if (!bad) {
            TcSplit pa[4][4];
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                const float* p0 = sPw + g * PTC_LDP + 8 * ks + t;
                pa[ks][0] = tc_split(p0[0]);
                pa[ks][1] = tc_split(p0[8 * PTC_LDP]);
                pa[ks][2] = tc_split(p0[4]);
                pa[ks][3] = tc_split(p0[8 * PTC_LDP + 4]);
            }
#pragma unroll
            for (int nt = 0; nt < PTC_DT; ++nt) {
                if (nt >= dt) break;
                float th[4] = {0.0f, 0.0f, 0.0f, 0.0f}, tl[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int ks = 0; ks < 4; ++ks) {
                    const float* vr = sV + (8 * ks + t) * ldv + 8 * nt + g;
                    const TcSplit b[2] = {tc_split(vr[0]), tc_split(vr[4 * ldv])};
                    tc_mma3(th, tl, pa[ks], b);
                }
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    if (seen[i >> 1]) O[nt][i] = fmaf(O[nt][i], corr[i >> 1], th[i] + tl[i]);
            }
        } else {
#pragma unroll
            for (int nt = 0; nt < PTC_DT; ++nt) {
                if (nt >= dt) break;
                float T[4];
                ptc_pv_skip(T, sPw, sV, ldv, nt, g, t);
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    if (seen[i >> 1]) O[nt][i] = fmaf(O[nt][i], corr[i >> 1], T[i]);
            }
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);  // no copy outlives the block

    // out[i, h] = O / l, 0 when no key was visible: columns 8 nt + 2 t, + 1 of rows r0, r0 + 8.
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        if (!row_ok[hr]) continue;
        const long long i = i0 + r0 + 8 * hr;
        const float inv = (l[hr] > 0.0f) ? 1.0f / l[hr] : 0.0f;
#pragma unroll
        for (int nt = 0; nt < PTC_DT; ++nt) {
            const int col = 8 * nt + 2 * t;
            if (nt >= dt || col >= d) break;
            *reinterpret_cast<float2*>(out + (i * nh + h) * d + col) =
                make_float2(O[nt][2 * hr] * inv, O[nt][2 * hr + 1] * inv);
        }
    }
}
