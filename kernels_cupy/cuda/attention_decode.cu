// attention_decode.cu: decode / verify attention v2 (few query rows, GQA, flash-decoding).
// Reference: dflash_ref/ops/attention.py (attention) and dflash_ref/ops/masks.py (the
// visibility predicate: att_key_visible of attention_mask.cuh, which _build.py prepends).
// Plan: kernels_cupy/attention_decode.py (plan_decode); CPU emulation of this loop:
// tests/kernels/test_attention_decode_plan.py. docs/attention.md, "The decode kernel (v2)".
//
// Kernels (all float32, contiguous; q [Tq, nh, d], k / v [Tk, nkv, d], q_pos [Tq] int32,
// k_pos [Tk] int32 with -1 = invalid slot, anc [Tq, Tk] uint8 or a dummy when has_anc == 0):
//   attention_decode_d128_f32, attention_decode_d128_vec4_f32   (RPW = 8, DC = 4: d <= 128)
//   attention_decode_d256_f32, attention_decode_d256_vec4_f32   (RPW = 4, DC = 8: d <= 256)
//       grid = (ceil(Tq * g / R), nkv, n_splits), block = DEC_WARPS * 32 = 256 threads.
//       A block owns R <= DEC_WARPS * RPW rows of ONE kv head kvh = blockIdx.y: row rg =
//       i * g + (h - kvh * g) for query row i and query head h of the group, rg in
//       [blockIdx.x * R, ...) (the whole group when Tq * g <= R), and the key slots
//       [z * keys_per_split, min(Tk, (z + 1) * keys_per_split)) of split z = blockIdx.z.
//       Row r of the block is slot s = r / DEC_WARPS of warp r % DEC_WARPS.
//       Key tiles of DEC_KT = 32 slots from the split's start (lane j <-> slot t0 + j) pass
//       through a ring of `stages` shared buffers (K and V of one tile each), filled by
//       cp.async (16-byte copies in the vec4 kernels, 4-byte otherwise; slots past the split
//       are zero-filled). Prologue: tiles 0 .. stages - 2 are issued (one commit group each).
//       Iteration t:
//         1. each warp evaluates the mask of tile tn = t + stages - 1 for its rows (one ballot
//            per row; lane 0 keeps the words in sBits[tn % stages]);
//         2. cp.async.wait_group(stages - 2): this thread's copies of tile t have landed;
//         3. __syncthreads_or over (1)'s words: every thread's copies of tile t are visible,
//            every warp is done with tile t - 1 (whose buffer tn reuses), and tile tn is
//            loaded only if some row of the block sees one of its slots;
//         4. tile tn's copies are issued into buffer tn % stages; commit (always: the group
//            count stays one per tile);
//         5. a warp with a visible slot in tile t (mask words from sBits[t % stages], written
//            by its own lane 0 at iteration t - stages + 1 or in the prologue) scores its rows:
//            s_j = q . k_j (fmaf, dd ascending), x scale, optional softcap tanh, the mask;
//            m_new = fmaxf(m, max_j s_j); sh = m_new, or 0 while it is -inf; c = e^(m - sh);
//            p_j = e^(s_j - sh) (0 where masked); l = c l + sum_j p_j; acc = c acc; then
//            acc += p_j V[j] over the slots j some row of the warp sees, ascending (each row
//            only its own visible slots).
//       One barrier per key tile. n_splits == 1: out = acc / l (0 when l == 0). n_splits > 1:
//       unnormalised acc -> part_o [S, Tq * nh, d], (m, l) -> part_ml [S, Tq * nh, 2].
//   attention_decode_combine_f32
//       grid = Tq * nh (one block per (i, h) row), any multiple of 32 threads <= 1024.
//       M = max over splits with l_s != 0 (0 if none is finite); w_s = e^(m_s - M) (0 when
//       l_s == 0; a NaN l_s is mass); L = sum_s l_s w_s (s ascending); out = (sum_s w_s acc_s)
//       / L (fmaf over every split, s ascending), 0 when L == 0. Non-finite inputs:
//       docs/conventions.md, "Non-finite attention" (att_softmax_shift, attention_mask.cuh).
// Launch assumptions: blockDim.x == DEC_WARPS * 32 for the forward kernels; 1 <= d <= 32 * DC;
// 1 <= R <= DEC_WARPS * RPW; 2 <= stages <= DEC_MAX_STAGES; n_splits <= DEC_MAX_SPLITS;
// ld = d + 4 (vec4: d % 4 == 0 and q / k / v 16-byte aligned) or d + 1; dynamic shared memory
// = (stages * 2 * DEC_KT * ld + R * d + stages * R) * 4 bytes (above 48 KiB the wrapper raises
// the kernel's opt-in limit). Positions are int32; indices into q / k / v / anc are 64-bit.
// Registers (ptxas via NVRTC 13.0, sm_90): d128 vec4 128, d128 126, d256 vec4 114, d256 100, no
// spills (tests/kernels/test_attention_decode_plan.py checks <= 128 and no spill).
// Precision: FP32 CUDA cores (no tensor cores, no TF32); within float32 rounding of the
// reference (tests/kernels/test_attention_decode_plan.py states the tolerance).

