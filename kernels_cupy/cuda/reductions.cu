// reductions.cu: per-row reductions over logits for verify and the gates.
// Reference: dflash_ref/ops/reductions.py.
//
// Kernels (x: [rows, n] float32 contiguous; one output per row):
//   argmax_rows_f32(x, out, n)           out int64: index of the max, lowest index on ties;
//                                        the first NaN if the row holds one
//   top1_prob_rows_f32(x, out, n)        out f32: 1 / sum exp(x - max); NaN if max is not finite
//   entropy_rows_f32(x, out, n)          out f32: log s - sum exp(x - max) (x - max) / s,
//                                        s = sum exp(x - max); NaN if max is not finite
//   count_nonfinite_rows_f32(x, out, n)  out int64: number of NaN, +inf and -inf entries
// Non-finite rule (docs/conventions.md, "Non-finite logits"), the same as NumPy's:
//   argmax: NaN is greater than every number and the first NaN wins; +-inf are ordinary values.
//   top1/entropy: "max is not finite" means the row holds a NaN or a +inf, or is all -inf
//   (fmaxf skips NaN, so NaN is detected by its own count, not through the max).
// Parallelisation: one block per row (grid.x = rows), threads stride the vocabulary and
// combine with block_max / block_sum / block_argmax (common.cuh) and the integer block
// reductions below.
// Launch: blockDim.x a multiple of 32, <= 1024; no dynamic shared memory.

#define DFR_NAN __int_as_float(0x7fc00000)

// Block-wide integer sum / min (common.cuh's dfr_block_reduce), returned to every thread.
__device__ int dfr_block_sum_int(int v) { return dfr_block_reduce(v, 0, DfrAdd()); }

__device__ int dfr_block_min_int(int v) { return dfr_block_reduce(v, DFR_INT_MAX, DfrMinI()); }

extern "C" __global__ void argmax_rows_f32(const float* __restrict__ x, long long* __restrict__ out,
                                           const int n) {
    const long long row = blockIdx.x;
    const float* xr = x + row * n;
    float best = -INFINITY;
    int idx = DFR_INT_MAX;
    int first_nan = DFR_INT_MAX;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float v = xr[j];
        if (isnan(v)) first_nan = min(first_nan, j);
        else dfr_argmax_combine(best, idx, v, j);
    }
    first_nan = dfr_block_min_int(first_nan);
    idx = block_argmax(best, idx);
    if (threadIdx.x == 0) {
        // A NaN wins over every number; a row of -inf ties at -inf and gives its lowest index, 0.
        out[row] = (first_nan != DFR_INT_MAX) ? first_nan : ((idx == DFR_INT_MAX) ? 0 : idx);
    }
}

// max over the row and whether softmax is defined: no NaN (counted, since fmaxf skips NaN), and
// a finite max (not +inf, not -inf from an all -inf row).
__device__ bool dfr_softmax_max(const float* __restrict__ xr, const int n, float& m) {
    m = -INFINITY;
    int nans = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float v = xr[j];
        nans += isnan(v) ? 1 : 0;
        m = fmaxf(m, v);
    }
    m = block_max(m);
    nans = dfr_block_sum_int(nans);
    return nans == 0 && isfinite(m);
}

extern "C" __global__ void top1_prob_rows_f32(const float* __restrict__ x, float* __restrict__ out,
                                              const int n) {
    const long long row = blockIdx.x;
    const float* xr = x + row * n;
    float m;
    if (!dfr_softmax_max(xr, n, m)) {  // block-uniform: every thread returns together
        if (threadIdx.x == 0) out[row] = DFR_NAN;
        return;
    }
    float s = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s += expf(xr[j] - m);
    s = block_sum(s);
    if (threadIdx.x == 0) out[row] = 1.0f / s;
}

extern "C" __global__ void entropy_rows_f32(const float* __restrict__ x, float* __restrict__ out,
                                            const int n) {
    const long long row = blockIdx.x;
    const float* xr = x + row * n;
    float m;
    if (!dfr_softmax_max(xr, n, m)) {  // block-uniform: every thread returns together
        if (threadIdx.x == 0) out[row] = DFR_NAN;
        return;
    }
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

extern "C" __global__ void count_nonfinite_rows_f32(const float* __restrict__ x,
                                                    long long* __restrict__ out, const int n) {
    const long long row = blockIdx.x;
    const float* xr = x + row * n;
    int c = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) c += isfinite(xr[j]) ? 0 : 1;
    c = dfr_block_sum_int(c);
    if (threadIdx.x == 0) out[row] = c;
}
