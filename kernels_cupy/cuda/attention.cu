// attention.cu: masked GQA attention with the MaskSpec evaluated inline.
// Reference: dflash_ref/ops/attention.py (attention; attention_online is this algorithm in NumPy)
// and dflash_ref/ops/masks.py (the visibility predicate, mirrored by att_key_visible below).
//
// Kernels (all float32, contiguous; q [Tq, nh, d], k / v [Tk, nkv, d], q_pos [Tq] int32,
// k_pos [Tk] int32 with -1 = invalid slot, anc [Tq, Tk] uint8 or a dummy when has_anc == 0):
//   attention_fwd_f32      flash-style forward. grid = (ceil(Tq*g / R), nkv, n_splits),
//   attention_fwd_vec4_f32 block = ATT_WARPS * 32 threads. A block owns R = ATT_WARPS * rpw
//                          "rows" = (query i, query head h) pairs that share one kv head kvh
//                          (blockIdx.y): flattened row index rg = i * g + (h - kvh * g), block x
//                          takes rg in [x*R, (x+1)*R). Row r of the block belongs to warp
//                          r % ATT_WARPS (slot r / ATT_WARPS), so a few rows spread over warps.
//                          blockIdx.z is a split of the key slots ([z*keys_per_split, ...)).
//                          Per key tile of ATT_KT = 32 slots (lane j <-> slot t0 + j):
//                            1. K and V tiles -> shared memory, both at once (float4 loads and
//                               stores in the vec4 kernel), unless the tile is skipped;
//                            2. each warp evaluates the mask of the NEXT tile for its rows
//                               (ballot -> 32-bit visibility word per row); the tile's barrier
//                               is __syncthreads_or over those words: it publishes this tile's
//                               K/V and decides whether the next tile is loaded at all (a tile
//                               no row of the block can see costs no K/V traffic);
//                            3. lane j scores its slot for each of its warp's rows (scale,
//                               optional softcap tanh, then the mask);
//                            4. online softmax update of the row's running (m, l, acc), acc
//                               accumulating only visible slots from the shared V tile.
//                          With nbuf = 2 the K/V buffers alternate between tiles and step 2 is
//                          the tile's only barrier; with nbuf = 1 (large d) one more barrier
//                          guards the next load.
//                          n_splits == 1: writes out = acc / l (0 when l == 0, no visible key).
//                          n_splits > 1: writes unnormalised acc to part_o [S, Tq*nh, d] and
//                          (m, l) to part_ml [S, Tq*nh, 2]; attention_combine_f32 finishes.
//                          The vec4 kernel needs d % 4 == 0 and q, k, v 16-byte aligned; both
//                          kernels sum q.k in the same order (dd = 0, 1, ...).
//   attention_combine_f32  one block per (i, h) row (grid = Tq*nh); threads stride over d.
//                          M = max over splits with l != 0 (0 if none is finite);
//                          L = sum l_s e^(m_s - M); out = sum acc_s e^(m_s - M) / L, or 0
//                          when L == 0 (weight 0 for l_s == 0; every split's acc is read).
//   Non-finite inputs, every kernel here: docs/conventions.md, "Non-finite attention" (masked
//   keys never reach a row; the online softmax shifts by att_softmax_shift, attention_mask.cuh).
//   attention_prefill_d128_f32, attention_prefill_d128_vec4_f32, attention_prefill_d256_f32,
//   attention_prefill_d256_vec4_f32: many query rows (prefill, long verify; selected by shape in
//                          kernels_cupy/attention.py). grid = (ceil(Tq / BQ), nh); a block owns
//                          BQ = 64 (d <= 128) or 32 (d <= 256) consecutive query rows of one
//                          query head and streams K/V tiles once for all of them; no key split.
//                          Same per-row arithmetic as attention_fwd_*; details below.
// Launch assumptions: blockDim.x == ATT_WARPS * 32 for the forward kernels (any multiple of 32
// for the combine); 1 <= d <= ATT_MAX_D; rpw <= ATT_MAX_RPW; keys_per_split a multiple of
// ATT_KT; nbuf in {1, 2}; shared row stride ld = d + 4 (vec4: keeps rows 16-byte aligned and
// a quarter-warp's float4 reads on distinct banks) or d + 1 (scalar: lane-strided reads on
// distinct banks); dynamic shared memory = (R * d + nbuf * 2 * ATT_KT * ld) * 4 bytes
// (kernels_cupy/attention.py plan_launch; above 48 KiB the wrapper raises the kernel's
// opt-in limit). Positions are int32; indices into q / k / v / anc are 64-bit.

