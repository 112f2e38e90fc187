// attention_decode_v3.cu: decode attention v3, every warp on keys, the split combine in-kernel.
// Reference: dflash_ref/ops/attention.py (attention) and dflash_ref/ops/masks.py (the visibility
// predicate att_key_visible of attention_mask.cuh, which _build.py prepends). Plan:
// kernels_cupy/attention_decode_v3.py (plan_decode_v3); CPU emulation of the thread mapping and
// the summation order: tests/kernels/test_attention_decode_v3.py. docs/attention.md, "The decode
// kernel (v3)". Non-finite inputs: docs/conventions.md, "Non-finite attention".
//
// Kernel (float32, contiguous, q / k / v 16-byte aligned; q [Tq, nh, d], k / v [Tk, nkv, d],
// q_pos [Tq] int32, k_pos [Tk] int32 with -1 = invalid slot, anc [Tq, Tk] uint8 or a dummy when
// has_anc == 0; d % 4 == 0, d <= 128; rows = Tq * (nh / nkv) <= D3_ROWS):
//   attention_decode_v3_f32
//       grid = (n_splits, nkv), block = D3_WARPS * 32 = 256 threads. A block owns every row of
//       ONE kv head kvh = blockIdx.y (row r = i * g + (h - kvh * g) for query row i and query
//       head h; r < rows) and the keys [z * keys_per_split, min(Tk, (z + 1) * keys_per_split))
//       of split z = blockIdx.x. Every warp works on keys: warp w takes the groups of D3_KG = 8
//       consecutive keys starting at j_begin + 8 (w + 8 u), u = 0, 1, ..., with its own online
//       softmax state (m, l, acc) for every row. Lane L owns columns 4 L .. 4 L + 3 (one float4
//       of q, acc and of each K / V row); the warp's 8 K rows and 8 V rows of a group are loaded
//       together (16 float4 per lane in flight; eight groups per block), only for keys some row
//       sees (the mask of the next group is evaluated while they land). Per group:
//         1. pair P = 8 s + t (row s < 4, key t < 8): lane L's partial dot
//            v_P = fmaf over its 4 columns (x, y, z, w in order); then a reduce-scatter over the
//            32 lanes (xor offsets 16, 8, 4, 2, 1; at offset o a lane keeps the half of its
//            values whose index bit matches its lane bit and adds its partner's): lane L ends
//            with the score of pair P = L, summed in the xor-butterfly tree;
//         2. x = score * scale, optional softcap tanh, the mask (pair L's bit of one ballot;
//            invisible -> -inf); the row's group max (fmaxf, xor 4, 2, 1 within its 8 lanes);
//            m_new = fmaxf(m, max); sh = att_softmax_shift(m_new); c = e^(m - sh);
//            p = e^(x - sh) (0 where masked); l = c l + (sum of the row's 8 p, xor 4, 2, 1);
//            acc = c acc; then acc += p_t V[t] (fmaf) for t = 0 .. 7 ascending, only where the
//            row sees key t (a masked key's V is never multiplied).
//       Then the block's warps merge (warp order 0 .. 7, through shared memory) and, with one
//       split, write out = O / L (0 when L == 0). With several splits each block writes its
//       merged (O, M, L) to part_o [S, Tq * nh, d] / part_ml [S, Tq * nh, 2], fences, and takes a
//       ticket from counters[kvh]; the last block of kv head kvh reads every split's partial
//       (split order 0 .. S - 1) and merges them with the same function, writes out and resets
//       the counter to 0 (no memset per call, no second launch; the counters are zero once,
//       when the wrapper allocates them). Merge (warps or splits k ascending): M = fmaxf over k
//       with l_k != 0 (a NaN l is mass), then att_softmax_shift; w_k = e^(m_k - M) (0 when
//       l_k == 0); L = sum_k fmaf(l_k, w_k); O = sum_k fmaf(acc_k, w_k) over every k.
// Launch assumptions: blockDim.x == D3_WARPS * 32; 1 <= n_splits <= D3_MAX_SPLITS; keys_per_split
// a multiple of D3_WARPS * D3_KG (64) unless n_splits == 1; dynamic shared memory =
// D3_WARPS * D3_ROWS * (d + 2) * 4 bytes; counters: nkv zeroed uint32, used by one launch at a
// time (one stream). Positions are int32; indices into q / k / v / anc are 64-bit.
// Precision: FP32 CUDA cores, within float32 rounding of the reference (the tolerance is
// tests/kernels/test_attention_decode_v3.py's).

