// gdn_chunk.cu: the chunked Gated DeltaNet prefill, three kernels per block of chunks.
// Reference: dflash_ref/ops/gdn.py::gdn_chunked and ops/_gdn_chunk.py (equations: docs/gdn.md,
// sections 2 and 8). Wrapper: kernels_cupy/gdn.py::gdn_chunked.
//
// Layouts (float32, contiguous): the block's tokens q, k [T, H, K]; v [T, HV, V]; g [T, HV]
// (scalar gate, gk = 1) or [T, HV, K] (KDA, gk = K); beta [T, HV]; o [T, HV, V]. Chunked
// temporaries [HV, N, ...] with N = ceil(T / C) chunks of C tokens, the last zero-padded (exact:
// g = beta = 0 there). GQA is grouped: value head hv reads q/k head hv / (HV / H).
//
// Kernels:
//   gdn_chunk_prep_f32     everything of a chunk that does not depend on the state, from the
//       raw inputs: G = running sum of g (token order), P = scale (Q K^T) Gamma (i >= j),
//       A = beta_i (K K^T) Gamma (i > j) (Gamma_ij = exp(G_i - G_j), masked before exp; KDA: the
//       decay inside the sum over channels), Tinv = (I + A)^-1 by a blocked inverse, then
//       [W | U] = Tinv [beta e^G K | beta V], and the state pass's operands KdT, fold, dC (see
//       the state kernel). One block per (value head, chunk), GDN_PREP_THREADS threads. Dynamic
//       shared memory (kernels_cupy/gdn.py::plan_chunk_prep): K [C][K + 1], G [C][gk or K + 1],
//       beta [C], A [C][C + 1], then Q [C][K + 1] whose space the inverse's temporaries, then
//       one column slot per thread [C][GDN_PREP_THREADS], reuse. Scores: one thread per (i, j),
//       sums over the channels in order. Inverse (gdn_prep_invert), in place of A: the
//       GDN_INV_B x GDN_INV_B diagonal blocks by forward substitution (thread (b, col): column
//       col of block b, rows in order), then block rows bi = 1, 2, ... in order, each as
//       Y = sum_(l = bj)^(bi - 1) A_(bi, l) Tinv_(l, bj) for every bj < bi and
//       Tinv_(bi, bj) = -Tinv_(bi, bi) Y (one thread per element, sums in index order; two
//       barriers per block row). Product: thread t owns columns t, t + 128, ... of [W | U],
//       puts the column's right-hand side in its slots, and forms rows i0 .. i0 + 3 at a time
//       (four independent sums over j <= i in order; no barrier). CPU emulation and the
//       tolerance against the serial solve: tests/kernels/test_gdn_prep_inverse.py.
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
//       n + 1 loads while chunk n computes. W and KdT are padded by the prep kernel to Kp, Cp
//       (multiples of 4, zeros). Three barriers per chunk.
//   gdn_chunk_output_f32   o = [scale Q e^G | P] [S0 ; Delta] for each chunk, written in place
//       into o [T, HV, V] (padded rows are not written). Grid (HV * N, ceil(V / GDN_OUT_VT)),
//       block (16, 16): thread (tx, ty) owns rows ty + 16 a (a < 4) and columns tx + 16 b
//       (b < 4) of the block's [C, 64] tile; one accumulator per output, the K + C terms summed
//       in order (state rows first, then the chunk's delta rows) with fmaf, in slabs of
//       GDN_OUT_KS staged in shared memory.
// A chunk whose g has an entry > 0 (not a log decay) gets beta = NaN in the prep kernel: the
// head's outputs from that chunk on and its state come out NaN (no host check, no sync).
// Launch assumptions: sm_80+ (cp.async); blockDim as stated per kernel; C <= GDN_MAX_C,
// K <= GDN_MAX_K; every pointer is contiguous float32; int arguments are 32-bit.