#define ATT_WARPS 4
#define ATT_KT 32
#define ATT_MAX_RPW 4
#define ATT_MAX_DC 8  // d <= 32 * ATT_MAX_DC
#define ATT_MAX_D (32 * ATT_MAX_DC)
#define ATT_NEG_INF __int_as_float(0xff800000)
#define ATT_FULL 0xffffffffu

// att_key_visible (the MaskSpec predicate): attention_mask.cuh.

__device__ __forceinline__ float att_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(ATT_FULL, v, o));
    return v;
}

__device__ __forceinline__ float att_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(ATT_FULL, v, o);
    return v;
}

// Mask bits of the key tile starting at t0 for this warp's NR row slots (one ballot per row)
// and their OR. Lane j evaluates slot t0 + j; slots at or past j_end are invisible. NR is
// ATT_MAX_RPW for the decode kernels, the template's RPW for the prefill kernels.
template <int NR>
__device__ __forceinline__ unsigned att_tile_mask(
    unsigned* bits, const long long t0, const long long j_end, const int lane, const int* k_pos,
    const unsigned char* anc, const int Tk, const bool* row_ok, const int* qp,
    const long long* qi, const int causal, const int window, const int window_mode,
    const int has_base, const int base_pos, const int has_anc) {
    const long long j = t0 + lane;
    const bool in = j < j_end;
    const int kp = in ? k_pos[j] : -1;
    unsigned any = 0u;
#pragma unroll
    for (int s = 0; s < NR; ++s) {
        bool vis = false;
        if (row_ok[s] && in) {
            const unsigned char* anc_row = has_anc ? anc + qi[s] * (long long)Tk : anc;
            vis = att_key_visible(qp[s], kp, anc_row, j, causal, window, window_mode, has_base,
                                  base_pos, has_anc);
        }
        bits[s] = __ballot_sync(ATT_FULL, vis);
        any |= bits[s];
    }
    return any;
}

// One [ATT_KT, d] tile of k or v (kv head kvh, slots t0 ..) -> shared rows of ld floats; rows at
// or past j_end are zero. VEC4: 16-byte loads and stores (d % 4 == 0, src 16-byte aligned,
// ld % 4 == 0; the wrapper checks), consecutive threads on consecutive float4 of a row.
template <bool VEC4>
__device__ __forceinline__ void att_load_tile(float* __restrict__ dst,
                                              const float* __restrict__ src, const long long t0,
                                              const long long j_end, const int nkv,
                                              const int kvh, const int d, const int ld) {
    if (VEC4) {
        const int d4 = d >> 2;
        for (int idx = threadIdx.x; idx < ATT_KT * d4; idx += blockDim.x) {
            const int jj = idx / d4, c4 = idx - jj * d4;
            const long long jg = t0 + jj;
            float4 val = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (jg < j_end) val = reinterpret_cast<const float4*>(src + (jg * nkv + kvh) * d)[c4];
            reinterpret_cast<float4*>(dst + jj * ld)[c4] = val;
        }
    } else {
        for (int idx = threadIdx.x; idx < ATT_KT * d; idx += blockDim.x) {
            const int jj = idx / d, dd = idx - jj * d;
            const long long jg = t0 + jj;
            dst[jj * ld + dd] = (jg < j_end) ? src[(jg * nkv + kvh) * d + dd] : 0.0f;
        }
    }
}