#define D3_WARPS 8
#define D3_KG 8          // keys per warp group
#define D3_ROWS 4        // rows per block (D3_ROWS * D3_KG == 32 pairs: one per lane)
#define D3_MAX_SPLITS 8  // the merge buffer holds D3_WARPS >= n_splits slots
#define D3_MAX_D 128
#define D3_FULL 0xffffffffu
#define D3_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float d3_group_max(float x) {  // over the 8 lanes of a row
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(D3_FULL, x, o));
    return x;
}

__device__ __forceinline__ float d3_group_sum(float x) {
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) x += __shfl_xor_sync(D3_FULL, x, o);
    return x;
}

// The reduce-scatter of step 1: v[P] holds this lane's partial of pair P; returns the full sum
// of pair P = lane.
__device__ __forceinline__ float d3_reduce_scatter(float (&v)[32], const int lane) {
#pragma unroll
    for (int o = 16, n = 16; o > 0; o >>= 1, n >>= 1) {  // n: values kept after this step
        const bool upper = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < n; ++i) {
            const float keep = upper ? v[i + n] : v[i];
            const float give = upper ? v[i] : v[i + n];
            v[i] = keep + __shfl_xor_sync(D3_FULL, give, o);
        }
    }
    return v[0];
}

// Merge `n` partial states (m, l, acc) in slot order for row r, columns 4 c4 .. 4 c4 + 3:
// returns O (float4) and sets L, M. sM / sL [n][D3_ROWS], sAcc [n][D3_ROWS][d].
__device__ __forceinline__ float4 d3_merge(const float* sM, const float* sL, const float* sAcc,
                                           const int n, const int r, const int c4, const int d,
                                           float& L, float& M) {
    M = D3_NEG_INF;
    for (int k = 0; k < n; ++k)
        if (sL[k * D3_ROWS + r] != 0.0f) M = fmaxf(M, sM[k * D3_ROWS + r]);
    M = att_softmax_shift(M);
    L = 0.0f;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int k = 0; k < n; ++k) {
        const float lk = sL[k * D3_ROWS + r];
        const float w = (lk != 0.0f) ? expf(sM[k * D3_ROWS + r] - M) : 0.0f;
        L = fmaf(lk, w, L);
        const float4 a = reinterpret_cast<const float4*>(sAcc + (k * D3_ROWS + r) * d)[c4];
        o.x = fmaf(a.x, w, o.x);
        o.y = fmaf(a.y, w, o.y);
        o.z = fmaf(a.z, w, o.z);
        o.w = fmaf(a.w, w, o.w);
    }
    return o;
}

__device__ __forceinline__ void d3_store_out(float* __restrict__ out, const long long orow,
                                             const int d, const int c4, const float4 o,
                                             const float L) {
    const float inv = (L != 0.0f) ? 1.0f / L : 0.0f;  // no visible key -> 0; NaN stays NaN
    reinterpret_cast<float4*>(out + orow * d)[c4] =
        make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
}

extern "C" __global__ void attention_decode_v3_f32(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const int* __restrict__ q_pos, const int* __restrict__ k_pos,
    const unsigned char* __restrict__ anc, float* __restrict__ out, float* __restrict__ part_o,
    float* __restrict__ part_ml, unsigned* __restrict__ counters, const int Tq, const int Tk,
    const int nh, const int nkv, const int d, const float scale, const float softcap,
    const int causal, const int window, const int window_mode, const int has_base,
    const int base_pos, const int has_anc, const int keys_per_split, const int n_splits);
