// norm.cu: row-wise normalisation kernels. Reference: dflash_ref/ops/norm.py.
//
// Kernels (all float32, contiguous row-major [rows, n]):
//   rms_norm_f32(x, w, y, n, eps, offset)    y = (offset + w) * x / sqrt(mean(x^2) + eps)
//   add_rms_norm_f32(x, r, w, h, y, n, eps, offset)
//                                            h = x + r; y = (offset + w) * h / sqrt(mean(h^2) + eps)
//   norm_add_rms_norm_f32(x, r, w, w2, m, h, y, n, eps, offset)
//                                            m = (offset + w) * x / sqrt(mean(x^2) + eps); h = m + r;
//                                            y = (offset + w2) * h / sqrt(mean(h^2) + eps)
//   l2_norm_f32(x, y, n, eps, mode, H, rs, hs)
//                                            mode 0: x / sqrt(sum x^2 + eps); 1: x / max(|x|, eps)
//                                            x [R, H, n], row (r, h) at x + r * rs + h * hs (read
//                                            in place: strided rows and heads); y contiguous
//   gated_rms_norm_f32(x, z, w, y, n, eps)   y = w * x / sqrt(mean(x^2) + eps) * silu(z)
// Parallelisation: one block per row (grid.x = rows); the block's threads stride over the n
// channels, accumulate a partial sum of squares, and combine it with block_sum (common.cuh).
// add_rms_norm_f32 reads x and r once: each thread keeps the h values it wrote and reads them
// back from its own writes (same thread, same addresses, no barrier needed) for the second pass.
// norm_add_rms_norm_f32 makes three passes over its row, each thread over the same channels: the
// mean square of x; m and h written, the mean square of h accumulated; h read back (its own
// writes) and normed.
// Launch: blockDim.x a multiple of 32, <= 1024; no dynamic shared memory.

extern "C" __global__ void rms_norm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                        float* __restrict__ y, const int n, const float eps,
                                        const float offset) {
    const long long row = blockIdx.x;
    const float* xr = x + row * n;
    float* yr = y + row * n;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) ss += xr[j] * xr[j];
    const float inv = 1.0f / sqrtf(block_sum(ss) / (float)n + eps);
    for (int j = threadIdx.x; j < n; j += blockDim.x) yr[j] = xr[j] * inv * (offset + w[j]);
}

extern "C" __global__ void add_rms_norm_f32(const float* __restrict__ x,
                                            const float* __restrict__ r,
                                            const float* __restrict__ w, float* __restrict__ h,
                                            float* __restrict__ y, const int n, const float eps,
                                            const float offset) {
    const long long row = blockIdx.x;
    const float* xr = x + row * n;
    const float* rr = r + row * n;
    float* hr = h + row * n;
    float* yr = y + row * n;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float hj = xr[j] + rr[j];
        hr[j] = hj;
        ss += hj * hj;
    }
    const float inv = 1.0f / sqrtf(block_sum(ss) / (float)n + eps);
    for (int j = threadIdx.x; j < n; j += blockDim.x) yr[j] = hr[j] * inv * (offset + w[j]);
}

extern "C" __global__ void norm_add_rms_norm_f32(
    const float* __restrict__ x, const float* __restrict__ r, const float* __restrict__ w,
    const float* __restrict__ w2, float* __restrict__ m, float* __restrict__ h,
    float* __restrict__ y, const int n, const float eps, const float offset) {
    const long long row = blockIdx.x;
    const float* xr = x + row * n;
    const float* rr = r + row * n;
    float* mr = m + row * n;
    float* hr = h + row * n;
    float* yr = y + row * n;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) ss += xr[j] * xr[j];
    const float inv = 1.0f / sqrtf(block_sum(ss) / (float)n + eps);
    float hs = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float mj = xr[j] * inv * (offset + w[j]);
        const float hj = mj + rr[j];
        mr[j] = mj;
        hr[j] = hj;
        hs += hj * hj;
    }
    const float inv2 = 1.0f / sqrtf(block_sum(hs) / (float)n + eps);
    for (int j = threadIdx.x; j < n; j += blockDim.x) yr[j] = hr[j] * inv2 * (offset + w2[j]);
}

extern "C" __global__ void l2_norm_f32(const float* __restrict__ x, float* __restrict__ y,
                                       const int n, const float eps, const int mode, const int H,
                                       const long long rs, const long long hs) {
    const long long row = blockIdx.x;  // (r, h) of x [R, H, n]; y contiguous
    const float* xr = x + (row / H) * rs + (row % H) * hs;
    float* yr = y + row * n;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) ss += xr[j] * xr[j];
    ss = block_sum(ss);
    const float denom = (mode == 0) ? sqrtf(ss + eps) : fmaxf(sqrtf(ss), eps);
    for (int j = threadIdx.x; j < n; j += blockDim.x) yr[j] = xr[j] / denom;
}

extern "C" __global__ void gated_rms_norm_f32(const float* __restrict__ x,
                                              const float* __restrict__ z,
                                              const float* __restrict__ w, float* __restrict__ y,
                                              const int n, const float eps) {
    const long long row = blockIdx.x;
    const float* xr = x + row * n;
    const float* zr = z + row * n;
    float* yr = y + row * n;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) ss += xr[j] * xr[j];
    const float inv = 1.0f / sqrtf(block_sum(ss) / (float)n + eps);
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float zj = zr[j];
        const float silu = zj / (1.0f + expf(-zj));
        yr[j] = xr[j] * inv * w[j] * silu;
    }
}