#define DEC_WARPS 8
#define DEC_KT 32
#define DEC_MAX_STAGES 4
#define DEC_MAX_SPLITS 256
#define DEC_NEG_INF __int_as_float(0xff800000)
#define DEC_FULL 0xffffffffu

__device__ __forceinline__ float dec_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(DEC_FULL, v, o));
    return v;
}

__device__ __forceinline__ float dec_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(DEC_FULL, v, o);
    return v;
}

// cp.async with a source size: `valid` copies `bytes` from global, otherwise zero-fills.
__device__ __forceinline__ void dec_cp_async16(float* dst, const float* src, const bool valid) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(n)
                 : "memory");
}

__device__ __forceinline__ void dec_cp_async4(float* dst, const float* src, const bool valid) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    const int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src), "r"(n)
                 : "memory");
}

__device__ __forceinline__ void dec_cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most `pending` of this thread's newest commit groups are still in flight.
__device__ __forceinline__ void dec_cp_wait(const int pending) {
    if (pending <= 0) asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    else if (pending == 1) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    else asm volatile("cp.async.wait_group 2;\n" ::: "memory");  // DEC_MAX_STAGES - 2
}

// Issue the copies of one K/V tile (kv head kvh, slots t0 .. t0 + DEC_KT - 1, zero past j_end)
// into sK / sV rows of ld floats. VEC4: consecutive threads on consecutive float4 of a row.
template <bool VEC4>
__device__ __forceinline__ void dec_issue_tile(float* __restrict__ sK, float* __restrict__ sV,
                                               const float* __restrict__ k,
                                               const float* __restrict__ v, const long long t0,
                                               const long long j_end, const int nkv,
                                               const int kvh, const int d, const int ld) {
    const int w = VEC4 ? (d >> 2) : d;  // copies per row
    for (int idx = threadIdx.x; idx < 2 * DEC_KT * w; idx += blockDim.x) {
        const int which = idx >= DEC_KT * w;  // 0: K, 1: V
        const int rem = idx - which * DEC_KT * w;
        const int jj = rem / w, c = rem - jj * w;
        const long long jg = t0 + jj;
        const bool valid = jg < j_end;
        const float* src = (which ? v : k) + (valid ? (jg * nkv + kvh) * d : 0);
        float* dst = (which ? sV : sK) + jj * ld;
        if (VEC4) dec_cp_async16(dst + 4 * c, src + (valid ? 4 * c : 0), valid);
        else dec_cp_async4(dst + c, src + (valid ? c : 0), valid);
    }
}