extern "C" {
__global__ void __launch_bounds__(D3_WARPS * 32, 1) attention_decode_v3_f32(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const int* __restrict__ q_pos, const int* __restrict__ k_pos,
    const unsigned char* __restrict__ anc, float* __restrict__ out, float* __restrict__ part_o,
    float* __restrict__ part_ml, unsigned* __restrict__ counters, const int Tq, const int Tk,
    const int nh, const int nkv, const int d, const float scale, const float softcap,
    const int causal, const int window, const int window_mode, const int has_base,
    const int base_pos, const int has_anc, const int keys_per_split, const int n_splits) {
    extern __shared__ __align__(16) float d3_smem[];
    float* sAcc = d3_smem;                                 // [D3_WARPS][D3_ROWS][d]
    float* sM = sAcc + D3_WARPS * D3_ROWS * d;             // [D3_WARPS][D3_ROWS]
    float* sL = sM + D3_WARPS * D3_ROWS;                   // [D3_WARPS][D3_ROWS]
    __shared__ int sLast;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = nh / nkv, kvh = blockIdx.y, split = blockIdx.x;
    const int rows = Tq * g;
    const long long j_begin = (long long)split * keys_per_split;
    const long long j_end = min((long long)Tk, j_begin + keys_per_split);
    const bool col_ok = 4 * lane < d;

    // This lane's columns of q for every row (0 past the rows and past d).
    float4 qv[D3_ROWS];
#pragma unroll
    for (int s = 0; s < D3_ROWS; ++s) {
        qv[s] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (s < rows && col_ok) {
            const long long i = s / g;
            const int h = kvh * g + s % g;
            qv[s] = reinterpret_cast<const float4*>(q + (i * nh + h) * d)[lane];
        }
    }
    // The pair this lane scores and masks: row ps, key pt of a group.
    const int ps = lane / D3_KG, pt = lane % D3_KG;
    const bool prow_ok = ps < rows;
    const int pi = prow_ok ? ps / g : 0;
    const int pqp = prow_ok ? q_pos[pi] : 0;
    const unsigned char* anc_row = has_anc ? anc + (long long)pi * Tk : anc;
    auto group_bits = [&](const long long j0) {  // bit 8 s + t: row s sees key j0 + t
        const long long j = j0 + pt;
        bool vis = false;
        if (prow_ok && j < j_end)
            vis = att_key_visible(pqp, k_pos[j], anc_row, j, causal, window, window_mode,
                                  has_base, base_pos, has_anc);
        return __ballot_sync(D3_FULL, vis);
    };

    float m[D3_ROWS], l[D3_ROWS];
    float4 acc[D3_ROWS];
#pragma unroll
    for (int s = 0; s < D3_ROWS; ++s) {
        m[s] = D3_NEG_INF;
        l[s] = 0.0f;
        acc[s] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }

    const long long stride = (long long)D3_WARPS * D3_KG;
    long long j0 = j_begin + (long long)warp * D3_KG;
    unsigned bits = (j0 < j_end) ? group_bits(j0) : 0u;
    for (; j0 < j_end; j0 += stride) {
        // Issue the group's K and V rows (keys some row sees), then the next group's mask.
        float4 kr[D3_KG], vr[D3_KG];
#pragma unroll
        for (int t = 0; t < D3_KG; ++t) {
            const bool need = ((bits >> t) & 0x01010101u) != 0u && col_ok;
            const long long off = ((j0 + t) * nkv + kvh) * d;
            kr[t] = need ? reinterpret_cast<const float4*>(k + off)[lane]
                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            vr[t] = need ? reinterpret_cast<const float4*>(v + off)[lane]
                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        const unsigned next = (j0 + stride < j_end) ? group_bits(j0 + stride) : 0u;
        if (bits != 0u) {  // warp-uniform: a row of the block sees a key of this group
            // 1. Partial dots of the 32 pairs, then the reduce-scatter: lane L scores pair L.
            float pv[32];
#pragma unroll
            for (int s = 0; s < D3_ROWS; ++s)
#pragma unroll
                for (int t = 0; t < D3_KG; ++t) {
                    float a = qv[s].x * kr[t].x;
                    a = fmaf(qv[s].y, kr[t].y, a);
                    a = fmaf(qv[s].z, kr[t].z, a);
                    pv[s * D3_KG + t] = fmaf(qv[s].w, kr[t].w, a);
                }
            float x = d3_reduce_scatter(pv, lane) * scale;
            // 2. The online softmax of each row (its 8 lanes), then the V rows it sees.
            if (softcap > 0.0f) x = softcap * tanhf(x / softcap);  // before the mask
            const bool vis = (bits >> lane) & 1u;
            x = vis ? x : D3_NEG_INF;
            const float gmax = d3_group_max(x);
            float m_own = m[0];
#pragma unroll
            for (int s = 1; s < D3_ROWS; ++s) m_own = (ps == s) ? m[s] : m_own;
            const float sh_own = att_softmax_shift(fmaxf(m_own, gmax));
            const float p = vis ? expf(x - sh_own) : 0.0f;
            const float psum = d3_group_sum(p);
#pragma unroll
            for (int s = 0; s < D3_ROWS; ++s) {
                if (((bits >> (s * D3_KG)) & 0xffu) == 0u) continue;  // warp-uniform
                const float m_new = fmaxf(m[s], __shfl_sync(D3_FULL, gmax, s * D3_KG));
                const float corr = expf(m[s] - att_softmax_shift(m_new));  // 0 when m was -inf
                l[s] = fmaf(l[s], corr, __shfl_sync(D3_FULL, psum, s * D3_KG));
                acc[s].x *= corr;
                acc[s].y *= corr;
                acc[s].z *= corr;
                acc[s].w *= corr;
                m[s] = m_new;
#pragma unroll
                for (int t = 0; t < D3_KG; ++t) {
                    if (((bits >> (s * D3_KG + t)) & 1u) == 0u) continue;  // warp-uniform
                    const float pj = __shfl_sync(D3_FULL, p, s * D3_KG + t);
                    acc[s].x = fmaf(pj, vr[t].x, acc[s].x);
                    acc[s].y = fmaf(pj, vr[t].y, acc[s].y);
                    acc[s].z = fmaf(pj, vr[t].z, acc[s].z);
                    acc[s].w = fmaf(pj, vr[t].w, acc[s].w);
                }
            }
        }
        bits = next;
    }

    // The warps' states -> shared memory, then the block's merge (warp order).
#pragma unroll
    for (int s = 0; s < D3_ROWS; ++s) {
        if (col_ok) reinterpret_cast<float4*>(sAcc + (warp * D3_ROWS + s) * d)[lane] = acc[s];
        if (lane == 0) {
            sM[warp * D3_ROWS + s] = m[s];
            sL[warp * D3_ROWS + s] = l[s];
        }
    }
    __syncthreads();
    const int d4 = d >> 2;
    const int r = tid / d4, c4 = tid - r * d4;  // this thread's (row, float4 column)
    const bool mine = r < rows && r < D3_ROWS;
    float L = 0.0f, M = 0.0f;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (mine) o = d3_merge(sM, sL, sAcc, D3_WARPS, r, c4, d, L, M);
    const long long orow = mine ? (long long)(r / g) * nh + kvh * g + r % g : 0;
    if (n_splits == 1) {
        if (mine) d3_store_out(out, orow, d, c4, o, L);
        return;
    }
    // Several splits: publish this block's partial, then the last block of the kv head merges.
    const long long prow = (long long)split * Tq * nh + orow;
    if (mine) {
        reinterpret_cast<float4*>(part_o + prow * d)[c4] = o;
        if (c4 == 0) {
            part_ml[prow * 2 + 0] = M;
            part_ml[prow * 2 + 1] = L;
        }
    }
    __threadfence();  // the partial is visible device-wide before the ticket
    __syncthreads();  // every thread's partial written (and the merge done with shared memory)
    if (tid == 0) sLast = atomicAdd(counters + kvh, 1u) == (unsigned)(n_splits - 1);
    __syncthreads();
    if (!sLast) return;  // block-uniform
    __threadfence();
    for (int e = tid; e < n_splits * D3_ROWS * d4; e += blockDim.x) {  // splits -> the slots
        const int z = e / (D3_ROWS * d4), rem = e - z * D3_ROWS * d4;
        const int rr = rem / d4, cc = rem - rr * d4;
        if (rr >= rows) continue;
        const long long pr = (long long)z * Tq * nh + (long long)(rr / g) * nh + kvh * g + rr % g;
        reinterpret_cast<float4*>(sAcc + (z * D3_ROWS + rr) * d)[cc] =
            __ldcg(reinterpret_cast<const float4*>(part_o + pr * d) + cc);
        if (cc == 0) {
            sM[z * D3_ROWS + rr] = __ldcg(part_ml + pr * 2 + 0);
            sL[z * D3_ROWS + rr] = __ldcg(part_ml + pr * 2 + 1);
        }
    }
    __syncthreads();
    if (mine) {
        o = d3_merge(sM, sL, sAcc, n_splits, r, c4, d, L, M);
        d3_store_out(out, orow, d, c4, o, L);
    }
    if (tid == 0) counters[kvh] = 0u;  // ready for the next launch
}
}
