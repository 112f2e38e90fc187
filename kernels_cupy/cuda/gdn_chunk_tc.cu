// gdn_chunk_tc.cu: the chunked Gated DeltaNet's inter-chunk state pass on tensor cores, 3xTF32.
// Float32 CUDA-core twin: gdn_chunk_state_f32 (gdn_chunk.cu), same arguments, outputs and
// order of chunks; reference: dflash_ref/ops/gdn.py::gdn_chunked (docs/gdn.md, sections 2 and
// 8). Plan, layout and error bound: kernels_cupy/gdn_state_tc.py; the split and the MMA:
// tf32_mma.cuh. Wrapper: kernels_cupy/gdn.py::gdn_chunked (plan_state_pass picks the kernel).
// Emulated lane by lane on CPU by tests/kernels/test_gdn_state_tc.py.
//
// Kernels (float32, contiguous; the prep kernel's operands as gdn_chunk_state_f32 reads them:
// W [HV, N, C, Kp] zero past K, KdT [HV, N, K, Cp] zero past C, U [HV, N, C, V], fold [HV, N, C],
// dC [HV, N, K]; state_in / state_out [HV, K, V]; S0s [HV, N, K, V]; Delta [HV, N, C, V]):
//   gdn_chunk_state_tc_f32   grid (HV, ceil(V / GTC_VS)): one block per (value head, slice of
//       GTC_VS = 16 value columns, two n-tiles of 8); block GTC_THREADS = 8 warps. Per chunk, in
//       fla's chunk_delta_h order:
//       1. Delta [C, 16] = U - W S0: warp w takes the m-tile dm = w >> 1 (chunk rows 16 dm ..)
//          and the n-tile dn = w & 1; k-steps of 8 over the state rows (padded to round8(K)),
//          hi and lo accumulators, Delta = U - (hi + lo). Writes Delta, and fold * Delta into
//          shared memory.
//       2. S <- dC * S + KdT (fold * Delta): warp w owns the state m-tiles w and w + 8 (state
//          rows 16 mt ..; K <= 256) and both n-tiles, in registers across all chunks (C layout);
//          k-steps of 8 over the chunk rows (padded to round8(C)); S = fmaf(dC_r, S, hi + lo),
//          mirrored to shared memory as the next chunk's B operand.
//       Every chunk-start state goes to S0s. Chunk operands arrive by cp.async, chunk n + 1's
//       while chunk n computes when nbuf == 2. Shared memory is zeroed once, so the padding
//       rows and columns the MMAs read (W rows past C, columns past Kp; KdT rows past K, columns
//       past Cp; fold past C; the state and fold * Delta tiles past K and C) hold zeros. Three
//       barriers per chunk. The MMA's internal order is the hardware's: held to the per-chunk
//       error bound of gdn_state_tc.py, not bit for bit.
// Launch assumptions: sm_80+ (mma.sync .tf32, cp.async); blockDim == (GTC_THREADS, 1, 1);
// C <= 64, K <= 256; dynamic shared memory = plan_state_tc's (nbuf stages of W [round16(C)][ldw],
// KdT [round16(K)][ldk], U [C][16], fold [round8(C)], dC [round16(K)], then the state tile
// [round16(K)][GTC_LDS] and fold * Delta [round8(C)][GTC_LDS]; ldw = round32(round8(K)) + 4,
// ldk = round32(round8(C)) + 4).

#define GTC_VS 16          // value columns per block: two n-tiles of 8
#define GTC_WARPS 8        // warps per block
#define GTC_THREADS 256    // 32 * GTC_WARPS
#define GTC_MAX_C 64       // chunk rows: four m-tiles of 16 (warps 2 dm, 2 dm + 1)
#define GTC_MAX_K 256      // state rows: sixteen m-tiles of 16 (warps w, w + 8)
#define GTC_LDS 24         // row stride of the state and fold * Delta tiles: B reads (t, g)
                           // hit banks 24 t + g mod 32, all different

