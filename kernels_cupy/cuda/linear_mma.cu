// linear_mma.cu: the projection y = x @ w.T for 1 to 16 rows on tensor cores, in 3xTF32.
// Reference twin: cuda/linear.cu (float32 CUDA cores); NumPy reference: dflash_ref/ops/linear.py.
// Plan and fragment layout: kernels_cupy/linear_mma_plan.py; the split and its error bound:
// kernels_cupy/tf32.py (emulated on CPU by tests/kernels/test_linear_mma.py).
//
// Kernels (x [T, K], y [T, N] float32, contiguous row-major, T <= 16; w [N, K] as nn.Linear):
//   linear_mma_rows16_f32(x, w, y, T, N, K)    w float32: per k-step three MMAs
//                                              (lo += x_lo w_hi, lo += x_hi w_lo, hi += x_hi w_hi)
//   linear_mma_rows16_bf16w(x, w, y, T, N, K)  w bf16 bit patterns (unsigned short): a bf16 value
//                                              is an exact TF32 value, so two MMAs
//                                              (lo += x_lo w, hi += x_hi w)
//   weights_to_bf16(w, out, n)                 out[i] = w[i] rounded to bf16 (nearest, ties to
//                                              even; NaN stays NaN), grid-stride over n
// Parallelisation: a block of LMM_THREADS threads computes a tile of LMM_COLS = 8 output columns
// (the MMA's N) for all rows at a time, tiles blockIdx.x, blockIdx.x + gridDim.x, ... of
// ceil(N / 8). Warp v takes the k-steps (of LMM_KSTEP = 8, the MMA's K) v, v + LMM_WARPS, ...;
// its m-th step accumulates into pair m % LMM_NACC (independent accumulators: shorter float32
// chains and MMAs in flight), its loads issued for LMM_NACC steps before the first MMA. Lane
// (g = lane >> 2, t = lane & 3) loads, per the PTX ISA's m16n8k8 .tf32 fragments, A = x:
// a0 (g, k0 + t), a1 (g + 8, k0 + t), a2 (g, k0 + t + 4), a3 (g + 8, k0 + t + 4), and B = w^T
// (".col": w's rows as stored): b0 (k0 + t, n0 + g), b1 (k0 + t + 4, n0 + g). Rows >= T, columns
// >= N and k >= K read nothing and hold 0. Each operand is split hi = cvt.rna.tf32(a),
// lo = cvt.rna.tf32(a - hi). Afterwards each lane adds, per fragment element, its hi
// accumulators in order, its lo accumulators in order, then hi + lo, and stores the sum to
// shared memory; thread (4 l + i), i < 4, adds warp 0's to warp 7's in warp order for lane l's
// element i, which is D (g + 8 (i >> 1), 2 t + (i & 1)) of lane l, and writes y if row < T and
// column < N. The accumulation order inside an MMA is the hardware's: the result is checked
// against an error bound, not bit for bit.
// Launch: sm_80+ (mma.sync with .tf32); grid (any count <= ceil(N / 8), 1, 1), block
// (LMM_THREADS, 1, 1), no dynamic shared memory (red: LMM_WARPS x 32 x 4 floats, static).
// __launch_bounds__(LMM_THREADS, 2): at most 128 registers, so two blocks share an SM (twice
// the weight loads in flight of one).

#define LMM_THREADS 256
#define LMM_WARPS (LMM_THREADS / 32)
#define LMM_COLS 8
#define LMM_KSTEP 8
#define LMM_NACC 8

// cvt.rna.tf32.f32: the nearest TF32 (ties away from zero), as the bits of a float32.
__device__ __forceinline__ unsigned lmm_tf32(const float v) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
    return r;
}