template <bool VEC4>
__device__ __forceinline__ void attention_fwd_body(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const int* __restrict__ q_pos, const int* __restrict__ k_pos,
    const unsigned char* __restrict__ anc, float* __restrict__ out,
    float* __restrict__ part_o, float* __restrict__ part_ml,
    const int Tq, const int Tk, const int nh, const int nkv, const int d,
    const float scale, const float softcap,
    const int causal, const int window, const int window_mode, const int has_base,
    const int base_pos, const int has_anc,
    const int rpw, const int keys_per_split, const int n_splits, const int ld, const int nbuf) {
    extern __shared__ __align__(16) float att_smem[];
    const int R = ATT_WARPS * rpw;
    float* sQ = att_smem;            // [R, d]
    float* sKV = att_smem + R * d;   // nbuf x { K [ATT_KT, ld], V [ATT_KT, ld] }
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = nh / nkv, kvh = blockIdx.y, split = blockIdx.z;
    const long long rows_total = (long long)Tq * g;
    const long long row0 = (long long)blockIdx.x * R;

    // Queries of this block -> shared memory (0 for rows past the end).
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

    // Per-row state of this warp's rows (slot s <-> block row s * ATT_WARPS + warp).
    bool row_ok[ATT_MAX_RPW];
    int qp[ATT_MAX_RPW];
    long long qi[ATT_MAX_RPW];
    float m[ATT_MAX_RPW], l[ATT_MAX_RPW], acc[ATT_MAX_RPW][ATT_MAX_DC];
#pragma unroll
    for (int s = 0; s < ATT_MAX_RPW; ++s) {
        const long long rg = row0 + s * ATT_WARPS + warp;
        row_ok[s] = (s < rpw) && (rg < rows_total);
        qi[s] = row_ok[s] ? rg / g : 0;
        qp[s] = row_ok[s] ? q_pos[qi[s]] : 0;
        m[s] = ATT_NEG_INF;
        l[s] = 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_MAX_DC; ++c) acc[s][c] = 0.0f;
    }

    const long long j_begin = (long long)split * keys_per_split;
    const long long j_end = min((long long)Tk, j_begin + keys_per_split);
    // Pipeline: the mask of tile t + 1 is evaluated before tile t's barrier, so that barrier
    // (__syncthreads_or) both publishes tile t's K/V and decides whether tile t + 1 is loaded.
    // With two buffers (nbuf == 2) it is the tile's only barrier: the load of tile t + 2 into
    // this buffer comes after every thread has passed tile t + 1's barrier, hence after every
    // read of tile t. With one buffer a second barrier guards the next load.
    unsigned bits[ATT_MAX_RPW], next_bits[ATT_MAX_RPW];
    bool vis = __syncthreads_or(  // also publishes sQ
        att_tile_mask<ATT_MAX_RPW>(bits, j_begin, j_end, lane, k_pos, anc, Tk, row_ok, qp, qi,
                                   causal, window, window_mode, has_base, base_pos,
                                   has_anc) != 0u);
    int buf = 0;
    for (long long t0 = j_begin; t0 < j_end; t0 += ATT_KT) {
        float* sK = sKV + buf * 2 * ATT_KT * ld;
        float* sV = sK + ATT_KT * ld;
        // 1. K and V tiles -> shared (skipped when no row of the block sees any of its keys).
        if (vis) {
            att_load_tile<VEC4>(sK, k, t0, j_end, nkv, kvh, d, ld);
            att_load_tile<VEC4>(sV, v, t0, j_end, nkv, kvh, d, ld);
        }
        // 2. The next tile's mask, then the barrier.
        const bool next_vis = __syncthreads_or(
            att_tile_mask<ATT_MAX_RPW>(next_bits, t0 + ATT_KT, j_end, lane, k_pos, anc, Tk,
                                       row_ok, qp, qi, causal, window, window_mode, has_base,
                                       base_pos, has_anc) != 0u);
        if (vis) {
            // 3. Lane j scores slot t0 + j for each of its warp's rows (scale, softcap, mask).
            float sc[ATT_MAX_RPW];
#pragma unroll
            for (int s = 0; s < ATT_MAX_RPW; ++s) sc[s] = 0.0f;
            if (VEC4) {
                const float4* kr = reinterpret_cast<const float4*>(sK + lane * ld);
                for (int c4 = 0; c4 < (d >> 2); ++c4) {  // one K read serves all the rows
                    const float4 kv = kr[c4];
#pragma unroll
                    for (int s = 0; s < ATT_MAX_RPW; ++s) {
                        if (s < rpw) {
                            const float4 qv = reinterpret_cast<const float4*>(
                                sQ + (s * ATT_WARPS + warp) * d)[c4];  // broadcast
                            sc[s] = fmaf(qv.x, kv.x, sc[s]);  // same order as the scalar loop
                            sc[s] = fmaf(qv.y, kv.y, sc[s]);
                            sc[s] = fmaf(qv.z, kv.z, sc[s]);
                            sc[s] = fmaf(qv.w, kv.w, sc[s]);
                        }
                    }
                }
            } else {
                const float* kr = sK + lane * ld;
                for (int dd = 0; dd < d; ++dd) {
                    const float kval = kr[dd];
#pragma unroll
                    for (int s = 0; s < ATT_MAX_RPW; ++s) {
                        if (s < rpw) sc[s] = fmaf(sQ[(s * ATT_WARPS + warp) * d + dd], kval, sc[s]);
                    }
                }
            }
#pragma unroll
            for (int s = 0; s < ATT_MAX_RPW; ++s) {
                float x = sc[s] * scale;
                if (softcap > 0.0f) x = softcap * tanhf(x / softcap);  // before the mask
                sc[s] = ((bits[s] >> lane) & 1u) ? x : ATT_NEG_INF;
            }
            // 4. Online softmax update; acc accumulates the visible slots' V rows.
#pragma unroll
            for (int s = 0; s < ATT_MAX_RPW; ++s) {
                const unsigned b0 = bits[s];
                if (b0 == 0u) continue;  // warp-uniform (a ballot result)
                const float m_new = fmaxf(m[s], att_warp_max(sc[s]));  // fmaxf drops NaN
                const float sh = att_softmax_shift(m_new);  // 0 while m_new is -inf
                const float corr = expf(m[s] - sh);         // 0 when m was -inf
                const float p = ((b0 >> lane) & 1u) ? expf(sc[s] - sh) : 0.0f;
                l[s] = l[s] * corr + att_warp_sum(p);
#pragma unroll
                for (int c = 0; c < ATT_MAX_DC; ++c) acc[s][c] *= corr;
                unsigned b = b0;
                while (b) {  // visible slots only; the loop is warp-uniform
                    const int jj = __ffs(b) - 1;
                    b &= b - 1u;
                    const float pj = __shfl_sync(ATT_FULL, p, jj);
                    const float* vr = sV + jj * ld;
#pragma unroll
                    for (int c = 0; c < ATT_MAX_DC; ++c) {
                        const int dd = lane + 32 * c;
                        if (dd < d) acc[s][c] = fmaf(pj, vr[dd], acc[s][c]);
                    }
                }
                m[s] = m_new;
            }
        }
        if (nbuf == 1 && next_vis) __syncthreads();  // block-uniform: the next load reuses sK/sV
        buf = (nbuf == 2) ? buf ^ 1 : 0;
        vis = next_vis;
#pragma unroll
        for (int s = 0; s < ATT_MAX_RPW; ++s) bits[s] = next_bits[s];
    }

    // Write the rows: final output, or this split's partial state (common.cuh).
    dfr_attention_write_rows<ATT_MAX_RPW, ATT_MAX_DC, ATT_WARPS>(
        acc, m, l, row_ok, qi, out, part_o, part_ml, row0, warp, lane, g, kvh, nh, Tq, d, split,
        n_splits);
}

