// common.cuh: block-level reductions shared by the row kernels, and the split-key attention
// kernels' output epilogue (dfr_attention_write_rows).
// _build.py prepends this text to every family source before compiling (no #include, so CuPy's
// source-keyed kernel cache can never serve a module built against an older header).
//
// Launch assumptions for every user: blockDim.x is a multiple of 32 and at most 1024.
// block_sum / block_max / block_argmax return the block-wide result to EVERY thread and end
// with __syncthreads(), so they may be called several times in a row within one kernel.

// NVRTC compiles without the host math headers, so INFINITY is not predefined.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

#define DFR_FULL_MASK 0xffffffffu
#define DFR_INT_MAX 0x7fffffff

// The one block-wide reduction behind block_sum / block_max (and reductions.cu's integer sum
// and min): each warp combines its lanes with xor shuffles, warp 0 combines the warps' results
// (lanes past the last warp contribute `identity`), and every thread gets the result.
// Each instantiation has its own shared buffer.
template <typename T, typename Op>
__device__ __forceinline__ T dfr_block_reduce(T v, const T identity, const Op op) {
    __shared__ T buf[32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(DFR_FULL_MASK, v, o));
    if (lane == 0) buf[wid] = v;
    __syncthreads();
    if (wid == 0) {
        v = (lane < nw) ? buf[lane] : identity;
        for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(DFR_FULL_MASK, v, o));
        if (lane == 0) buf[0] = v;
    }
    __syncthreads();
    v = buf[0];
    __syncthreads();
    return v;
}

struct DfrAdd {
    template <typename T>
    __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct DfrMaxF {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct DfrMinI {
    __device__ __forceinline__ int operator()(int a, int b) const { return min(a, b); }
};

__device__ float block_sum(float v) { return dfr_block_reduce(v, 0.0f, DfrAdd()); }

__device__ float block_max(float v) { return dfr_block_reduce(v, -INFINITY, DfrMaxF()); }

// (v, i) <- the larger value; on equal values the lower index (NumPy argmax semantics).
__device__ __forceinline__ void dfr_argmax_combine(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) { v = v2; i = i2; }
}

__device__ int block_argmax(float v, int i) {
    __shared__ float bv[32];
    __shared__ int bi[32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(DFR_FULL_MASK, v, o);
        int i2 = __shfl_xor_sync(DFR_FULL_MASK, i, o);
        dfr_argmax_combine(v, i, v2, i2);
    }
    if (lane == 0) { bv[wid] = v; bi[wid] = i; }
    __syncthreads();
    if (wid == 0) {
        v = (lane < nw) ? bv[lane] : -INFINITY;
        i = (lane < nw) ? bi[lane] : DFR_INT_MAX;
        for (int o = 16; o > 0; o >>= 1) {
            float v2 = __shfl_xor_sync(DFR_FULL_MASK, v, o);
            int i2 = __shfl_xor_sync(DFR_FULL_MASK, i, o);
            dfr_argmax_combine(v, i, v2, i2);
        }
        if (lane == 0) bi[0] = i;
    }
    __syncthreads();
    i = bi[0];
    __syncthreads();
    return i;
}

// The epilogue of the split-key attention kernels (attention.cu's attention_fwd_* and
// attention_decode.cu's attention_decode_*): each of a warp's NR row slots that holds a row is
// written as the final output (n_splits == 1: out = acc / l, 0 when l == 0, no visible key) or
// as this split's partial state (unnormalised acc -> part_o [S, Tq * nh, d], (m, l) -> part_ml
// [S, Tq * nh, 2]; the combine kernels finish). Slot s of warp `warp` is block row
// s * NWARPS + warp, i.e. the flattened (query, head-in-group) row rg = row0 + s * NWARPS + warp
// of kv head kvh, query row qi[s]; lane + 32 c is the lane's column c (DC columns per lane).
template <int NR, int DC, int NWARPS, typename QI>
__device__ __forceinline__ void dfr_attention_write_rows(
    const float (&acc)[NR][DC], const float (&m)[NR], const float (&l)[NR],
    const bool (&row_ok)[NR], const QI (&qi)[NR], float* __restrict__ out,
    float* __restrict__ part_o, float* __restrict__ part_ml, const long long row0,
    const int warp, const int lane, const int g, const int kvh, const int nh, const int Tq,
    const int d, const int split, const int n_splits) {
#pragma unroll
    for (int s = 0; s < NR; ++s) {
        if (!row_ok[s]) continue;
        const long long rg = row0 + s * NWARPS + warp;
        const long long i = qi[s];
        const int h = kvh * g + (int)(rg - i * g);
        const long long orow = i * nh + h;  // row of out / part_* in [Tq * nh]
        if (n_splits == 1) {
            const float inv = (l[s] > 0.0f) ? 1.0f / l[s] : 0.0f;  // no visible key -> 0
#pragma unroll
            for (int c = 0; c < DC; ++c) {
                const int dd = lane + 32 * c;
                if (dd < d) out[orow * d + dd] = acc[s][c] * inv;
            }
        } else {
            const long long prow = (long long)split * Tq * nh + orow;
#pragma unroll
            for (int c = 0; c < DC; ++c) {
                const int dd = lane + 32 * c;
                if (dd < d) part_o[prow * d + dd] = acc[s][c];
            }
            if (lane == 0) {
                part_ml[prow * 2 + 0] = m[s];
                part_ml[prow * 2 + 1] = l[s];
            }
        }
    }
}
