// dequant.cu: GGUF block formats -> float32. Reference: dflash_ref/ops/dequant.py; byte layouts
// drawn in dflash_ref/io/quant.py (Q8_0, Q4_K) and ops/dequant.py (Q6_K).
//
// Kernels (raw: the tensor's bytes as stored in the GGUF, contiguous uint8; y: float32 [n]):
//   dequantize_q8_0_f32(raw, y, n)   34-byte blocks of 32:  y = d * q
//   dequantize_q4_k_f32(raw, y, n)   144-byte blocks of 256: y = (d * sc[s]) * q - dmin * m[s]
//   dequantize_q6_k_f32(raw, y, n)   210-byte blocks of 256: y = (d * scales[e / 16]) * q
// Parallelisation: one thread per output weight, grid-stride loop over the n weights (n is a
// whole number of blocks); each thread reads its block's f16 scale(s) and its own quant bits.
// Blocks are not aligned to 4 bytes (34, 210), so everything is read byte by byte.
// Launch: any 1-D grid and block (kernels_cupy/_launch.py launch_elementwise); no shared memory.
// Numerics: f16 -> f32 is exact (PTX cvt.f32.f16, no flush); products use __fmul_rn/__fsub_rn so
// the compiler cannot contract them into an FMA, which keeps the results bit-identical to the
// NumPy reference and to gguf.quants.dequantize.

__device__ __forceinline__ float dfr_f16_at(const unsigned char* p) {
    const unsigned short bits = (unsigned short)(p[0] | (p[1] << 8));  // little-endian f16
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
}

extern "C" __global__ void dequantize_q8_0_f32(const unsigned char* __restrict__ raw,
                                               float* __restrict__ y, const long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const unsigned char* blk = raw + (i / 32) * 34;  // d f16 | qs[32] int8
        const float d = dfr_f16_at(blk);
        const int q = (int)(signed char)blk[2 + i % 32];
        y[i] = __fmul_rn(d, (float)q);
    }
}

extern "C" __global__ void dequantize_q4_k_f32(const unsigned char* __restrict__ raw,
                                               float* __restrict__ y, const long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const unsigned char* blk = raw + (i / 256) * 144;  // d | dmin | scales[12] | qs[128]
        const unsigned char* scales = blk + 4;
        const unsigned char* qs = blk + 16;
        const int e = (int)(i % 256);
        const int s = e / 32, l = e % 32;  // sub-block, index within it
        int sc, m;
        if (s < 4) {
            sc = scales[s] & 63;
            m = scales[s + 4] & 63;
        } else {
            sc = (scales[s + 4] & 15) | ((scales[s - 4] >> 6) << 4);
            m = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
        }
        // Chunk s/2 of 32 bytes: even sub-blocks in the low nibble, odd in the high nibble.
        const int q = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 15;
        const float step = __fmul_rn(dfr_f16_at(blk), (float)sc);
        const float offset = __fmul_rn(dfr_f16_at(blk + 2), (float)m);
        y[i] = __fsub_rn(__fmul_rn(step, (float)q), offset);
    }
}

extern "C" __global__ void dequantize_q6_k_f32(const unsigned char* __restrict__ raw,
                                               float* __restrict__ y, const long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const unsigned char* blk = raw + (i / 256) * 210;  // ql[128] | qh[64] | scales[16] | d
        const int e = (int)(i % 256);
        const int h = e / 128, t = e % 128;  // half, index within the half
        const int k = t / 32, l = t % 32;    // quarter, index within the quarter
        const int low = (blk[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15;
        const int high = (blk[128 + 32 * h + l] >> (2 * k)) & 3;
        const int q = (low | (high << 4)) - 32;
        const float scale = __fmul_rn(dfr_f16_at(blk + 208), (float)(signed char)blk[192 + e / 16]);
        y[i] = __fmul_rn(scale, (float)q);
    }
}
