// gdn.cu: Gated DeltaNet kernels. Reference: dflash_ref/ops/gdn.py (equations: docs/gdn.md).
//
// Layouts (float32, contiguous, one sequence): q, k [T, H, K]; v [T, HV, V]; g [T, HV] (scalar
// gate) or [T, HV, K] (KDA); beta [T, HV]; state [HV, K, V] (rows = key channel); o [T, HV, V];
// trace [T, HV, K, V]. GQA is grouped: value head hv reads q/k head hv / (HV / H).
// Chunked layouts (prepared by kernels_cupy/gdn.py): [HV, N, C, X] with N chunks of C tokens.
//
// Kernels:
//   gdn_recurrent_f32      the per-token recurrence (decode and verify batches), optional trace.
//       Parallelises over (value head, tile of GDN_REC_COLS value columns): grid
//       (HV, ceil(V / GDN_REC_COLS)), block (GDN_REC_COLS = 32, GDN_REC_WARPS = 8). Lane x of
//       warp y owns column tile * 32 + x and the rows k = y, y + 8, ... (K <= 8 *
//       GDN_REC_MAX_ROWS = 256) of one head's state, in registers for all T tokens. Lanes run
//       along the contiguous V axis, so every state load / store and every trace write is one
//       128-byte transaction per warp; k_t, q_t and a KDA g_t are read at one address per warp
//       (broadcast). The two dot products per token (S^T k, S^T q) sum a thread's rows, then
//       the 8 warps' partials through shared memory in a fixed order: two __syncthreads per
//       token. The trace is written only when write_trace != 0.
//   gdn_chunk_gather_f32   [T, H, X] -> the chunked [HV, N, C, X] (grouped GQA, zero padding):
//       one thread per output element (grid-stride); replaces a repeat, a memset and a strided
//       copy per input.
//   gdn_chunk_scores_f32   scalar gate: P = scale * QK^T * Gamma (i >= j), A = beta_i KK^T * Gamma
//       (i > j) from cuBLAS products; the mask is applied before exp. One thread per element of
//       the [B, C, C] score matrices (grid-stride).
//   gdn_chunk_scores_kda_f32  KDA gate: the same P and A with per-channel decays
//       sum_c x_ic k_jc exp(G_ic - G_jc), computed directly from Q, K, G. One thread per element.
//   gdn_chunk_solve_f32    [W | U] = (I + A)^-1 [beta e^G K | beta V] by forward substitution.
//       One block per (head, chunk) of GDN_SOLVE_THREADS threads; A staged in shared memory
//       (C <= 64); each thread owns columns of the right-hand side and walks the C rows in
//       order, reading its earlier rows back from its own shared-memory slots.
//   gdn_chunk_state_f32    the sequential inter-chunk pass, fla's chunk_delta_h order:
//       Delta = U - W S0, S <- dC * S + KdT (fold * Delta), saving every chunk-start state S0
//       and every Delta. Scalar gate: KdT = K^T and fold_i = exp(G_C - G_i) (the decay folded
//       into the delta rows, as fla folds it into v_new), dC = exp(G_C); KDA: KdT already
//       decayed per channel, fold = 1, dC_r = exp(G_C,r).
//       Grid (HV, ceil(V / GDN_ST_VS)): one block per (value head, slice of 16 value columns),
//       128 blocks at 16 heads of V = 128. Block (GDN_ST_VS = 16, GDN_ST_TY = 16): thread (tx,
//       ty) owns column tx and the state rows ty + 16 m in registers (K <= 256), and computes
//       the Delta rows ty + 16 j (C <= 64): independent accumulators, each summed in index
//       order with fmaf over float4 shared loads. The state tile is mirrored transposed in
//       shared memory for the Delta product. Each chunk's W [C, Kp], KdT [K, Cp], U columns,
//       fold and dC arrive by cp.async; with nbuf = 2 (dynamic shared memory allowing) chunk
//       n + 1 loads while chunk n computes. W and KdT are padded by the wrapper to Kp, Cp
//       (multiples of 4, zeros). Three barriers per chunk.
//   causal_conv1d_f32      y[t, c] = silu(sum_j w[c, j] xx[t + j, c]), xx = concat(state^T, x).
//   conv_state_update_f32  new_state[c, j] = xx[T + j, c]: the last W - 1 raw inputs.
//       Both conv kernels are grid-stride elementwise.
// Launch assumptions: blockDim == (GDN_REC_COLS, GDN_REC_WARPS) for the recurrent kernel,
// (GDN_ST_VS, GDN_ST_TY) for the state kernel (sm_80+: cp.async); every pointer is
// contiguous float32; int arguments are 32-bit (the wrappers cast with np.int32).

