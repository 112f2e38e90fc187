// gdn_step.cuh: device code shared by gdn.cu and gdn_tree.cu. First, one token of the Gated
// DeltaNet recurrence for one thread of the coalesced mapping that gdn_recurrent_f32 (gdn.cu)
// and gdn_tree_recurrent_f32 (gdn_tree.cu) share
// (reference: dflash_ref/ops/gdn.py `recurrent_step`; equations: docs/gdn.md).
//
// Lane `lane` of warp `wy` owns value column `col` and the state rows wy, wy + WARPS, ... of
// value head hv, in registers s[]. Token t, in the reference's order:
//   1. decay  s <- exp(g_t) s (KDA: per row),  2. read  rd = S^T k_t (decayed state),
//   3. delta  d = beta_t (v_t - rd),           4. write s <- s + k_t d,
//   5. output o_t = scale S^T q_t (updated state).
// The two dot products sum this thread's rows, then the WARPS partials through shared memory
// (part_rd, part_out: [WARPS][32]) in a fixed order: two __syncthreads per token, which every
// thread of the block must reach (dead lanes pass live = false).

template <int WARPS, int ROWS>
__device__ __forceinline__ void gdn_token_step(
    float (&s)[ROWS], float (*part_rd)[32], float (*part_out)[32],
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, float* __restrict__ o,
    const int t, const int H, const int HV, const int K, const int V, const int hv,
    const int hk, const int wy, const int lane, const int col, const bool live, const int kda,
    const float scale) {
    const float* kt = k + ((long long)t * H + hk) * K;  // read by a whole warp at one
    const float* qt = q + ((long long)t * H + hk) * K;  // address: a broadcast
    const long long th = (long long)t * HV + hv;
    const float decay = kda ? 0.0f : expf(g[th]);
    const float b = beta[th];
    // 1. decay, 2. read with the decayed state (this thread's rows, then across warps)
    float rd = 0.0f;
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
        const int kk = wy + WARPS * i;
        if (kk < K) {
            s[i] *= kda ? expf(g[th * K + kk]) : decay;
            rd += s[i] * kt[kk];
        }
    }
    part_rd[wy][lane] = rd;
    __syncthreads();  // (also: every thread has read part_out of the previous token)
    rd = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) rd += part_rd[w][lane];  // same order everywhere
    // 3. delta, 4. rank-1 write, 5. output from the updated state
    const float vt = live ? v[th * V + col] : 0.0f;
    const float delta = b * (vt - rd);
    float out = 0.0f;
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
        const int kk = wy + WARPS * i;
        if (kk < K) {
            s[i] += kt[kk] * delta;
            out += s[i] * qt[kk];
        }
    }
    part_out[wy][lane] = out;
    __syncthreads();  // (also: every thread has read part_rd of this token)
    if (wy == 0 && live) {
        out = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) out += part_out[w][lane];
        o[th * V + col] = scale * out;
    }
}

// The raw conv input at row m of xx = concat(state^T, x): state column m for m < W - 1, else
// row (token or tree node) m - (W - 1). x: [T, D]; state: [D, W - 1]. Shared by the chain and
// tree short-conv kernels.
__device__ __forceinline__ float gdn_conv_input(const float* x, const float* state, int m, int c,
                                                int D, int W) {
    return (m < W - 1) ? state[(long long)c * (W - 1) + m] : x[(long long)(m - (W - 1)) * D + c];
}
