// gdn.cu: Gated DeltaNet kernels. Reference: dflash_ref/ops/gdn.py (equations: docs/gdn.md).
//
// Layouts (float32, contiguous, one sequence): q, k [T, H, K]; v [T, HV, V]; g [T, HV] (scalar
// gate) or [T, HV, K] (KDA); beta [T, HV]; state [HV, K, V] (rows = key channel); o [T, HV, V];
// trace [T, HV, K, V]. GQA is grouped: value head hv reads q/k head hv / (HV / H).
// The chunked prefill's kernels are in gdn_chunk.cu.
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
//   causal_conv1d_f32      y[t, c] = silu(sum_j w[c, j] xx[t + j, c]), xx = concat(state^T, x).
//   conv_state_update_f32  new_state[c, j] = xx[T + j, c]: the last W - 1 raw inputs.
//       Both conv kernels are grid-stride elementwise.
// Launch assumptions: blockDim == (GDN_REC_COLS, GDN_REC_WARPS) for the recurrent kernel;
// every pointer is contiguous float32; int arguments are 32-bit (the wrappers cast with np.int32).

#define GDN_REC_COLS 32          // value columns per block of the recurrent kernel (= lanes)
#define GDN_REC_WARPS 8          // row groups (warps) per block of the recurrent kernel
#define GDN_REC_MAX_ROWS 32      // rows per thread: K <= GDN_REC_WARPS * GDN_REC_MAX_ROWS = 256

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