#define GDN_REC_COLS 32          // value columns per block of the recurrent kernel (= lanes)
#define GDN_REC_WARPS 8          // row groups (warps) per block of the recurrent kernel
#define GDN_REC_MAX_ROWS 32      // rows per thread: K <= GDN_REC_WARPS * GDN_REC_MAX_ROWS = 256
#define GDN_MAX_C 64             // chunk size limit of the chunk kernels
#define GDN_MAX_K 256            // key dim limit of the chunk state kernel
#define GDN_SOLVE_THREADS 128    // threads per block of gdn_chunk_solve_f32 (blockDim.x)
#define GDN_ST_VS 16             // value columns per block of gdn_chunk_state_f32 (threadIdx.x)
#define GDN_ST_TY 16             // threadIdx.y extent of gdn_chunk_state_f32
#define GDN_ST_THREADS 256       // GDN_ST_VS * GDN_ST_TY
#define GDN_ST_MAX_RPT 16        // state rows per thread: K <= GDN_ST_TY * GDN_ST_MAX_RPT = 256
#define GDN_ST_MAX_IPT 4         // Delta rows per thread: C <= GDN_ST_TY * GDN_ST_MAX_IPT = 64

extern "C" __global__ void gdn_recurrent_f32(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta,
    const float* __restrict__ state_in, float* __restrict__ state_out, float* __restrict__ o,
    float* __restrict__ trace, const int T, const int H, const int HV, const int K, const int V,
    const int kda, const int write_trace, const float scale) {
    // Partial sums over each warp's rows, one per (warp, column), for the two dot products.
    __shared__ float part_rd[GDN_REC_WARPS][GDN_REC_COLS];
    __shared__ float part_out[GDN_REC_WARPS][GDN_REC_COLS];
    const int hv = blockIdx.x;
    const int lane = threadIdx.x;  // column within the tile: consecutive lanes, consecutive floats
    const int wy = threadIdx.y;    // row group: rows wy, wy + GDN_REC_WARPS, ...
    const int col = blockIdx.y * GDN_REC_COLS + lane;
    const bool live = col < V;     // dead lanes still reach every __syncthreads
    const int hk = hv / (HV / H);  // grouped GQA mapping

    float s[GDN_REC_MAX_ROWS];
#pragma unroll
    for (int i = 0; i < GDN_REC_MAX_ROWS; ++i) {
        const int kk = wy + GDN_REC_WARPS * i;
        s[i] = (live && kk < K) ? state_in[((long long)hv * K + kk) * V + col] : 0.0f;
    }
    for (int t = 0; t < T; ++t) {
        gdn_token_step<GDN_REC_WARPS, GDN_REC_MAX_ROWS>(
            s, part_rd, part_out, q, k, v, g, beta, o, t, H, HV, K, V, hv, hk, wy, lane, col,
            live, kda, scale);  // gdn_step.cuh: steps 1-5 of token t
        const long long th = (long long)t * HV + hv;
        if (write_trace && live) {  // only when asked: T * HV * K * V floats
#pragma unroll
            for (int i = 0; i < GDN_REC_MAX_ROWS; ++i) {
                const int kk = wy + GDN_REC_WARPS * i;
                if (kk < K) trace[(th * K + kk) * V + col] = s[i];
            }
        }
    }
    if (live) {
#pragma unroll
        for (int i = 0; i < GDN_REC_MAX_ROWS; ++i) {
            const int kk = wy + GDN_REC_WARPS * i;
            if (kk < K) state_out[((long long)hv * K + kk) * V + col] = s[i];
        }
    }
}