__device__ __forceinline__ void gtc_cp_async16(float* dst, const float* src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void gtc_cp_async4(float* dst, const float* src, const bool src_ok) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
                 "r"(src_ok ? 4 : 0));
}
__device__ __forceinline__ void gtc_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int PENDING>
__device__ __forceinline__ void gtc_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

// The shapes of one stage and of the fixed tiles (floats), as plan_state_tc counts them.
struct GtcLayout {
    int Kp8, C8, C16, K16, ldw, ldk, stage;
    __device__ GtcLayout(const int C, const int K) {
        Kp8 = (K + 7) & ~7;
        C8 = (C + 7) & ~7;
        C16 = (C + 15) & ~15;
        K16 = (K + 15) & ~15;
        ldw = ((Kp8 + 31) & ~31) + 4;  // A reads (g, t) of W: banks 4 g + t
        ldk = ((C8 + 31) & ~31) + 4;   // A reads (g, t) of KdT: banks 4 g + t
        stage = C16 * ldw + K16 * ldk + C * GTC_VS + C8 + K16;
    }
};

// One chunk's operands into a stage (one commit group): W [C][Kp] into rows of ldw, KdT [K][Cp]
// into rows of ldk, the block's U columns [C][GTC_VS] (zero past V), fold [C], dC [K].
__device__ __forceinline__ void gtc_load_chunk(
    float* st, const GtcLayout& L, const float* __restrict__ W, const float* __restrict__ KdT,
    const float* __restrict__ U, const float* __restrict__ fold, const float* __restrict__ dC,
    const long long hn, const int C, const int K, const int V, const int Kp, const int Cp,
    const int c0, const int tid) {
    float* sW = st;
    float* sK = sW + L.C16 * L.ldw;
    float* sU = sK + L.K16 * L.ldk;
    float* sF = sU + C * GTC_VS;
    float* sC = sF + L.C8;
    const float* gW = W + hn * C * Kp;
    for (int e = tid; e < C * (Kp / 4); e += GTC_THREADS) {
        const int i = e / (Kp / 4), q = 4 * (e % (Kp / 4));
        gtc_cp_async16(sW + i * L.ldw + q, gW + (long long)i * Kp + q);
    }
    const float* gK = KdT + hn * K * Cp;
    for (int e = tid; e < K * (Cp / 4); e += GTC_THREADS) {
        const int r = e / (Cp / 4), q = 4 * (e % (Cp / 4));
        gtc_cp_async16(sK + r * L.ldk + q, gK + (long long)r * Cp + q);
    }
    for (int e = tid; e < C * GTC_VS; e += GTC_THREADS) {
        const int i = e / GTC_VS, x = e % GTC_VS;
        const bool ok = c0 + x < V;
        gtc_cp_async4(sU + e, ok ? U + (hn * C + i) * V + c0 + x : U, ok);
    }
    for (int e = tid; e < C; e += GTC_THREADS) gtc_cp_async4(sF + e, fold + hn * C + e, true);
    for (int e = tid; e < K; e += GTC_THREADS) gtc_cp_async4(sC + e, dC + hn * K + e, true);
    gtc_cp_commit();
}

