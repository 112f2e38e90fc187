// linear.cu: the projection y = x @ w.T for 1 to 16 rows. Reference: dflash_ref/ops/linear.py;
// launch plan: kernels_cupy/linear_plan.py; docs/performance.md, "The projection kernel".
//
// Kernels (float32, contiguous row-major x [T, K], w [N, K] (HF nn.Linear layout), y [T, N]):
//   linear_rows{TT}_vec4_f32(x, w, y, T, N, K)  TT in {1, 2, 4, 8, 16}, T <= TT; float4 loads:
//                                                K % 4 == 0 and x, w 16-byte aligned
//   linear_rows{TT}_f32(x, w, y, T, N, K)       the same with scalar loads (any K, any alignment)
// Parallelisation: a block of LIN_THREADS threads computes a tile of LIN_COLS consecutive output
// columns at a time, tiles blockIdx.x, blockIdx.x + gridDim.x, ... of ceil(N / LIN_COLS) (the plan
// launches at most one wave of resident blocks, so the blocks start together and walk K in step:
// the x rows they all read stay in L1); the block's threads split K. Thread i owns the element
// groups j = i, i + LIN_THREADS, i + 2 LIN_THREADS, ... (a group: one float4 = 4 consecutive k, or
// one float), so every weight element is read exactly once, from one thread, and a warp reads 512
// contiguous bytes of a weight row per load. Per group the thread loads its LIN_COLS weight groups
// (streaming, __ldcs: read once, evict first), LIN_UNROLL groups ahead before the first FMA, then
// for each row t < T one x group (__ldg: read by every block, kept in L1/L2) and accumulates
// acc[t][c] = fmaf(w[c][q], x[t][q], acc[t][c]) for q = 0..3 in order. Rows T..TT-1 read nothing
// and stay 0; columns past N (the last block when N % LIN_COLS != 0) read nothing (their weights
// are 0) and are not written.
// Reduction over the block's threads, in a fixed order (emulated in
// tests/kernels/test_linear_plan.py): inside each warp a butterfly over the lane bits 4, 3, 2,
// 1, 0 (a reduce-scatter while a lane holds more than one value: each step keeps half of the
// TT * LIN_COLS sums and adds the partner's copy of that half), then warp 0's result + warp 1's
// + ... + warp 7's, in that order, read from shared memory by thread (t * LIN_COLS + c).
// Launch: grid (any count <= ceil(N / LIN_COLS), 1, 1), block (LIN_THREADS, 1, 1), no dynamic
// shared memory (red: LIN_WARPS x TT x LIN_COLS floats, static).

#define LIN_THREADS 256
#define LIN_WARPS (LIN_THREADS / 32)
#define LIN_COLS 4
#define LIN_UNROLL 2

// Live sums per lane at butterfly step s (offset 16 >> s): V, V/2, ... down to 1.
__host__ __device__ constexpr int lin_live(int V, int s) { return (V >> s) >= 1 ? (V >> s) : 1; }

// One butterfly step at lane offset o over H live sums. H >= 2: the lanes with bit o clear keep
// the lower half, the others the upper half; each adds its partner's copy of the half it keeps
// (a sum over the lanes that differ in bit o). H == 1: both lanes add each other's single sum.
template <int H, int V>
__device__ __forceinline__ void lin_butterfly(float (&acc)[V], const int lane, const int o,
                                              int& base) {
    if constexpr (H >= 2) {
        const bool up = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < H / 2; ++i) {
            const float send = up ? acc[i] : acc[i + H / 2];
            const float keep = up ? acc[i + H / 2] : acc[i];
            acc[i] = keep + __shfl_xor_sync(DFR_FULL_MASK, send, o);
        }
        if (up) base += H / 2;
    } else {
        acc[0] += __shfl_xor_sync(DFR_FULL_MASK, acc[0], o);
    }
}

template <bool VEC>
struct LinGroup;
template <>
struct LinGroup<true> {  // 4 consecutive k: one 16-byte load
    static constexpr int n = 4;
    float v[4];
    __device__ __forceinline__ void load_stream(const float* p, const int j) {
        const float4 t = __ldcs(reinterpret_cast<const float4*>(p) + j);
        v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    }
    __device__ __forceinline__ void load_cached(const float* p, const int j) {
        const float4 t = __ldg(reinterpret_cast<const float4*>(p) + j);
        v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    }
    __device__ __forceinline__ void zero() { v[0] = v[1] = v[2] = v[3] = 0.0f; }
};
template <>
struct LinGroup<false> {  // one k: a 4-byte load
    static constexpr int n = 1;
    float v[1];
    __device__ __forceinline__ void load_stream(const float* p, const int j) {
        v[0] = __ldcs(p + j);
    }
    __device__ __forceinline__ void load_cached(const float* p, const int j) {
        v[0] = __ldg(p + j);
    }
    __device__ __forceinline__ void zero() { v[0] = 0.0f; }
};

