// pager.cu: KVFlash pool copies and the slot -> position table. Reference: dflash_ref/ops/pager.py.
//
// Kernels (pool: [S, P, W] contiguous, S segments = (layer, K|V) pairs, P slots, W words per row;
// rows: [S, n, W] contiguous; slots: [n] int32 in [0, P)):
//   gather_rows_u32(pool, slots, rows, S, P, n, W)    rows[s, i, w] = pool[s, slots[i], w]
//   scatter_rows_u32(pool, slots, rows, S, P, n, W)   pool[s, slots[i], w] = rows[s, i, w]
//   fill_slot_pos_i32(chunk_block, out, n_chunks, T)  out[b*T + i] = c*T + i where b = chunk_block[c] >= 0
//   write_kv_rows_f32(kv, k, v, rows, T, C, H, D, ks_r, ks_h, vs_r, vs_h)
//                                                      kv[0, rows[i]] = k[i], kv[1, rows[i]] = v[i]
//   write_kv_from_f32(kv, k, v, start, T, C, H, D, ks_r, ks_h, vs_r, vs_h)
//                                                      the same at rows start + i
// Data is moved as 32-bit words whatever the dtype (float32, or two float16 per word): copies are
// bit-exact. The wrapper views the arrays as uint32 and checks that a row is a whole number of
// words. scatter needs distinct slots (the wrapper checks); fill_slot_pos needs distinct blocks
// and an output pre-filled with -1 (the wrapper allocates it so). A slot outside [0, P) is
// skipped (gather writes 0 words for it), a guard that costs no synchronisation: the wrapper's
// check raises first, but a device-slot check can be switched off for speed.
// write_kv (a KV cache's write, K and V in one launch): kv is one layer's [2, C, H, D] float32
// storage, contiguous; k and v are [T, H, D] float32 read in place with row strides ks_r / vs_r
// and head strides ks_h / vs_h in floats (the v column slice of a stacked q/k/v product, no
// copy); channels contiguous. Rows must be distinct (the wrapper checks host rows; a store
// checks its device positions once per forward); a row outside [0, C) is skipped.
// Parallelisation: one thread per copied word (gather/scatter: S * n * W; write_kv: 2 * T * H * D,
// K's elements first, then V's) or per (chunk, offset) pair (fill_slot_pos: n_chunks * T),
// grid-stride loops with 64-bit indices (a pool of 64 layers x 16K slots x 1K words has 2^31
// words).
// Launch: any 1-D grid and block (launch_elementwise); no shared memory.

extern "C" __global__ void gather_rows_u32(const unsigned int* __restrict__ pool,
                                           const int* __restrict__ slots,
                                           unsigned int* __restrict__ rows, const int S,
                                           const int P, const int n, const int W) {
    const long long total = (long long)S * n * W;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const long long w = t % W;
        const long long i = (t / W) % n;
        const long long s = t / ((long long)W * n);
        const int p = slots[i];
        rows[t] = (p >= 0 && p < P) ? pool[(s * P + p) * W + w] : 0u;  // guard: never out of bounds
    }
}

extern "C" __global__ void scatter_rows_u32(unsigned int* __restrict__ pool,
                                            const int* __restrict__ slots,
                                            const unsigned int* __restrict__ rows, const int S,
                                            const int P, const int n, const int W) {
    const long long total = (long long)S * n * W;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const long long w = t % W;
        const long long i = (t / W) % n;
        const long long s = t / ((long long)W * n);
        const int p = slots[i];
        if (p >= 0 && p < P) pool[(s * P + p) * W + w] = rows[t];  // guard: never out of bounds
    }
}

extern "C" __global__ void fill_slot_pos_i32(const int* __restrict__ chunk_block,
                                             int* __restrict__ out, const int n_chunks,
                                             const int T) {
    const long long total = (long long)n_chunks * T;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const long long c = t / T;
        const long long i = t % T;
        const int b = chunk_block[c];
        if (b >= 0) out[(long long)b * T + i] = (int)(c * T + i);
    }
}

// Element t of the batch's 2 * T * H * D: d = t % D, h = (t / D) % H, i = (t / (D H)) % T,
// half s = t / (T H D) (0: K from k, 1: V from v); it lands at kv[s, row(i), h, d].
__device__ __forceinline__ void write_kv_body(float* __restrict__ kv, const float* __restrict__ k,
                                              const float* __restrict__ v,
                                              const int* __restrict__ rows, const int start,
                                              const int T, const int C, const int H, const int D,
                                              const long long ks_r, const long long ks_h,
                                              const long long vs_r, const long long vs_h) {
    const long long per_half = (long long)T * H * D;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < 2 * per_half;
         t += (long long)gridDim.x * blockDim.x) {
        const long long d = t % D;
        const long long h = (t / D) % H;
        const long long i = (t / ((long long)D * H)) % T;
        const long long s = t / per_half;
        const long long p = rows != nullptr ? (long long)rows[i] : (long long)start + i;
        if (p < 0 || p >= C) continue;  // guard: never out of bounds
        const float x = s == 0 ? k[i * ks_r + h * ks_h + d] : v[i * vs_r + h * vs_h + d];
        kv[((s * C + p) * H + h) * D + d] = x;
    }
}

extern "C" __global__ void write_kv_rows_f32(float* __restrict__ kv, const float* __restrict__ k,
                                             const float* __restrict__ v,
                                             const int* __restrict__ rows, const int T,
                                             const int C, const int H, const int D,
                                             const long long ks_r, const long long ks_h,
                                             const long long vs_r, const long long vs_h) {
    write_kv_body(kv, k, v, rows, 0, T, C, H, D, ks_r, ks_h, vs_r, vs_h);
}

extern "C" __global__ void write_kv_from_f32(float* __restrict__ kv, const float* __restrict__ k,
                                             const float* __restrict__ v, const int start,
                                             const int T, const int C, const int H, const int D,
                                             const long long ks_r, const long long ks_h,
                                             const long long vs_r, const long long vs_h) {
    write_kv_body(kv, k, v, nullptr, start, T, C, H, D, ks_r, ks_h, vs_r, vs_h);
}