// Mask words of the tile at t0 for this warp's RPW row slots (bit j: slot t0 + j visible);
// returns their OR. Slots at or past j_end are invisible.
template <int RPW>
__device__ __forceinline__ unsigned dec_tile_mask(
    unsigned* bits, const long long t0, const long long j_end, const int lane,
    const int* __restrict__ k_pos, const unsigned char* __restrict__ anc, const int Tk,
    const bool* row_ok, const int* qp, const int* qi, const int causal, const int window,
    const int window_mode, const int has_base, const int base_pos, const int has_anc) {
    const long long j = t0 + lane;
    const bool in = j < j_end;
    const int kp = in ? k_pos[j] : -1;
    unsigned any = 0u;
#pragma unroll
    for (int s = 0; s < RPW; ++s) {
        bool vis = false;
        if (row_ok[s] && in) {
            const unsigned char* anc_row = has_anc ? anc + (long long)qi[s] * Tk : anc;
            vis = att_key_visible(qp[s], kp, anc_row, j, causal, window, window_mode, has_base,
                                  base_pos, has_anc);
        }
        bits[s] = __ballot_sync(DEC_FULL, vis);
        any |= bits[s];
    }
    return any;
}

template <bool VEC4, int RPW, int DC>
__device__ __forceinline__ void attention_decode_body(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const int* __restrict__ q_pos, const int* __restrict__ k_pos,
    const unsigned char* __restrict__ anc, float* __restrict__ out,
    float* __restrict__ part_o, float* __restrict__ part_ml,
    const int Tq, const int Tk, const int nh, const int nkv, const int d,
    const float scale, const float softcap,
    const int causal, const int window, const int window_mode, const int has_base,
    const int base_pos, const int has_anc,
    const int R, const int keys_per_split, const int n_splits, const int ld, const int stages) {
    extern __shared__ __align__(16) float dec_smem[];
    float* sKV = dec_smem;                                   // stages x {K, V} [DEC_KT, ld]
    float* sQ = dec_smem + stages * 2 * DEC_KT * ld;         // [R, d]
    unsigned* sBits = reinterpret_cast<unsigned*>(sQ + R * d);  // [stages, R]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = nh / nkv, kvh = blockIdx.y, split = blockIdx.z;
    const long long rows_total = (long long)Tq * g;
    const long long row0 = (long long)blockIdx.x * R;
    const long long j_begin = (long long)split * keys_per_split;
    const long long j_end = min((long long)Tk, j_begin + keys_per_split);
    const int n_tiles = (int)((j_end - j_begin + DEC_KT - 1) / DEC_KT);

    // Per-row state of this warp's rows (slot s <-> block row s * DEC_WARPS + warp).
    bool row_ok[RPW];
    int qp[RPW];
    int qi[RPW];  // query row i (Tq < 2^31)
    float m[RPW], l[RPW], acc[RPW][DC];
#pragma unroll
    for (int s = 0; s < RPW; ++s) {
        const int r = s * DEC_WARPS + warp;
        const long long rg = row0 + r;
        row_ok[s] = (r < R) && (rg < rows_total);
        qi[s] = row_ok[s] ? (int)(rg / g) : 0;
        qp[s] = row_ok[s] ? q_pos[qi[s]] : 0;
        m[s] = DEC_NEG_INF;
        l[s] = 0.0f;
#pragma unroll
        for (int c = 0; c < DC; ++c) acc[s][c] = 0.0f;
    }

    // Prologue: the masks of tiles 0 .. stages - 2 and their copies (one group per tile).
    unsigned bits[RPW];
    for (int p = 0; p < stages - 1; ++p) {
        const long long t0 = j_begin + (long long)p * DEC_KT;
        const unsigned wb = dec_tile_mask<RPW>(bits, t0, j_end, lane, k_pos, anc, Tk, row_ok, qp,
                                               qi, causal, window, window_mode, has_base,
                                               base_pos, has_anc);
        if (lane == 0) {
#pragma unroll
            for (int s = 0; s < RPW; ++s)
                if (s * DEC_WARPS + warp < R) sBits[p * R + s * DEC_WARPS + warp] = bits[s];
        }
        if (__syncthreads_or(wb != 0u)) {
            float* sK = sKV + p * 2 * DEC_KT * ld;
            dec_issue_tile<VEC4>(sK, sK + DEC_KT * ld, k, v, t0, j_end, nkv, kvh, d, ld);
        }
        dec_cp_commit();
    }

    // Queries of this block -> shared memory (0 for rows past the end), while tiles land.
    if (VEC4) {
        const int d4 = d >> 2;
        for (int idx = tid; idx < R * d4; idx += blockDim.x) {
            const int r = idx / d4, c4 = idx - r * d4;
            const long long rg = row0 + r;
            float4 val = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (rg < rows_total) {
                const long long i = rg / g;
                const int h = kvh * g + (int)(rg - i * g);
                val = reinterpret_cast<const float4*>(q + (i * nh + h) * d)[c4];
            }
            reinterpret_cast<float4*>(sQ + r * d)[c4] = val;
        }
    } else {
        for (int idx = tid; idx < R * d; idx += blockDim.x) {
            const int r = idx / d, dd = idx - r * d;
            const long long rg = row0 + r;
            float val = 0.0f;
            if (rg < rows_total) {
                const long long i = rg / g;
                const int h = kvh * g + (int)(rg - i * g);
                val = q[(i * nh + h) * d + dd];
            }
            sQ[idx] = val;
        }
    }

    for (int t = 0; t < n_tiles; ++t) {
        // 1. The mask of the tile to prefetch, kept by this warp's lane 0.
        const int tn = t + stages - 1;
        const long long tn0 = j_begin + (long long)tn * DEC_KT;
        const unsigned wbn = dec_tile_mask<RPW>(bits, tn0, j_end, lane, k_pos, anc, Tk, row_ok,
                                                qp, qi, causal, window, window_mode, has_base,
                                                base_pos, has_anc);
        __syncwarp();  // every lane of the warp has read tile t - 1's words
        if (lane == 0) {
#pragma unroll
            for (int s = 0; s < RPW; ++s)
                if (s * DEC_WARPS + warp < R)
                    sBits[(tn % stages) * R + s * DEC_WARPS + warp] = bits[s];
        }
        // 2-3. Tile t landed (this thread's copies), then the tile's one barrier.
        dec_cp_wait(stages - 2);
        const bool load_next = __syncthreads_or(wbn != 0u);
        // 4. Prefetch tile tn into the buffer every warp finished with at iteration t - 1.
        if (load_next) {
            float* sK = sKV + (tn % stages) * 2 * DEC_KT * ld;
            dec_issue_tile<VEC4>(sK, sK + DEC_KT * ld, k, v, tn0, j_end, nkv, kvh, d, ld);
        }
        dec_cp_commit();
        // 5. Score and accumulate tile t.
        const float* sK = sKV + (t % stages) * 2 * DEC_KT * ld;
        const float* sV = sK + DEC_KT * ld;
        unsigned wb = 0u;
#pragma unroll
        for (int s = 0; s < RPW; ++s) {
            bits[s] = (s * DEC_WARPS + warp < R) ? sBits[(t % stages) * R + s * DEC_WARPS + warp]
                                                 : 0u;
            wb |= bits[s];
        }
        if (wb == 0u) continue;  // warp-uniform: no row of this warp sees tile t
        float sc[RPW], p[RPW];
#pragma unroll
        for (int s = 0; s < RPW; ++s) sc[s] = 0.0f;
        if (VEC4) {
            const float4* kr = reinterpret_cast<const float4*>(sK + lane * ld);
#pragma unroll 1
            for (int c4 = 0; c4 < (d >> 2); ++c4) {  // one K read serves the warp's rows
                const float4 kv = kr[c4];
#pragma unroll
                for (int s = 0; s < RPW; ++s) {
                    if (bits[s] == 0u) continue;  // warp-uniform
                    const float4 qv = reinterpret_cast<const float4*>(
                        sQ + (s * DEC_WARPS + warp) * d)[c4];  // broadcast
                    sc[s] = fmaf(qv.x, kv.x, sc[s]);  // dd ascending, as the scalar loop
                    sc[s] = fmaf(qv.y, kv.y, sc[s]);
                    sc[s] = fmaf(qv.z, kv.z, sc[s]);
                    sc[s] = fmaf(qv.w, kv.w, sc[s]);
                }
            }
        } else {
            const float* kr = sK + lane * ld;
#pragma unroll 1
            for (int dd = 0; dd < d; ++dd) {
                const float kval = kr[dd];
#pragma unroll
                for (int s = 0; s < RPW; ++s) {
                    if (bits[s] == 0u) continue;
                    sc[s] = fmaf(sQ[(s * DEC_WARPS + warp) * d + dd], kval, sc[s]);
                }
            }
        }
#pragma unroll
        for (int s = 0; s < RPW; ++s) {
            p[s] = 0.0f;
            if (bits[s] == 0u) continue;  // warp-uniform: this row sees nothing here
            float x = sc[s] * scale;
            if (softcap > 0.0f) x = softcap * tanhf(x / softcap);  // before the mask
            const bool vis = (bits[s] >> lane) & 1u;
            x = vis ? x : DEC_NEG_INF;
            const float m_new = fmaxf(m[s], dec_warp_max(x));  // fmaxf drops NaN
            const float sh = att_softmax_shift(m_new);          // 0 while m_new is -inf
            const float corr = expf(m[s] - sh);                 // 0 when m was -inf
            p[s] = vis ? expf(x - sh) : 0.0f;
            l[s] = l[s] * corr + dec_warp_sum(p[s]);
#pragma unroll
            for (int c = 0; c < DC; ++c) acc[s][c] *= corr;
            m[s] = m_new;
        }
        unsigned b = wb;
        while (b) {  // warp-uniform; slots ascending
            const int jj = __ffs(b) - 1;
            b &= b - 1u;
            const float* vr = sV + jj * ld;
            float vv[DC];
#pragma unroll
            for (int c = 0; c < DC; ++c) {
                const int dd = lane + 32 * c;
                vv[c] = (dd < d) ? vr[dd] : 0.0f;
            }
#pragma unroll
            for (int s = 0; s < RPW; ++s) {
                if (((bits[s] >> jj) & 1u) == 0u) continue;  // warp-uniform
                const float pj = __shfl_sync(DEC_FULL, p[s], jj);
#pragma unroll
                for (int c = 0; c < DC; ++c) acc[s][c] = fmaf(pj, vv[c], acc[s][c]);
            }
        }
    }
    dec_cp_wait(0);  // no copy outlives the block (the trailing groups are empty)

    // Write the rows: the final output, or this split's partial state (common.cuh).
    dfr_attention_write_rows<RPW, DC, DEC_WARPS>(acc, m, l, row_ok, qi, out, part_o, part_ml,
                                                 row0, warp, lane, g, kvh, nh, Tq, d, split,
                                                 n_splits);
}