// d = A B + d: one m16n8k8 MMA, TF32 operands, float32 accumulator.
__device__ __forceinline__ void lmm_mma(float (&d)[4], const unsigned (&a)[4],
                                        const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <bool BF16>
struct LmmWeight;
template <>
struct LmmWeight<false> {  // float32 weights, streamed (read once: evict first)
    using type = float;
    static __device__ __forceinline__ float load(const float* p) { return __ldcs(p); }
};
template <>
struct LmmWeight<true> {  // bf16 bit patterns: the high half of a float32
    using type = unsigned short;
    static __device__ __forceinline__ float load(const unsigned short* p) {
        return __uint_as_float(((unsigned)__ldcs(p)) << 16);
    }
};

template <bool BF16>
__device__ __forceinline__ void lmm_body(const float* __restrict__ x,
                                         const typename LmmWeight<BF16>::type* __restrict__ w,
                                         float* __restrict__ y, const int T, const int N,
                                         const int K) {
    __shared__ float red[LMM_WARPS][32][4];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;  // the PTX ISA's groupID, threadID_in_group
    const int ksteps = (K + LMM_KSTEP - 1) / LMM_KSTEP;
    const int tiles = (N + LMM_COLS - 1) / LMM_COLS;
    const bool r0 = g < T, r1 = g + 8 < T;  // this lane's two x rows exist
    const float* x0 = x + (long long)(r0 ? g : 0) * K;
    const float* x1 = x + (long long)(r1 ? g + 8 : 0) * K;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int n0 = tile * LMM_COLS;
        const bool nok = n0 + g < N;  // this lane's weight row (B's column g) exists
        const typename LmmWeight<BF16>::type* wr = w + (long long)(nok ? n0 + g : 0) * K;
        float hi[LMM_NACC][4], lo[LMM_NACC][4];
#pragma unroll
        for (int q = 0; q < LMM_NACC; ++q)
#pragma unroll
            for (int i = 0; i < 4; ++i) hi[q][i] = lo[q][i] = 0.0f;

        for (int s0 = warp; s0 < ksteps; s0 += LMM_WARPS * LMM_NACC) {
            float av[LMM_NACC][4], bv[LMM_NACC][2];
#pragma unroll
            for (int q = 0; q < LMM_NACC; ++q) {  // every load issued before any MMA
                const int ka = (s0 + q * LMM_WARPS) * LMM_KSTEP + t, kb = ka + 4;
                const bool a_ok = ka < K, b_ok = kb < K;
                av[q][0] = (r0 && a_ok) ? __ldg(x0 + ka) : 0.0f;
                av[q][1] = (r1 && a_ok) ? __ldg(x1 + ka) : 0.0f;
                av[q][2] = (r0 && b_ok) ? __ldg(x0 + kb) : 0.0f;
                av[q][3] = (r1 && b_ok) ? __ldg(x1 + kb) : 0.0f;
                bv[q][0] = (nok && a_ok) ? LmmWeight<BF16>::load(wr + ka) : 0.0f;
                bv[q][1] = (nok && b_ok) ? LmmWeight<BF16>::load(wr + kb) : 0.0f;
            }
#pragma unroll
            for (int q = 0; q < LMM_NACC; ++q) {
                if (s0 + q * LMM_WARPS >= ksteps) break;  // warp-uniform: the MMAs stay aligned
                unsigned ah[4], al[4], bh[2];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    ah[i] = lmm_tf32(av[q][i]);
                    al[i] = lmm_tf32(av[q][i] - __uint_as_float(ah[i]));
                }
                if constexpr (BF16) {
                    bh[0] = __float_as_uint(bv[q][0]);  // already TF32: no split
                    bh[1] = __float_as_uint(bv[q][1]);
                    lmm_mma(lo[q], al, bh);
                } else {
                    unsigned bl[2];
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        bh[i] = lmm_tf32(bv[q][i]);
                        bl[i] = lmm_tf32(bv[q][i] - __uint_as_float(bh[i]));
                    }
                    lmm_mma(lo[q], al, bh);
                    lmm_mma(lo[q], ah, bl);
                }
                lmm_mma(hi[q], ah, bh);
            }
        }

#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float h = hi[0][i], l = lo[0][i];
#pragma unroll
            for (int q = 1; q < LMM_NACC; ++q) {
                h += hi[q][i];
                l += lo[q][i];
            }
            red[warp][lane][i] = h + l;
        }
        __syncthreads();
        if (tid < 32 * 4) {  // lane ln's element i: D (g + 8 (i >> 1), 2 t + (i & 1)) of ln
            const int ln = tid >> 2, i = tid & 3;
            float s = red[0][ln][i];
#pragma unroll
            for (int w8 = 1; w8 < LMM_WARPS; ++w8) s += red[w8][ln][i];
            const int row = (ln >> 2) + 8 * (i >> 1), col = n0 + 2 * (ln & 3) + (i & 1);
            if (row < T && col < N) y[(long long)row * N + col] = s;
        }
        __syncthreads();  // red is rewritten by the next tile
    }
}

#define LMM_PARAMS(WT) const float* __restrict__ x, const WT* __restrict__ w, \
                       float* __restrict__ y, const int T, const int N, const int K

extern "C" __global__ void __launch_bounds__(LMM_THREADS, 2)
linear_mma_rows16_f32(LMM_PARAMS(float)) {
    lmm_body<false>(x, w, y, T, N, K);
}
extern "C" __global__ void __launch_bounds__(LMM_THREADS, 2)
linear_mma_rows16_bf16w(LMM_PARAMS(unsigned short)) {
    lmm_body<true>(x, w, y, T, N, K);
}

extern "C" __global__ void weights_to_bf16(const float* __restrict__ w,
                                           unsigned short* __restrict__ out, const long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const unsigned b = __float_as_uint(w[i]);
        const bool nan = (b & 0x7F800000u) == 0x7F800000u && (b & 0x007FFFFFu) != 0u;
        out[i] = (unsigned short)(nan ? ((b >> 16) | 0x0040u)  // stays a (quiet) NaN
                                      : ((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16));
    }
}