// x: [T, H, X] contiguous; out: [HV, NC, X] (NC = N * C: the chunked layout [HV, N, C, X]).
// Value head hv reads head hv / (HV / H) (grouped GQA; H = HV for v, beta and g); rows t >= T
// are the zero padding. One thread per output element (grid-stride), writes coalesced along X.
extern "C" __global__ void gdn_chunk_gather_f32(const float* __restrict__ x,
                                                float* __restrict__ out, const long long total,
                                                const int T, const int H, const int HV,
                                                const int NC, const int X) {
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(idx % X);
        const long long row = idx / X;
        const int t = (int)(row % NC);
        const int hv = (int)(row / NC);
        out[idx] = (t < T) ? x[((long long)t * H + hv / (HV / H)) * X + c] : 0.0f;
    }
}

// qk, kk: [B, C, C] raw Q K^T and K K^T; G, beta: [B, C]; P, A: [B, C, C] outputs.
extern "C" __global__ void gdn_chunk_scores_f32(
    const float* __restrict__ qk, const float* __restrict__ kk, const float* __restrict__ G,
    const float* __restrict__ beta, float* __restrict__ P, float* __restrict__ A,
    const long long total, const int C, const float scale) {
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(idx % C);
        const int i = (int)((idx / C) % C);
        const long long b = idx / ((long long)C * C);
        // Mask before exp: only i >= j is exponentiated, and G_i - G_j <= 0 there.
        const float gamma = (i >= j) ? expf(G[b * C + i] - G[b * C + j]) : 0.0f;
        P[idx] = scale * qk[idx] * gamma;
        A[idx] = (i > j) ? beta[b * C + i] * kk[idx] * gamma : 0.0f;
    }
}

// Q, K: [B, C, Kd]; G: [B, C, Kd] (per-channel cumulative gate); beta: [B, C].
extern "C" __global__ void gdn_chunk_scores_kda_f32(
    const float* __restrict__ Q, const float* __restrict__ Kc, const float* __restrict__ G,
    const float* __restrict__ beta, float* __restrict__ P, float* __restrict__ A,
    const long long total, const int C, const int Kd, const float scale) {
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(idx % C);
        const int i = (int)((idx / C) % C);
        const long long b = idx / ((long long)C * C);
        float p = 0.0f, a = 0.0f;
        if (i >= j) {  // mask before exp
            const float* gi = G + (b * C + i) * Kd;
            const float* gj = G + (b * C + j) * Kd;
            const float* qi = Q + (b * C + i) * Kd;
            const float* ki = Kc + (b * C + i) * Kd;
            const float* kj = Kc + (b * C + j) * Kd;
            for (int c = 0; c < Kd; ++c) {
                const float e = expf(gi[c] - gj[c]);  // <= 1
                p += qi[c] * kj[c] * e;
                a += ki[c] * kj[c] * e;
            }
        }
        P[idx] = scale * p;
        A[idx] = (i > j) ? beta[b * C + i] * a : 0.0f;
    }
}

// A: [B, C, C] strictly lower; K: [B, C, Kd]; V: [B, C, Vd]; G: [B, C, gk] (gk = 1 or Kd);
// beta: [B, C]. Outputs W [B, C, Kd] and U [B, C, Vd].
extern "C" __global__ void gdn_chunk_solve_f32(
    const float* __restrict__ A, const float* __restrict__ Kc, const float* __restrict__ Vc,
    const float* __restrict__ G, const float* __restrict__ beta, float* __restrict__ W,
    float* __restrict__ U, const int C, const int Kd, const int Vd, const int gk) {
    __shared__ float sA[GDN_MAX_C * GDN_MAX_C];
    // The thread's column so far, one slot per thread: earlier rows are read back from here,
    // not from global memory (16 + 32 KiB: the 48 KiB static limit at C = 64).
    __shared__ float sX[GDN_MAX_C * GDN_SOLVE_THREADS];
    const long long b = blockIdx.x;
    const int tid = threadIdx.x;
    for (int e = tid; e < C * C; e += GDN_SOLVE_THREADS) sA[e] = A[b * C * C + e];
    __syncthreads();
    for (int c = tid; c < Kd + Vd; c += GDN_SOLVE_THREADS) {
        const bool is_k = c < Kd;
        float* X = is_k ? W + b * C * Kd + c : U + b * C * Vd + (c - Kd);
        const int ld = is_k ? Kd : Vd;
        for (int i = 0; i < C; ++i) {
            const float bi = beta[b * C + i];
            // right-hand side: beta e^G k (the W columns) or beta v (the U columns)
            float x = is_k ? bi * expf(G[(b * C + i) * gk + (gk == 1 ? 0 : c)]) *
                                 Kc[(b * C + i) * Kd + c]
                           : bi * Vc[(b * C + i) * Vd + (c - Kd)];
#pragma unroll 4
            for (int j = 0; j < i; ++j) x -= sA[i * C + j] * sX[j * GDN_SOLVE_THREADS + tid];
            sX[i * GDN_SOLVE_THREADS + tid] = x;  // only this thread reads its slots: no sync
            X[(long long)i * ld] = x;
        }
    }
}

