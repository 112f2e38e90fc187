// attention_decode_v3.cu: decode / verify attention v3, every warp busy, the split combine
// in-kernel.
// Reference: dflash_ref/ops/attention.py (attention) and dflash_ref/ops/masks.py (the visibility
// predicate att_key_visible of attention_mask.cuh, which _build.py prepends). Plan:
// kernels_cupy/attention_decode_v3.py (plan_decode_v3); CPU emulation of the thread mapping and
// the summation order: tests/kernels/test_attention_decode_v3.py. docs/attention.md, "The decode
// kernel (v3)". Non-finite inputs: docs/conventions.md, "Non-finite attention".
//
// Kernels (float32, contiguous, q / k / v 16-byte aligned; q [Tq, nh, d], k / v [Tk, nkv, d],
// q_pos [Tq] int32, k_pos [Tk] int32 with -1 = invalid slot, anc [Tq, Tk] uint8 or a dummy when
// has_anc == 0; d % 4 == 0; the rows of a kv head r = i * g + (h - kvh * g) for query row i
// and query head h, r < Tq * g), one body d3_body<NV, NQ>:
//   attention_decode_v3_f32       NV = 1, NQ = 1: d <= 128, 4 rows per warp
//   attention_decode_v3_r8_f32    NV = 1, NQ = 2: d <= 128, 8 rows per warp
//   attention_decode_v3_d256_f32  NV = 2, NQ = 1: d <= 256, 4 rows per warp
//       grid = (n_splits, nkv, row blocks), block = D3_WARPS * 32 = 256 threads. A block owns
//       the rows [z * rows_per_block, ...) of ONE kv head kvh = blockIdx.y (z = blockIdx.z) and
//       the keys [x * keys_per_split, min(Tk, (x + 1) * keys_per_split)) of split x =
//       blockIdx.x. Warp w is row group w / key_warps (rows 4 NQ (w / key_warps) .. of the
//       block) and key warp kw = w % key_warps: it takes the groups of D3_KG = 8 consecutive
//       keys starting at j_begin + 8 (kw + key_warps u), u = 0, 1, ..., with its own online
//       softmax state (m, l, acc) for each of its rows. Lane L owns the float4 columns L + 32 c,
//       c < NV (columns 4 L .. 4 L + 3, then 128 + 4 L .. 128 + 4 L + 3); the warp's 8 K rows
//       and 8 V rows of a group are loaded together (16 NV float4 per lane in flight), only
//       for keys some row of the warp sees (the next group's mask is evaluated while they
//       land). Per group and per quad u of the warp's rows (rows 4 u .. 4 u + 3):
//         1. pair P = 8 s + t (row 4 u + s, key t < 8): lane L's partial dot v_P = a chain of
//            fmaf over its columns (slot 0 x, y, z, w, then slot 1); then a reduce-scatter over
//            the 32 lanes (xor offsets 16, 8, 4, 2, 1; at offset o a lane keeps the half of its
//            values whose index bit matches its lane bit and adds its partner's): lane L ends
//            with the score of pair P = L, summed in the xor-butterfly tree;
//         2. x = score * scale, optional softcap tanh, the mask (pair L's bit of the quad's
//            ballot; invisible -> -inf); the row's group max (fmaxf, xor 4, 2, 1 within its 8
//            lanes); m_new = fmaxf(m, max); sh = att_softmax_shift(m_new); c = e^(m - sh);
//            p = e^(x - sh) (0 where masked); l = c l + (sum of the row's 8 p, xor 4, 2, 1);
//            acc = c acc; then acc += p_t V[t] (fmaf) for t = 0 .. 7 ascending, only where the
//            row sees key t (a masked key's V is never multiplied).
//       Then the warps' states go to shared memory and block row rr merges the key_warps slots
//       of its row group (warp order); with one split it writes out = O / L (0 when L == 0).
//       With several splits each block writes its merged (O, M, L) to part_o [S, Tq * nh, d] /
//       part_ml [S, Tq * nh, 2], fences, and takes a ticket from counters[kvh * row blocks +
//       z]; the last block reads every split's partial (split order 0 .. S - 1, through L2) and
//       merges them with the same function, writes out and resets the counter to 0 (no memset
//       per call, no second launch; the counters are zero once, when the wrapper allocates
//       them). Merge (slots k ascending): M = fmaxf over k with l_k != 0 (a NaN l is mass),
//       then att_softmax_shift; w_k = e^(m_k - M) (0 when l_k == 0); L = sum_k fmaf(l_k, w_k);
//       O = sum_k fmaf(acc_k, w_k) over every k.
// Launch assumptions: blockDim.x == D3_WARPS * 32; key_warps in {1, 2, 4, 8} with
// (8 / key_warps) * 4 NQ >= rows_per_block; d <= 128 NV; 1 <= n_splits <= D3_MAX_SPLITS;
// keys_per_split a multiple of D3_WARPS * D3_KG (64) unless n_splits == 1; dynamic shared
// memory = D3_WARPS * 4 NQ * (d + 2) * 4 bytes; counters: nkv * row blocks zeroed uint32, used
// by one launch at a time (one stream). Positions are int32; indices into q / k / v / anc are
// 64-bit. Registers (ptxas, sm_90): 168 / 224 / 255, no spill (__launch_bounds__(256, 1)).
// Precision: FP32 CUDA cores, within float32 rounding of the reference (the tolerance is
// tests/kernels/test_attention_decode_v3.py's).