#define GDN_MAX_C 64             // chunk size limit of the chunk kernels
#define GDN_MAX_K 256            // key dim limit of the chunk kernels
#define GDN_PREP_THREADS 128     // threads per block of gdn_chunk_prep_f32 (= solve slots)
#define GDN_INV_B 16             // diagonal block size of the prep kernel's blocked inverse
#define GDN_ST_VS 16             // value columns per block of gdn_chunk_state_f32 (threadIdx.x)
#define GDN_ST_TY 16             // threadIdx.y extent of gdn_chunk_state_f32
#define GDN_ST_THREADS 256       // GDN_ST_VS * GDN_ST_TY
#define GDN_ST_MAX_RPT 16        // state rows per thread: K <= GDN_ST_TY * GDN_ST_MAX_RPT = 256
#define GDN_ST_MAX_IPT 4         // Delta rows per thread: C <= GDN_ST_TY * GDN_ST_MAX_IPT = 64
#define GDN_OUT_VT 64            // value columns per block of gdn_chunk_output_f32
#define GDN_OUT_TX 16            // block (GDN_OUT_TX, GDN_OUT_TX): rows ty + 16 a, cols tx + 16 b
#define GDN_OUT_KS 16            // reduction terms per shared-memory slab of the output kernel

// (I + A)^-1 in place of the strictly lower A [C][C + 1] (zeros on and above the diagonal), for
// C <= GDN_MAX_C, blocked by GDN_INV_B (the last block may be smaller); sT: temporaries of at
// least min(C, GDN_INV_B) * GDN_INV_B floats when C <= GDN_INV_B, else ceil(C / GDN_INV_B)
// * GDN_INV_B^2 (inside the prep kernel's query space). Called by every thread of the block.
__device__ __forceinline__ void gdn_prep_invert(float* sA, float* sT, const int C,
                                                const int tid) {
    constexpr int B = GDN_INV_B, BB = GDN_INV_B * GDN_INV_B;
    const int lda = C + 1;
    const int nb = (C + B - 1) / B;
    // 1. Diagonal blocks: thread (b, col) forward-substitutes column col of block b's inverse,
    //    D_b[i][col] = delta(i, col) - sum_(col <= j < i) A[o + i][o + j] D_b[j][col], into sT.
    for (int e = tid; e < nb * B; e += GDN_PREP_THREADS) {
        const int b = e / B, col = e % B, o = b * B;
        const int bs = min(B, C - o);
        float* D = sT + b * BB;
        for (int i = 0; i < bs; ++i) {
            float x = (i == col) ? 1.0f : 0.0f;
            if (col < bs)
                for (int j = col; j < i; ++j) x = fmaf(-sA[(o + i) * lda + o + j], D[j * B + col], x);
            D[i * B + col] = x;  // rows of this column: only this thread writes and reads them
        }
    }
    __syncthreads();
    for (int e = tid; e < nb * BB; e += GDN_PREP_THREADS) {  // D_b over A's diagonal block
        const int b = e / BB, i = (e / B) % B, j = e % B, o = b * B;
        if (o + i < C && o + j < C) sA[(o + i) * lda + o + j] = sT[e];
    }
    __syncthreads();
    // 2. Block rows in order: Y_bj = sum_(m = oj)^(oi - 1) A[oi + r][m] Tinv[m][oj + c] (block
    //    row bi of A still intact, earlier block rows already inverted), then
    //    Tinv[oi + r][oj + c] = -sum_(m <= r) D_bi[r][m] Y_bj[m][c] over A's block (bi, bj).
    for (int bi = 1; bi < nb; ++bi) {
        const int oi = bi * B, bsi = min(B, C - oi);
        for (int e = tid; e < bi * BB; e += GDN_PREP_THREADS) {
            const int bj = e / BB, r = (e / B) % B, c = e % B, oj = bj * B;
            float y = 0.0f;
            if (r < bsi)
                for (int m = oj; m < oi; ++m) y = fmaf(sA[(oi + r) * lda + m], sA[m * lda + oj + c], y);
            sT[e] = y;
        }
        __syncthreads();
        for (int e = tid; e < bi * BB; e += GDN_PREP_THREADS) {
            const int bj = e / BB, r = (e / B) % B, c = e % B, oj = bj * B;
            if (r < bsi) {
                float x = 0.0f;
                for (int m = 0; m <= r; ++m)
                    x = fmaf(-sA[(oi + r) * lda + oi + m], sT[bj * BB + m * B + c], x);
                sA[(oi + r) * lda + oj + c] = x;
            }
        }
        __syncthreads();
    }
}