#define DEC_PARAMS                                                                            \
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,      \
        const int* __restrict__ q_pos, const int* __restrict__ k_pos,                           \
        const unsigned char* __restrict__ anc, float* __restrict__ out,                         \
        float* __restrict__ part_o, float* __restrict__ part_ml, const int Tq, const int Tk,    \
        const int nh, const int nkv, const int d, const float scale, const float softcap,       \
        const int causal, const int window, const int window_mode, const int has_base,          \
        const int base_pos, const int has_anc, const int R, const int keys_per_split,           \
        const int n_splits, const int ld, const int stages
// Two blocks of 256 threads per SM: at most 128 registers a thread. Each kernel is declared
// once on one line (the form kernels_cupy/_build.py scans for names), then defined inside an
// extern "C" block with its launch bounds.
#define DEC_BOUNDS __launch_bounds__(DEC_WARPS * 32, 2)
#define DEC_ARGS                                                                              \
    q, k, v, q_pos, k_pos, anc, out, part_o, part_ml, Tq, Tk, nh, nkv, d, scale, softcap,       \
        causal, window, window_mode, has_base, base_pos, has_anc, R, keys_per_split, n_splits,  \
        ld, stages

extern "C" __global__ void attention_decode_d128_f32(DEC_PARAMS);
extern "C" {
__global__ void DEC_BOUNDS attention_decode_d128_f32(DEC_PARAMS) {
    attention_decode_body<false, 8, 4>(DEC_ARGS);
}
}

