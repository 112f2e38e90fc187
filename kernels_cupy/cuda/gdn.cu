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
//   gdn_chunk_scores_f32   scalar gate: P = scale * QK^T * Gamma (i >= j), A = beta_i KK^T * Gamma
//       (i > j) from cuBLAS products; the mask is applied before exp. One thread per element of
//       the [B, C, C] score matrices (grid-stride).
//   gdn_chunk_scores_kda_f32  KDA gate: the same P and A with per-channel decays
//       sum_c x_ic k_jc exp(G_ic - G_jc), computed directly from Q, K, G. One thread per element.
//   gdn_chunk_solve_f32    [W | U] = (I + A)^-1 [beta e^G K | beta V] by forward substitution.
//       One block per (head, chunk); A staged in shared memory (C <= 64); each thread owns
//       columns of the right-hand side and walks the C rows in order.
//   gdn_chunk_state_f32    the sequential inter-chunk pass: Delta = U - W S0,
//       S <- exp(G_C) S + Kd^T Delta, saving every chunk-start state S0 and every Delta.
//       Grid (HV, ceil(V / 32)), block (32, 8): the block keeps a [K, 32] state tile and a
//       [C, 32] Delta tile in shared memory (K <= 256, C <= 64: 40 KiB static) and loops over
//       the N chunks; lane = column, threadIdx.y strides the rows.
//   causal_conv1d_f32      y[t, c] = silu(sum_j w[c, j] xx[t + j, c]), xx = concat(state^T, x).
//   conv_state_update_f32  new_state[c, j] = xx[T + j, c]: the last W - 1 raw inputs.
//       Both conv kernels are grid-stride elementwise.
// Launch assumptions: blockDim == (GDN_REC_COLS, GDN_REC_WARPS) for the recurrent kernel,
// blockDim.x == 32 for the state kernel; every pointer is
// contiguous float32; int arguments are 32-bit (the wrappers cast with np.int32).

#define GDN_REC_COLS 32          // value columns per block of the recurrent kernel (= lanes)
#define GDN_REC_WARPS 8          // row groups (warps) per block of the recurrent kernel
#define GDN_REC_MAX_ROWS 32      // rows per thread: K <= GDN_REC_WARPS * GDN_REC_MAX_ROWS = 256
#define GDN_MAX_C 64             // chunk size limit of the chunk kernels
#define GDN_MAX_K 256            // key dim limit of the chunk state kernel
#define GDN_STATE_COLS 32        // value columns per block in gdn_chunk_state_f32
#define GDN_STATE_ROWS 8         // threadIdx.y extent in gdn_chunk_state_f32

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
    const long long b = blockIdx.x;
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) sA[e] = A[b * C * C + e];
    __syncthreads();
    for (int c = threadIdx.x; c < Kd + Vd; c += blockDim.x) {
        const bool is_k = c < Kd;
        float* X = is_k ? W + b * C * Kd + c : U + b * C * Vd + (c - Kd);
        const int ld = is_k ? Kd : Vd;
        for (int i = 0; i < C; ++i) {
            const float bi = beta[b * C + i];
            // right-hand side: beta e^G k (the W columns) or beta v (the U columns)
            float x = is_k ? bi * expf(G[(b * C + i) * gk + (gk == 1 ? 0 : c)]) *
                                 Kc[(b * C + i) * Kd + c]
                           : bi * Vc[(b * C + i) * Vd + (c - Kd)];
            for (int j = 0; j < i; ++j) x -= sA[i * C + j] * X[(long long)j * ld];
            X[(long long)i * ld] = x;  // this thread wrote rows j < i itself: no sync needed
        }
    }
}

// W, Kd: [HV, N, C, K]; U: [HV, N, C, V]; dC: [HV, N, K] (exp(G_C) per state row);
// state_in/state_out: [HV, K, V]; S0s: [HV, N, K, V]; Delta: [HV, N, C, V].
extern "C" __global__ void gdn_chunk_state_f32(
    const float* __restrict__ W, const float* __restrict__ U, const float* __restrict__ Kdec,
    const float* __restrict__ dC, const float* __restrict__ state_in,
    float* __restrict__ state_out, float* __restrict__ S0s, float* __restrict__ Delta,
    const int N, const int C, const int K, const int V) {
    __shared__ float sS[GDN_MAX_K * GDN_STATE_COLS];
    __shared__ float sD[GDN_MAX_C * GDN_STATE_COLS];
    const int hv = blockIdx.x;
    const int lane = threadIdx.x;  // column within the tile
    const int col = blockIdx.y * GDN_STATE_COLS + lane;
    const bool live = col < V;
    const int ty = threadIdx.y;
    for (int r = ty; r < K; r += GDN_STATE_ROWS)
        sS[r * GDN_STATE_COLS + lane] = live ? state_in[((long long)hv * K + r) * V + col] : 0.0f;
    __syncthreads();
    for (int n = 0; n < N; ++n) {
        const long long hn = (long long)hv * N + n;
        const float* Wn = W + hn * C * K;
        const float* Kn = Kdec + hn * C * K;
        // save the chunk-start state (for the inter-chunk output term)
        if (live)
            for (int r = ty; r < K; r += GDN_STATE_ROWS)
                S0s[(hn * K + r) * V + col] = sS[r * GDN_STATE_COLS + lane];
        // Delta = U - W S0
        for (int i = ty; i < C; i += GDN_STATE_ROWS) {
            float x = 0.0f;
            for (int r = 0; r < K; ++r) x += Wn[i * K + r] * sS[r * GDN_STATE_COLS + lane];
            const float d = live ? U[(hn * C + i) * V + col] - x : 0.0f;
            sD[i * GDN_STATE_COLS + lane] = d;
            if (live) Delta[(hn * C + i) * V + col] = d;
        }
        __syncthreads();
        // S <- exp(G_C) S + Kd^T Delta (row r scaled by dC[r]; equal for a scalar gate)
        for (int r = ty; r < K; r += GDN_STATE_ROWS) {
            float x = 0.0f;
            for (int i = 0; i < C; ++i) x += Kn[i * K + r] * sD[i * GDN_STATE_COLS + lane];
            sS[r * GDN_STATE_COLS + lane] = dC[hn * K + r] * sS[r * GDN_STATE_COLS + lane] + x;
        }
        __syncthreads();
    }
    if (live)
        for (int r = ty; r < K; r += GDN_STATE_ROWS)
            state_out[((long long)hv * K + r) * V + col] = sS[r * GDN_STATE_COLS + lane];
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
