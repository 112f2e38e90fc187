// attention_prefill.cu: prefill attention v2, register-tiled FP32 with a cp.async K/V ring.
// Reference: dflash_ref/ops/attention.py (attention; attention_online is the online softmax in
// NumPy); the mask predicate att_key_visible is attention_mask.cuh. Wrapper:
// kernels_cupy/attention.py (kernel "prefill_v2"), plan: kernels_cupy/attention_prefill.py
// (plan_prefill_v2).
//
// Kernels (float32, contiguous; q [Tq, nh, d], k / v [Tk, nkv, d], q_pos [Tq] int32, k_pos [Tk]
// int32 with -1 = invalid slot, anc [Tq, Tk] uint8 or a dummy when has_anc == 0):
//   attention_prefill_v2_f32   grid = (ceil(Tq / PF2_BQ), nh); block (PF2_TX, PF2_TX) = 256
//       threads. A block owns PF2_BQ = 64 consecutive query rows of ONE query head h (query
//       tiles in reverse: blockIdx.x = 0 takes the last, which under a causal mask has the most
//       keys) and walks the keys of kv head h / g in steps of PF2_BK = 32. Thread (tx, ty) owns
//       rows ty + 16 a (a < 4) of the tile; for the scores, keys tx + 16 b (b < 2) of the step
//       (a 4 x 2 register tile of S = Q K^T, each score summed over dd = 0 .. d - 1 in order
//       with fmaf, as attention_fwd_* and attention_prefill_* do); for the output, columns
//       4 tx + 64 c .. + 3 (c < 2; d <= 128) of its 4 rows (32 accumulators). A row's 16
//       threads are one half-warp: its max and its sum of p combine over them by xor shuffles
//       (offsets 8, 4, 2, 1) after each thread adds its two keys, the order of the decode
//       kernels' 32-lane sums. Per step: scale, optional softcap tanh, the mask (invisible ->
//       -inf); a row that sees a key of the step (decided from the mask, never from the max:
//       fmaxf drops NaN) updates m_new = fmaxf(m, max_j s), sh = m_new or 0 while it is -inf,
//       c = e^(m - sh), p_j = e^(s_j - sh) (-0 where masked), l = c l + sum_j p_j, acc = c acc;
//       p goes through shared memory and acc += p_j V[j] over j = 0 .. 31 in order, skipping
//       the masked keys of a row in a step where some row has one (pf2_accumulate). Writes
//       out = acc / l (0 when l == 0). Non-finite inputs: docs/conventions.md, "Non-finite
//       attention".
//       K/V ring: `stages` (1..PF2_MAX_STAGES) buffers of {K, V} [PF2_BK, d + 4] filled by
//       cp.async, one commit group per step; the step `stages - 1` ahead is issued while the
//       current one computes. Slots past Tk and invalid slots (k_pos < 0) arrive as zeros
//       (cp.async zero fill), so garbage in free cache slots never reaches acc. Each step's
//       block-wide visibility (__syncthreads_or over every thread's (row, key) pairs) decides
//       whether it is loaded and computed at all. Barriers per step: 3 (the ahead step's
//       visibility, which also frees its buffer; copies landed; p complete, which also says
//       whether some row has a masked key in the step).
// Launch assumptions: sm_80+ (cp.async); blockDim == (PF2_TX, PF2_TX); d % 4 == 0, d <= 128;
// q, k, v 16-byte aligned; dynamic shared memory = (PF2_BQ * d + stages * 2 * PF2_BK * (d + 4)
// + PF2_BQ * PF2_LDP) * 4 bytes (plan_prefill_v2). Positions are int32; indices 64-bit.

#define PF2_BQ 64          // query rows per block
#define PF2_BK 32          // keys per step
#define PF2_TX 16          // block (PF2_TX, PF2_TX): rows ty + 16 a, keys tx + 16 b
#define PF2_THREADS 256    // PF2_TX * PF2_TX
#define PF2_MAX_D 128      // columns 4 tx + 64 c, c < 2
#define PF2_MAX_STAGES 3   // K/V ring depth
#define PF2_LDP 36         // row stride of the p tile (floats; float4 reads)
#define PF2_NEG_INF __int_as_float(0xff800000)