// Asynchronous global -> shared copies (sm_80+): 16 bytes (both addresses 16-byte aligned), or
// 4 bytes with zero fill (src_ok false: nothing is read and the destination gets 0).
__device__ __forceinline__ void gdn_cp_async16(float* dst, const float* src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void gdn_cp_async4(float* dst, const float* src, const bool src_ok) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
                 "r"(src_ok ? 4 : 0));
}
__device__ __forceinline__ void gdn_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int PENDING>
__device__ __forceinline__ void gdn_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

// One chunk's inputs of gdn_chunk_state_f32 into one stage of shared memory (cp.async, one
// commit group): W [C, Kp] into rows of ldw floats, KdT [K, Cp] into rows of ldk floats, the
// block's U columns [C, GDN_ST_VS] (zero past V), fold [C] and dC [K].
__device__ __forceinline__ void gdn_state_load_chunk(
    float* st, const float* __restrict__ W, const float* __restrict__ KdT,
    const float* __restrict__ U, const float* __restrict__ fold, const float* __restrict__ dC,
    const long long hn, const int C, const int K, const int V, const int Kp, const int Cp,
    const int ldw, const int ldk, const int c0, const int tid) {
    float* sW = st;
    float* sK = sW + C * ldw;
    float* sU = sK + K * ldk;
    float* sF = sU + C * GDN_ST_VS;
    float* sC = sF + Cp;
    const float* gW = W + hn * C * Kp;
    for (int e = tid; e < C * (Kp / 4); e += GDN_ST_THREADS) {
        const int i = e / (Kp / 4), q = 4 * (e % (Kp / 4));
        gdn_cp_async16(sW + i * ldw + q, gW + (long long)i * Kp + q);
    }
    const float* gK = KdT + hn * K * Cp;
    for (int e = tid; e < K * (Cp / 4); e += GDN_ST_THREADS) {
        const int r = e / (Cp / 4), q = 4 * (e % (Cp / 4));
        gdn_cp_async16(sK + r * ldk + q, gK + (long long)r * Cp + q);
    }
    for (int e = tid; e < C * GDN_ST_VS; e += GDN_ST_THREADS) {
        const int i = e / GDN_ST_VS, x = e % GDN_ST_VS;
        const bool ok = c0 + x < V;
        gdn_cp_async4(sU + e, ok ? U + (hn * C + i) * V + c0 + x : U, ok);
    }
    for (int e = tid; e < C; e += GDN_ST_THREADS) gdn_cp_async4(sF + e, fold + hn * C + e, true);
    for (int e = tid; e < K; e += GDN_ST_THREADS) gdn_cp_async4(sC + e, dC + hn * K + e, true);
    gdn_cp_async_commit();
}