#define ATT_FWD_PARAMS                                                                        \
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,      \
        const int* __restrict__ q_pos, const int* __restrict__ k_pos,                           \
        const unsigned char* __restrict__ anc, float* __restrict__ out,                         \
        float* __restrict__ part_o, float* __restrict__ part_ml, const int Tq, const int Tk,    \
        const int nh, const int nkv, const int d, const float scale, const float softcap,       \
        const int causal, const int window, const int window_mode, const int has_base,          \
        const int base_pos, const int has_anc, const int rpw, const int keys_per_split,         \
        const int n_splits, const int ld, const int nbuf
#define ATT_FWD_ARGS                                                                          \
    q, k, v, q_pos, k_pos, anc, out, part_o, part_ml, Tq, Tk, nh, nkv, d, scale, softcap,       \
        causal, window, window_mode, has_base, base_pos, has_anc, rpw, keys_per_split,          \
        n_splits, ld, nbuf

extern "C" __global__ void attention_fwd_f32(ATT_FWD_PARAMS) {
    attention_fwd_body<false>(ATT_FWD_ARGS);
}

extern "C" __global__ void attention_fwd_vec4_f32(ATT_FWD_PARAMS) {
    attention_fwd_body<true>(ATT_FWD_ARGS);
}

extern "C" __global__ void attention_combine_f32(const float* __restrict__ part_o,
                                                 const float* __restrict__ part_ml,
                                                 float* __restrict__ out, const int rows,
                                                 const int d, const int n_splits) {
    const long long row = blockIdx.x;  // (i * nh + h)
    float M = ATT_NEG_INF;  // over the splits with mass (l != 0; a NaN l is mass)
    for (int s = 0; s < n_splits; ++s) {
        const long long pr = (long long)s * rows + row;
        if (part_ml[pr * 2 + 1] != 0.0f) M = fmaxf(M, part_ml[pr * 2 + 0]);
    }
    M = att_softmax_shift(M);  // 0 when no split has a finite max
    float L = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
        const long long pr = (long long)s * rows + row;
        const float ls = part_ml[pr * 2 + 1];
        if (ls != 0.0f) L += ls * expf(part_ml[pr * 2 + 0] - M);
    }
    const float inv = (L != 0.0f) ? 1.0f / L : 0.0f;  // no visible key in any split -> 0
    for (int dd = threadIdx.x; dd < d; dd += blockDim.x) {
        float o = 0.0f;  // every split, even at weight 0: a NaN acc_s (non-finite V) reaches out
        for (int s = 0; s < n_splits; ++s) {
            const long long pr = (long long)s * rows + row;
            const float ls = part_ml[pr * 2 + 1];
            const float w = (ls != 0.0f) ? expf(part_ml[pr * 2 + 0] - M) : 0.0f;
            o = fmaf(part_o[pr * d + dd], w, o);
        }
        out[row * d + dd] = o * inv;
    }
}

