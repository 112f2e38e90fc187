// common.cuh: block-level reductions shared by the row kernels.
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

__device__ __forceinline__ float dfr_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(DFR_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float dfr_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(DFR_FULL_MASK, v, o));
    return v;
}

__device__ float block_sum(float v) {
    __shared__ float buf[32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = dfr_warp_sum(v);
    if (lane == 0) buf[wid] = v;
    __syncthreads();
    if (wid == 0) {
        v = (lane < nw) ? buf[lane] : 0.0f;
        v = dfr_warp_sum(v);
        if (lane == 0) buf[0] = v;
    }
    __syncthreads();
    v = buf[0];
    __syncthreads();
    return v;
}

__device__ float block_max(float v) {
    __shared__ float buf[32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = dfr_warp_max(v);
    if (lane == 0) buf[wid] = v;
    __syncthreads();
    if (wid == 0) {
        v = (lane < nw) ? buf[lane] : -INFINITY;
        v = dfr_warp_max(v);
        if (lane == 0) buf[0] = v;
    }
    __syncthreads();
    v = buf[0];
    __syncthreads();
    return v;
}

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