template <int TT, bool VEC>
__device__ __forceinline__ void linear_tile(const float* __restrict__ x,
                                            const float* __restrict__ w, float* __restrict__ y,
                                            const int T, const int N, const int K,
                                            const int groups, const int n0, const int tid,
                                            const int lane, const int warp,
                                            float (&red)[LIN_WARPS][TT * LIN_COLS]) {
    constexpr int V = TT * LIN_COLS;  // sums per thread: acc[t * LIN_COLS + c]
    constexpr int G = LinGroup<VEC>::n;
    const float* wrow[LIN_COLS];
#pragma unroll
    for (int c = 0; c < LIN_COLS; ++c) wrow[c] = w + (long long)min(n0 + c, N - 1) * K;
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.0f;

    for (int j0 = tid; j0 < groups; j0 += LIN_THREADS * LIN_UNROLL) {
        LinGroup<VEC> wg[LIN_UNROLL][LIN_COLS];
#pragma unroll
        for (int u = 0; u < LIN_UNROLL; ++u) {  // every weight load issued before any use
            const int j = j0 + u * LIN_THREADS;
#pragma unroll
            for (int c = 0; c < LIN_COLS; ++c) {
                if (j < groups && n0 + c < N) wg[u][c].load_stream(wrow[c], j);
                else wg[u][c].zero();
            }
        }
#pragma unroll
        for (int u = 0; u < LIN_UNROLL; ++u) {
            const int j = j0 + u * LIN_THREADS;
            if (j >= groups) break;
#pragma unroll
            for (int t = 0; t < TT; ++t) {
                if (t >= T) break;
                LinGroup<VEC> xg;
                xg.load_cached(x + (long long)t * K, j);
#pragma unroll
                for (int c = 0; c < LIN_COLS; ++c) {
#pragma unroll
                    for (int q = 0; q < G; ++q)
                        acc[t * LIN_COLS + c] = fmaf(wg[u][c].v[q], xg.v[q], acc[t * LIN_COLS + c]);
                }
            }
        }
    }

    // Inside the warp: lane bits 4, 3, 2, 1, 0. Afterwards the lane holds the sums of indices
    // base .. base + R - 1 (R = max(V / 32, 1)); for V < 32, 32 / V lanes hold each index and
    // the one with its low bits clear stores it.
    int base = 0;
    lin_butterfly<lin_live(V, 0)>(acc, lane, 16, base);
    lin_butterfly<lin_live(V, 1)>(acc, lane, 8, base);
    lin_butterfly<lin_live(V, 2)>(acc, lane, 4, base);
    lin_butterfly<lin_live(V, 3)>(acc, lane, 2, base);
    lin_butterfly<lin_live(V, 4)>(acc, lane, 1, base);
    constexpr int R = V >= 32 ? V / 32 : 1;
    constexpr int dup = V >= 32 ? 1 : 32 / V;
    if ((lane & (dup - 1)) == 0) {
#pragma unroll
        for (int i = 0; i < R; ++i) red[warp][base + i] = acc[i];
    }
    __syncthreads();
    // Across warps, in warp order; thread v = t * LIN_COLS + c writes y[t, n0 + c].
    if (tid < V) {
        float s = red[0][tid];
#pragma unroll
        for (int w8 = 1; w8 < LIN_WARPS; ++w8) s += red[w8][tid];
        const int t = tid / LIN_COLS, n = n0 + tid % LIN_COLS;
        if (t < T && n < N) y[(long long)t * N + n] = s;
    }
}

template <int TT, bool VEC>
__device__ __forceinline__ void linear_rows_body(const float* __restrict__ x,
                                                 const float* __restrict__ w,
                                                 float* __restrict__ y, const int T, const int N,
                                                 const int K) {
    constexpr int V = TT * LIN_COLS;  // sums per thread: acc[t * LIN_COLS + c]
    constexpr int G = LinGroup<VEC>::n;
    __shared__ float red[LIN_WARPS][V];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int groups = K / G;  // the wrapper guarantees K % G == 0
    const int tiles = (N + LIN_COLS - 1) / LIN_COLS;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        linear_tile<TT, VEC>(x, w, y, T, N, K, groups, tile * LIN_COLS, tid, lane, warp, red);
        __syncthreads();  // red is rewritten by the next tile
    }
}

#define LIN_PARAMS const float* __restrict__ x, const float* __restrict__ w, \
                   float* __restrict__ y, const int T, const int N, const int K
#define LIN_ARGS x, w, y, T, N, K

extern "C" __global__ void linear_rows1_vec4_f32(LIN_PARAMS) {
    linear_rows_body<1, true>(LIN_ARGS);
}
extern "C" __global__ void linear_rows2_vec4_f32(LIN_PARAMS) {
    linear_rows_body<2, true>(LIN_ARGS);
}
extern "C" __global__ void linear_rows4_vec4_f32(LIN_PARAMS) {
    linear_rows_body<4, true>(LIN_ARGS);
}
extern "C" __global__ void linear_rows8_vec4_f32(LIN_PARAMS) {
    linear_rows_body<8, true>(LIN_ARGS);
}
extern "C" __global__ void linear_rows16_vec4_f32(LIN_PARAMS) {
    linear_rows_body<16, true>(LIN_ARGS);
}
extern "C" __global__ void linear_rows1_f32(LIN_PARAMS) {
    linear_rows_body<1, false>(LIN_ARGS);
}
extern "C" __global__ void linear_rows2_f32(LIN_PARAMS) {
    linear_rows_body<2, false>(LIN_ARGS);
}
extern "C" __global__ void linear_rows4_f32(LIN_PARAMS) {
    linear_rows_body<4, false>(LIN_ARGS);
}
extern "C" __global__ void linear_rows8_f32(LIN_PARAMS) {
    linear_rows_body<8, false>(LIN_ARGS);
}
extern "C" __global__ void linear_rows16_f32(LIN_PARAMS) {
    linear_rows_body<16, false>(LIN_ARGS);
}