// ---------------------------------------------------------------- prefill / long verify
//
// attention_prefill_body<VEC4, RPW, DC>: the same per-row arithmetic as attention_fwd_body
// (scale, softcap, mask, online softmax, V accumulation, in the same order), for many query rows.
// A block owns BQ = PF_WARPS * RPW consecutive query rows of ONE query head h (blockIdx.y) and
// reads kv head h / g; warp w owns rows w * RPW .. w * RPW + RPW - 1 of the tile. Query tiles run
// in reverse (blockIdx.x = 0 takes the last tile: under a causal mask it has the most keys to
// visit, so the longest blocks start first). Per key tile of ATT_KT = 32 slots (lane j <-> slot
// t0 + j), with barriers (A)..(D):
//   1. each warp evaluates the tile's mask for its rows (att_tile_mask<RPW>: one ballot per
//      row); (A) = __syncthreads_or over those words: every thread is done with the previous
//      tile's sK / sV, and the tile is skipped by the whole block when no row sees any slot;
//   2. K (and V when kv_bufs == 2) -> shared (att_load_tile, zero rows past Tk); (B);
//   3. a warp with a visible slot scores its rows (lane j: slot t0 + j; the q row is a shared
//      broadcast) and updates each row with a visible slot: m_new = max(m, max_j s),
//      c = e^(m - m_new), p_j = e^(s_j - m_new) (0 where masked), l = c l + sum_j p_j,
//      acc = c acc; m = m_new;
//   4. kv_bufs == 1 only: (C), V -> the same buffer, (D);
//   5. for each slot jj visible to some row of the warp (ascending), lane-strided V row jj from
//      shared; each row that sees jj adds p_jj * V[jj] to acc (p_jj by shuffle).
// Each row therefore sees exactly the operations, in the order, of attention_fwd_body with one
// key split (a row that does not see slot jj skips it, as there). A row's running max m and
// normaliser l are the same in every lane of its warp, so lane s keeps them for row s (m_lane,
// l_lane, read by shuffle). Writes out = acc / l (0 when l == 0). Barriers per key tile: 1 when
// skipped, 2 when loaded with kv_bufs == 2, 4 with kv_bufs == 1. Precision: FP32 CUDA cores
// throughout (no tensor cores, no TF32); within float32 rounding of the reference.
// Launch assumptions: blockDim.x == PF_WARPS * 32; grid = (ceil(Tq / BQ), nh); d <= 32 * DC;
// ld = d + 4 (VEC4: d % 4 == 0, q / k / v 16-byte aligned) or d + 1; kv_bufs in {1, 2};
// dynamic shared memory = (BQ * d + kv_bufs * ATT_KT * ld) * 4 bytes
// (kernels_cupy/attention_prefill.py plan_prefill).
//   attention_prefill_d128_f32, _d128_vec4_f32   RPW = 8 (BQ = 64), DC = 4: d <= 128
//   attention_prefill_d256_f32, _d256_vec4_f32   RPW = 4 (BQ = 32), DC = 8: d <= 256

#define PF_WARPS 8

