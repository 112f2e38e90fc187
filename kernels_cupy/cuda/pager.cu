// pager.cu: KVFlash pool copies and the slot -> position table. Reference: dflash_ref/ops/pager.py.
//
// Kernels (pool: [S, P, W] contiguous, S segments = (layer, K|V) pairs, P slots, W words per row;
// rows: [S, n, W] contiguous; slots: [n] int32 in [0, P)):
//   gather_rows_u32(pool, slots, rows, S, P, n, W)    rows[s, i, w] = pool[s, slots[i], w]
//   scatter_rows_u32(pool, slots, rows, S, P, n, W)   pool[s, slots[i], w] = rows[s, i, w]
//   fill_slot_pos_i32(chunk_block, out, n_chunks, T)  out[b*T + i] = c*T + i where b = chunk_block[c] >= 0
// Data is moved as 32-bit words whatever the dtype (float32, or two float16 per word): copies are
// bit-exact. The wrapper views the arrays as uint32 and checks that a row is a whole number of
// words. scatter needs distinct slots (the wrapper checks); fill_slot_pos needs distinct blocks
// and an output pre-filled with -1 (the wrapper allocates it so). A slot outside [0, P) is
// skipped (gather writes 0 words for it), a guard that costs no synchronisation: the wrapper's
// check raises first, but a device-slot check can be switched off for speed.
// Parallelisation: one thread per copied word (gather/scatter: S * n * W) or per (chunk, offset)
// pair (fill_slot_pos: n_chunks * T), grid-stride loops with 64-bit indices (a pool of
// 64 layers x 16K slots x 1K words has 2^31 words).
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
