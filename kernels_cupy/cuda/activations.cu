// activations.cu: SwiGLU, GeGLU, the sigmoid gate, the GDN gates, row softmax.
// Reference: dflash_ref/ops/activations.py.
//
// Kernels (float32):
//   swiglu_f32(gate, up, y, total, F, gs, us)   y = silu(gate) * up
//   geglu_f32(gate, up, y, total, F, gs, us)    y = g / (1 + exp(-2z)) * up,
//     2z = c (g + 0.044715 g^3), c = 2 sqrt(2/pi) (GELU's tanh form; models/gemma.py)
//     gate, up: rows of F contiguous floats, row r at gate + r * gs (up + r * us): the column
//     slices of a stacked [T, 2F] product are read in place; y: contiguous [total / F, F].
//     One thread per output element e (row e / F, column e % F), grid-stride.
//   sigmoid_gate_f32(x, gate, y, total, H, n, xr, xh, gr, gh)   y = x * (1 / (1 + exp(-gate)))
//     x, gate [R, H, n] with channels contiguous, element (r, h, j)
//     at x + r * xr + h * xh + j (gate likewise: a [q | gate] head's strided half is read in
//     place); y contiguous. One thread per output element, grid-stride.
//   gdn_gates_f32(b, a, A, dt_bias, beta, g, total, HV, bs, as)
//     beta = 1 / (1 + exp(-b)), g = A[h] * softplus(a + dt_bias[h]), softplus(u) = u above
//     GDN_SOFTPLUS_THRESHOLD (20, FLA's), else log1p(exp(u)); b and a [T, HV] rows at
//     b + t * bs, a + t * as (the stacked input projection's column slices, read in place),
//     beta and g contiguous [T, HV]. One thread per (t, h), grid-stride.
//   softmax_rows_f32(x, y, n)            y = exp(x - max) / sum exp(x - max), one block per row
//   log_softmax_rows_f32(x, y, n)        y = x - max - log(sum exp(x - max)), one block per row
// Row kernels: grid.x = rows, blockDim.x a multiple of 32 (<= 1024), no dynamic shared memory.

extern "C" __global__ void swiglu_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                      float* __restrict__ y, const long long total,
                                      const long long F, const long long gs, const long long us) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long r = e / F, f = e - r * F;
        const float g = gate[r * gs + f];
        y[e] = g / (1.0f + expf(-g)) * up[r * us + f];
    }
}

extern "C" __global__ void geglu_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                     float* __restrict__ y, const long long total,
                                     const long long F, const long long gs, const long long us) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long r = e / F, f = e - r * F;
        const float g = gate[r * gs + f];
        const float two_z = 1.5957691216057308f * (g + 0.044715f * g * g * g);  // 2 sqrt(2/pi)
        y[e] = g / (1.0f + expf(-two_z)) * up[r * us + f];  // exp overflows below g ~ -10.3: -0
    }
}

extern "C" __global__ void sigmoid_gate_f32(const float* __restrict__ x,
                                            const float* __restrict__ gate,
                                            float* __restrict__ y, const long long total,
                                            const long long H, const long long n,
                                            const long long xr, const long long xh,
                                            const long long gr, const long long gh) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long j = e % n, rh = e / n, h = rh % H, r = rh / H;
        const float gv = gate[r * gr + h * gh + j];
        y[e] = x[r * xr + h * xh + j] * (1.0f / (1.0f + expf(-gv)));
    }
}

#define GDN_SOFTPLUS_THRESHOLD 20.0f

extern "C" __global__ void gdn_gates_f32(const float* __restrict__ b, const float* __restrict__ a,
                                         const float* __restrict__ A,
                                         const float* __restrict__ dt_bias,
                                         float* __restrict__ beta, float* __restrict__ g,
                                         const long long total, const int HV,
                                         const long long bs, const long long as) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long t = e / HV;
        const int h = (int)(e - t * HV);
        beta[e] = 1.0f / (1.0f + expf(-b[t * bs + h]));  // sigmoid; exp overflow gives 0
        const float u = a[t * as + h] + dt_bias[h];
        const float sp = (u > GDN_SOFTPLUS_THRESHOLD)
                             ? u : log1pf(expf(fminf(u, GDN_SOFTPLUS_THRESHOLD)));
        g[e] = A[h] * sp;
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
