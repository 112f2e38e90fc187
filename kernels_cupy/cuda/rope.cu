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
//     Parallelisation: one thread per output element (total = T*H*d), grid-stride loop.
//     Launch: any 1-D grid/block; no shared memory.
//   qk_norm_rope_f32(q, k, pos, qw, kw, inv_freq, yq, yk, nq, nk, d, rd,
//                    q_row, q_head, k_row, k_head, q_normed, k_normed, eps, offset)
//     The per-head RMSNorm of q and k (when q_normed / k_normed), then RoPE as rope_neox_f32:
//     x_hat = x * inv * (offset + w), inv = 1 / sqrt(sum(x^2) / d + eps), then the rotation of
//     x_hat at pos[t]. q [T, nq, d] head (t, h) at q + t * q_row + h * q_head (k likewise; the
//     channels contiguous, rows and heads strided: the stacked q/k/v product's column slices
//     are read in place); yq [T, nq, d], yk [T, nk, d] contiguous; qw, kw [d] (not read when
//     that side is not normed).
//     Parallelisation: one block per head row, blockIdx.x = t * (nq + nk) + h with q's heads
//     first; the block's threads stride over the d channels (channel j on thread j % blockDim.x),
//     sum their squares and combine them with block_sum (common.cuh); each thread then writes
//     its channels, reading a channel's rotation partner (j +- rd/2) from global memory and
//     norming it itself (no shared memory, no second barrier).
//     Launch: grid.x = T * (nq + nk), blockDim.x = QK_THREADS (kernels_cupy/_build.py; a
//     multiple of 32); no dynamic shared memory.

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

extern "C" __global__ void qk_norm_rope_f32(
    const float* __restrict__ q, const float* __restrict__ k, const int* __restrict__ pos,
    const float* __restrict__ qw, const float* __restrict__ kw,
    const float* __restrict__ inv_freq, float* __restrict__ yq, float* __restrict__ yk,
    const int nq, const int nk, const int d, const int rd, const long long q_row,
    const long long q_head, const long long k_row, const long long k_head, const int q_normed,
    const int k_normed, const float eps, const float offset) {
    const long long row = blockIdx.x;  // (t, h) over q's heads, then k's
    const long long t = row / (nq + nk);
    const int h = (int)(row - t * (nq + nk));
    const bool is_q = h < nq;
    const int hh = is_q ? h : h - nq;
    const float* x = is_q ? q + t * q_row + hh * q_head : k + t * k_row + hh * k_head;
    float* y = is_q ? yq + (t * nq + hh) * d : yk + (t * nk + hh) * d;
    const float* w = is_q ? qw : kw;
    const bool normed = is_q ? q_normed != 0 : k_normed != 0;  // the same for the whole block
    float inv = 1.0f;
    if (normed) {
        float ss = 0.0f;
        for (int j = threadIdx.x; j < d; j += blockDim.x) ss += x[j] * x[j];
        inv = 1.0f / sqrtf(block_sum(ss) / (float)d + eps);
    }
    const int half = rd / 2;
    const float p = (float)pos[t];
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float xj = normed ? x[j] * inv * (offset + w[j]) : x[j];
        if (j >= rd) { y[j] = xj; continue; }
        const int jp = (j < half) ? j + half : j - half;  // the rotation partner
        const float xp = normed ? x[jp] * inv * (offset + w[jp]) : x[jp];
        float s, c;
        sincosf(p * inv_freq[(j < half) ? j : j - half], &s, &c);
        y[j] = (j < half) ? xj * c - xp * s : xj * c + xp * s;
    }
}