extern "C" __global__ void __launch_bounds__(GTC_THREADS, 1) gdn_chunk_state_tc_f32(
    const float* __restrict__ W, const float* __restrict__ KdT, const float* __restrict__ U,
    const float* __restrict__ fold, const float* __restrict__ dC,
    const float* __restrict__ state_in, float* __restrict__ state_out, float* __restrict__ S0s,
    float* __restrict__ Delta, const int N, const int C, const int K, const int V, const int Kp,
    const int Cp, const int nbuf) {
    extern __shared__ float4 gtc_smem4[];
    float* smem = reinterpret_cast<float*>(gtc_smem4);
    const GtcLayout L(C, K);
    float* sS = smem + nbuf * L.stage;  // [K16][GTC_LDS]: the state tile (row r, column cc)
    float* sFD = sS + L.K16 * GTC_LDS;  // [C8][GTC_LDS]: fold * Delta (row i, column cc)
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;  // the PTX ISA's groupID, threadID_in_group
    const int hv = blockIdx.x, c0 = blockIdx.y * GTC_VS;

    for (int e = tid; e < nbuf * L.stage + (L.K16 + L.C8) * GTC_LDS; e += GTC_THREADS)
        smem[e] = 0.0f;  // every padding row and column the MMAs read
    // The state in the C layout of step 2 (fragment C: c0 (g, 2 t), c1 (g, 2 t + 1), c2 (g + 8,
    // 2 t), c3 (g + 8, 2 t + 1)): element e of (m-tile warp + 8 j, n-tile dn) is state row
    // 16 (warp + 8 j) + g + 8 (e >> 1), slice column 8 dn + 2 t + (e & 1).
    float s[2][2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int dn = 0; dn < 2; ++dn)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = 16 * (warp + 8 * j) + g + 8 * (e >> 1);
                const int col = c0 + 8 * dn + 2 * t + (e & 1);
                s[j][dn][e] = (r < K && col < V) ? state_in[((long long)hv * K + r) * V + col] : 0.0f;
            }
    __syncthreads();  // the zero fill before the state rows land in it
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int dn = 0; dn < 2; ++dn)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = 16 * (warp + 8 * j) + g + 8 * (e >> 1);
                if (r < K) sS[r * GTC_LDS + 8 * dn + 2 * t + (e & 1)] = s[j][dn][e];
            }
    if (nbuf == 2)
        gtc_load_chunk(smem, L, W, KdT, U, fold, dC, (long long)hv * N, C, K, V, Kp, Cp, c0, tid);
    for (int n = 0; n < N; ++n) {
        const long long hn = (long long)hv * N + n;
        float* st = smem + ((nbuf == 2) ? (n & 1) * L.stage : 0);
        if (nbuf == 2) {  // the next chunk's loads overlap this chunk's arithmetic
            if (n + 1 < N)
                gtc_load_chunk(smem + ((n + 1) & 1) * L.stage, L, W, KdT, U, fold, dC, hn + 1, C,
                               K, V, Kp, Cp, c0, tid);
            else
                gtc_cp_commit();  // an empty group keeps "all but the newest" meaning n
            gtc_cp_wait<1>();
        } else {
            gtc_load_chunk(st, L, W, KdT, U, fold, dC, hn, C, K, V, Kp, Cp, c0, tid);
            gtc_cp_wait<0>();
        }
        __syncthreads();  // chunk n's stage and the state tile visible to every thread
        const float* sW = st;
        const float* sK = sW + L.C16 * L.ldw;
        const float* sU = sK + L.K16 * L.ldk;
        const float* sF = sU + C * GTC_VS;
        const float* sC = sF + L.C8;
#pragma unroll
        for (int j = 0; j < 2; ++j)  // the chunk-start state, for the output pass
#pragma unroll
            for (int dn = 0; dn < 2; ++dn)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = 16 * (warp + 8 * j) + g + 8 * (e >> 1);
                    const int col = c0 + 8 * dn + 2 * t + (e & 1);
                    if (r < K && col < V) S0s[(hn * K + r) * V + col] = s[j][dn][e];
                }

        // 1. Delta = U - W S0 for chunk rows 16 dm .., columns 8 dn ... A = W: a0 (g, t),
        //    a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4) (PTX ISA, mma.m16n8k8 .tf32,
        //    fragment A); B = the state tile: b0 (k = t, n = g), b1 (k = t + 4, n = g), i.e.
        //    state rows 8 ks + t (+ 4), column 8 dn + g (fragment B).
        const int dm = warp >> 1, dn = warp & 1;
        if (16 * dm < C) {  // warp-uniform
            float hi[4] = {0.0f, 0.0f, 0.0f, 0.0f}, lo[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const float* w0 = sW + (16 * dm + g) * L.ldw;
            const float* w1 = w0 + 8 * L.ldw;
            for (int ks = 0; ks < L.Kp8 / 8; ++ks) {
                const int c = 8 * ks + t;
                const TcSplit a[4] = {tc_split(w0[c]), tc_split(w1[c]), tc_split(w0[c + 4]),
                                      tc_split(w1[c + 4])};
                const float* b0 = sS + c * GTC_LDS + 8 * dn + g;
                const TcSplit b[2] = {tc_split(b0[0]), tc_split(b0[4 * GTC_LDS])};
                tc_mma3(hi, lo, a, b);
            }
            // Fragment C: element e is chunk row 16 dm + g + 8 (e >> 1), column 8 dn + 2 t + (e & 1).
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = 16 * dm + g + 8 * (e >> 1), cc = 8 * dn + 2 * t + (e & 1);
                if (i < C) {
                    const bool live = c0 + cc < V;
                    const float d = live ? sU[i * GTC_VS + cc] - (hi[e] + lo[e]) : 0.0f;
                    if (live) Delta[(hn * C + i) * V + c0 + cc] = d;
                    sFD[i * GTC_LDS + cc] = sF[i] * d;  // fla's fold: exp(G_C - G_i)
                }
            }
        }
        __syncthreads();  // fold * Delta complete

        // 2. S <- dC S + KdT (fold Delta) for state rows 16 mt .., both n-tiles. A = KdT:
        //    rows 16 mt + g (+ 8), chunk rows 8 ks + t (+ 4) (fragment A); B = fold * Delta:
        //    b0 (k = t, n = g), b1 (k = t + 4, n = g), i.e. chunk rows 8 ks + t (+ 4), column
        //    8 dn + g (fragment B); the result in the state's C layout.
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int mt = warp + 8 * j;
            if (16 * mt >= K) break;  // warp-uniform
            float hi[2][4], lo[2][4];