extern "C" __global__ void attention_decode_d128_vec4_f32(DEC_PARAMS);
extern "C" {
__global__ void DEC_BOUNDS attention_decode_d128_vec4_f32(DEC_PARAMS) {
    attention_decode_body<true, 8, 4>(DEC_ARGS);
}
}

extern "C" __global__ void attention_decode_d256_f32(DEC_PARAMS);
extern "C" {
__global__ void DEC_BOUNDS attention_decode_d256_f32(DEC_PARAMS) {
    attention_decode_body<false, 4, 8>(DEC_ARGS);
}
}

extern "C" __global__ void attention_decode_d256_vec4_f32(DEC_PARAMS);
extern "C" {
__global__ void DEC_BOUNDS attention_decode_d256_vec4_f32(DEC_PARAMS) {
    attention_decode_body<true, 4, 8>(DEC_ARGS);
}
}

extern "C" __global__ void attention_decode_combine_f32(const float* __restrict__ part_o,
                                                        const float* __restrict__ part_ml,
                                                        float* __restrict__ out, const int rows,
                                                        const int d, const int n_splits) {
    __shared__ float sM[DEC_MAX_SPLITS], sW[DEC_MAX_SPLITS];
    const long long row = blockIdx.x;  // (i * nh + h)
    for (int s = threadIdx.x; s < n_splits; s += blockDim.x) {
        const long long pr = (long long)s * rows + row;
        const float ls = part_ml[pr * 2 + 1];
        // A split without mass (l == 0) has no weight; a NaN l is mass: it reaches L.
        sM[s] = (ls != 0.0f) ? part_ml[pr * 2 + 0] : DEC_NEG_INF;
        sW[s] = ls;
    }
    __syncthreads();
    float M = DEC_NEG_INF;
    for (int s = 0; s < n_splits; ++s) M = fmaxf(M, sM[s]);
    M = att_softmax_shift(M);  // 0 when no split has a finite max
    __syncthreads();
    for (int s = threadIdx.x; s < n_splits; s += blockDim.x) {
        sM[s] = (sW[s] != 0.0f) ? expf(sM[s] - M) : 0.0f;  // w_s
    }
    __syncthreads();
    float L = 0.0f;
    for (int s = 0; s < n_splits; ++s) L = fmaf(sW[s], sM[s], L);  // sum l_s w_s, s ascending
    const float inv = (L != 0.0f) ? 1.0f / L : 0.0f;  // no visible key in any split -> 0
    for (int dd = threadIdx.x; dd < d; dd += blockDim.x) {
        float o = 0.0f;  // every split, even at w_s = 0: a NaN acc_s (non-finite V) must reach out
        for (int s = 0; s < n_splits; ++s) {
            const long long pr = (long long)s * rows + row;
            o = fmaf(part_o[pr * d + dd], sM[s], o);
        }
        out[row * d + dd] = o * inv;
    }
}