// 16-byte global -> shared copy; ok == false reads nothing and writes zeros (sm_80+).
__device__ __forceinline__ void pf2_cp_async16(float* dst, const float* src, const bool ok) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void pf2_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void pf2_cp_wait(const int stages) {  // all but stages - 1 groups
    if (stages >= 3) asm volatile("cp.async.wait_group 2;\n" ::);
    else if (stages == 2) asm volatile("cp.async.wait_group 1;\n" ::);
    else asm volatile("cp.async.wait_group 0;\n" ::);
}

// K and V rows t0 .. t0 + PF2_BK - 1 of kv head kvh into one ring buffer (rows of ld floats).
__device__ __forceinline__ void pf2_issue_step(float* sK, float* sV, const float* __restrict__ k,
                                               const float* __restrict__ v,
                                               const int* __restrict__ k_pos,
                                               const long long t0, const int Tk, const int nkv,
                                               const int kvh, const int d, const int ld,
                                               const int tid) {
    const int d4 = d >> 2;
    for (int e = tid; e < PF2_BK * d4; e += PF2_THREADS) {
        const int jj = e / d4, c = 4 * (e - jj * d4);
        const long long j = t0 + jj;
        const bool ok = j < Tk && k_pos[j] >= 0;
        const long long src = ok ? (j * nkv + kvh) * d + c : 0;
        pf2_cp_async16(sK + jj * ld + c, k + src, ok);
        pf2_cp_async16(sV + jj * ld + c, v + src, ok);
    }
}

// Does (row slot a, key slot b) of this thread see its key in the step starting at t0?
__device__ __forceinline__ bool pf2_visible(const long long qi, const int qp, const bool row_ok,
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

// 5. acc += p_j V[j], j = 0 .. PF2_BK - 1 in order, over this thread's rows ty + 16 a and
// columns 4 tx + 64 c. SKIP_MASKED: keys with p_j = -0 (masked for the row) are skipped, so
// whatever their V holds (another row sees it) never reaches this row; without it (every key
// of the step visible to every row) the plain loop. A visible key's V is multiplied even at
// p_j = +0, so a NaN or inf there makes the row's column non-finite (docs/conventions.md).
template <bool SKIP_MASKED>
__device__ __forceinline__ void pf2_accumulate(float (&acc)[4][8], const float* sP,
                                               const float* sV, const int ld, const int d,
                                               const int tx, const int ty) {
    for (int j4 = 0; j4 < PF2_BK / 4; ++j4) {
        float4 pv[4];
#pragma unroll
        for (int a = 0; a < 4; ++a)
            pv[a] = reinterpret_cast<const float4*>(sP + (ty + PF2_TX * a) * PF2_LDP)[j4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
            const float* vr = sV + (4 * j4 + jj) * ld;
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int col = 4 * tx + 64 * c;
                if (col >= d) continue;
                const float4 vv = *reinterpret_cast<const float4*>(vr + col);
#pragma unroll
                for (int a = 0; a < 4; ++a) {
                    const float pj = (jj == 0) ? pv[a].x : (jj == 1) ? pv[a].y
                                   : (jj == 2) ? pv[a].z : pv[a].w;
                    if (SKIP_MASKED && __float_as_uint(pj) == 0x80000000u) continue;
                    acc[a][4 * c + 0] = fmaf(pj, vv.x, acc[a][4 * c + 0]);
                    acc[a][4 * c + 1] = fmaf(pj, vv.y, acc[a][4 * c + 1]);
                    acc[a][4 * c + 2] = fmaf(pj, vv.z, acc[a][4 * c + 2]);
                    acc[a][4 * c + 3] = fmaf(pj, vv.w, acc[a][4 * c + 3]);
                }
            }
        }
    }
}

