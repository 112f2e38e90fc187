// activations.cu: SwiGLU and row softmax kernels. Reference: dflash_ref/ops/activations.py.
//
// Kernels (float32, contiguous):
//   swiglu_f32(gate, up, y, total)       y = silu(gate) * up; one thread per element, grid-stride
//   softmax_rows_f32(x, y, n)            y = exp(x - max) / sum exp(x - max), one block per row
//   log_softmax_rows_f32(x, y, n)        y = x - max - log(sum exp(x - max)), one block per row
// Row kernels: grid.x = rows, blockDim.x a multiple of 32 (<= 1024), no dynamic shared memory.

extern "C" __global__ void swiglu_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                      float* __restrict__ y, const long long total) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const float g = gate[e];
        y[e] = g / (1.0f + expf(-g)) * up[e];
    }
}

extern "C" __global__ void softmax_rows_f32(const float* __restrict__ x, float* __restrict__ y,
                                            const int n) {
    const long long row = blockIdx.x;
    const float* xr = x + row * n;
    float* yr = y + row * n;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_max(m);
    float s = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s += expf(xr[j] - m);
    const float inv = 1.0f / block_sum(s);
    for (int j = threadIdx.x; j < n; j += blockDim.x) yr[j] = expf(xr[j] - m) * inv;
}

extern "C" __global__ void log_softmax_rows_f32(const float* __restrict__ x,
                                                float* __restrict__ y, const int n) {
    const long long row = blockIdx.x;
    const float* xr = x + row * n;
    float* yr = y + row * n;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_max(m);
    float s = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s += expf(xr[j] - m);
    const float log_s = logf(block_sum(s));
    for (int j = threadIdx.x; j < n; j += blockDim.x) yr[j] = xr[j] - m - log_s;
}