#pragma unroll
            for (int x = 0; x < 2; ++x)
#pragma unroll
                for (int e = 0; e < 4; ++e) hi[x][e] = lo[x][e] = 0.0f;
            const float* k0 = sK + (16 * mt + g) * L.ldk;
            const float* k1 = k0 + 8 * L.ldk;
            for (int ks = 0; ks < L.C8 / 8; ++ks) {
                const int c = 8 * ks + t;
                const TcSplit a[4] = {tc_split(k0[c]), tc_split(k1[c]), tc_split(k0[c + 4]),
                                      tc_split(k1[c + 4])};
#pragma unroll
                for (int x = 0; x < 2; ++x) {
                    const float* b0 = sFD + c * GTC_LDS + 8 * x + g;
                    const TcSplit b[2] = {tc_split(b0[0]), tc_split(b0[4 * GTC_LDS])};
                    tc_mma3(hi[x], lo[x], a, b);
                }
            }
#pragma unroll
            for (int x = 0; x < 2; ++x)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = 16 * mt + g + 8 * (e >> 1);
                    if (r < K) {
                        s[j][x][e] = fmaf(sC[r], s[j][x][e], hi[x][e] + lo[x][e]);
                        sS[r * GTC_LDS + 8 * x + 2 * t + (e & 1)] = s[j][x][e];
                    }
                }
        }
        __syncthreads();  // the new state tile written; this stage free for chunk n + 2
    }
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int dn = 0; dn < 2; ++dn)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = 16 * (warp + 8 * j) + g + 8 * (e >> 1);
                const int col = c0 + 8 * dn + 2 * t + (e & 1);
                if (r < K && col < V) state_out[((long long)hv * K + r) * V + col] = s[j][dn][e];
            }
}