extern "C" __global__ void attention_prefill_v2_f32(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const int* __restrict__ q_pos, const int* __restrict__ k_pos,
    const unsigned char* __restrict__ anc, float* __restrict__ out, const int Tq, const int Tk,
    const int nh, const int nkv, const int d, const float scale, const float softcap,
    const int causal, const int window, const int window_mode, const int has_base,
    const int base_pos, const int has_anc, const int stages) {
    extern __shared__ __align__(16) float pf2_smem[];
    const int ld = d + 4;
    float* sQ = pf2_smem;                                // [PF2_BQ, d]
    float* sKV = sQ + PF2_BQ * d;                        // stages x {K, V} [PF2_BK, ld]
    float* sP = sKV + stages * 2 * PF2_BK * ld;          // [PF2_BQ, PF2_LDP]
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * PF2_TX + tx;
    const int h = blockIdx.y, g = nh / nkv, kvh = h / g;
    const long long i0 = (long long)(gridDim.x - 1 - blockIdx.x) * PF2_BQ;  // first query row
    const int d4 = d >> 2;

    for (int e = tid; e < PF2_BQ * d4; e += PF2_THREADS) {  // queries; zero rows past Tq
        const int r = e / d4, c4 = e - r * d4;
        const long long i = i0 + r;
        float4 val = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < Tq) val = reinterpret_cast<const float4*>(q + (i * nh + h) * d)[c4];
        reinterpret_cast<float4*>(sQ + r * d)[c4] = val;
    }
    bool row_ok[4];
    int qp[4];
    float m[4], l[4], acc[4][8];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        const long long i = i0 + ty + PF2_TX * a;
        row_ok[a] = i < Tq;
        qp[a] = row_ok[a] ? q_pos[i] : 0;
        m[a] = PF2_NEG_INF;
        l[a] = 0.0f;
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[a][c] = 0.0f;
    }

    // Does any of this thread's (row, key) pairs see a key of the step at t0?
    auto any_visible = [&](const long long t0) {
        bool any = false;
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int b = 0; b < 2; ++b)
                any |= pf2_visible(i0 + ty + PF2_TX * a, qp[a], row_ok[a], t0 + tx + PF2_TX * b,
                                   Tk, k_pos, anc, causal, window, window_mode, has_base,
                                   base_pos, has_anc);
        return any;
    };

    const int n_steps = (Tk + PF2_BK - 1) / PF2_BK;
    unsigned ring = 0u;  // bit s: step t + s is visible to some row of the block (block-uniform)
    for (int s = 0; s < stages - 1; ++s) {  // prologue: steps 0 .. stages - 2
        const long long t0 = (long long)s * PF2_BK;
        const bool vis = __syncthreads_or(s < n_steps && any_visible(t0)) != 0;
        if (vis) {
            float* sK = sKV + s * 2 * PF2_BK * ld;
            pf2_issue_step(sK, sK + PF2_BK * ld, k, v, k_pos, t0, Tk, nkv, kvh, d, ld, tid);
        }
        pf2_cp_commit();
        ring |= (unsigned)vis << s;
    }
    for (int t = 0; t < n_steps; ++t) {
        // 1. The step stages - 1 ahead: its visibility decides its load. The barrier also means
        //    every thread is done with step t - 1, whose buffer that load reuses, and with sP.
        const int ta = t + stages - 1;
        const bool vis_a = __syncthreads_or(ta < n_steps && any_visible((long long)ta * PF2_BK)) != 0;
        if (vis_a) {
            float* sK = sKV + (ta % stages) * 2 * PF2_BK * ld;
            pf2_issue_step(sK, sK + PF2_BK * ld, k, v, k_pos, (long long)ta * PF2_BK, Tk, nkv, kvh,
                           d, ld, tid);
        }
        pf2_cp_commit();  // possibly empty: one group per step keeps the count
        ring |= (unsigned)vis_a << (stages - 1);
        const bool vis = ring & 1u;
        ring >>= 1;
        // 2. Step t's copies landed (this thread's), then everyone's.
        pf2_cp_wait(stages);
        __syncthreads();
        if (!vis) continue;  // block-uniform
        const long long t0 = (long long)t * PF2_BK;
        const float* sK = sKV + (t % stages) * 2 * PF2_BK * ld;
        const float* sV = sK + PF2_BK * ld;
        // 3. Scores: a 4 x 2 tile, dd in order.
        float sc[4][2];
#pragma unroll
        for (int a = 0; a < 4; ++a) sc[a][0] = sc[a][1] = 0.0f;
#pragma unroll 2
        for (int c4 = 0; c4 < d4; ++c4) {
            float4 kv[2];
#pragma unroll
            for (int b = 0; b < 2; ++b)
                kv[b] = reinterpret_cast<const float4*>(sK + (tx + PF2_TX * b) * ld)[c4];
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                const float4 qv = reinterpret_cast<const float4*>(sQ + (ty + PF2_TX * a) * d)[c4];
#pragma unroll
                for (int b = 0; b < 2; ++b) {
                    sc[a][b] = fmaf(qv.x, kv[b].x, sc[a][b]);
                    sc[a][b] = fmaf(qv.y, kv[b].y, sc[a][b]);
                    sc[a][b] = fmaf(qv.z, kv[b].z, sc[a][b]);
                    sc[a][b] = fmaf(qv.w, kv[b].w, sc[a][b]);
                }
            }
        }
        // 4. Mask and the online-softmax update of each row (its half-warp), p -> sP.
        bool partial = false;  // a (row, key) pair of this thread masked
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            const int r = ty + PF2_TX * a;
            bool vb[2];
            float x[2];
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                vb[b] = pf2_visible(i0 + r, qp[a], row_ok[a], t0 + tx + PF2_TX * b, Tk, k_pos, anc,
                                    causal, window, window_mode, has_base, base_pos, has_anc);
                float y = sc[a][b] * scale;
                if (softcap > 0.0f) y = softcap * tanhf(y / softcap);  // before the mask
                x[b] = vb[b] ? y : PF2_NEG_INF;
            }
            float mx = fmaxf(x[0], x[1]);
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            // Whether the row sees a key of this step comes from the mask (one ballot; the
            // row's half-warp), never from mx: fmaxf drops NaN, so a step whose visible scores
            // are all NaN has mx = -inf and must still make the row NaN. A row that sees no key
            // keeps m, l and acc; the shuffles stay outside the branch (the warp holds two rows).
            const unsigned seen_bits = __ballot_sync(0xffffffffu, vb[0] || vb[1]);
            const bool seen = ((seen_bits >> ((ty & 1) * 16)) & 0xffffu) != 0u;  // lane / 16
            const float m_new = fmaxf(m[a], mx);
            const float sh = att_softmax_shift(m_new);  // 0 while m_new is -inf
            float p[2];
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                p[b] = vb[b] ? expf(x[b] - sh) : -0.0f;  // -0: masked, its V never multiplied
                partial |= row_ok[a] && !vb[b];
            }
            float sum = p[0] + p[1];
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (seen) {
                const float corr = expf(m[a] - sh);  // 0 when m was -inf
                l[a] = l[a] * corr + sum;
#pragma unroll
                for (int c = 0; c < 8; ++c) acc[a][c] *= corr;
                m[a] = m_new;
            }
#pragma unroll
            for (int b = 0; b < 2; ++b) sP[r * PF2_LDP + tx + PF2_TX * b] = p[b];
        }
        // p complete; does a row of the block have a masked key in this step (block-uniform)?
        if (__syncthreads_or(partial)) pf2_accumulate<true>(acc, sP, sV, ld, d, tx, ty);
        else pf2_accumulate<false>(acc, sP, sV, ld, d, tx, ty);
    }
    asm volatile("cp.async.wait_group 0;\n" ::);  // no copy outlives the block

    // Write the rows: out[i, h] = acc / l, 0 when no key was visible.
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        if (!row_ok[a]) continue;
        const long long i = i0 + ty + PF2_TX * a;
        const float inv = (l[a] > 0.0f) ? 1.0f / l[a] : 0.0f;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int col = 4 * tx + 64 * c;
            if (col >= d) continue;
            float4 o4;
            o4.x = acc[a][4 * c + 0] * inv;
            o4.y = acc[a][4 * c + 1] * inv;
            o4.z = acc[a][4 * c + 2] * inv;
            o4.w = acc[a][4 * c + 3] * inv;
            *reinterpret_cast<float4*>(out + (i * nh + h) * d + col) = o4;
        }
    }
}