template <bool VEC4, int RPW, int DC>
__device__ __forceinline__ void attention_prefill_body(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const int* __restrict__ q_pos, const int* __restrict__ k_pos,
    const unsigned char* __restrict__ anc, float* __restrict__ out,
    const int Tq, const int Tk, const int nh, const int nkv, const int d,
    const float scale, const float softcap,
    const int causal, const int window, const int window_mode, const int has_base,
    const int base_pos, const int has_anc, const int ld, const int kv_bufs) {
    extern __shared__ __align__(16) float att_smem[];
    constexpr int BQ = PF_WARPS * RPW;
    float* sQ = att_smem;                                 // [BQ, d]
    float* sK = att_smem + BQ * d;                        // [ATT_KT, ld]
    float* sV = (kv_bufs == 2) ? sK + ATT_KT * ld : sK;   // [ATT_KT, ld]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = blockIdx.y, g = nh / nkv, kvh = h / g;
    const long long i0 = (long long)(gridDim.x - 1 - blockIdx.x) * BQ;  // first query row

    // Queries of this tile -> shared memory (0 for rows past Tq).
    if (VEC4) {
        const int d4 = d >> 2;
        for (int idx = tid; idx < BQ * d4; idx += blockDim.x) {
            const int r = idx / d4, c4 = idx - r * d4;
            const long long i = i0 + r;
            float4 val = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (i < Tq) val = reinterpret_cast<const float4*>(q + (i * nh + h) * d)[c4];
            reinterpret_cast<float4*>(sQ + r * d)[c4] = val;
        }
    } else {
        for (int idx = tid; idx < BQ * d; idx += blockDim.x) {
            const int r = idx / d, dd = idx - r * d;
            const long long i = i0 + r;
            sQ[idx] = (i < Tq) ? q[(i * nh + h) * d + dd] : 0.0f;
        }
    }

    // Per-row state of this warp's rows (slot s <-> tile row warp * RPW + s).
    bool row_ok[RPW];
    int qp[RPW];
    long long qi[RPW];
    float acc[RPW][DC];
    // The running max and normaliser of row s are the same in every lane; lane s keeps them.
    float m_lane = ATT_NEG_INF, l_lane = 0.0f;
#pragma unroll
    for (int s = 0; s < RPW; ++s) {
        const long long i = i0 + warp * RPW + s;
        row_ok[s] = i < Tq;
        qi[s] = i;  // i0 + const: no register of its own
        qp[s] = row_ok[s] ? q_pos[i] : 0;
#pragma unroll
        for (int c = 0; c < DC; ++c) acc[s][c] = 0.0f;
    }

    for (long long t0 = 0; t0 < Tk; t0 += ATT_KT) {
        // 1. The tile's mask; (A) also publishes sQ on the first tile.
        unsigned bits[RPW];
        const unsigned wb = att_tile_mask<RPW>(bits, t0, Tk, lane, k_pos, anc, Tk, row_ok, qp,
                                               qi, causal, window, window_mode, has_base,
                                               base_pos, has_anc);
        if (!__syncthreads_or(wb != 0u)) continue;  // (A); block-uniform skip
        // 2. K (and V) -> shared.
        att_load_tile<VEC4>(sK, k, t0, Tk, nkv, kvh, d, ld);
        if (kv_bufs == 2) att_load_tile<VEC4>(sV, v, t0, Tk, nkv, kvh, d, ld);
        __syncthreads();  // (B)
        // 3. Scores and the online-softmax update of each row with a visible slot.
        float p[RPW];
#pragma unroll
        for (int s = 0; s < RPW; ++s) p[s] = 0.0f;
        if (wb != 0u) {  // warp-uniform (ballot results)
            float sc[RPW];
#pragma unroll
            for (int s = 0; s < RPW; ++s) sc[s] = 0.0f;
            if (VEC4) {
                const float4* kr = reinterpret_cast<const float4*>(sK + lane * ld);
                // Not unrolled: unrolling keeps several iterations' q float4s live (138 registers
                // on sm_90, one block per SM); rolled, every prefill kernel stays <= 104.
#pragma unroll 1
                for (int c4 = 0; c4 < (d >> 2); ++c4) {  // one K read serves the warp's rows
                    const float4 kv = kr[c4];
#pragma unroll
                    for (int s = 0; s < RPW; ++s) {
                        const float4 qv = reinterpret_cast<const float4*>(
                            sQ + (warp * RPW + s) * d)[c4];  // broadcast
                        sc[s] = fmaf(qv.x, kv.x, sc[s]);  // the order of attention_fwd_body
                        sc[s] = fmaf(qv.y, kv.y, sc[s]);
                        sc[s] = fmaf(qv.z, kv.z, sc[s]);
                        sc[s] = fmaf(qv.w, kv.w, sc[s]);
                    }
                }
            } else {
                const float* kr = sK + lane * ld;
                for (int dd = 0; dd < d; ++dd) {
                    const float kval = kr[dd];
#pragma unroll
                    for (int s = 0; s < RPW; ++s) {
                        sc[s] = fmaf(sQ[(warp * RPW + s) * d + dd], kval, sc[s]);
                    }
                }
            }
#pragma unroll
            for (int s = 0; s < RPW; ++s) {
                if (bits[s] == 0u) continue;  // warp-uniform: this row sees nothing here
                float x = sc[s] * scale;
                if (softcap > 0.0f) x = softcap * tanhf(x / softcap);  // before the mask
                const bool vis = (bits[s] >> lane) & 1u;
                x = vis ? x : ATT_NEG_INF;
                const float m_old = __shfl_sync(ATT_FULL, m_lane, s);
                const float m_new = fmaxf(m_old, att_warp_max(x));  // fmaxf drops NaN
                const float sh = att_softmax_shift(m_new);          // 0 while m_new is -inf
                const float corr = expf(m_old - sh);                // 0 when m was -inf
                p[s] = vis ? expf(x - sh) : 0.0f;
                const float l_new = __shfl_sync(ATT_FULL, l_lane, s) * corr + att_warp_sum(p[s]);
#pragma unroll
                for (int c = 0; c < DC; ++c) acc[s][c] *= corr;
                if (lane == s) {
                    m_lane = m_new;
                    l_lane = l_new;
                }
            }
        }
        // 4. One buffer: V replaces K once every warp has scored.
        if (kv_bufs == 1) {
            __syncthreads();  // (C)
            att_load_tile<VEC4>(sV, v, t0, Tk, nkv, kvh, d, ld);
            __syncthreads();  // (D)
        }
        // 5. acc += p_jj V[jj] over the slots some row of the warp sees, in ascending order.
        unsigned b = wb;
        while (b) {  // warp-uniform
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
                const float pj = __shfl_sync(ATT_FULL, p[s], jj);
#pragma unroll
                for (int c = 0; c < DC; ++c) acc[s][c] = fmaf(pj, vv[c], acc[s][c]);
            }
        }
    }

    // Write the rows: out[i, h] = acc / l, 0 when no key was visible.
