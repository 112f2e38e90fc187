// reductions.cu: per-row reductions over logits for verify and the gates.
// Reference: dflash_ref/ops/reductions.py.
//
// Kernels (x: [rows, n] float32 contiguous; one output per row):
//   argmax_rows_f32(x, out, n)      out int64: index of the max, lowest index on ties
//   top1_prob_rows_f32(x, out, n)   out f32: 1 / sum exp(x - max)
//   entropy_rows_f32(x, out, n)     out f32: log s - sum exp(x - max) (x - max) / s, s = sum exp(x - max)
// Parallelisation: one block per row (grid.x = rows), threads stride the vocabulary and
// combine with block_max / block_sum / block_argmax (common.cuh).
// Launch: blockDim.x a multiple of 32, <= 1024; no dynamic shared memory.

extern "C" __global__ void argmax_rows_f32(const float* __restrict__ x, long long* __restrict__ out,
                                           const int n) {
    const long long row = blockIdx.x;
    const float* xr = x + row * n;
    float best = -INFINITY;
    int idx = DFR_INT_MAX;
    for (int j = threadIdx.x; j < n; j += blockDim.x) dfr_argmax_combine(best, idx, xr[j], j);
    idx = block_argmax(best, idx);
    if (threadIdx.x == 0) out[row] = (idx == DFR_INT_MAX) ? 0 : idx;
}

extern "C" __global__ void top1_prob_rows_f32(const float* __restrict__ x, float* __restrict__ out,
                                              const int n) {
    const long long row = blockIdx.x;
    const float* xr = x + row * n;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_max(m);
    float s = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s += expf(xr[j] - m);
    s = block_sum(s);
    if (threadIdx.x == 0) out[row] = 1.0f / s;
}

extern "C" __global__ void entropy_rows_f32(const float* __restrict__ x, float* __restrict__ out,
                                            const int n) {
    const long long row = blockIdx.x;
    const float* xr = x + row * n;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_max(m);
    float s = 0.0f, sl = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float sh = xr[j] - m;
        const float e = expf(sh);
        s += e;
        sl += (e > 0.0f) ? e * sh : 0.0f;  // a -inf logit adds 0, not 0 * -inf = NaN
    }
    s = block_sum(s);
    sl = block_sum(sl);
    if (threadIdx.x == 0) out[row] = logf(s) - sl / s;
}