// W: [HV, N, C, Kp] (zero past K); KdT: [HV, N, K, Cp] (zero past C); U: [HV, N, C, V];
// fold: [HV, N, C]; dC: [HV, N, K]; state_in / state_out: [HV, K, V]; S0s: [HV, N, K, V];
// Delta: [HV, N, C, V]. Dynamic shared memory: gdn_state_shared_floats(...) * 4 bytes.
extern "C" __global__ void gdn_chunk_state_f32(
    const float* __restrict__ W, const float* __restrict__ KdT, const float* __restrict__ U,
    const float* __restrict__ fold, const float* __restrict__ dC,
    const float* __restrict__ state_in, float* __restrict__ state_out, float* __restrict__ S0s,
    float* __restrict__ Delta, const int N, const int C, const int K, const int V, const int Kp,
    const int Cp, const int nbuf) {
    extern __shared__ float4 gdn_smem4[];
    float* smem = reinterpret_cast<float*>(gdn_smem4);
    const int ldw = Kp + 4, ldk = Cp + 4;  // padded rows: 16-byte aligned, banks shifted by 4
    const int stage = C * ldw + K * ldk + C * GDN_ST_VS + Cp + 4 * ((K + 3) / 4);
    float* sST = smem + nbuf * stage;  // [GDN_ST_VS][ldw]: the state tile, transposed
    float* sDT = sST + GDN_ST_VS * ldw;  // [GDN_ST_VS][ldk]: fold * Delta, transposed
    const int hv = blockIdx.x;
    const int tx = threadIdx.x;  // value column within the slice
    const int ty = threadIdx.y;  // row group: state rows ty + 16 m, Delta rows ty + 16 j
    const int tid = ty * GDN_ST_VS + tx;
    const int c0 = blockIdx.y * GDN_ST_VS;
    const int col = c0 + tx;
    const bool live = col < V;     // dead columns hold zeros and still reach every barrier

    for (int e = tid; e < GDN_ST_VS * (ldw + ldk); e += GDN_ST_THREADS) sST[e] = 0.0f;
    float s[GDN_ST_MAX_RPT];  // this thread's state rows, in registers across all chunks
#pragma unroll
    for (int m = 0; m < GDN_ST_MAX_RPT; ++m) {
        const int r = ty + GDN_ST_TY * m;
        s[m] = (live && r < K) ? state_in[((long long)hv * K + r) * V + col] : 0.0f;
    }
    __syncthreads();  // the zero fill before the state rows land in it
#pragma unroll
    for (int m = 0; m < GDN_ST_MAX_RPT; ++m) {
        const int r = ty + GDN_ST_TY * m;
        if (r < K) sST[tx * ldw + r] = s[m];
    }
    if (nbuf == 2)
        gdn_state_load_chunk(smem, W, KdT, U, fold, dC, (long long)hv * N, C, K, V, Kp, Cp, ldw,
                             ldk, c0, tid);
    for (int n = 0; n < N; ++n) {
        const long long hn = (long long)hv * N + n;
        float* st = smem + ((nbuf == 2) ? (n & 1) * stage : 0);
        if (nbuf == 2) {  // the next chunk's loads overlap this chunk's arithmetic
            if (n + 1 < N)
                gdn_state_load_chunk(smem + ((n + 1) & 1) * stage, W, KdT, U, fold, dC, hn + 1, C,
                                     K, V, Kp, Cp, ldw, ldk, c0, tid);
            else
                gdn_cp_async_commit();  // an empty group keeps "all but the newest" meaning n
            gdn_cp_async_wait<1>();
        } else {
            gdn_state_load_chunk(st, W, KdT, U, fold, dC, hn, C, K, V, Kp, Cp, ldw, ldk, c0, tid);
            gdn_cp_async_wait<0>();
        }
        __syncthreads();  // chunk n's stage and the state tile visible to every thread
        const float* sW = st;
        const float* sK = sW + C * ldw;
        const float* sU = sK + K * ldk;
        const float* sF = sU + C * GDN_ST_VS;
        const float* sC = sF + Cp;
        if (live) {  // the chunk-start state, for the output pass
#pragma unroll
            for (int m = 0; m < GDN_ST_MAX_RPT; ++m) {
                const int r = ty + GDN_ST_TY * m;
                if (r < K) S0s[(hn * K + r) * V + col] = s[m];
            }
        }
        // Delta = U - W S0: rows ty + 16 j, GDN_ST_MAX_IPT independent sums over r in order.
        float acc[GDN_ST_MAX_IPT];
#pragma unroll
        for (int j = 0; j < GDN_ST_MAX_IPT; ++j) acc[j] = 0.0f;
#pragma unroll 4
        for (int r = 0; r < Kp; r += 4) {
            const float4 sv = *reinterpret_cast<const float4*>(sST + tx * ldw + r);
#pragma unroll
            for (int j = 0; j < GDN_ST_MAX_IPT; ++j) {
                const int i = ty + GDN_ST_TY * j;
                if (i < C) {
                    const float4 w = *reinterpret_cast<const float4*>(sW + i * ldw + r);
                    acc[j] = fmaf(w.x, sv.x, acc[j]);
                    acc[j] = fmaf(w.y, sv.y, acc[j]);
                    acc[j] = fmaf(w.z, sv.z, acc[j]);
                    acc[j] = fmaf(w.w, sv.w, acc[j]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < GDN_ST_MAX_IPT; ++j) {
            const int i = ty + GDN_ST_TY * j;
            if (i < C) {
                const float d = live ? sU[i * GDN_ST_VS + tx] - acc[j] : 0.0f;
                if (live) Delta[(hn * C + i) * V + col] = d;
                sDT[tx * ldk + i] = sF[i] * d;  // fla's fold: exp(G_C - G_i) on the delta row
            }
        }
        __syncthreads();  // fold * Delta complete
        // S <- dC S + KdT (fold * Delta): rows ty + 16 m, independent sums over i in order.
        float acc2[GDN_ST_MAX_RPT];
#pragma unroll
        for (int m = 0; m < GDN_ST_MAX_RPT; ++m) acc2[m] = 0.0f;
#pragma unroll 4
        for (int i = 0; i < Cp; i += 4) {
            const float4 dv = *reinterpret_cast<const float4*>(sDT + tx * ldk + i);
#pragma unroll
            for (int m = 0; m < GDN_ST_MAX_RPT; ++m) {
                const int r = ty + GDN_ST_TY * m;
                if (r < K) {
                    const float4 kv = *reinterpret_cast<const float4*>(sK + r * ldk + i);
                    acc2[m] = fmaf(kv.x, dv.x, acc2[m]);
                    acc2[m] = fmaf(kv.y, dv.y, acc2[m]);
                    acc2[m] = fmaf(kv.z, dv.z, acc2[m]);
                    acc2[m] = fmaf(kv.w, dv.w, acc2[m]);
                }
            }
        }
#pragma unroll
        for (int m = 0; m < GDN_ST_MAX_RPT; ++m) {
            const int r = ty + GDN_ST_TY * m;
            if (r < K) {
                s[m] = fmaf(sC[r], s[m], acc2[m]);
                sST[tx * ldw + r] = s[m];
            }
        }
        __syncthreads();  // the new state tile written; this stage free for chunk n + 2
    }
    if (live) {
#pragma unroll
        for (int m = 0; m < GDN_ST_MAX_RPT; ++m) {
            const int r = ty + GDN_ST_TY * m;
            if (r < K) state_out[((long long)hv * K + r) * V + col] = s[m];
        }
    }
}

// x: [T, D]; w: [D, W]; state: [D, W - 1]; y: [T, D]. gdn_conv_input: gdn_step.cuh.

extern "C" __global__ void causal_conv1d_f32(const float* __restrict__ x,
                                             const float* __restrict__ w,
                                             const float* __restrict__ state,
                                             float* __restrict__ y, const int T, const int D,
                                             const int W) {
    const long long total = (long long)T * D;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(idx % D);
        const int t = (int)(idx / D);
        float acc = 0.0f;
        for (int j = 0; j < W; ++j) acc += w[(long long)c * W + j] * gdn_conv_input(x, state, t + j, c, D, W);
        y[idx] = acc / (1.0f + expf(-acc));  // silu
    }
}

extern "C" __global__ void conv_state_update_f32(const float* __restrict__ x,
                                                 const float* __restrict__ state,
                                                 float* __restrict__ new_state, const int T,
                                                 const int D, const int W) {
    const long long total = (long long)D * (W - 1);
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(idx % (W - 1));
        const int c = (int)(idx / (W - 1));
        new_state[idx] = gdn_conv_input(x, state, T + j, c, D, W);
    }
}