#pragma unroll
    for (int s = 0; s < RPW; ++s) {
        if (!row_ok[s]) continue;
        const long long orow = qi[s] * nh + h;  // row of out in [Tq * nh]
        const float l_s = __shfl_sync(ATT_FULL, l_lane, s);
        const float inv = (l_s > 0.0f) ? 1.0f / l_s : 0.0f;
#pragma unroll
        for (int c = 0; c < DC; ++c) {
            const int dd = lane + 32 * c;
            if (dd < d) out[orow * d + dd] = acc[s][c] * inv;
        }
    }
}

#define PF_PARAMS                                                                             \
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,      \
        const int* __restrict__ q_pos, const int* __restrict__ k_pos,                           \
        const unsigned char* __restrict__ anc, float* __restrict__ out, const int Tq,           \
        const int Tk, const int nh, const int nkv, const int d, const float scale,              \
        const float softcap, const int causal, const int window, const int window_mode,         \
        const int has_base, const int base_pos, const int has_anc, const int ld,                \
        const int kv_bufs
#define PF_ARGS                                                                               \
    q, k, v, q_pos, k_pos, anc, out, Tq, Tk, nh, nkv, d, scale, softcap, causal, window,        \
        window_mode, has_base, base_pos, has_anc, ld, kv_bufs

extern "C" __global__ void attention_prefill_d128_f32(PF_PARAMS) {
    attention_prefill_body<false, 8, 4>(PF_ARGS);
}

extern "C" __global__ void attention_prefill_d128_vec4_f32(PF_PARAMS) {
    attention_prefill_body<true, 8, 4>(PF_ARGS);
}

extern "C" __global__ void attention_prefill_d256_f32(PF_PARAMS) {
    attention_prefill_body<false, 4, 8>(PF_ARGS);
}

extern "C" __global__ void attention_prefill_d256_vec4_f32(PF_PARAMS) {
    attention_prefill_body<true, 4, 8>(PF_ARGS);
}