// Outputs, per (value head, chunk) hn: W [C, Kp] (zero past K), KdT [K, Cp] (zero past C),
// U [C, V], fold [C], dC [K], P [C, C] (zero above the diagonal), G [C, gk].
extern "C" __global__ void gdn_chunk_prep_f32(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, float* __restrict__ W,
    float* __restrict__ KdT, float* __restrict__ U, float* __restrict__ fold,
    float* __restrict__ dC, float* __restrict__ P, float* __restrict__ Gout, const int T,
    const int H, const int HV, const int N, const int C, const int K, const int V, const int gk,
    const int Kp, const int Cp, const float scale) {
    extern __shared__ float4 gdn_smem4[];
    float* smem = reinterpret_cast<float*>(gdn_smem4);
    const int ldk = K + 1;                   // odd row strides: walks down a column are
    const int ldg = (gk == 1) ? 1 : K + 1;   // free of bank conflicts
    float* sK = smem;                        // [C][ldk] keys, zero past T
    float* sG = sK + C * ldk;                // [C][ldg] the gate, then its running sum
    float* sB = sG + C * ldg;                // [C] beta, zero past T
    float* sA = sB + C;                      // [C][C + 1] A, strictly lower
    float* sX = sA + C * (C + 1);            // [C][ldk] queries, then [C][threads] solve slots
    const long long hn = blockIdx.x;
    const int hv = (int)(hn / N), n = (int)(hn % N);
    const int hk = hv / (HV / H);            // grouped GQA
    const int t0 = n * C;
    const int nT = min(C, T - t0);           // real tokens of this chunk
    const int tid = threadIdx.x;

    for (int e = tid; e < C * K; e += GDN_PREP_THREADS) {
        const int i = e / K, c = e % K;
        const long long src = ((long long)(t0 + i) * H + hk) * K + c;
        sK[i * ldk + c] = (i < nT) ? k[src] : 0.0f;
        sX[i * ldk + c] = (i < nT) ? q[src] : 0.0f;
    }
    int rising = 0;  // a log decay g > 0 seen by this thread
    for (int e = tid; e < C * gk; e += GDN_PREP_THREADS) {
        const int i = e / gk, c = e % gk;
        const float gv = (i < nT) ? g[((long long)(t0 + i) * HV + hv) * gk + c] : 0.0f;
        rising |= gv > 0.0f;
        sG[i * ldg + c] = gv;
    }
    for (int i = tid; i < C; i += GDN_PREP_THREADS)
        sB[i] = (i < nT) ? beta[(long long)(t0 + i) * HV + hv] : 0.0f;
    // The log-decay rule, checked here rather than on the host (no synchronisation): a chunk
    // with any g > 0 gets beta = NaN, so its W, U, Delta, every later chunk's state and output
    // of this head, and the returned state are NaN (the NumPy reference raises instead).
    rising = __syncthreads_or(rising);
    for (int c = tid; c < gk; c += GDN_PREP_THREADS)  // G_i = G_(i-1) + g_i, in token order
        for (int i = 1; i < C; ++i) sG[i * ldg + c] += sG[(i - 1) * ldg + c];
    if (rising)
        for (int i = tid; i < C; i += GDN_PREP_THREADS) sB[i] = __int_as_float(0x7fffffff);
    __syncthreads();

    // Scores: P (written out) and A (kept in shared memory); only i >= j is exponentiated.
    for (int e = tid; e < C * C; e += GDN_PREP_THREADS) {
        const int i = e / C, j = e % C;
        float p = 0.0f, a = 0.0f;
        if (i >= j) {
            const float* qi = sX + i * ldk;
            const float* ki = sK + i * ldk;
            const float* kj = sK + j * ldk;
            if (gk == 1) {
                float qk = 0.0f, kk = 0.0f;
                for (int c = 0; c < K; ++c) {
                    qk = fmaf(qi[c], kj[c], qk);
                    kk = fmaf(ki[c], kj[c], kk);
                }
                const float gamma = expf(sG[i] - sG[j]);  // G_i - G_j <= 0
                p = scale * qk * gamma;
                a = sB[i] * kk * gamma;
            } else {
                const float* gi = sG + i * ldg;
                const float* gj = sG + j * ldg;
                for (int c = 0; c < K; ++c) {
                    const float ex = expf(gi[c] - gj[c]);  // <= 1
                    p = fmaf(qi[c] * kj[c], ex, p);
                    a = fmaf(ki[c] * kj[c], ex, a);
                }
                p = scale * p;
                a = sB[i] * a;
            }
        }
        P[hn * C * C + e] = p;
        sA[i * (C + 1) + j] = (i > j) ? a : 0.0f;
    }
    __syncthreads();  // A complete; the queries are dead, their space becomes the solve slots

    // The state pass's operands: KdT [K, Cp], fold [C], dC [K]; G for the output kernel.
    const float* gC = sG + (C - 1) * ldg;  // G at the chunk's end
    for (int e = tid; e < K * Cp; e += GDN_PREP_THREADS) {
        const int r = e / Cp, i = e % Cp;
        float x = 0.0f;
        if (i < C) x = (gk == 1) ? sK[i * ldk + r] : sK[i * ldk + r] * expf(gC[r] - sG[i * ldg + r]);
        KdT[hn * K * Cp + e] = x;
    }
    for (int i = tid; i < C; i += GDN_PREP_THREADS)
        fold[hn * C + i] = (gk == 1) ? expf(gC[0] - sG[i]) : 1.0f;
    for (int r = tid; r < K; r += GDN_PREP_THREADS) dC[hn * K + r] = expf(gC[(gk == 1) ? 0 : r]);
    for (int e = tid; e < C * gk; e += GDN_PREP_THREADS)
        Gout[hn * C * gk + e] = sG[(e / gk) * ldg + e % gk];
    for (int e = tid; e < C * (Kp - K); e += GDN_PREP_THREADS)  // W's zero padding
        W[hn * C * Kp + (long long)(e / (Kp - K)) * Kp + K + e % (Kp - K)] = 0.0f;

    gdn_prep_invert(sA, sX, C, tid);  // sA <- (I + A)^-1 (lower, ones on the diagonal)

    // [W | U] = Tinv [beta e^G K | beta V]: the column's right-hand side into this thread's
    // slots, then rows i0 .. i0 + 3 as four independent sums over j <= i, in j order.
    for (int c = tid; c < K + V; c += GDN_PREP_THREADS) {
        const bool is_k = c < K;
        float* X = is_k ? W + hn * C * Kp + c : U + hn * C * V + (c - K);
        const int ld = is_k ? Kp : V;
        for (int i = 0; i < C; ++i) {
            const float bi = sB[i];
            float x;
            if (is_k)
                x = bi * expf(sG[i * ldg + ((gk == 1) ? 0 : c)]) * sK[i * ldk + c];
            else
                x = (i < nT) ? bi * v[((long long)(t0 + i) * HV + hv) * V + (c - K)] : 0.0f;
            sX[i * GDN_PREP_THREADS + tid] = x;  // only this thread reads its slots
        }
        for (int i0 = 0; i0 < C; i0 += 4) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const int jend = min(C, i0 + 4);
            for (int j = 0; j < jend; ++j) {
                const float r = sX[j * GDN_PREP_THREADS + tid];
#pragma unroll
                for (int a = 0; a < 4; ++a)
                    if (j <= i0 + a && i0 + a < C)
                        acc[a] = fmaf(sA[(i0 + a) * (C + 1) + j], r, acc[a]);
            }
#pragma unroll
            for (int a = 0; a < 4; ++a)
                if (i0 + a < C) X[(long long)(i0 + a) * ld] = acc[a];
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
// Delta: [HV, N, C, V]. Dynamic shared memory: kernels_cupy/gdn.py::plan_state_pass.
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


// q: [T, H, K]; G: [HV, N, C, gk]; P: [HV, N, C, C]; S0s: [HV, N, K, V]; Delta: [HV, N, C, V];
// o: [T, HV, V] (the block's rows), written in place.
extern "C" __global__ void gdn_chunk_output_f32(
    const float* __restrict__ q, const float* __restrict__ G, const float* __restrict__ P,
    const float* __restrict__ S0s, const float* __restrict__ Delta, float* __restrict__ o,
    const int T, const int H, const int HV, const int N, const int C, const int K, const int V,
    const int gk, const float scale) {
    __shared__ float sA[GDN_MAX_C][GDN_OUT_KS + 1];  // [scale Q e^G | P] slab: rows i, terms r
    __shared__ float sB[GDN_OUT_KS][GDN_OUT_VT];     // [S0 ; Delta] slab: terms r, columns
    const int nthreads = GDN_OUT_TX * GDN_OUT_TX;
    const long long hn = blockIdx.x;
    const int hv = (int)(hn / N), n = (int)(hn % N);
    const int hk = hv / (HV / H);
    const int t0 = n * C;
    const int nT = min(C, T - t0);
    const int c0 = blockIdx.y * GDN_OUT_VT;
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * GDN_OUT_TX + tx;
    const int R = K + C;  // reduction terms: K state rows, then C delta rows
    float acc[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] = 0.0f;
    for (int r0 = 0; r0 < R; r0 += GDN_OUT_KS) {
        for (int e = tid; e < GDN_MAX_C * GDN_OUT_KS; e += nthreads) {
            const int i = e / GDN_OUT_KS, rr = e % GDN_OUT_KS, r = r0 + rr;
            float x = 0.0f;
            if (i < nT && r < R) {
                if (r < K)
                    x = q[((long long)(t0 + i) * H + hk) * K + r] *
                        (scale * expf(G[(hn * C + i) * gk + ((gk == 1) ? 0 : r)]));
                else
                    x = P[(hn * C + i) * C + (r - K)];
            }
            sA[i][rr] = x;
        }
        for (int e = tid; e < GDN_OUT_KS * GDN_OUT_VT; e += nthreads) {
            const int rr = e / GDN_OUT_VT, x = e % GDN_OUT_VT, r = r0 + rr, col = c0 + x;
            float y = 0.0f;
            if (r < R && col < V)
                y = (r < K) ? S0s[(hn * K + r) * V + col] : Delta[(hn * C + (r - K)) * V + col];
            sB[rr][x] = y;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < GDN_OUT_KS; ++rr) {
            float av[4], bv[4];
#pragma unroll
            for (int a = 0; a < 4; ++a) av[a] = sA[ty + GDN_OUT_TX * a][rr];
#pragma unroll
            for (int b = 0; b < 4; ++b) bv[b] = sB[rr][tx + GDN_OUT_TX * b];
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int b = 0; b < 4; ++b) acc[a][b] = fmaf(av[a], bv[b], acc[a][b]);
        }
        __syncthreads();  // the slab is free for the next terms
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        const int i = ty + GDN_OUT_TX * a;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const int col = c0 + tx + GDN_OUT_TX * b;
            if (i < nT && col < V) o[((long long)(t0 + i) * HV + hv) * V + col] = acc[a][b];
        }
    }
}