#define D3_WARPS 8
#define D3_KG 8          // keys per warp group
#define D3_ROWS 4        // rows of a quad (D3_ROWS * D3_KG == 32 pairs: one per lane)
#define D3_MAX_SPLITS 8  // splits merged by the last block of a (kv head, row block)
#define D3_MAX_D 256     // NV = 2 float4 column slots per lane
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

// Shared merge slots are read plainly; the splits' partials (written by other blocks) through
// L2 (ld.global.cg), never from a stale L1 line.
template <bool kGlobal>
__device__ __forceinline__ float d3_ld(const float* p) {
    if constexpr (kGlobal) return __ldcg(p);
    else return *p;
}

template <bool kGlobal>
__device__ __forceinline__ float4 d3_ld4(const float* p) {
    if constexpr (kGlobal) return __ldcg(reinterpret_cast<const float4*>(p));
    else return *reinterpret_cast<const float4*>(p);
}

// Merge `n` partial states (m, l, acc) of one row in slot order k = 0 .. n - 1, for the columns
// 4 c4 .. 4 c4 + 3: slot k's (m, l) at ml[k * ml_step], its acc row at acc[k * acc_step].
// Returns O (float4) and sets L, M.
template <bool kGlobal>
__device__ __forceinline__ float4 d3_merge(const float* ml, const long long ml_step,
                                           const float* acc, const long long acc_step,
                                           const int n, const int c4, float& L, float& M) {
    M = D3_NEG_INF;
    for (int k = 0; k < n; ++k)
        if (d3_ld<kGlobal>(ml + k * ml_step + 1) != 0.0f)
            M = fmaxf(M, d3_ld<kGlobal>(ml + k * ml_step));
    M = att_softmax_shift(M);
    L = 0.0f;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int k = 0; k < n; ++k) {
        const float lk = d3_ld<kGlobal>(ml + k * ml_step + 1);
        const float w = (lk != 0.0f) ? expf(d3_ld<kGlobal>(ml + k * ml_step) - M) : 0.0f;
        L = fmaf(lk, w, L);
        const float4 a = d3_ld4<kGlobal>(acc + k * acc_step + 4 * c4);
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

__device__ __forceinline__ float4 d3_zero4() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// The kernel body, for NV float4 column slots per lane (lane L: float4 columns L + 32 v) and NQ
// quads of 4 rows per warp.
template <int NV, int NQ>
__device__ __forceinline__ void d3_body(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const int* __restrict__ q_pos, const int* __restrict__ k_pos,
    const unsigned char* __restrict__ anc, float* __restrict__ out, float* __restrict__ part_o,
    float* __restrict__ part_ml, unsigned* __restrict__ counters, const int Tq, const int Tk,
    const int nh, const int nkv, const int d, const float scale, const float softcap,
    const int causal, const int window, const int window_mode, const int has_base,
    const int base_pos, const int has_anc, const int keys_per_split, const int n_splits,
    const int rows_per_block, const int key_warps) {
    constexpr int RPW = D3_ROWS * NQ;  // rows per warp
    extern __shared__ __align__(16) float d3_smem[];
    float* sAcc = d3_smem;                      // [D3_WARPS][RPW][d]
    float* sML = sAcc + D3_WARPS * RPW * d;     // [D3_WARPS][RPW][2]: (m, l)
    __shared__ int sLast;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = nh / nkv, kvh = blockIdx.y, split = blockIdx.x;
    const int rows = Tq * g;
    const int row0 = blockIdx.z * rows_per_block;             // first row of this block
    const int nrows = min(rows_per_block, rows - row0);       // rows of this block
    const int kw = warp % key_warps, wrow0 = (warp / key_warps) * RPW;  // key lane, first row
    const long long j_begin = (long long)split * keys_per_split;
    const long long j_end = min((long long)Tk, j_begin + keys_per_split);
    const int d4 = d >> 2;

    // Block row rr -> row r = row0 + rr of the kv head = (query row r / g, head kvh g + r % g).
    auto out_row = [&](const int rr) {
        const int r = row0 + rr;
        return (long long)(r / g) * nh + kvh * g + r % g;
    };
    // This lane's columns of q for the warp's rows (0 past the rows and past d).
    float4 qv[RPW][NV];
#pragma unroll
    for (int s = 0; s < RPW; ++s)
#pragma unroll
        for (int c = 0; c < NV; ++c) {
            qv[s][c] = d3_zero4();
            if (wrow0 + s < nrows && lane + 32 * c < d4)
                qv[s][c] = reinterpret_cast<const float4*>(q + out_row(wrow0 + s) * d)[
                    lane + 32 * c];
        }
    // The pair this lane scores and masks in quad u: row 4 u + ps of the warp, key pt of a group.
    const int ps = lane / D3_KG, pt = lane % D3_KG;
    int pqp[NQ];
    const unsigned char* anc_row[NQ];
    bool prow_ok[NQ];
#pragma unroll
    for (int u = 0; u < NQ; ++u) {
        const int rr = wrow0 + D3_ROWS * u + ps;
        prow_ok[u] = rr < nrows;
        const int i = prow_ok[u] ? (row0 + rr) / g : 0;
        pqp[u] = prow_ok[u] ? q_pos[i] : 0;
        anc_row[u] = has_anc ? anc + (long long)i * Tk : anc;
    }
    auto group_bits = [&](const long long j0, unsigned (&b)[NQ]) {  // bit 8 s + t of quad u:
        const long long j = j0 + pt;                                // row 4 u + s sees j0 + t
        const int kp = (j < j_end) ? k_pos[j] : -1;
#pragma unroll
        for (int u = 0; u < NQ; ++u) {
            bool vis = false;
            if (prow_ok[u] && j < j_end)
                vis = att_key_visible(pqp[u], kp, anc_row[u], j, causal, window, window_mode,
                                      has_base, base_pos, has_anc);
            b[u] = __ballot_sync(D3_FULL, vis);
        }
    };

    float m[RPW], l[RPW];
    float4 acc[RPW][NV];
#pragma unroll
    for (int s = 0; s < RPW; ++s) {
        m[s] = D3_NEG_INF;
        l[s] = 0.0f;
#pragma unroll
        for (int c = 0; c < NV; ++c) acc[s][c] = d3_zero4();
    }

    const long long stride = (long long)key_warps * D3_KG;
    long long j0 = j_begin + (long long)kw * D3_KG;
    unsigned bits[NQ];
#pragma unroll
    for (int u = 0; u < NQ; ++u) bits[u] = 0u;
    if (wrow0 < nrows && j0 < j_end) group_bits(j0, bits);
    for (; j0 < j_end && wrow0 < nrows; j0 += stride) {  // warp-uniform
        unsigned any = 0u;
#pragma unroll
        for (int u = 0; u < NQ; ++u) any |= bits[u];
        // Issue the group's K and V rows (keys some row sees), then the next group's mask.
        float4 kr[D3_KG][NV], vr[D3_KG][NV];
#pragma unroll
        for (int t = 0; t < D3_KG; ++t) {
            const bool need = ((any >> t) & 0x01010101u) != 0u;
            const long long off = ((j0 + t) * nkv + kvh) * d;
#pragma unroll
            for (int c = 0; c < NV; ++c) {
                const bool ld = need && lane + 32 * c < d4;
                const int c4 = lane + 32 * c;
                kr[t][c] = ld ? reinterpret_cast<const float4*>(k + off)[c4] : d3_zero4();
                vr[t][c] = ld ? reinterpret_cast<const float4*>(v + off)[c4] : d3_zero4();
            }
        }
        unsigned next[NQ];
#pragma unroll
        for (int u = 0; u < NQ; ++u) next[u] = 0u;
        if (j0 + stride < j_end) group_bits(j0 + stride, next);
#pragma unroll
        for (int u = 0; u < NQ; ++u) {
            const unsigned b = bits[u];
            if (b == 0u) continue;  // warp-uniform: no row of the quad sees a key of the group
            // 1. Partial dots of the 32 pairs, then the reduce-scatter: lane L scores pair L.
            float pv[32];
#pragma unroll
            for (int s = 0; s < D3_ROWS; ++s)
#pragma unroll
                for (int t = 0; t < D3_KG; ++t) {
                    const float4* qs = qv[D3_ROWS * u + s];
                    float a = qs[0].x * kr[t][0].x;
                    a = fmaf(qs[0].y, kr[t][0].y, a);
                    a = fmaf(qs[0].z, kr[t][0].z, a);
                    a = fmaf(qs[0].w, kr[t][0].w, a);
#pragma unroll
                    for (int c = 1; c < NV; ++c) {
                        a = fmaf(qs[c].x, kr[t][c].x, a);
                        a = fmaf(qs[c].y, kr[t][c].y, a);
                        a = fmaf(qs[c].z, kr[t][c].z, a);
                        a = fmaf(qs[c].w, kr[t][c].w, a);
                    }
                    pv[s * D3_KG + t] = a;
                }
            float x = d3_reduce_scatter(pv, lane) * scale;
            // 2. The online softmax of each row (its 8 lanes), then the V rows it sees.
            if (softcap > 0.0f) x = softcap * tanhf(x / softcap);  // before the mask
            const bool vis = (b >> lane) & 1u;
            x = vis ? x : D3_NEG_INF;
            const float gmax = d3_group_max(x);
            float m_own = m[D3_ROWS * u];
#pragma unroll
            for (int s = 1; s < D3_ROWS; ++s) m_own = (ps == s) ? m[D3_ROWS * u + s] : m_own;
            const float sh_own = att_softmax_shift(fmaxf(m_own, gmax));
            const float p = vis ? expf(x - sh_own) : 0.0f;
            const float psum = d3_group_sum(p);
#pragma unroll
            for (int s = 0; s < D3_ROWS; ++s) {
                if (((b >> (s * D3_KG)) & 0xffu) == 0u) continue;  // warp-uniform
                const int w = D3_ROWS * u + s;
                const float m_new = fmaxf(m[w], __shfl_sync(D3_FULL, gmax, s * D3_KG));
                const float corr = expf(m[w] - att_softmax_shift(m_new));  // 0 when m was -inf
                l[w] = fmaf(l[w], corr, __shfl_sync(D3_FULL, psum, s * D3_KG));
#pragma unroll
                for (int c = 0; c < NV; ++c) {
                    acc[w][c].x *= corr;
                    acc[w][c].y *= corr;
                    acc[w][c].z *= corr;
                    acc[w][c].w *= corr;
                }
                m[w] = m_new;
#pragma unroll
                for (int t = 0; t < D3_KG; ++t) {
                    if (((b >> (s * D3_KG + t)) & 1u) == 0u) continue;  // warp-uniform
                    const float pj = __shfl_sync(D3_FULL, p, s * D3_KG + t);
#pragma unroll
                    for (int c = 0; c < NV; ++c) {
                        acc[w][c].x = fmaf(pj, vr[t][c].x, acc[w][c].x);
                        acc[w][c].y = fmaf(pj, vr[t][c].y, acc[w][c].y);
                        acc[w][c].z = fmaf(pj, vr[t][c].z, acc[w][c].z);
                        acc[w][c].w = fmaf(pj, vr[t][c].w, acc[w][c].w);
                    }
                }
            }
        }
#pragma unroll
        for (int u = 0; u < NQ; ++u) bits[u] = next[u];
    }

    // The warps' states -> shared memory, then the block's merge: block row rr merges the
    // key_warps slots of its row group in warp order.
#pragma unroll
    for (int s = 0; s < RPW; ++s) {
#pragma unroll
        for (int c = 0; c < NV; ++c)
            if (lane + 32 * c < d4)
                reinterpret_cast<float4*>(sAcc + (warp * RPW + s) * d)[lane + 32 * c] = acc[s][c];
        if (lane == 0) {
            sML[(warp * RPW + s) * 2 + 0] = m[s];
            sML[(warp * RPW + s) * 2 + 1] = l[s];
        }
    }
    __syncthreads();
    const long long plane = (long long)Tq * nh;  // rows of one split's partial
    for (int e = tid; e < nrows * d4; e += blockDim.x) {
        const int rr = e / d4, c4 = e - rr * d4;  // (block row, float4 column)
        const int slot0 = (rr / RPW) * key_warps * RPW + rr % RPW;  // its first warp's row
        float L, M;
        const float4 o = d3_merge<false>(sML + slot0 * 2, 2 * RPW, sAcc + (long long)slot0 * d,
                                         (long long)RPW * d, key_warps, c4, L, M);
        const long long orow = out_row(rr);
        if (n_splits == 1) {
            d3_store_out(out, orow, d, c4, o, L);
            continue;
        }
        const long long prow = split * plane + orow;  // publish this block's partial
        reinterpret_cast<float4*>(part_o + prow * d)[c4] = o;
        if (c4 == 0) {
            part_ml[prow * 2 + 0] = M;
            part_ml[prow * 2 + 1] = L;
        }
    }
    if (n_splits == 1) return;
    // Several splits: the last block of (kv head, row block) merges them (split order).
    __threadfence();  // the partial is visible device-wide before the ticket
    __syncthreads();  // every thread's partial written
    unsigned* counter = counters + (long long)kvh * gridDim.z + blockIdx.z;
    if (tid == 0) sLast = atomicAdd(counter, 1u) == (unsigned)(n_splits - 1);
    __syncthreads();
    if (!sLast) return;  // block-uniform
    __threadfence();
    for (int e = tid; e < nrows * d4; e += blockDim.x) {
        const int rr = e / d4, c4 = e - rr * d4;
        const long long orow = out_row(rr);
        float L, M;
        const float4 o = d3_merge<true>(part_ml + orow * 2, 2 * plane, part_o + orow * d,
                                        plane * d, n_splits, c4, L, M);
        d3_store_out(out, orow, d, c4, o, L);
    }
    if (tid == 0) *counter = 0u;  // ready for the next launch
}

#define D3_ARGS                                                                                 \
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,     \
        const int* __restrict__ q_pos, const int* __restrict__ k_pos,                           \
        const unsigned char* __restrict__ anc, float* __restrict__ out,                         \
        float* __restrict__ part_o, float* __restrict__ part_ml,                                \
        unsigned* __restrict__ counters, const int Tq, const int Tk, const int nh,              \
        const int nkv, const int d, const float scale, const float softcap, const int causal,   \
        const int window, const int window_mode, const int has_base, const int base_pos,        \
        const int has_anc, const int keys_per_split, const int n_splits,                        \
        const int rows_per_block, const int key_warps
#define D3_PASS                                                                                \
    q, k, v, q_pos, k_pos, anc, out, part_o, part_ml, counters, Tq, Tk, nh, nkv, d, scale,     \
        softcap, causal, window, window_mode, has_base, base_pos, has_anc, keys_per_split,      \
        n_splits, rows_per_block, key_warps

// The declarations name the kernels for _build.kernel_names; the definitions follow.
extern "C" __global__ void attention_decode_v3_f32(D3_ARGS);
extern "C" __global__ void attention_decode_v3_r8_f32(D3_ARGS);
extern "C" __global__ void attention_decode_v3_d256_f32(D3_ARGS);
extern "C" {
__global__ void __launch_bounds__(D3_WARPS * 32, 1) attention_decode_v3_f32(D3_ARGS) {
    d3_body<1, 1>(D3_PASS);
}
__global__ void __launch_bounds__(D3_WARPS * 32, 1) attention_decode_v3_r8_f32(D3_ARGS) {
    d3_body<1, 2>(D3_PASS);
}
__global__ void __launch_bounds__(D3_WARPS * 32, 1) attention_decode_v3_d256_f32(D3_ARGS) {
    d3_body<2, 1>(D3_PASS);
}
}
