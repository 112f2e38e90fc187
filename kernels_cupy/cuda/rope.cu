// rope.cu: NEOX (rotate-half) rotary embedding. Reference: dflash_ref/ops/rope.py.
//
// Kernels:
//   rope_neox_f32(x, pos, inv_freq, y, total, H, d, rd)
//     x, y: [T, H, d] float32 contiguous; pos: [T] int32 absolute positions;
//     inv_freq: [rd/2] float32, computed on the host by dflash_ref.ops.rope.rope_inv_freq so the
//     angle float(pos) * inv_freq is the same float32 product as the reference's.
//     For channel j of a head: j < rd/2      -> x[j] cos - x[j + rd/2] sin
//                              rd/2 <= j < rd -> x[j] cos + x[j - rd/2] sin
//                              j >= rd       -> x[j] (pass-through, partial rotary)
// Parallelisation: one thread per output element (total = T*H*d), grid-stride loop.
// Launch: any 1-D grid/block; no shared memory.

extern "C" __global__ void rope_neox_f32(const float* __restrict__ x, const int* __restrict__ pos,
                                         const float* __restrict__ inv_freq,
                                         float* __restrict__ y, const long long total,
                                         const int H, const int d, const int rd) {
    const int half = rd / 2;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(e % d);
        const long long t = e / ((long long)H * d);
        if (j >= rd) { y[e] = x[e]; continue; }
        const int i = (j < half) ? j : j - half;
        const float angle = (float)pos[t] * inv_freq[i];
        float s, c;
        sincosf(angle, &s, &c);
        y[e] = (j < half) ? x[e] * c - x[e + half] * s : x[e] * c + x[e - half] * s;
    }
}
